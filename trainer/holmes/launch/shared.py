"""The trainer's standard-library modules the launcher uses too: ``fabric.py`` (the device
checks) and ``ncclenv.py`` (NCCL_NET wherever NCCL reads it). In a pod they sit beside the
launcher, copied by install.py (the user's image holds no Holmes trainer); in a checkout or the
Holmes image, the trainer's own files. Loaded by path: this package imports nothing of the
trainer (README's dependency table)."""

from __future__ import annotations

import importlib.util
import runpy
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the directory holding holmes/launch (PYTHONPATH)
FILES = ("fabric.py", "ncclenv.py")


def trainer_file(name: str, root: Path = ROOT) -> Path:
    """The copy beside the launcher in a pod; the trainer's own file in a checkout."""
    copied = root / name
    if copied.is_file():
        return copied
    spec = importlib.util.find_spec(f"holmes.trainer.{name.removesuffix('.py')}")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"no {name} beside the launcher in {root}: copy it with holmes.launch.install"
        )
    return Path(spec.origin)


def load(name: str, root: Path = ROOT) -> dict[str, Any]:
    """The module's globals (functions and classes by name)."""
    return runpy.run_path(str(trainer_file(name, root)))
