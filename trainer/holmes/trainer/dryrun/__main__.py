"""python -m holmes.trainer.dryrun: see harness.py."""

import os
import sys

from . import main

code = main()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)  # now: the autograd engine's threads for the fake devices never join at exit
