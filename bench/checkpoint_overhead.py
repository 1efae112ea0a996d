"""What checkpointing every 10 iterations costs, asynchronous against synchronous, side by side.

    .venv/bin/python bench/checkpoint_overhead.py [--rounds 5] [--cores 0.5] [--smoke]

DP=2 over gloo, AdamW (so each rank saves its share of the weights, its ZeRO-1 shard of fp32
master weights and both moments). Four cases per round, interleaved so drift hits them alike: no
checkpoint, ``training.checkpoint.asynchronous: true`` (the writer: a checkpoint process of each
rank's own, async_checkpoint.py), the same with DCP's writer thread in the training process (as
before issue 54), and ``asynchronous: false``, every 10 iterations. Each rank runs in a CPU
cgroup of its own with a fixed budget (bench/cpu_limit.py, ``--cores`` per rank): a rank that
waits (for its file writes, for the other rank) hands no CPU to anyone. A writer thread takes
its time from its own rank's budget (and its GIL); the checkpoint process runs in a cgroup of
its own with the same budget, as on a GPU node, whose host has cores the training process does
not use, and the CPU it spends over the window is measured and printed (``writerCpuSeconds``,
/proc), not hidden. The ranks' groups take the CPU first (the highest weight, up to their
budget: a quota alone guarantees nothing on a shared machine, whose other load then decided
single rounds); the writers' groups compete at the default weight, as background work does (the
checkpoint process runs niced in a pod).

The checkpoint process starts once per run (a fresh interpreter, torch, a gloo group over the
ranks): a job overlaps that with its first iterations; here each rank waits for it before
iteration 1, and its median is printed apart (``processStartSeconds``), so the window is the
steady state.

Measured on rank 0 from the end of iteration 10 to the end of iteration 30: 20 iterations and
the saves after iterations 10 and 20 (the one at the end, which waits for its write, is outside).
Per round ``overhead = window(case) / window(no checkpoint, same round) - 1``; the table gives
each case's median round and the spread (lowest, highest), and the verdict (asynchronous at most
5% of iteration time and below synchronous) is on the median. Each round is printed as it ends,
every run with the machine's load average at its start. The last line is JSON.
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
from holmes.trainer.async_checkpoint import AsyncCheckpointer  # noqa: E402
from holmes.trainer.config import CheckpointConfig  # noqa: E402
from holmes.trainer.engine import Trainer  # noqa: E402

MODEL = ModelSpec(layers=4, hidden_size=256, attention_heads=4, seq_length=32, vocab_size=8192)
MB, M, D = 1, 2, 2
INTERVAL, FIRST, LAST = 10, 10, 30  # save every 10; the window: end of iteration 10 to end of 30
CASES = ("none", "async", "async-thread", "sync")
TARGET = 0.05  # asynchronous: at most this share of iteration time (issue 54)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker(
    rank: int, model: ModelSpec, case: str, root: str, group_dir: str | None, writer_dir: str | None = None
) -> dict:
    if group_dir:  # this rank (and every thread it starts) under its own budget from here on
        with open(os.path.join(group_dir, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    ckpt = CheckpointConfig()
    if case != "none":
        ckpt = CheckpointConfig(root, INTERVAL, asynchronous=case.startswith("async"))
    cfg = train_config(model, MB * M * D, MB, LAST, checkpoint=ckpt, bucket_elements=2_000_000)
    lay = layout(1, D, [model.layers], MB, M)
    t = Trainer(cfg, lay, rank=rank, device=torch.device("cpu"), backend="gloo")
    if case == "async-thread":  # DCP's writer thread in this process instead of a process
        assert t.checkpointer is not None
        t.checkpointer.close()
        t.checkpointer = AsyncCheckpointer(t.checkpoint_group, rank, on_commit=t._committed, writer="thread")
    start, writer_pid = None, None
    if t.checkpointer is not None:  # the process writer's one-time start, timed apart
        t.checkpointer.ready()
        start = t.checkpointer.start_seconds
    if case == "async":
        from torch.distributed.checkpoint import _async_process_executor as executor

        assert executor._CHECKPOINT_PROCESS is not None
        writer_pid = executor._CHECKPOINT_PROCESS._save_process.pid
        if writer_dir:  # the writer on a budget of its own, as on a GPU node's spare host cores
            with open(os.path.join(writer_dir, "cgroup.procs"), "w") as f:
                f.write(str(writer_pid))
    marks: dict[int, float] = {}
    writer_cpu: dict[int, float] = {}

    def on_iteration(trainer: Trainer, record: dict) -> None:
        marks[trainer.iteration] = time.perf_counter()
        if writer_pid is not None and trainer.iteration in (FIRST, LAST):
            writer_cpu[trainer.iteration] = cpu_seconds(writer_pid)

    hist = t.train(on_iteration)
    staged = t.checkpointer.stager.staged_bytes if t.checkpointer is not None else 0
    return {
        "window": marks[LAST] - marks[FIRST],
        # what the checkpoint process spent in the window (outside the rank's budget)
        "writerCpuSeconds": writer_cpu[LAST] - writer_cpu[FIRST] if writer_cpu else None,
        "iteration": median([h["iterationSeconds"] for h in hist]),
        "stagedBytes": staged,
        "startSeconds": start,
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
    return worker(rank, model, case, root, dirs[rank], dirs[D + rank])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cores", type=float, default=0.5, help="CPU budget of each rank (cgroup quota)")
    ap.add_argument(
        "--no-cpu-limit", action="store_true", help="run unthrottled (the numbers then depend on load)"
    )
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    a = ap.parse_args()
    model = smoke_model(MODEL) if a.smoke else MODEL
    rounds = 1 if a.smoke else a.rounds
    ranks = [f"ckpt{os.getpid()}-rank{r}" for r in range(D)]  # this run's own: others may run
    writers = [f"ckpt{os.getpid()}-writer{r}" for r in range(D)]  # each rank's checkpoint process
    groups: list[cpu_limit.CpuLimits] = []
    if not a.no_cpu_limit:
        try:
            # the ranks take the CPU first, up to their budget (a quota alone guarantees nothing
            # on a shared machine); the writers compete at the default weight, as background work
            groups.append(
                cpu_limit.CpuLimits.create(dict.fromkeys(ranks, a.cores), sweep=False, priority=True)
            )
            groups.append(cpu_limit.CpuLimits.create(dict.fromkeys(writers, a.cores), sweep=False))
        except cpu_limit.CpuLimitError as e:
            for g in groups:
                g.remove()
            sys.exit(f"checkpoint_overhead: {e}; or pass --no-cpu-limit")
    dirs = (
        [groups[0].dir(n) for n in ranks] + [groups[1].dir(n) for n in writers] if groups else [None] * 2 * D
    )
    try:
        windows: dict[str, list[float]] = {c: [] for c in CASES}
        loads: dict[str, list[float]] = {c: [] for c in CASES}  # 1-minute load average at each start
        staged, starts, writer_cpu = 0, [], []
        for r in range(rounds):
            for case in CASES:
                loads[case].append(os.getloadavg()[0])
                res = measure(model, case, dirs)
                windows[case].append(res["window"])
                staged = max(staged, res["stagedBytes"])
                if case == "async" and res["startSeconds"] is not None:
                    starts.append(res["startSeconds"])
                if res.get("writerCpuSeconds") is not None:
                    writer_cpu.append(res["writerCpuSeconds"])
            print(
                f"round {r + 1}: "
                + ", ".join(
                    f"{c} {windows[c][-1]:.2f} s (load {loads[c][-1]:.1f})"
                    + ("" if c == "none" else f" {windows[c][-1] / windows['none'][-1] - 1:+.1%}")
                    for c in CASES
                ),
                flush=True,
            )
    finally:
        for g in groups:
            g.remove()
    summary = summarize(windows)
    per_iter = median(windows["none"]) / (LAST - FIRST)
    rows = [
        [c, median(windows[c]), median(windows[c]) / (LAST - FIRST), *summary.get(c, (0.0, 0.0, 0.0))]
        for c in CASES
    ]
    budget = (
        f"{a.cores:g} cores per rank and per writer (cgroups, the ranks first)" if groups else "no CPU limit"
    )
    print(
        f"DP={D}, {model.layers} layers x h={model.hidden_size}, AdamW; checkpoint every {INTERVAL} "
        f"iterations; {budget}; {rounds} round(s), overhead per round against that round's no-checkpoint run"
    )
    print(table(["case", "median window s", "s/iteration", "overhead median", "lowest", "highest"], rows))
    a_med, s_med, t_med = summary["async"][0], summary["sync"][0], summary["async-thread"][0]
    met = a_med <= TARGET and a_med < s_med
    print(
        f"verdict (median round): asynchronous {a_med:+.1%} of iteration time, synchronous {s_med:+.1%}, "
        f"writer thread {t_med:+.1%}: target (asynchronous <= {TARGET:.0%} and below synchronous) "
        + ("met" if met else "missed")
    )
    print(
        json.dumps(
            {
                "asyncOverhead": round(a_med, 4),
                "asyncSpread": [round(x, 4) for x in summary["async"][1:]],
                "threadOverhead": round(t_med, 4),
                "threadSpread": [round(x, 4) for x in summary["async-thread"][1:]],
                "syncOverhead": round(s_med, 4),
                "syncSpread": [round(x, 4) for x in summary["sync"][1:]],
                "targetMet": met,
                "iterationSeconds": round(per_iter, 4),
                "checkpointEvery": INTERVAL,
                "stagedBytesPerRank": staged,
                # once per run, before iteration 1 here (a job overlaps it with its first iterations)
                "processStartSeconds": round(median(starts), 3) if starts else None,
                # the checkpoint process's CPU over the window's two saves (rank 0), median round
                "writerCpuSeconds": round(median(writer_cpu), 3) if writer_cpu else None,
                "coresPerRank": a.cores if groups else None,
                "rounds": rounds,
                # per round, against that round's no-checkpoint run; and each run's load average
                "perRound": {
                    c: [round(w / b - 1, 4) for w, b in zip(windows[c], windows["none"])] for c in CASES[1:]
                },
                "windows": {c: [round(w, 3) for w in windows[c]] for c in CASES},
                "loadAverages": {c: [round(x, 2) for x in loads[c]] for c in CASES},
            }
        )
    )


def summarize(windows: dict[str, list[float]]) -> dict[str, tuple[float, float, float]]:
    """Per checkpointing case: the median, lowest and highest of its rounds' overheads, each
    against the no-checkpoint run of the same round."""
    out = {}
    for c in CASES[1:]:
        over = [w / base - 1 for w, base in zip(windows[c], windows["none"])]
        out[c] = (median(over), min(over), max(over))
    return out


if __name__ == "__main__":
    main()
