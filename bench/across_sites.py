"""Across sites: the cross-island pipeline against replicas that meet over the link (DiLoCo), on
the emulated fabric, to a target loss.

    sudo .venv/bin/python bench/across_sites.py            # the table in docs/benchmarks.md
    sudo .venv/bin/python bench/across_sites.py --smoke    # the code path (make test); numbers mean little

Fabric: bench/fabric_netns.py with one node per island; the trunk between them is the link:
--slow-mbit (a WAN per node) and --fast-mbit (a fast link between halls). This kernel has no
sch_netem, so the link adds no delay beyond its queueing: the planner is told the latency the
fabric has (--latency-ms, default 0), and a WAN's tens of milliseconds stay unmeasured here.
Compute: each rank runs in a CPU cgroup of its own at --cores cores (bench/cpu_limit.py), so a
waiting rank cannot lend its CPU to the other: the comparison GPUs would see. One trainer process
per node, gloo, the real trainer (python -m holmes.trainer under torchrun).

Model and data: a small GPT on a synthetic corpus with learnable structure (each token follows
from the two before it by a fixed rule, with --noise of them random), written once as a token
file. Same job either way, same total batch per iteration:
  pipeline      one world, stage 0 on island A and stage 1 on B, --batch sequences per iteration
  replicas H=h  one world per island (the whole model), --batch / 2 sequences each, an outer
                step every h inner steps (outer lr --outer-lr, Nesterov momentum --outer-momentum)
"time to loss" is the sum of the iterations' seconds until the loss (mean over replicas, a
running mean over --smooth iterations) first reaches --target-loss; start-ups are left out.

The planner's pick (holmes.plan.across) prices both modes from the compute rate measured here
(the trainer's block timed on one thread, times --cores), the link's bandwidth and latency and
the model's bytes, with the replicas' convergence (tokens to the target relative to the
pipeline) taken from these runs: tokens to a loss do not depend on the link, only time does.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "hack")]
import cpu_limit  # noqa: E402
import fabric_emulation as fe  # noqa: E402
import fabric_netns as fab  # noqa: E402
from holmes_dev.jobs import holmes_job  # noqa: E402

from holmes.contract import ModelCost  # noqa: E402
from holmes.contract.layout import GroupFamily, Layout, Stage  # noqa: E402
from holmes.plan import across  # noqa: E402

MASTER_PORT = 29500
OUTER_PORT = 29600
NODE_MBIT = 10000  # each node's own NIC: not the bottleneck


# ---- pure: corpus, job, layouts, curves ------------------------------------------------------------


def corpus(n: int, vocab: int, noise: float, seed: int = 3) -> Any:
    """Tokens where each token follows from the one before by a fixed random table (one of two
    successors, at random), except a ``noise`` share drawn uniformly: learnable, with a floor of
    about ``(1 - noise) ln 2 + noise ln vocab`` plus the noise's own entropy."""
    import numpy as np

    rng = np.random.default_rng(seed)
    table = rng.integers(0, vocab, (vocab, 2))
    out = np.empty(n, dtype=np.uint16)
    out[0] = rng.integers(0, vocab)
    pick = rng.integers(0, 2, n)
    rand = rng.integers(0, vocab, n)
    flip = rng.random(n) < noise
    for t in range(1, n):
        out[t] = rand[t] if flip[t] else table[out[t - 1], pick[t]]
    return out


def job_manifest(a: argparse.Namespace, data: str, mode: str, inner_steps: int, batch: int) -> dict:
    training: dict[str, Any] = {
        "globalBatchSize": batch,
        "microBatchSize": a.micro_batch,
        "iterations": a.iterations,
        "learningRate": a.lr,
        "warmupIterations": max(1, a.iterations // 20),
        "minLearningRate": a.lr / 10,
        "seed": 7,
        "gradClip": 1.0,
        "activationRecompute": False,
        "data": {"path": data},
    }
    if mode == "replicas":
        training["acrossIslands"] = {
            "mode": "replicas",
            "innerSteps": inner_steps,
            "outerLearningRate": a.outer_lr,
            "outerMomentum": a.outer_momentum,
        }
    return holmes_job(
        "across",
        {
            "model": {
                "layers": a.layers,
                "hiddenSize": a.hidden,
                "attentionHeads": a.heads,
                "seqLength": a.seq,
                "vocabSize": a.vocab,
            },
            "training": training,
            "nodes": {"count": 2, "gpusPerNode": 1},
        },
    )


def layout(nodes: tuple[str, ...], layers: int, micro_batch: int, micro_batches: int) -> Layout:
    """One stage per node (pipeline across the link when two nodes, the whole model when one)."""
    P = len(nodes)
    cut = [layers * i // P for i in range(P + 1)]
    stages = tuple(Stage(i, (cut[i], cut[i + 1]), f"isl{i}/ethernet", "ethernet", "Socket") for i in range(P))
    groups = tuple(GroupFamily("dp", "Socket", s) for s in range(P)) + (GroupFamily("pp", "Socket"),)
    groups += tuple(GroupFamily("p2p", "Socket", b) for b in range(P - 1))
    return Layout(
        tensor=1,
        pipeline=P,
        data=1,
        gpus_per_node=1,
        nodes=nodes,
        stages=stages,
        groups=groups,
        micro_batch_size=micro_batch,
        micro_batches=micro_batches,
    )


def smoothed(losses: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(losses)):
        part = losses[max(0, i - window + 1) : i + 1]
        out.append(sum(part) / len(part))
    return out


def to_target(curves: list[list[dict]], target: float, window: int) -> tuple[int, float] | None:
    """(iterations, seconds) until the loss, averaged over ``curves`` (one per replica, rank 0's
    iteration lines) and smoothed, first reaches ``target``; seconds: the slowest replica's."""
    n = min(len(c) for c in curves)
    losses = smoothed([sum(c[i]["loss"] for c in curves) / len(curves) for i in range(n)], window)
    for i, loss in enumerate(losses):
        if loss <= target:
            return i + 1, max(sum(r["iterationSeconds"] for r in c[: i + 1]) for c in curves)
    return None


@dataclass
class Run:
    link: str  # "slow" | "fast"
    mode: str  # "pipeline" | "replicas"
    inner_steps: int = 0
    curves: list[list[dict]] = field(default_factory=list)
    error: str | None = None

    @property
    def name(self) -> str:
        return "pipeline" if self.mode == "pipeline" else f"replicas H={self.inner_steps}"


# ---- I/O: running a case ---------------------------------------------------------------------------


def launch(a, spec, run: Run, workdir: str, data: str, limits) -> None:
    """Start the case's trainers in their namespaces and CPU groups; wait; read rank 0's lines."""
    d = os.path.join(workdir, f"{run.link}-{run.name.replace(' ', '').replace('=', '')}")
    os.makedirs(d)
    a_node, b_node = (next(n for n in spec.nodes if n.island == i) for i in "ab")
    gangs: list[tuple[str, str, Layout, dict[str, str], str]] = []  # node, group, layout, env, metrics
    if run.mode == "pipeline":
        lay = layout((a_node.name, b_node.name), a.layers, a.micro_batch, a.batch // a.micro_batch)
        job = job_manifest(a, data, "pipeline", 0, a.batch)
        for node in (a_node, b_node):
            gangs.append((node.name, node.island, lay, {}, os.path.join(d, "metrics.jsonl")))
        worlds = [(lay, job, [a_node, b_node])]
    else:
        half = a.batch // 2
        job = job_manifest(a, data, "replicas", run.inner_steps, half)
        worlds = []
        for r, node in enumerate((a_node, b_node)):
            lay = layout((node.name,), a.layers, a.micro_batch, half // a.micro_batch)
            env = {
                "HOLMES_REPLICA": str(r),
                "HOLMES_REPLICAS": "2",
                "HOLMES_OUTER_ADDR": f"{a_node.addr}:{OUTER_PORT}",
            }
            gangs.append((node.name, node.island, lay, env, os.path.join(d, f"metrics-{r}.jsonl")))
            worlds.append((lay, job, [node]))
    job_file = os.path.join(d, "job.yaml")
    with open(job_file, "w") as f:
        yaml.safe_dump(worlds[0][1], f)
    procs, logs = [], []
    try:
        for i, (name, island, lay, env, metrics) in enumerate(gangs):
            lay_file = os.path.join(d, f"layout-{i}.json")
            with open(lay_file, "w") as f:
                f.write(lay.to_json())
            node_rank = lay.nodes.index(name)
            cmd = [
                "ip", "netns", "exec", spec.node(name).netns, sys.executable, "-m", "torch.distributed.run",
                f"--nnodes={len(lay.nodes)}", "--nproc-per-node=1", f"--node-rank={node_rank}",
                "--rdzv-backend=static", f"--master-addr={lay.nodes[0]}", f"--master-port={MASTER_PORT}",
                "--max-restarts=0", "-m", "holmes.trainer", "--job", job_file, "--layout", lay_file,
                *(["--metrics-file", metrics] if node_rank == 0 else []),
            ]  # fmt: skip
            log = open(os.path.join(d, f"{name}.log"), "w")
            logs.append(log)
            environ = fe.trainer_env(a.timeout, 40_000_000, d, env)
            p = subprocess.Popen(
                limits.wrap(island, cmd),
                env=environ,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            procs.append(p)
            fe.LIVE.append(p)
        deadline = time.time() + a.timeout
        while any(p.poll() is None for p in procs):
            if time.time() > deadline:
                run.error = f"timed out after {a.timeout} s (logs in {d})"
                break
            if any(p.returncode for p in procs if p.poll() is not None):
                time.sleep(2)
                break
            time.sleep(0.3)
    finally:
        fe.kill_tree(procs)
        for p in procs:
            fe.LIVE.remove(p)
        for log in logs:
            log.close()
    bad = [(g[0], p.returncode) for g, p in zip(gangs, procs) if p.returncode]
    if bad and not run.error:
        tail = open(os.path.join(d, f"{bad[0][0]}.log")).read()[-1500:]
        run.error = f"exit codes {bad} (logs in {d}):\n{tail}"
    if run.error:
        return
    for metrics in dict.fromkeys(g[4] for g in gangs):  # rank 0 of each world writes one
        with open(metrics) as f:
            run.curves.append(
                [x for x in map(json.loads, filter(str.strip, f)) if x.get("holmes") == "iteration"]
            )


# ---- the planner's view ----------------------------------------------------------------------------


def planner_inputs(a: argparse.Namespace, gflops: float) -> across.AcrossWork:
    """The job in the planner's terms: a replica's iteration from the model's FLOPs at the
    measured rate, the activations at the cut, the weights each replica exchanges."""
    from holmes.contract import ModelSpec

    m = ModelSpec(
        layers=a.layers, hidden_size=a.hidden, attention_heads=a.heads, seq_length=a.seq, vocab_size=a.vocab
    )
    cost = ModelCost.of(m)
    flops = cost.flops_per_iteration(a.batch // 2, recompute=False)
    return across.AcrossWork(
        compute_s=flops / (gflops * 1e9),
        micro_batches=a.batch // a.micro_batch,
        activation_bytes=a.micro_batch * a.seq * a.hidden * 4,
        model_bytes=cost.total_params * 4,
        tokens_per_iteration=a.batch * a.seq,
    )


# ---- main --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a short run of every case (make test)")
    ap.add_argument("--slow-mbit", type=float, default=20)
    ap.add_argument("--fast-mbit", type=float, default=5000)
    ap.add_argument(
        "--latency-ms", type=float, default=0.0, help="the link's one-way delay the planner assumes"
    )
    ap.add_argument("--cores", type=float, default=0.5, help="CPU budget of each rank (cgroup quota)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16, help="sequences per iteration, both modes")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--target-loss", type=float, default=2.0)
    ap.add_argument("--smooth", type=int, default=5)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--inner-steps", type=int, nargs=2, default=[5, 20])
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--timeout", type=float, default=1800)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.smoke:
        a.layers, a.hidden, a.seq, a.iterations, a.target_loss = 2, 64, 32, 32, 4.3
        a.inner_steps, a.timeout = [4], 300  # one H: each run starts a torch world per rank
    problems = fab.missing_prerequisites()
    if problems:
        print("cannot emulate the fabric here:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    spec = fab.two_islands(per_island=1, fast_mbit=NODE_MBIT, cross_mbit=a.slow_mbit)
    workdir = tempfile.mkdtemp(prefix="holmes-across-")
    data = os.path.join(workdir, "corpus.bin")
    corpus(max(200_000, a.iterations * a.batch * (a.seq + 1) * 2), a.vocab, a.noise).tofile(data)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    runs = [
        Run(link, mode, h)
        for link in ("slow", "fast")
        for mode, h in [("pipeline", 0)] + [("replicas", h) for h in a.inner_steps]
    ]
    gflops = (
        fe.block_gflops(
            argparse.Namespace(
                hidden=a.hidden, heads=a.heads, seq=a.seq, vocab=a.vocab, micro_batch=a.micro_batch
            )
        )
        * a.cores
    )
    limits = None
    with fab.exclusive():
        try:
            fab.destroy(spec)
            fab.build(spec)
            limits = cpu_limit.CpuLimits.create({"a": a.cores, "b": a.cores})
            for link in ("slow", "fast"):
                fab.set_trunk(a.slow_mbit if link == "slow" else a.fast_mbit)
                for run in (r for r in runs if r.link == link):
                    print(f">> {link} link: {run.name}", file=sys.stderr, flush=True)
                    launch(a, spec, run, workdir, data, limits)
                    if run.error:
                        print(f"   failed: {run.error}", file=sys.stderr, flush=True)
        finally:
            fe.kill_tree(list(fe.LIVE))
            if limits is not None:
                limits.remove()
            fab.destroy(spec)
    failed = [r for r in runs if r.error]
    if failed:
        for r in failed:
            print(f"{r.link} {r.name}: {r.error}")
        return 1
    result = summarize(a, runs, gflops)
    shutil.rmtree(workdir, ignore_errors=True)  # kept above, with the logs, when a case failed
    print(json.dumps(result, separators=(",", ":")))
    return 0


def summarize(a: argparse.Namespace, runs: list[Run], gflops: float) -> dict[str, Any]:
    reached = {(r.link, r.name): to_target(r.curves, a.target_loss, a.smooth) for r in runs}
    tokens_per_it = a.batch * a.seq
    pipe_its = {link: reached[(link, "pipeline")] for link in ("slow", "fast")}
    print(
        f"\n{'link':5} {'case':15} {'ms/it':>7} {'its to loss':>11} {'tokens to loss':>14} "
        f"{'s to loss':>9} {'final loss':>10}"
    )
    for r in runs:
        got = reached[(r.link, r.name)]
        ms = 1e3 * sum(x["iterationSeconds"] for x in r.curves[0]) / len(r.curves[0])
        final = sum(c[-1]["loss"] for c in r.curves) / len(r.curves)
        its, secs = got if got else (None, None)
        print(
            f"{r.link:5} {r.name:15} {ms:7.0f} {its if its else '-':>11} "
            f"{its * tokens_per_it if its else '-':>14} {f'{secs:.1f}' if secs else '-':>9} {final:10.3f}"
        )
    out: dict[str, Any] = {"targetLoss": a.target_loss, "coresPerRank": a.cores}
    best: dict[str, str] = {}
    for link in ("slow", "fast"):
        times = {name: v[1] for (lk, name), v in reached.items() if lk == link and v}
        winner = min(times, key=times.get) if times else None
        best[link] = "pipeline" if winner == "pipeline" else ("replicas" if winner else "none")
        reps = [t for n, t in times.items() if n != "pipeline"]
        if link == "slow":
            p = times.get("pipeline")
            out["slowLinkTimeToLossRatio"] = round(p / min(reps), 3) if p and reps else None
    # convergence: tokens to the loss relative to the pipeline's (synchronous), per H; the same on
    # both links (same math), measured on the slow one
    ratios = {}
    for h in a.inner_steps:
        rep, pipe = reached[("slow", f"replicas H={h}")], pipe_its["slow"]
        ratios[h] = rep[0] / pipe[0] if rep and pipe else math.inf
    work = planner_inputs(a, gflops)
    picks = {}
    for link, mbit in (("slow", a.slow_mbit), ("fast", a.fast_mbit)):
        lk = across.Link(mbit / 1000, a.latency_ms / 1000)
        h = min(a.inner_steps, key=lambda h: across.replicas_iteration_s(work, lk, h) * ratios[h])
        if math.isinf(ratios[h]):
            picks[link] = "pipeline"
            print(
                f"planner, {link} link: pipeline (no replica run reached the loss: no convergence measured)"
            )
            continue
        choice = across.choose(work, lk, h, ratios[h])
        picks[link] = choice.pick
        print(f"planner, {link} link (H={h}): {choice.why}")
    h = min(a.inner_steps, key=lambda h: ratios[h])
    cross = (
        across.crossover_gbps(work, a.latency_ms / 1000, h, ratios[h]) if not math.isinf(ratios[h]) else None
    )
    out.update(
        plannerPickSlow=picks["slow"],
        plannerPickFast=picks["fast"],
        measuredBestSlow=best["slow"],
        measuredBestFast=best["fast"],
        tokensRatio={str(k): (round(v, 3) if not math.isinf(v) else None) for k, v in ratios.items()},
        predictedCrossoverMbit=round(cross * 1000, 1) if cross else None,
        computeGflopsPerRank=round(gflops, 2),
    )
    return out


if __name__ == "__main__":
    sys.exit(main())
