"""Pipeline schedules side by side on one layout: 1F1B against the interleaved and zero-bubble
schedules, tokens/s and parity with the single-process reference, and the planner's pick.

    sudo .venv/bin/python bench/pipeline_schedules.py [--rounds 3] [--cores 0.3] [--smoke]
    sudo .venv/bin/python bench/pipeline_schedules.py --message-costs   # seconds: messages only

The layout: three nodes of one GPU on three islands (east/InfiniBand, west/RoCE,
south/Ethernet), pipeline 3, planned by Holmes' planner with the cost model priced on this
machine (one "GPU" is one CPU process: a transformer block timed on one thread, times the
budget; fabric_emulation.planner_config). Each schedule is planned with
``training.pipelineSchedule`` fixed: the same placement and layers per stage (checked), its
chunks split by the planner. ``plannerPick`` is what ``auto`` chooses. M = P micro-batches: 1F1B
idles 40% of its iteration in fill and drain, too few for DualPipeV (shown with the planner's
reason, not run).

The planner is priced with what is measured here, before the runs: a block's FLOP rate, what a
p2p message costs between two budgeted ranks, a schedule action's fixed cost (1F1B at toy width
on the budgeted ranks: its time through the planner's price at negligible FLOPs), and a split
backward's cost over a full one (torch's input- and weight-gradient passes on one block).

Each rank runs in a CPU cgroup of its own with a fixed budget (bench/cpu_limit.py, ``--cores``
per rank), as a GPU is its own: a rank idling in the bubble hands no CPU to the others, so the
bubble costs here what it costs on a GPU. Ranks talk gloo over loopback, unshaped: the links
between the islands are fast here, so the p2p that interleaving adds costs little (the planner is
told so: it prices the links at --link-gbps).

Rounds interleave the schedules so drift hits them alike; tokens/s is the median of the measured
iterations (after --warmup) over rounds. Parity: each schedule's losses against the plain
single-process PyTorch loop of the tests (same seed, data, AdamW, clipping): the worst relative
difference. The last line is JSON: speedupOver1F1B (the best new schedule over 1F1B),
plannerPick, measuredBest, worstParityRelDiff, and what was measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [HERE, REPO, os.path.join(REPO, "hack")]
import cpu_limit  # noqa: E402
from fabric_emulation import planner_config  # noqa: E402
from trainer_common import SMOKE_HELP, median, run_ranks, smoke_model, table, train_config  # noqa: E402

from holmes.contract import Layout, ModelSpec  # noqa: E402
from holmes.contract.flops import ModelCost  # noqa: E402
from holmes.plan import PlanError, plan  # noqa: E402
from holmes.plan import pipeline_simulation as sim  # noqa: E402
from holmes.trainer.engine import Trainer  # noqa: E402
from holmes.trainer.model import build_stage  # noqa: E402
from tests.helpers.trainer.trainer_harness import reference  # noqa: E402

# wide enough that a split backward costs what a full one does (at h=256, seq 64 torch's separate
# input- and weight-gradient passes took up to 1.7x a full backward on one thread: CPU overhead)
# and that each schedule action's fixed cost (a few ms on a budgeted rank) is small beside its FLOPs
MODEL = ModelSpec(layers=12, hidden_size=768, attention_heads=4, seq_length=128, vocab_size=2048)
P, MB, M = 3, 1, 3  # M = P: 1F1B's bubble is (P-1)/(M+P-1) = 40%; DualPipeV needs M >= 2P
SCHEDULES = ("1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
ISLANDS = (("east", "infiniband"), ("west", "roce"), ("south", "ethernet"))


def nodes() -> list[dict]:
    """One node of one GPU per island (v1 Node objects, as kubectl prints them)."""
    out = []
    for i, (cluster, nic) in enumerate(ISLANDS):
        labels = {"holmes.dev/cluster": cluster, "holmes.dev/nic": nic}
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": f"{cluster}-{i}", "labels": labels},
                "spec": {},
                "status": {
                    "allocatable": {"cpu": "8", "nvidia.com/gpu": "1"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
    return out


def job(model: ModelSpec, iterations: int, schedule: str, micro_batches: int) -> dict:
    return {
        "model": {
            "layers": model.layers,
            "hiddenSize": model.hidden_size,
            "attentionHeads": model.attention_heads,
            "seqLength": model.seq_length,
            "vocabSize": model.vocab_size,
        },
        "training": {
            "globalBatchSize": MB * micro_batches,
            "microBatchSize": MB,
            "iterations": iterations,
            "learningRate": 1.0e-3,
            "activationRecompute": False,
            "pipelineSchedule": schedule,
        },
        "parallelism": {"pipeline": P, "data": 1, "tensor": 1},
        "nodes": {"count": P, "gpusPerNode": 1},
    }


def block_tflops(model: ModelSpec, cores: float) -> float:
    """One transformer block's forward+backward on one thread, as TFLOP/s, times the budget."""
    torch.set_num_threads(1)
    block = build_stage(model, 0, 1, False, False, seed=1)
    x = torch.randn(MB, model.seq_length, model.hidden_size, requires_grad=True)
    flops = 3 * MB * model.seq_length * ModelCost.of(model).layer_fwd_flops_per_token()
    block(x).sum().backward()  # warm-up
    t0 = time.perf_counter()
    n = 5
    for _ in range(n):
        block(x).sum().backward()
    return flops * n / (time.perf_counter() - t0) / 1e12 * cores


def split_backward_ratio(model: ModelSpec, n: int = 7) -> float:
    """A split backward (torch's input-gradient pass, then its weight pass, as the zero-bubble
    schedules run them) over one full backward, on one block, one thread: the fastest of ``n``
    of each, taken alternately (on a shared machine the fastest is the least disturbed)."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    torch.set_num_threads(1)
    block = build_stage(model, 0, 1, False, False, seed=1)
    x = torch.randn(MB, model.seq_length, model.hidden_size)

    def full() -> float:
        y = block(x.requires_grad_())
        t0 = time.perf_counter()
        y.sum().backward()
        return time.perf_counter() - t0

    def split() -> float:
        y = block(x.requires_grad_())
        t0 = time.perf_counter()
        _, groups = stage_backward_input([y.sum()], None, [x], block.parameters())
        stage_backward_weight(block.parameters(), groups)
        return time.perf_counter() - t0

    full(), split()  # warm-up
    pairs = [(split(), full()) for _ in range(n)]
    return min(p[0] for p in pairs) / min(p[1] for p in pairs)


def action_seconds(iteration: float, message: float, micro_batches: int) -> float:
    """The cost model's fixed cost per schedule action, from 1F1B's schedule time at toy width
    (its FLOPs negligible): the planner prices that run at M steps of 2 actions and the messages
    a middle stage waits for (2 per micro-batch), plus P-1 fill-and-drain steps of 2 actions."""
    return max(0.0, (iteration - 2 * micro_batches * message) / (2 * (micro_batches + P - 1)))


def _join(group_dir: str | None) -> None:
    """This process (and every thread it starts) under its group's budget from here on."""
    if group_dir:
        with open(os.path.join(group_dir, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


def ping(rank: int, dirs: list, n: int) -> float:
    """Seconds one small p2p message costs between two budgeted ranks (half a round trip, mean)."""
    return sum(pings(rank, dirs, n, 16)) / n


# ---- --message-costs: does a per-message cost explain the interleaved schedules' idle? -----------
# The full run measured 0.59-0.68 s of idle per rank under the three new schedules where torch's
# order with free messages leaves 0.14-0.55 s (docs/benchmarks.md#pipeline-schedules). This mode
# measures what a message costs between two budgeted ranks, small and at one activation, and
# replays torch's orders with it (holmes.plan.pipeline_simulation): each message holds its
# direction for the small message's time plus its bytes at the measured bandwidth, as if the
# whole half round trip were a per-message overhead (the upper bound: latency would overlap),
# and is sent once its receiver asked (gloo's rendezvous; the notice costs a message too).
SIMULATED = (("1F1B", 1), ("Interleaved1F1B", 4), ("InterleavedZeroBubble", 4), ("ZBVZeroBubble", 2))


def pings(rank: int, dirs: list, n: int, elements: int) -> list[float]:
    """Each of ``n`` round trips of a message of ``elements`` floats between two budgeted ranks,
    halved (after 2 not timed): a CPU quota's pauses land on some, so callers take the median."""
    import torch.distributed as dist

    _join(dirs[rank])
    t, out = torch.zeros(elements), []
    for i in range(n + 2):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        else:
            dist.recv(t, 0)
            dist.send(t, 0)
        if i >= 2:
            out.append((time.perf_counter() - t0) / 2)
    return out


def message_link(small_s: float, large_s: float, large_bytes: float) -> sim.Link:
    """A direction between two ranks from two measured messages: the small one's time as a
    per-message overhead, the difference as bandwidth (unbounded when the large one cost no more)."""
    extra = large_s - small_s
    return sim.Link(bytes_per_s=large_bytes / extra if extra > 0 else math.inf, overhead_s=small_s)


def simulated_idle(
    name: str,
    virtual: int,
    micro_batches: int,
    compute_s: float,
    action_s: float,
    link: sim.Link,
    nbytes: float,
) -> float:
    """Seconds per iteration a rank spends outside its compute under torch's order for this
    schedule at P, v, M: each micro-batch's forward+backward on a rank is compute_s / M, split
    over its v chunks by UNIT_SHARES, each action costing ``action_s`` more (the engine's step,
    which the trainer counts outside compute, as it does the waits) and each message on ``link``."""
    from gen_bubble_table import torch_orders

    t = compute_s / micro_batches
    orders = (
        sim.one_f_one_b(P, micro_batches) if name == "1F1B" else torch_orders(name, P, virtual, micro_batches)
    )
    durations = {op: share * t / virtual + action_s for op, share in sim.UNIT_SHARES.items()}
    messages = sim.Messages(nbytes, lambda _s, _d: link, rendezvous=True)  # torch's p2p over gloo
    return sim.makespan(orders, durations, messages) - compute_s


def rank_budgets(a: argparse.Namespace, names: list[str]) -> tuple[cpu_limit.CpuLimits | None, list]:
    """A CPU cgroup of a.cores per rank name (none with --no-cpu-limit), and each rank's directory."""
    if a.no_cpu_limit:
        return None, [None] * len(names)
    try:
        limits = cpu_limit.CpuLimits.create(dict.fromkeys(names, a.cores), sweep=False, priority=True)
    except cpu_limit.CpuLimitError as e:
        sys.exit(f"pipeline_schedules: {e}; or pass --no-cpu-limit")
    return limits, [limits.dir(n) for n in names]


def message_costs(a: argparse.Namespace, model: ModelSpec) -> int:
    """--message-costs: measure, simulate, print (no training run)."""
    activation = MB * model.seq_length * model.hidden_size  # floats: one micro-batch at a boundary
    limits, dirs = rank_budgets(a, [f"pp{os.getpid()}-msg{r}" for r in range(2)])
    try:
        small = median(run_ranks(2, pings, dirs, 200, 16)[0])
        large = median(run_ranks(2, pings, dirs, 60, activation)[0])
    finally:
        if limits is not None:
            limits.remove()
    nbytes = activation * 4
    link = message_link(small, large, nbytes)
    m = a.micro_batches
    rows, idle = [], {}
    for name, v in SIMULATED:
        free = simulated_idle(name, v, m, a.compute_s, 0.0, sim.FREE, nbytes)
        priced = simulated_idle(name, v, m, a.compute_s, a.action_s, link, nbytes)
        idle[name] = round(priced, 3)
        rows.append([name, v, free, priced])
    print(
        f"per message between two ranks at {a.cores:g} core{'' if limits else ' (no CPU limit)'}: "
        f"{small * 1e3:.3g} ms (64 B), {large * 1e3:.3g} ms ({nbytes / 1e3:.0f} kB: "
        f"{link.bytes_per_s * 8 / 1e9:.3g} Gbit/s beyond the small one); compute {a.compute_s:g} s per "
        f"rank per iteration, {a.action_s * 1e3:g} ms per action; P={P}, M={m}"
    )
    print(table(["schedule", "v", "idle s, free messages", "idle s, measured messages + actions"], rows))
    print(
        json.dumps(
            {
                "messageSeconds": float(f"{small:.3g}"),
                "activationMessageSeconds": float(f"{large:.3g}"),
                "activationBytes": nbytes,
                "simulatedIdleSeconds": idle,
                "coresPerRank": a.cores if limits else None,
            }
        )
    )
    return 0


def worker(rank: int, cfg, layout: Layout, dirs: list, warmup: int) -> dict:
    _join(dirs[rank])
    trainer = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    hist = trainer.train()
    steady = hist[warmup:]
    return {
        "losses": [h["loss"] for h in hist],
        "seconds": median([h["iterationSeconds"] for h in steady]),
        "bubble": median([h["time"]["bubble"] for h in steady]),
        "compute": median([h["time"]["compute"] for h in steady]),
        "schedule": median([h["time"]["compute"] + h["time"]["bubble"] for h in steady]),
    }


def pick_line(layout: Layout) -> str:
    return next(line for line in layout.explanation if line.startswith("schedule:"))


def rel_diff(got: list[float], want: list[float]) -> float:
    return max(abs(g - w) / abs(w) for g, w in zip(got, want))


def planned_bubble(layout: Layout) -> float:
    """The planner's bubble for this layout: the schedule's (virtual stages), else 1F1B's per
    stage, the median over the stages as the measured column takes over the ranks."""
    if "bubbleSeconds" in layout.estimate:
        return layout.estimate["bubbleSeconds"]
    return median([st["bubbleSeconds"] for st in layout.estimate["stages"]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=4, help="per run, --warmup of them not measured")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--cores", type=float, default=0.3, help="CPU budget of each rank (cgroup quota)")
    ap.add_argument("--link-gbps", type=float, default=8.0, help="what the planner assumes of the links")
    ap.add_argument("--no-cpu-limit", action="store_true", help="run unthrottled (then the bubble is free)")
    ap.add_argument("--micro-batches", type=int, default=M, help="per iteration (DualPipeV needs >= 2P)")
    ap.add_argument("--hidden", type=int, default=MODEL.hidden_size)
    ap.add_argument("--seq", type=int, default=MODEL.seq_length)
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    ap.add_argument(
        "--message-costs",
        action="store_true",
        help="only measure a p2p message between two budgeted ranks (small and one activation) and "
        "simulate each schedule's idle with it (no training run)",
    )
    ap.add_argument(
        "--compute-s",
        type=float,
        default=2.55,
        help="--message-costs: a rank's compute per iteration (1F1B's, as the full run measured it)",
    )
    ap.add_argument(
        "--action-s",
        type=float,
        default=0.0034,
        help="--message-costs: a schedule action's fixed cost (pipelineActionSeconds of the full run)",
    )
    a = ap.parse_args(argv)
    model = replace(MODEL, hidden_size=a.hidden, seq_length=a.seq)
    model = smoke_model(model) if a.smoke else model
    if a.message_costs:
        return message_costs(a, model)
    rounds, iterations, warmup = (1, 3, 1) if a.smoke else (a.rounds, a.iterations, a.warmup)
    m = a.micro_batches
    cfg = train_config(model, MB * m, MB, iterations, bucket_elements=2_000_000)
    ref_losses, _, _ = reference(cfg)
    tflops = block_tflops(model, a.cores)
    split_ratio = split_backward_ratio(model)

    limits, dirs = rank_budgets(a, [f"pp{os.getpid()}-rank{r}" for r in range(P)])  # this run's own
    try:
        # the cost model priced on this machine: compute per budget, links, and what a step
        # loses per p2p message it waits for (measured between two budgeted ranks)
        message = median(list(run_ranks(2, ping, dirs, 40).values()))
        # and per schedule action: 1F1B at toy width on the same budgeted ranks (the engine's
        # own steps, hooks and waits, next to no FLOPs)
        toy = smoke_model(replace(model, hidden_size=16, seq_length=16))
        toy_cfg = train_config(toy, MB * m, MB, 6, bucket_elements=2_000_000)
        toy_layout = plan(nodes(), job(toy, 6, "1F1B", m), planner_config(tflops, a.link_gbps, a.link_gbps))
        toy_run = run_ranks(P, worker, toy_cfg, toy_layout, dirs, 1)
        action = action_seconds(max(o["schedule"] for o in toy_run.values()), message, m)
        config = replace(
            planner_config(tflops, a.link_gbps, a.link_gbps),
            p2p_message_seconds=message,
            pipeline_action_seconds=action,
            split_backward_ratio=split_ratio,
        )
        layouts, refused = {}, {}
        for s in SCHEDULES:  # one the planner refuses here is shown with its reason, not run
            try:
                layouts[s] = plan(nodes(), job(model, iterations, s, m), config)
            except PlanError as e:
                refused[s] = str(e).split(": ", 2)[-1]
        pick = plan(nodes(), job(model, iterations, "auto", m), config)
    except BaseException:
        if limits is not None:
            limits.remove()
        raise
    base = layouts["1F1B"]
    for s, lay in layouts.items():  # one placement, one split per stage: only the schedule differs
        same_split = [x.num_layers for x in lay.stages] == [x.num_layers for x in base.stages]
        assert lay.nodes == base.nodes and same_split, s
    runs = [s for s in SCHEDULES if s in layouts]
    seconds: dict[str, list[float]] = {s: [] for s in runs}
    bubble: dict[str, list[float]] = {s: [] for s in runs}
    compute: dict[str, list[float]] = {s: [] for s in runs}
    parity: dict[str, float] = {}
    try:
        for _ in range(rounds):
            for s in runs:
                out = run_ranks(P, worker, cfg, layouts[s], dirs, warmup)
                seconds[s].append(max(o["seconds"] for o in out.values()))
                bubble[s].append(median([o["bubble"] for o in out.values()]))
                compute[s].append(max(o["compute"] for o in out.values()))
                diff = rel_diff(out[0]["losses"], ref_losses)  # any rank's: the loss is all-reduced
                parity[s] = max(parity.get(s, 0.0), diff)
    finally:
        if limits is not None:
            limits.remove()
    tokens = MB * m * model.seq_length
    tps = {s: tokens / median(seconds[s]) for s in runs}
    best_new = max(runs[1:], key=lambda s: tps[s])
    measured_best = max(runs, key=lambda s: tps[s])
    rows = [
        [
            s,
            layouts[s].virtual_stages,
            tps[s],
            median(seconds[s]),
            median(compute[s]),
            median(bubble[s]),
            tps[s] / tps["1F1B"],
            layouts[s].estimate["iterationSeconds"],
            planned_bubble(layouts[s]),
            parity[s],
        ]
        for s in runs
    ]
    budget = f"{a.cores:g} core per rank (cgroup quota: a rank idling in the bubble lends no CPU)"
    print(
        f"pipeline {P} over 3 islands (gloo on loopback, unshaped), {model.layers} layers x "
        f"h={model.hidden_size}, M={m}, layers per stage {[x.num_layers for x in base.stages]}; "
        f"{budget if limits else 'no CPU limit'}; median of {rounds} round(s)"
    )
    print(
        table(
            [
                "schedule",
                "v",
                "tokens/s",
                "s/iteration",
                "compute s",
                "bubble s",
                "x 1F1B",
                "planned s",
                "planned bubble s",
                "parity rel diff",
            ],
            rows,
        )
    )
    for s, why in refused.items():
        print(f"{s}: not run, the planner refuses it here: {why}")
    print(
        f"planner (measured: {message * 1e3:.2g} ms per p2p message, {action * 1e3:.2g} ms per schedule "
        f"action, split backward {split_ratio:.2f}x a full one): {pick_line(pick)}"
    )
    print(
        json.dumps(
            {
                "speedupOver1F1B": round(tps[best_new] / tps["1F1B"], 4),
                "bestNewSchedule": best_new,
                "plannerPick": pick.schedule,
                "measuredBest": measured_best,
                "worstParityRelDiff": float(f"{max(parity.values()):.3g}"),
                "tokensPerSecond": {s: round(tps[s], 2) for s in runs},
                "bubbleSeconds": {s: round(median(bubble[s]), 3) for s in runs},
                "notRunnable": refused,
                "pipeline": P,
                "microBatches": m,
                "islands": len(ISLANDS),
                "coresPerRank": a.cores if limits else None,
                "p2pMessageSeconds": float(f"{message:.3g}"),
                "pipelineActionSeconds": float(f"{action:.3g}"),
                "splitBackwardRatio": round(split_ratio, 3),
                "rounds": rounds,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
