"""``python -m holmes.launch.install DIR``: what the operator's init container runs (from the
Holmes image) to put the launcher into the pod's shared emptyDir, so the user's image needs no
rebuild. DIR then holds::

    launch.py              the entry: python DIR/launch.py -- <program> [args]
    sitecustomize.py       installs the network hook in every worker (PYTHONPATH=DIR)
    fabric.py, ncclenv.py  the trainer's device and NCCL_NET checks (standard library only)
    holmes/launch/*.py     this package
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from . import shared

HERE = Path(__file__).resolve().parent
ENTRY = '''"""Holmes' launcher entry (written by holmes.launch.install)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from holmes.launch.__main__ import main  # noqa: E402

sys.exit(main())
'''


def install(dest: Path) -> list[Path]:
    """Copy the launcher into ``dest``; the files written."""
    pkg = dest / "holmes" / "launch"
    pkg.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sorted(HERE.glob("*.py")):
        if src.name != "sitecustomize.py":
            written.append(Path(shutil.copyfile(src, pkg / src.name)))
    written.append(Path(shutil.copyfile(HERE / "sitecustomize.py", dest / "sitecustomize.py")))
    for name in shared.FILES:  # beside this package in the Holmes image
        written.append(Path(shutil.copyfile(HERE.parent / "trainer" / name, dest / name)))
    entry = dest / "launch.py"
    entry.write_text(ENTRY)
    written.append(entry)
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m holmes.launch.install DIR", file=sys.stderr)
        return 2
    files = install(Path(argv[0]))
    print(f"holmes.launch.install: wrote {len(files)} files to {argv[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
