"""Across sites: the cross-island pipeline against replicas that meet over the link (DiLoCo), on
the emulated fabric, to a target loss.

    sudo .venv/bin/python bench/across_sites.py            # the table in docs/benchmarks.md
    sudo .venv/bin/python bench/across_sites.py --smoke    # the code path (make test); numbers mean little
    sudo .venv/bin/python bench/across_sites.py --link-check --iterations 14 --lrs 4e-3
                    # the pipeline alone on tbf's bucket and on a line, against the simulation

Fabric: bench/fabric_netns.py with one node per island; the trunk between them is the link:
--slow-mbit with a one-way delay of --slow-delay-ms (a WAN per node: bench/delay_line.py holds
each packet that long, as this kernel has no sch_netem) and --fast-mbit (a fast link between
halls: a plain veth, no delay). The planner is told the same rates and delays; the slow link's
round trip is measured (TCP connects) and printed. Compute: each rank runs in a CPU cgroup of
its own at --cores cores (bench/cpu_limit.py), so a waiting rank cannot lend its CPU to the
other: the comparison GPUs would see; the delay line has a group of its own (--link-cores), so
it takes no rank's budget, and its CPU use is reported. One trainer process
per node, gloo, the real trainer (python -m holmes.trainer under torchrun).

Model and data: a small GPT on a synthetic corpus with learnable structure (each token follows
from the one before by a fixed rule, with --noise of them random), written once as a token
file. Same job either way, the global batch as the operator splits it:
  pipeline      one world, stage 0 on island A and stage 1 on B, --batch sequences per iteration
  replicas H=h  one world per island (the whole model), --batch / 2 sequences each, an outer
                step every h inner steps (outer lr --outer-lr, Nesterov momentum --outer-momentum)
Each case first runs at every inner learning rate of --lrs on the fast link (tokens to a loss do
not depend on the link: the same math); the one that reached --target-loss in the fewest
iterations is the case's, and only it runs on the slow link. "time to loss" is the sum of the
iterations' seconds until the loss (mean over replicas, a running mean over --smooth
iterations) first reaches --target-loss; start-ups are left out, and a run is stopped once it
got there.

The planner's pick (holmes.plan.across) prices both modes from a replica's iteration measured
here (the median over the fast link's replica iterations without an outer step), the link's
bandwidth, latency and tbf bucket and the model's bytes (the pipeline by simulating 1F1B's order
over the link), with the replicas' convergence (tokens to the target relative to the pipeline,
each at its best learning rate) taken from these runs; its predicted seconds per iteration are
printed beside the measured ones.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import signal
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


def job_manifest(
    a: argparse.Namespace, data: str, mode: str, inner_steps: int, batch: int, lr: float
) -> dict:
    training: dict[str, Any] = {
        "globalBatchSize": batch,
        "microBatchSize": a.micro_batch,
        "iterations": a.iterations,
        "learningRate": lr,
        "warmupIterations": max(1, a.iterations // 20),
        "minLearningRate": lr / 10,
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
    lr: float = 1e-3  # the inner optimizer's peak learning rate (AdamW)
    stopped_at_target: bool = False  # ended once the smoothed loss reached the target
    curves: list[list[dict]] = field(default_factory=list)
    error: str | None = None

    @property
    def name(self) -> str:
        return "pipeline" if self.mode == "pipeline" else f"replicas H={self.inner_steps}"


def cpu_group(island: str) -> str:
    """A CPU group named for this process: "a", "b" (the ranks) or "link" (the delay line)."""
    return f"across{os.getpid()}-{island}"


# ---- I/O: running a case ---------------------------------------------------------------------------


def launch(a, spec, run: Run, workdir: str, data: str, limits) -> None:
    """Start the case's trainers in their namespaces and CPU groups; wait; read rank 0's lines."""
    d = os.path.join(workdir, f"{run.link}-{run.name.replace(' ', '').replace('=', '')}-lr{run.lr:g}")
    os.makedirs(d)
    a_node, b_node = (next(n for n in spec.nodes if n.island == i) for i in "ab")
    gangs: list[tuple[str, str, Layout, dict[str, str], str]] = []  # node, group, layout, env, metrics
    if run.mode == "pipeline":
        lay = layout((a_node.name, b_node.name), a.layers, a.micro_batch, a.batch // a.micro_batch)
        job = job_manifest(a, data, "pipeline", 0, a.batch, run.lr)
        for node in (a_node, b_node):
            gangs.append((node.name, node.island, lay, {}, os.path.join(d, "metrics.jsonl")))
        worlds = [(lay, job, [a_node, b_node])]
    else:
        half = a.batch // 2
        job = job_manifest(a, data, "replicas", run.inner_steps, half, run.lr)
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
            environ = fe.trainer_env(a.timeout, 40_000_000, d, env)
            p, log = fe.start(name, limits.wrap(cpu_group(island), cmd), environ, d)
            logs.append(log)
            procs.append(p)
        deadline, metrics_files = time.time() + a.timeout, list(dict.fromkeys(g[4] for g in gangs))
        while any(p.poll() is None for p in procs):
            if time.time() > deadline:
                run.error = f"timed out after {a.timeout} s (logs in {d})"
                break
            if any(p.returncode for p in procs if p.poll() is not None):
                time.sleep(2)
                break
            if to_target(read_curves(metrics_files), a.target_loss, a.smooth):
                run.stopped_at_target = True  # the rest of the run decides nothing: stop it
                break
            time.sleep(0.5)
    finally:
        fe.kill_tree(procs)
        for p in procs:
            fe.LIVE.remove(p)
        for log in logs:
            log.close()
    bad = [(g[0], p.returncode) for g, p in zip(gangs, procs) if p.returncode]
    if bad and not run.error and not run.stopped_at_target:
        tail = open(os.path.join(d, f"{bad[0][0]}.log")).read()[-1500:]
        run.error = f"exit codes {bad} (logs in {d}):\n{tail}"
    if run.error:
        return
    run.curves = read_curves(metrics_files)


def read_curves(metrics_files: list[str]) -> list[list[dict]]:
    """Each world's iteration lines (rank 0 of each writes one file), as far as they are
    written: a line being written is left for the next read."""
    curves = []
    for path in metrics_files:
        lines = []
        if os.path.exists(path):
            with open(path) as f:
                for text in f:
                    try:
                        line = json.loads(text)
                    except ValueError:
                        break
                    if line.get("holmes") == "iteration":
                        lines.append(line)
        curves.append(lines)
    return curves


# ---- the planner's view ----------------------------------------------------------------------------


def planner_inputs(a: argparse.Namespace, compute_s: float) -> across.AcrossWork:
    """The job in the planner's terms: a replica's iteration (its half of the batch on one rank)
    as measured, the activations at the cut, the weights each replica exchanges."""
    from holmes.contract import ModelSpec

    m = ModelSpec(
        layers=a.layers, hidden_size=a.hidden, attention_heads=a.heads, seq_length=a.seq, vocab_size=a.vocab
    )
    return across.AcrossWork(
        compute_s=compute_s,
        micro_batches=a.batch // a.micro_batch,
        activation_bytes=a.micro_batch * a.seq * a.hidden * 4,
        model_bytes=ModelCost.of(m).total_params * 4,
        tokens_per_iteration=a.batch * a.seq,
    )


def replica_compute_s(runs: list[Run]) -> float:
    """A replica's iteration without an outer step (the median over every replica run's
    iterations that exchanged nothing): the compute rate the planner is calibrated with."""
    xs = sorted(
        r["iterationSeconds"]
        for run in runs
        if run.mode == "replicas"
        for c in run.curves
        for r in c[3:]  # the first iterations warm up
        if "outer" not in r
    )
    if not xs:
        raise ValueError("no replica iteration without an outer step: run longer than --inner-steps")
    return xs[len(xs) // 2]


def steady_s(run: Run) -> float:
    """Mean seconds per iteration after the warm-up (outer steps included: they are the cost)."""
    c = run.curves[0][3:] or run.curves[0]
    return sum(r["iterationSeconds"] for r in c) / len(c)


def emulated_links(a: argparse.Namespace) -> dict[str, across.Link]:
    """The links as the fabric makes them: the slow one's delay line and the fast veth's none
    (one-way latency), and tbf's token bucket on both (fabric_netns.tbf_burst_bytes: 256 KiB at
    3 Mbit/s, 0.7 s of line rate, which the pipeline's 1F1B loop refills while it idles)."""
    return {
        "slow": across.Link(a.slow_mbit / 1000, a.slow_delay_ms / 1000, fab.tbf_burst_bytes(a.slow_mbit)),
        "fast": across.Link(a.fast_mbit / 1000, 0.0, fab.tbf_burst_bytes(a.fast_mbit)),
    }


def predicted_s(work: across.AcrossWork, link: across.Link, run: Run) -> float:
    if run.mode == "pipeline":
        return across.pipeline_iteration_s(work, link)
    return across.replicas_iteration_s(work, link, run.inner_steps)


def best_lrs(reached: dict[tuple[str, float], tuple[int, float] | None]) -> dict[str, float]:
    """Each case's learning rate that reached the target in the fewest iterations (tokens; the
    lower learning rate on a tie); a case that reached it at no learning rate is left out."""
    out: dict[str, tuple[int, float]] = {}
    for (case, lr), got in sorted(reached.items()):
        if got and (case not in out or got[0] < out[case][0]):
            out[case] = (got[0], lr)
    return {case: lr for case, (_, lr) in out.items()}


# ---- main --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="a short run of every case (make test)")
    ap.add_argument(
        "--slow-mbit",
        type=float,
        default=3,
        help="a WAN, relative to this CPU compute: about a seventh of the crossover the planner predicts",
    )
    ap.add_argument("--fast-mbit", type=float, default=5000)
    ap.add_argument(
        "--slow-delay-ms",
        type=float,
        default=20.0,
        help="the slow link's one-way delay (the delay line; the planner is told the same)",
    )
    ap.add_argument("--link-cores", type=float, default=0.25, help="CPU budget of the slow link's delay line")
    ap.add_argument("--cores", type=float, default=0.5, help="CPU budget of each rank (cgroup quota)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16, help="sequences per iteration, both modes")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument(
        "--lrs",
        type=float,
        nargs="+",
        default=[5e-4, 1e-3, 2e-3, 4e-3, 8e-3],
        help="the inner AdamW learning rates swept per case on the fast link; each case then runs "
        "at its best (fewest tokens to the target) on the slow link",
    )
    ap.add_argument("--iterations", type=int, default=150)
    ap.add_argument(
        "--target-loss",
        type=float,
        default=1.8,
        help="the loss both modes race to: the synchronous run's loss once its fast early descent "
        "is over (its floor is about 1.5), so the race is about training, not its first steps",
    )
    ap.add_argument(
        "--early-loss",
        type=float,
        default=2.0,
        help="a loss on the way, reported beside the target: replicas get there sooner than to the target",
    )
    ap.add_argument("--smooth", type=int, default=5)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--inner-steps", type=int, nargs="+", default=[5, 20])
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument(
        "--link-check",
        action="store_true",
        help="only the pipeline on the slow link, without and with its delay, on tbf's bucket and on "
        "a line (--line-burst-bytes, a queue of --line-queue-ms): measured ms/iteration against "
        "the simulation's, at --lrs' first rate for --iterations",
    )
    ap.add_argument(
        "--shapers",
        nargs="+",
        choices=LINK_SHAPERS,
        default=list(LINK_SHAPERS),
        help="--link-check: the slow link's shapers to run (link_check says what each is)",
    )
    ap.add_argument(
        "--line-burst-bytes", type=int, default=3028, help="--link-check: the line's bucket (2 frames)"
    )
    ap.add_argument(
        "--line-queue-ms",
        type=float,
        default=3000,
        help="--link-check: the line's queue, long enough for an iteration's crossings (no drops)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.smoke:
        # a race stops at the target (near iteration 17); the link check keeps 5 steady iterations
        a.layers, a.hidden, a.seq, a.target_loss, a.early_loss = 2, 64, 32, 4.3, 4.8
        a.iterations = 8 if a.link_check else 32
        a.inner_steps, a.lrs, a.timeout = [4], [3e-3], 300  # each run starts a torch world per rank
        # a core per rank (the groups and their quotas as ever): at --cores' 0.5 each run's two
        # torch imports per rank (torchrun's and the worker's) took twice as long, and the smoke's
        # numbers mean nothing anyway
        a.cores = 1.0
    if fab.delay_line_problem() and a.slow_delay_ms > 0:
        print(f"cannot delay the slow link: {fab.delay_line_problem()}", file=sys.stderr)
        return 2
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
    cases = [("pipeline", 0)] + [("replicas", h) for h in a.inner_steps]
    # the sweep, on the fast link: tokens to a loss do not depend on the link (the same math)
    runs = [Run("fast", mode, h, lr) for mode, h in cases for lr in a.lrs]
    limits = None
    link_use: dict[str, float] = {}
    with fab.exclusive():
        try:
            fab.destroy(spec)
            fab.build(spec)
            # groups named for this process, none swept: other benches may be running theirs
            budgets = {cpu_group(i): a.cores for i in "ab"} | {cpu_group("link"): a.link_cores}
            limits = cpu_limit.CpuLimits.create(budgets, sweep=False)
            if a.link_check:
                result = link_check(a, spec, workdir, data, limits)
                shutil.rmtree(workdir, ignore_errors=True)
                print(json.dumps(result, separators=(",", ":")))
                return 0 if "error" not in result else 1
            for link in ("fast", "slow"):
                if link == "fast":  # a plain veth: a Python delay line cannot carry Gbit/s
                    fab.set_trunk(a.fast_mbit, delay_ms=0)
                else:
                    in_link_group = functools.partial(limits.wrap, cpu_group("link"))
                    fab.set_trunk(a.slow_mbit, a.slow_delay_ms, in_link_group)
                    a_node, b_node = (next(n for n in spec.nodes if n.island == i) for i in "ab")
                    link_use["rttMs"] = fab.measure_rtt_ms(a_node, b_node)
                    print(f">> slow link round trip {link_use['rttMs']:.1f} ms", file=sys.stderr, flush=True)
                    error, warning = fab.rtt_check(link_use["rttMs"], a.slow_delay_ms)
                    if error:
                        print(f"   failed: {error}", file=sys.stderr, flush=True)
                        return 1
                    if warning:
                        print(f"   warning: {warning}", file=sys.stderr, flush=True)
                    cpu0, wall0 = fab.delay_line_cpu_s(), time.monotonic()
                    # each case at its best learning rate only
                    best = best_lrs(
                        {(r.name, r.lr): to_target(r.curves, a.target_loss, a.smooth) for r in runs}
                    )
                    runs += [
                        Run("slow", r.mode, r.inner_steps, r.lr) for r in runs if best.get(r.name) == r.lr
                    ]
                for run in (r for r in runs if r.link == link):
                    print(f">> {link} link: {run.name} lr {run.lr:g}", file=sys.stderr, flush=True)
                    launch(a, spec, run, workdir, data, limits)
                    if run.error:
                        print(f"   failed: {run.error}", file=sys.stderr, flush=True)
                        return fail(runs)
            # the delay line's CPU (cores) over the slow link's runs
            link_use["cpuShare"] = (fab.delay_line_cpu_s() - cpu0) / (time.monotonic() - wall0)
        finally:
            fe.kill_tree(list(fe.LIVE))
            fab.destroy(spec)  # ends the delay line first: its CPU group is then empty
            if limits is not None:
                limits.remove()
    result = summarize(a, runs)
    result["slowLink"] = {
        "mbit": a.slow_mbit,
        "delayMs": a.slow_delay_ms,
        "rttMs": round(link_use.get("rttMs", 0.0), 2),
        "delayLineCores": round(link_use.get("cpuShare", 0.0), 4),
    }
    shutil.rmtree(workdir, ignore_errors=True)  # kept above, with the logs, when a case failed
    print(json.dumps(result, separators=(",", ":")))
    return 0


LINK_SHAPERS = ("bucket", "line", "line-warm")


def link_check(a: argparse.Namespace, spec, workdir: str, data: str, limits) -> dict[str, Any]:
    """--link-check: the pipeline alone on the slow link at 0 ms and at its delay, on each of
    --shapers: "bucket", tbf as the full bench runs it; "line", a bucket of two frames and a queue
    that holds an iteration's crossings; "line-warm", that line with TCP's slow start after idle
    off in the nodes' namespaces (net.ipv4.tcp_slow_start_after_idle=0: a connection keeps its
    window between messages). Each against holmes.plan.across's simulation told the same link
    and the compute rank 0 measured (its stage's forward and backward per iteration: a replica's
    iteration in the planner's terms, the same layers on the same batch)."""
    in_link_group = functools.partial(limits.wrap, cpu_group("link"))
    out: dict[str, Any] = {"slowMbit": a.slow_mbit, "iterations": a.iterations, "cases": []}
    for shaper in a.shapers:  # "line-warm" changes the namespaces for good: keep it last
        bucket = shaper == "bucket"
        burst = fab.tbf_burst_bytes(a.slow_mbit) if bucket else a.line_burst_bytes
        queue = 50.0 if bucket else a.line_queue_ms
        if shaper == "line-warm":
            for node in spec.nodes:
                fab.run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        node.netns,
                        "sysctl",
                        "-qw",
                        "net.ipv4.tcp_slow_start_after_idle=0",
                    ]
                )
        for delay in (0.0, a.slow_delay_ms):
            fab.set_trunk(a.slow_mbit, delay, in_link_group, burst, queue)
            run = Run("slow", "pipeline", 0, a.lrs[0])
            print(
                f">> link check: {delay:g} ms, {shaper} ({burst} B bucket, {queue:g} ms queue)",
                file=sys.stderr,
                flush=True,
            )
            launch(a, spec, run, os.path.join(workdir, f"{shaper}-{delay:g}"), data, limits)
            if run.error:
                out["error"] = run.error
                return out
            steady = run.curves[0][3:] or run.curves[0]  # the first iterations warm up
            if not steady:
                out["error"] = f"no iteration finished at {delay:g} ms on the {shaper}"
                return out
            measured = sum(r["iterationSeconds"] for r in steady) / len(steady)
            compute = sorted(r["time"]["compute"] for r in steady)[len(steady) // 2]
            rest = sorted(r["time"]["optimizer"] + r["time"]["data"] for r in steady)[len(steady) // 2]
            work = planner_inputs(a, compute)
            link = across.Link(a.slow_mbit / 1000, delay / 1000, burst)
            predicted = across.pipeline_iteration_s(work, link)
            out["cases"].append(
                {
                    "delayMs": delay,
                    "shaper": shaper,
                    "burstBytes": burst,
                    "measuredMs": round(measured * 1e3, 1),
                    "predictedMs": round(predicted * 1e3, 1),
                    "computeMs": round(compute * 1e3, 1),
                    "optimizerAndDataMs": round(rest * 1e3, 1),
                }
            )
            print(
                f"   measured {measured * 1e3:.0f} ms/iteration, simulated {predicted * 1e3:.0f} "
                f"(compute {compute * 1e3:.0f} ms, optimizer and data {rest * 1e3:.0f} ms)",
                file=sys.stderr,
                flush=True,
            )
    return out


def fail(runs: list[Run]) -> int:
    for r in runs:
        if r.error:
            print(f"{r.link} {r.name} lr {r.lr:g}: {r.error}")
    return 1


def cell(target: tuple[int, float] | None, early: tuple[int, float] | None) -> str:
    return f"{target[0] if target else '-'} ({early[0] if early else '-'})"


def summarize(a: argparse.Namespace, runs: list[Run]) -> dict[str, Any]:
    reached = {(r.link, r.name, r.lr): to_target(r.curves, a.target_loss, a.smooth) for r in runs}
    best = best_lrs({(name, lr): got for (link, name, lr), got in reached.items() if link == "fast"})
    tokens_per_it = a.batch * a.seq
    early = {(r.name, r.lr): to_target(r.curves, a.early_loss, a.smooth) for r in runs if r.link == "fast"}
    print(f"\nlearning-rate sweep (fast link), iterations to {a.target_loss} (to {a.early_loss}):")
    names = list(dict.fromkeys(r.name for r in runs))
    print(f"{'case':15} " + " ".join(f"{f'lr {lr:g}':>11}" for lr in a.lrs))
    sweep: dict[str, dict[str, list[int | None]]] = {}
    for name in names:
        cells = [(reached.get(("fast", name, lr)), early.get((name, lr))) for lr in a.lrs]
        sweep[name] = {
            f"{lr:g}": [t[0] if t else None, e[0] if e else None] for lr, (t, e) in zip(a.lrs, cells)
        }
        print(f"{name:15} " + " ".join(f"{cell(t, e):>11}" for t, e in cells))

    chosen = [r for r in runs if best.get(r.name) == r.lr]
    # the planner's compute rate: a replica's iteration measured on the fast link (no exchange)
    compute_s = replica_compute_s([r for r in chosen if r.link == "fast"])
    work = planner_inputs(a, compute_s)
    links = emulated_links(a)
    print(
        f"\n{'link':5} {'case':15} {'lr':>6} {'ms/it':>7} {'predicted':>9} {'its to loss':>11} "
        f"{'tokens to loss':>14} {'s to loss':>9}"
    )
    model_check: dict[str, dict[str, float]] = {}
    for link in ("slow", "fast"):
        for r in (r for r in chosen if r.link == link):
            got = reached[(r.link, r.name, r.lr)]
            ms, pred = 1e3 * steady_s(r), 1e3 * predicted_s(work, links[link], r)
            model_check[f"{link} {r.name}"] = {"measuredMs": round(ms, 1), "predictedMs": round(pred, 1)}
            its, secs = got if got else (None, None)
            print(
                f"{r.link:5} {r.name:15} {r.lr:6g} {ms:7.0f} {pred:9.0f} {its if its else '-':>11} "
                f"{its * tokens_per_it if its else '-':>14} {f'{secs:.1f}' if secs else '-':>9}"
            )
    out: dict[str, Any] = {"targetLoss": a.target_loss, "coresPerRank": a.cores}
    measured: dict[str, str] = {}
    for link in ("slow", "fast"):
        times = {r.name: got[1] for r in chosen if r.link == link and (got := reached[(link, r.name, r.lr)])}
        winner = min(times, key=times.__getitem__) if times else None
        measured[link] = "pipeline" if winner == "pipeline" else ("replicas" if winner else "none")
        reps = [t for n, t in times.items() if n != "pipeline"]
        if link == "slow":
            p = times.get("pipeline")
            out["slowLinkTimeToLossRatio"] = round(p / min(reps), 3) if p and reps else None
    # convergence: tokens to the loss relative to the synchronous pipeline's, each at its best lr
    pipe = reached.get(("fast", "pipeline", best.get("pipeline", -1.0)))
    ratios = {}
    for h in a.inner_steps:
        name = f"replicas H={h}"
        rep = reached.get(("fast", name, best.get(name, -1.0)))
        ratios[h] = rep[0] / pipe[0] if rep and pipe else math.inf
    picks, best_h = {}, {}
    for link in ("slow", "fast"):
        h = min(a.inner_steps, key=lambda h: across.replicas_iteration_s(work, links[link], h) * ratios[h])
        best_h[link] = h
        if math.isinf(ratios[h]):
            picks[link] = "pipeline"
            print(
                f"planner, {link} link: pipeline (no replica run reached the loss: no convergence measured)"
            )
            continue
        choice = across.choose(work, links[link], h, ratios[h])
        picks[link] = choice.pick
        print(f"planner, {link} link (H={h}): {choice.why}")
    h = best_h["slow"]  # the H replicas run at on a slow link: the crossover is where that stops paying
    # the link speed where the pipeline starts to win, on the slow link's shaper (its tbf bucket):
    # without delay (the fast veth's 0 ms; the slow link's rate is set relative to it) and at the
    # slow link's delay, where 1F1B's loop pays the latency per micro-batch once the bucket keeps
    # up, and the pipeline may lose at any speed (None)
    burst = fab.tbf_burst_bytes(a.slow_mbit)
    cross, cross_delayed = (
        across.crossover_gbps(work, latency_s, h, ratios[h], burst_bytes=burst)
        if not math.isinf(ratios[h])
        else None
        for latency_s in (0.0, a.slow_delay_ms / 1000)
    )
    best_early = best_lrs(early)
    early_ratio = {}
    for h in a.inner_steps:
        rep, pipe = (
            early.get((f"replicas H={h}", best_early.get(f"replicas H={h}", -1.0))),
            early.get(("pipeline", best_early.get("pipeline", -1.0))),
        )
        early_ratio[str(h)] = round(rep[0] / pipe[0], 3) if rep and pipe else None
    out.update(
        tokensRatioAtEarlyLoss={"loss": a.early_loss, **early_ratio},
        plannerPickSlow=picks["slow"],
        plannerPickFast=picks["fast"],
        measuredBestSlow=measured["slow"],
        measuredBestFast=measured["fast"],
        tokensRatio={str(k): (round(v, 3) if not math.isinf(v) else None) for k, v in ratios.items()},
        bestLearningRate=best,
        learningRateSweep=sweep,
        predictedCrossoverMbit=round(cross * 1000, 1) if cross else None,
        predictedCrossoverMbitAtSlowDelay=round(cross_delayed * 1000, 1) if cross_delayed else None,
        crossoverInnerSteps=h,
        replicaComputeMs=round(compute_s * 1e3, 1),
        secondsPerIteration=model_check,
    )
    return out


if __name__ == "__main__":
    sys.exit(main())
