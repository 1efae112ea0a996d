"""Test-only (never installed): in an operator process started with this folder on PYTHONPATH,
every reconcile of the jobs named in HOLMES_TEST_WEDGE_JOBS (``namespace/name``, comma-separated)
blocks for ever, as a deadlocked or hung reconcile would (issue 46). Python imports
``sitecustomize`` at start-up, after the site-packages' .pth files (the editable install)."""

import os


def _install() -> None:
    wedged = {j for j in os.environ.get("HOLMES_TEST_WEDGE_JOBS", "").split(",") if j}
    if not wedged:
        return
    import threading

    from holmes.operator import pipeline

    run = pipeline.Pipeline.run
    never = threading.Event()

    def run_or_hang(self, job, *args, **kwargs):
        if f"{job['metadata']['namespace']}/{job['metadata']['name']}" in wedged:
            never.wait()
        return run(self, job, *args, **kwargs)

    pipeline.Pipeline.run = run_or_hang


_install()
