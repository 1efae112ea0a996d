"""The dry run: the real engine, at the job's real scale, on fake CUDA and a fake process group,
checked rank by rank (harness.py says what it runs and checks; ``python -m holmes.trainer.dryrun
--help``, or ``holmes dryrun``). What only the dry run uses lives beside it: fakecuda.py (the
fake CUDA device) and recording.py (each rank's collectives, host syncs and memory).

Importing the package loads nothing: harness.py loads the fake CUDA library before torch, which
only a process of its own may do (:func:`main` imports it when called)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the dry run with these arguments (``sys.argv[1:]`` when None); the exit status."""
    from .harness import main as run

    return run(argv)
