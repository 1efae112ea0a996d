"""What checkpointing every 10 iterations costs, asynchronous against synchronous, side by side.

    .venv/bin/python bench/checkpoint_overhead.py [--rounds 2] [--cores 0.5] [--smoke]

DP=2 over gloo, AdamW (so each rank saves its weights, its ZeRO-1 shard of fp32 master weights
and both moments). Three cases per round, interleaved so drift hits them alike: no checkpoint,
``training.checkpoint.asynchronous: true`` and ``false``, every 10 iterations. Each rank runs in
a CPU cgroup of its own with a fixed budget (bench/cpu_limit.py, ``--cores`` per rank): a rank
that waits (for its file writes, for the other rank) hands no CPU to anyone, and the background
writer of an asynchronous save takes its time from its own rank's budget, as the host CPU
of a GPU node does not from the GPU (so here it is charged more than on a GPU).

Measured on rank 0 from the end of iteration 10 to the end of iteration 30: 20 iterations and
the saves after iterations 10 and 20 (the one at the end, which waits for its write, is outside).
``overhead = window(case) / window(no checkpoint) - 1``, the median over rounds. The last line
is JSON: asyncOverhead, syncOverhead (fractions of iteration time), and what was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_limit  # noqa: E402
from trainer_common import SMOKE_HELP, layout, median, run_ranks, smoke_model, table, train_config  # noqa: E402

from holmes.contract import ModelSpec  # noqa: E402
from holmes.trainer.config import CheckpointConfig  # noqa: E402
from holmes.trainer.engine import Trainer  # noqa: E402

MODEL = ModelSpec(layers=4, hidden_size=256, attention_heads=4, seq_length=32, vocab_size=8192)
MB, M, D = 1, 2, 2
INTERVAL, FIRST, LAST = 10, 10, 30  # save every 10; the window: end of iteration 10 to end of 30
CASES = ("none", "async", "sync")


def worker(rank: int, model: ModelSpec, case: str, root: str, group_dir: str | None) -> dict:
    if group_dir:  # this rank (and every thread it starts) under its own budget from here on
        with open(os.path.join(group_dir, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    ckpt = CheckpointConfig()
    if case != "none":
        ckpt = CheckpointConfig(root, INTERVAL, asynchronous=case == "async")
    cfg = train_config(model, MB * M * D, MB, LAST, checkpoint=ckpt, bucket_elements=2_000_000)
    lay = layout(1, D, [model.layers], MB, M)
    t = Trainer(cfg, lay, rank=rank, device=torch.device("cpu"), backend="gloo")
    marks: dict[int, float] = {}

    def on_iteration(trainer: Trainer, record: dict) -> None:
        marks[trainer.iteration] = time.perf_counter()

    hist = t.train(on_iteration)
    staged = t.checkpointer.stager.staged_bytes if t.checkpointer is not None else 0
    return {
        "window": marks[LAST] - marks[FIRST],
        "iteration": median([h["iterationSeconds"] for h in hist]),
        "stagedBytes": staged,
        "loss": hist[-1]["loss"],
    }


def measure(model: ModelSpec, case: str, dirs: list[str | None]) -> dict:
    """One run of ``case``; rank 0's numbers (every rank meets the others each iteration)."""
    root = tempfile.mkdtemp(prefix="holmes-ckpt-bench-")
    try:
        return run_ranks(D, _worker_in_group, model, case, root, dirs)[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _worker_in_group(rank: int, model: ModelSpec, case: str, root: str, dirs: list) -> dict:
    return worker(rank, model, case, root, dirs[rank])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cores", type=float, default=0.5, help="CPU budget of each rank (cgroup quota)")
    ap.add_argument(
        "--no-cpu-limit", action="store_true", help="run unthrottled (the numbers then depend on load)"
    )
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    a = ap.parse_args()
    model = smoke_model(MODEL) if a.smoke else MODEL
    rounds = 1 if a.smoke else a.rounds
    limits = None
    names = [f"ckpt{os.getpid()}-rank{r}" for r in range(D)]  # this run's own: others may run
    if not a.no_cpu_limit:
        try:
            limits = cpu_limit.CpuLimits.create(dict.fromkeys(names, a.cores), sweep=False)
        except cpu_limit.CpuLimitError as e:
            sys.exit(f"checkpoint_overhead: {e}; or pass --no-cpu-limit")
    dirs = [limits.dir(n) if limits else None for n in names]
    try:
        windows: dict[str, list[float]] = {c: [] for c in CASES}
        staged = 0
        for _ in range(rounds):
            for case in CASES:
                res = measure(model, case, dirs)
                windows[case].append(res["window"])
                staged = max(staged, res["stagedBytes"])
    finally:
        if limits is not None:
            limits.remove()
    base = median(windows["none"])
    over = {c: median(windows[c]) / base - 1 for c in ("async", "sync")}
    per_iter = base / (LAST - FIRST)
    rows = [[c, median(windows[c]), median(windows[c]) / (LAST - FIRST), over.get(c, 0.0)] for c in CASES]
    budget = f"{a.cores:g} cores per rank (cgroup)" if limits else "no CPU limit"
    print(
        f"DP={D}, {model.layers} layers x h={model.hidden_size}, AdamW; checkpoint every {INTERVAL} "
        f"iterations; {budget}; median of {rounds} round(s)"
    )
    print(table(["case", "window s", "s/iteration", "overhead"], rows))
    print(
        json.dumps(
            {
                "asyncOverhead": round(over["async"], 4),
                "syncOverhead": round(over["sync"], 4),
                "iterationSeconds": round(per_iter, 4),
                "checkpointEvery": INTERVAL,
                "stagedBytesPerRank": staged,
                "coresPerRank": a.cores if limits else None,
                "rounds": rounds,
            }
        )
    )


if __name__ == "__main__":
    main()
