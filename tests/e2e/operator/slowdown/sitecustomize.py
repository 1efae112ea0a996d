"""Test-only (never installed): makes the trainer processes of the nodes named in
HOLMES_TEST_SLOW_NODES genuinely slower, by sleeping HOLMES_TEST_SLOW_SECONDS before every
transformer block's forward, so a re-planning test sees one island's stage run slower for real
(its measured times are the trainer's own). A pod opts in by putting this folder on PYTHONPATH;
Python imports ``sitecustomize`` at start-up in every process, torchrun's workers included."""

import os


def _install() -> None:
    slow = {n for n in os.environ.get("HOLMES_TEST_SLOW_NODES", "").split(",") if n}
    if not slow or "RANK" not in os.environ:  # torchrun's workers only, not the launcher
        return
    import json

    with open(os.environ["HOLMES_LAYOUT"]) as f:
        layout = json.load(f)
    node = layout["nodes"][int(os.environ["GROUP_RANK"])]
    if node not in slow:
        return
    import time

    import torch

    seconds = float(os.environ.get("HOLMES_TEST_SLOW_SECONDS", "0.05"))

    def slower(module, _inputs):
        if type(module).__name__ == "Block":
            time.sleep(seconds)

    torch.nn.modules.module.register_module_forward_pre_hook(slower)


_install()
