"""Copied to the top of the launcher's directory as ``sitecustomize.py``, which Python imports at
start-up from ``PYTHONPATH``: in each worker torchrun starts (``RANK`` set) it installs Holmes'
network hook before the program creates any group, then runs the image's own sitecustomize, if
it has one (this file shadows it). A hook that refuses to install (hook.HookError: the message
says why and the fix) ends the worker with exit code 2: Python itself would print an exception
raised here and run the program on without the hook, on whatever network NCCL picks."""

import importlib.util
import os
import sys


def _holmes_hooks() -> None:
    if "RANK" not in os.environ or os.environ.get("HOLMES_NET_HOOK", "on") == "off":
        return
    from holmes.launch import hook, stages

    try:
        hook.install_from_env()
    except hook.HookError as e:
        sys.stderr.write(f"holmes network hook: rank {os.environ['RANK']}: {e}\n")
        sys.stderr.flush()
        os._exit(2)
    stages.install_from_env()


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        path = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.abspath(entry or os.getcwd()) != here and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_image_sitecustomize", path)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_holmes_hooks()
_chain()
