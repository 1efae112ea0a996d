"""Re-planning from measured stage speeds, closed loop, on the emulated fabric: islands whose
compute genuinely differs, a cost model that assumes they are equal, and what re-planning makes
of it next to the best split found by running every one.

    sudo .venv/bin/python bench/replan_closed_loop.py [--slow-cores 0.3] [--fast-cores 0.7] ...
    sudo .venv/bin/python bench/replan_closed_loop.py --smoke    # the code path; numbers mean little

Fabric: bench/fabric_netns.py, two islands of --per-island nodes (A "InfiniBand", B "RoCE"), a
tbf-shaped trunk between them; one trainer process per node under holmes.trainer.run (the pod's
launcher: SIGTERM makes the workers checkpoint and exit 83), gloo. Compute: each island's
processes run in a CPU cgroup of their own (bench/cpu_limit.py), --fast-cores per process on A,
--slow-cores on B: the kernel throttles them, nothing is faked. The budgets hold from rank 0's
``start`` line on (a slower GPU slows training, not the host's imports and start-up; throttled
start-ups would only lengthen the run). The cost model prices every node
the same (the trainer's transformer block timed on one thread, times the mean budget), so the
first plan splits the layers as if the islands were equal.

Cases, same job (pipeline 2 across the islands, data parallel inside each):
  off          the first plan, parallelism.replan.enabled false, --iterations iterations
  on           the same start with re-planning on (its defaults: threshold 10%, at most 2), the
               bench playing the operator's part with the operator's own code: every poll it
               turns rank 0's metrics into status.progress and calls core/replan.step; when the
               step says relaunch it SIGTERMs the gang (the trainers write a checkpoint:
               training.checkpoint.onPreemption, or with --no-save-on-stop it waits for the next
               periodic one), plans the new layout as the operator would (replan.measured_nodes: the
               nodes at their measured rates) and starts the gang again, resumed from the checkpoint
  brute force  every layer split with either island first, --probe-iters measured iterations each
"tokens/s" is the median of the measured iterations (after --warmup of each start) of the layout
the run ended in; "wall s" is the whole run's, start-ups and the relaunch included.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
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

from holmes.contract import JobSpec, Layout  # noqa: E402
from holmes.operator.core import replan  # noqa: E402
from holmes.plan import CostModelConfig, plan  # noqa: E402
from holmes.plan.calibrate import assess  # noqa: E402
from holmes.plan.estimate import evaluate_run, fixed_job  # noqa: E402
from holmes.plan.measured import CalibrationError, RunLayout, from_records, metric_records  # noqa: E402
from holmes.plan.planner import PlanError, as_job, to_layout  # noqa: E402

LAUNCHER = "holmes.trainer.run"
GRACE_SECONDS = 60  # the pods' grace period: time for the stopping trainers' checkpoint
POLL_SECONDS = 0.1


# ---- pure: the job, the candidates, what the operator would read ------------------------------


def job_manifest(a: argparse.Namespace, ckpt_dir: str | None, iterations: int, replan_on: bool) -> dict:
    training: dict[str, Any] = {
        "globalBatchSize": a.per_island * a.micro_batch * a.micro_batches,
        "microBatchSize": a.micro_batch,
        "iterations": iterations,
        "learningRate": 1e-4,
        "seed": 7,
        "activationRecompute": False,
        "data": {"synthetic": {}},
    }
    if ckpt_dir:
        training["checkpoint"] = {
            "path": ckpt_dir,
            "intervalIterations": a.checkpoint_interval,
            "onPreemption": a.save_on_stop,
        }
    return holmes_job(
        "replan-bench",
        {
            "model": {
                "layers": a.layers,
                "hiddenSize": a.hidden,
                "attentionHeads": a.heads,
                "seqLength": a.seq,
                "vocabSize": a.vocab,
            },
            "training": training,
            "parallelism": {
                "tensor": 1,
                "pipeline": 2,
                "data": a.per_island,
                "partition": "adaptive",
                "nicSelection": "auto",
                "replan": {"enabled": replan_on},
            },
            "nodes": {"count": 2 * a.per_island, "gpusPerNode": 1},
        },
    )


def candidates(nodes: list, job: JobSpec, first: Layout, config: CostModelConfig) -> list[Layout]:
    """Every layer split of ``first``'s pipeline, with its stages' node blocks in every order
    (for two stages: either island first), each as the Layout the planner would emit for it."""
    from itertools import permutations

    blocks = [first.stage_nodes(s) for s in range(first.pipeline)]
    L, out = first.num_layers, []
    for order in permutations(blocks):
        nodes_order = tuple(n for b in order for n in b)
        for cut in range(1, L):  # pipeline 2: every split with at least one layer per stage
            if first.pipeline != 2:
                raise ValueError("the brute force enumerates two-stage splits only")
            run = RunLayout(nodes_order, (cut, L - cut), first.tensor, first.data, first.micro_batches)
            try:
                out.append(to_layout(evaluate_run(nodes, job, run, config), fixed_job(job, run), config))
            except PlanError:
                continue  # a split the cost model refuses (memory): not a candidate
    return out


def split_name(layout: Layout, spec: fab.FabricSpec) -> str:
    """Layers per stage and each stage's island, e.g. ``6A/2B``."""
    return "/".join(
        f"{s.num_layers}{spec.node(layout.stage_nodes(s.index)[0]).island.upper()}" for s in layout.stages
    )


def progress_of(records: list[dict]) -> dict[str, Any]:
    """status.progress as the operator reads it from this gang's rank 0: the last iteration, the
    last checkpoint, and per stage the medians after the trainer's warm-up (the same medians the
    trainer's stage gauges hold, here from its metrics lines: holmes.plan.calibrate)."""
    its = [r for r in records if r.get("holmes") == "iteration"]
    if not its:
        return {}
    out: dict[str, Any] = {"iteration": its[-1]["iteration"], "iterationSeconds": its[-1]["iterationSeconds"]}
    saved = [r["iteration"] for r in records if r.get("holmes") == "checkpoint"]
    if saved:
        out["checkpointIteration"] = max(saved)
    try:
        m = from_records(records)
    except CalibrationError:
        return out  # too few iterations yet: replan.step says Measuring
    out["iterationSeconds"] = m.iteration_seconds
    out["stages"] = [
        {
            "stage": s.stage,
            "layers": m.run.layers[s.stage],
            "samples": m.samples,
            "computeSeconds": s.compute,
            "p2pWaitSeconds": s.p2p_wait,
            "dpExposedSeconds": s.dp_exposed,
        }
        for s in m.stages
    ]
    return out


def steady(records: list[dict], warmup: int, seen: dict[int, float], limited_at: float | None) -> list[dict]:
    """A start's iteration lines after its first ``warmup``, of iterations that ran wholly under
    the CPU budgets: the one before was seen after they were enforced (``seen``: when the bench
    saw each iteration's line; an iteration starts when the one before it ends)."""
    its = [r for r in records if r.get("holmes") == "iteration"][warmup:]
    if limited_at is None:
        return []
    return [r for r in its if seen.get(int(r["iteration"]) - 1, 0.0) > limited_at]


# ---- I/O: gangs -----------------------------------------------------------------------------------


def read_records(path: str) -> list[dict]:
    """Rank 0's metrics lines so far (none before the file exists)."""
    try:
        with open(path) as f:
            return metric_records(f)
    except FileNotFoundError:
        return []


@dataclass
class Gang:
    """One start of the job's trainers in a layout: one launcher per node, in its namespace and
    its island's CPU group."""

    layout: Layout
    dir: str
    procs: list = field(default_factory=list)  # (node, Popen, log)
    seen: dict[int, float] = field(default_factory=dict)  # iteration -> when the bench saw its line
    limited_at: float | None = None  # when the islands' CPU budgets were enforced (at rank 0's start line)

    @property
    def metrics(self) -> str:
        return os.path.join(self.dir, "metrics.jsonl")

    def records(self) -> list[dict]:
        recs = read_records(self.metrics)
        now = time.time()
        for r in recs:
            if r.get("holmes") == "iteration":
                self.seen.setdefault(int(r["iteration"]), now)
        return recs

    def running(self) -> bool:
        return any(p.poll() is None for _, p, _ in self.procs)

    def failed(self) -> list[tuple[str, int]]:
        return [(n, p.returncode) for n, p, _ in self.procs if p.poll() is not None and p.returncode]


def measured(gang: Gang, warmup: int) -> list[dict]:
    """The gang's iteration lines that count (``steady``); none is an error saying what to change."""
    its = steady(gang.records(), warmup, gang.seen, gang.limited_at)
    if not its:
        raise RuntimeError(
            f"{gang.dir}: no iteration after the {warmup} warm-up ones ran wholly under the CPU budgets "
            "(they hold from rank 0's start line on, seen within a poll): run more iterations "
            "(--iterations, --probe-iters) or a bigger model"
        )
    return its


class Bench:
    def __init__(
        self, a: argparse.Namespace, spec: fab.FabricSpec, limits: cpu_limit.CpuLimits, workdir: str
    ):
        self.a, self.spec, self.limits, self.workdir = a, spec, limits, workdir
        self.starts = 0

    def start(self, layout: Layout, job: dict, tag: str) -> Gang:
        self.starts += 1
        d = os.path.join(self.workdir, f"{self.starts:02d}-{tag}")
        os.makedirs(d)
        job_file, lay_file = os.path.join(d, "job.yaml"), os.path.join(d, "layout.json")
        with open(job_file, "w") as f:
            yaml.safe_dump(job, f)
        with open(lay_file, "w") as f:
            f.write(layout.to_json())
        gang = Gang(layout, d)
        self.limits.enforce(False)
        env = fe.trainer_env(
            self.a.timeout, self.a.bucket_elements, d, {"HOLMES_GRACE_SECONDS": str(GRACE_SECONDS)}
        )
        cmds = fe.launch_commands(layout, self.spec, job_file, lay_file, gang.metrics, launcher=LAUNCHER)

        def in_island(rank: int, cmd: list[str]) -> list[str]:
            return self.limits.wrap(self.spec.node(layout.nodes[rank]).island, cmd)

        gang.procs = fe.start_gang(cmds, env, d, self.workdir, in_island)
        return gang

    def stop(self, gang: Gang, graceful: bool) -> None:
        """SIGTERM the launchers as the kubelet does (graceful: wait for them to save and exit),
        then make sure nothing of the gang is left."""
        if graceful:
            for _, p, _ in gang.procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            deadline = time.time() + GRACE_SECONDS + 15
            while gang.running() and time.time() < deadline:
                time.sleep(POLL_SECONDS)
        procs = [p for _, p, _ in gang.procs]
        fe.kill_tree(procs)
        for p in procs:
            if p in fe.LIVE:
                fe.LIVE.remove(p)
        for _, _, log in gang.procs:
            log.close()

    def wait(self, gang: Gang, step=None) -> str | None:
        """Until the gang ends (None) or ``step(records)`` returns why to relaunch it now."""
        deadline, read = time.time() + self.a.timeout, 0
        while gang.running():
            if time.time() > deadline:
                raise RuntimeError(f"{gang.dir}: no end after {self.a.timeout} s (--timeout)")
            if gang.failed():
                time.sleep(2)  # the others report why, then stop
                break
            recs = gang.records()
            if gang.limited_at is None and any(r.get("holmes") == "start" for r in recs):
                self.limits.enforce(True)
                gang.limited_at = time.time()
            why = step(recs) if step and len(recs) > read else None  # judged on new lines only
            if why:
                return why
            read = len(recs)
            time.sleep(POLL_SECONDS)
        gang.records()
        bad = [(n, c) for n, c in gang.failed() if c]
        if bad:
            tail = open(os.path.join(gang.dir, f"{bad[0][0]}.log")).read()[-2000:]
            raise RuntimeError(f"exit codes {bad} (logs in {gang.dir}):\n{tail}")
        return None


# ---- the cases ------------------------------------------------------------------------------------


@dataclass
class Result:
    """One case, pooled over rounds."""

    name: str
    layouts: list[str] = field(default_factory=list)  # per round: what it ran, "4A/4B -> 2B/6A"
    its: list[dict] = field(default_factory=list)  # measured iteration lines of the layout it ended in
    walls: list[float] = field(default_factory=list)
    replans: list[int] = field(default_factory=list)
    other: list[float] = field(default_factory=list)  # per round: cores other work used meanwhile
    details: list[dict[str, Any]] = field(default_factory=list)

    def add(self, layouts: str, its: list[dict], wall: float, replans: int, other: float) -> None:
        self.layouts.append(layouts)
        self.its += its
        self.walls.append(wall)
        self.replans.append(replans)
        self.other.append(other)

    @property
    def tokens_per_s(self) -> float:
        return statistics.median(r["tokensPerSecond"] for r in self.its)

    @property
    def s_per_iter(self) -> float:
        return statistics.median(r["iterationSeconds"] for r in self.its)


class OtherLoad:
    """The CPU other work on the machine used while a block ran, in cores (fabric_emulation's
    measure: the machine's busy time minus this process tree's)."""

    def __enter__(self) -> OtherLoad:
        self.t, self.busy, self.own = time.time(), fe.machine_busy_seconds(), fe.own_cpu_seconds()
        return self

    def __exit__(self, *exc) -> None:
        busy = fe.machine_busy_seconds() - self.busy - (fe.own_cpu_seconds() - self.own)
        self.cores = max(0.0, busy) / max(time.time() - self.t, 1e-9)


def fixed_run(b: Bench, layout: Layout, job: dict, into: Result, tag: str) -> Result:
    """The job in one layout, start to end, re-planning off; its measurements added to ``into``."""
    t = time.time()
    with OtherLoad() as load:
        gang = b.start(layout, job, tag)
        try:
            b.wait(gang)
        finally:
            b.stop(gang, graceful=False)
    into.add(split_name(layout, b.spec), measured(gang, b.a.warmup), time.time() - t, 0, load.cores)
    return into


def closed_loop(
    b: Bench, first: Layout, job: dict, nodes: list, config: CostModelConfig, into: Result, log=print
) -> Result:
    """The job with re-planning on, the operator's decisions taken by core/replan (see the
    module docstring); every start of the gang is a ``Gang``. Measurements added to ``into``."""
    with OtherLoad() as load:
        t0 = time.time()
        gangs, its, detail = _closed_loop(b, first, job, nodes, config, log)
    path = " -> ".join(split_name(g.layout, b.spec) for g in gangs)
    into.add(path, its, time.time() - t0, detail["replans"], load.cores)
    into.details.append(detail)
    return into


def _closed_loop(b: Bench, first: Layout, job: dict, nodes: list, config: CostModelConfig, log):
    spec = as_job(job)
    plan_fn = lambda ns, j: plan(ns, j, config=config)  # noqa: E731
    calibrated = lambda ns, j, lay, m: assess(ns, j, lay, m, config)  # noqa: E731
    adaptation, layout = {}, first
    gangs, decisions = [], []
    while True:
        gang = b.start(layout, job, f"on-{len(gangs)}")
        gangs.append(gang)
        state = {"adaptation": adaptation}

        def operator_step(recs: list[dict], gang=gang, state=state) -> str | None:
            progress = progress_of(recs)
            if not progress:
                return None
            st = replan.step(spec, state["adaptation"], gang.layout, progress, nodes, plan_fn, calibrated)
            if st.adaptation is not None:
                state["adaptation"] = st.adaptation
            if st.condition is not None:
                log(f"    iteration {progress['iteration']}: {st.condition[1]}: {st.condition[2][:400]}")
            if st.event:
                decisions.append({"iteration": progress["iteration"], "at": time.time()})
            return st.relaunch or None

        try:
            why = b.wait(gang, operator_step)
        finally:
            stopped = time.time()
            b.stop(gang, graceful=True)  # a gang told to relaunch stops as a pod does: SIGTERM
        adaptation = state["adaptation"]
        if why is None:
            break
        decisions[-1]["stopped"] = stopped
        layout = plan_fn(list(replan.measured_nodes(nodes, adaptation, spec)), spec)
        log(f"  relaunch ({why}): {split_name(gang.layout, b.spec)} -> {split_name(layout, b.spec)}")
    last = gangs[-1]
    its = measured(last, b.a.warmup)
    recs = last.records()
    detail: dict[str, Any] = {"decisions": decisions, "replans": int(adaptation.get("replans") or 0)}
    resumed = [r for r in recs if r.get("holmes") == "resume"]
    if len(gangs) > 1 and resumed and last.seen:
        r_it = int(resumed[0]["iteration"])
        old = [r for r in gangs[-2].records() if r.get("holmes") in ("iteration", "preempted")]
        s_new = statistics.median(r["iterationSeconds"] for r in its)
        # from the SIGTERM to the new gang's first iteration, less that iteration's own time
        gap = last.seen[min(last.seen)] - decisions[-1]["stopped"] - s_new
        detail.update(
            resumed_from=r_it,
            interval=-(-r_it // b.a.checkpoint_interval),  # the checkpoint interval it ended in
            redone=max(int(r["iteration"]) for r in old) - r_it if old else 0,
            downtime=gap,
            downtime_iters=gap / s_new,
        )
    return gangs, its, detail


# ---- main -----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-island", type=int, default=2, help="nodes per island (one process each)")
    ap.add_argument("--fast-cores", type=float, default=0.6, help="CPU budget per process on island A")
    ap.add_argument("--slow-cores", type=float, default=0.25, help="CPU budget per process on island B")
    ap.add_argument("--cross-mbit", type=float, default=200, help="trunk between the islands (tbf)")
    ap.add_argument("--fast-mbit", type=float, default=2000, help="each node's NIC (tbf)")
    ap.add_argument("--iterations", type=int, default=30, help="of the off and on runs")
    ap.add_argument(
        "--checkpoint-interval", type=int, default=5, help="training.checkpoint.intervalIterations"
    )
    ap.add_argument(
        "--no-save-on-stop",
        dest="save_on_stop",
        action="store_false",
        help="training.checkpoint.onPreemption false: a re-plan waits for the next periodic checkpoint",
    )
    ap.add_argument("--warmup", type=int, default=2, help="iterations of each start left out of tokens/s")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every case this many times, order reversed every other round; iterations pooled",
    )
    ap.add_argument("--probe-iters", type=int, default=4, help="measured iterations per brute-force split")
    fe.add_job_arguments(ap, layers=8, hidden=256, heads=4, vocab=2048)
    ap.add_argument(
        "--timeout", type=int, default=900, help="seconds per start of a gang before it is killed"
    )
    ap.add_argument("--skip-brute-force", action="store_true", help="only the off and on runs")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the small mode `make test` runs: a toy model on one node per island, no brute force",
    )
    return ap


SMOKE = dict(  # three starts of a 2-process gang: the off run, and the on run's two layouts
    per_island=1,
    fast_cores=1.0,
    slow_cores=0.25,
    skip_brute_force=True,
    layers=6,  # big enough that island B's stage runs past its budget: throttled, slower
    hidden=128,
    heads=4,
    seq=64,
    vocab=256,
    micro_batch=2,
    iterations=14,
    checkpoint_interval=4,
    probe_iters=2,
    warmup=2,
    timeout=240,
)


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.smoke:
        vars(a).update(SMOKE)
    if min(a.per_island, a.probe_iters, a.checkpoint_interval, a.rounds, a.iterations - a.warmup) < 1:
        print(
            "replan_closed_loop: --per-island, --probe-iters, --checkpoint-interval, --rounds must be >= 1, "
            "--iterations more than --warmup",
            file=sys.stderr,
        )
        return 2
    budget = {"a": a.fast_cores * a.per_island, "b": a.slow_cores * a.per_island}
    try:
        for cores in budget.values():
            cpu_limit.quota_files(1, cores)
    except ValueError as e:
        print(f"replan_closed_loop: --fast-cores / --slow-cores: {e}", file=sys.stderr)
        return 2
    ncores = len(os.sched_getaffinity(0))
    if sum(budget.values()) > ncores:
        print(
            f"replan_closed_loop: the budgets ({sum(budget.values()):.2f} cores) exceed this machine's "
            f"{ncores} cores: the islands would slow each other down, not only by their budgets; lower "
            "--fast-cores / --slow-cores",
            file=sys.stderr,
        )
        return 2
    spec = fab.two_islands(per_island=a.per_island, fast_mbit=a.fast_mbit, cross_mbit=a.cross_mbit)
    with fab.exclusive():
        problems = fab.missing_prerequisites()
        try:
            cpu_limit.detect()
        except cpu_limit.CpuLimitError as e:
            problems.append(str(e))
        if problems:
            print("replan_closed_loop: cannot run here:\n  - " + "\n  - ".join(problems), file=sys.stderr)
            return 2
        return run(a, spec, budget)


def run(a: argparse.Namespace, spec: fab.FabricSpec, budget: dict[str, float]) -> int:
    fab.destroy(spec)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    workdir = tempfile.mkdtemp(prefix="holmes-replan-")
    t_start, failed, limits = time.time(), True, None
    results: list[Result] = []
    brute: list[Result] = []
    try:
        gflops = fe.block_gflops(a)  # before any trainer runs: a core to itself
        fab.build(spec)
        limits = cpu_limit.CpuLimits.create(budget)
        a_nodes = [n for n in spec.nodes if n.island == "a"]
        b_node = next(n for n in spec.nodes if n.island == "b")
        intra = fab.measure_mbit(a_nodes[0], a_nodes[-1], megabytes=16) / 1000 if len(a_nodes) > 1 else 1.0
        cross = fab.measure_mbit(a_nodes[0], b_node, megabytes=4) / 1000
        equal = statistics.mean([a.fast_cores, a.slow_cores])  # the one speed the model assumes
        config = fe.planner_config(gflops * equal / 1000, intra, cross / a.per_island)
        nodes = fe.node_dicts(spec, intra)
        first = plan(nodes, job_manifest(a, "/checkpoints", a.iterations, replan_on=True), config=config)
        print(
            f"fabric: 2 islands x {a.per_island} node(s) (network namespaces), trunk {a.cross_mbit:g} Mbit/s "
            f"tbf (measured {cross * 1000:.0f}); CPU per process: island A {a.fast_cores:g} core, island B "
            f"{a.slow_cores:g} core (cgroup v{limits.hierarchy.version} quota)"
        )
        print(
            f"job: GPT {a.layers}L h={a.hidden} s={a.seq} V={a.vocab}, PP=2 x DP={a.per_island}, "
            f"micro-batch {a.micro_batch} x {first.micro_batches}, fp32, gloo; checkpoint every "
            f"{a.checkpoint_interval} iterations, {'and' if a.save_on_stop else 'none'} on SIGTERM"
        )
        print(
            f"cost model: every node at {gflops * equal:.1f} GFLOP/s (block rate {gflops:.1f} on one thread "
            f"x {equal:.2f}, the mean budget: equal speeds); first plan {split_name(first, spec)}; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        b = Bench(a, spec, limits, workdir)
        off, on = Result("off"), Result("on")
        results = [off, on]
        job_probe = job_manifest(a, None, a.warmup + a.probe_iters, replan_on=False)
        cands = [] if a.skip_brute_force else candidates(nodes, as_job(job_probe), first, config)
        brute = [Result("split") for _ in cands]
        for r in range(a.rounds):
            order = (lambda xs: xs) if r % 2 == 0 else (lambda xs: xs[::-1])  # spread drift evenly
            for case in order(["off", "on", "brute"]):
                ckpt = os.path.join(workdir, f"checkpoints-{case}-{r}")
                if case == "off":
                    job_off = job_manifest(a, ckpt, a.iterations, replan_on=False)
                    fixed_run(b, first, job_off, off, "off")
                    print(f"round {r + 1} off (re-planning disabled): {off.layouts[-1]}", flush=True)
                elif case == "on":
                    print(f"round {r + 1} on (the operator's core/replan.step):", flush=True)
                    closed_loop(
                        b, first, job_manifest(a, ckpt, a.iterations, replan_on=True), nodes, config, on
                    )
                    print(f"  {on.layouts[-1]}", flush=True)
                else:
                    for c, res in order(list(zip(cands, brute))):
                        fixed_run(b, c, job_probe, res, "probe")
                    if cands:
                        print(f"round {r + 1} brute force over {len(cands)} layouts", flush=True)
        failed = False
    except KeyboardInterrupt:
        print("interrupted: stopping the trainers, removing the fabric and the CPU groups", file=sys.stderr)
        return 130
    except (fab.FabricError, cpu_limit.CpuLimitError, RuntimeError) as e:
        print(f"replan_closed_loop: {e}", file=sys.stderr)
        return 1
    finally:
        fe.kill_tree(list(fe.LIVE))
        fab.destroy(spec)
        if limits is not None:
            limits.remove()
        if a.keep_logs or failed:
            print(f"logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(a, results, brute)
    print(f"total {time.time() - t_start:.0f} s, load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


def print_table(a: argparse.Namespace, results: list[Result], brute: list[Result]) -> None:
    from trainer_common import table

    best = max(brute, key=lambda r: r.tokens_per_s) if brute else None

    def row(r: Result, name: str, replans: str, wall: str) -> list:
        ratio = r.tokens_per_s / best.tokens_per_s if best else float("nan")
        layouts = "; ".join(dict.fromkeys(r.layouts))  # distinct, in order
        other = f"{min(r.other):.2f}-{max(r.other):.2f}"
        return [name, layouts, replans, r.s_per_iter, r.tokens_per_s, ratio, wall, other]

    rows = [
        row(r, r.name, ",".join(map(str, r.replans)), "/".join(f"{w:.0f}" for w in r.walls)) for r in results
    ]
    if best:
        rows.append(row(best, "brute-force best", "-", "-"))
    print()
    print(
        table(
            [
                "case",
                "layers+island per stage",
                "re-plans",
                "s/iter",
                "tokens/s",
                "of best",
                "wall s",
                "other load",
            ],
            rows,
        )
    )
    if brute:
        print()
        print("brute force, every split: " + ", ".join(f"{r.layouts[0]} {r.tokens_per_s:.0f}" for r in brute))
    on = next((r for r in results if r.name == "on"), None)
    off = next((r for r in results if r.name == "off"), None)
    busiest = max((x for r in [*results, *brute] for x in r.other), default=0.0)
    if busiest > 0.25:
        print(
            f"warning: other work used up to {busiest:.2f} cores while a case ran (column 'other load'): "
            "those times are inflated, rerun on a quiet machine to compare"
        )
    if on and off:
        print(
            f"re-planning on / off: {on.tokens_per_s / off.tokens_per_s:.2f}x tokens/s, "
            f"{statistics.mean(off.walls) / statistics.mean(on.walls):.2f}x wall time for "
            f"{a.iterations} iterations"
        )
    for i, d in enumerate(on.details if on else []):
        if "resumed_from" in d:
            print(
                f"round {i + 1}: re-plan decided at iteration {d['decisions'][0]['iteration']}, "
                f"relaunched from the checkpoint of iteration {d['resumed_from']}: in checkpoint "
                f"interval {d['interval']} (every {a.checkpoint_interval} iterations); it cost "
                f"{d['redone']} iteration(s) run again and {d['downtime']:.1f} s from SIGTERM to the new "
                f"layout's first iteration (= {d['downtime_iters']:.1f} iterations of the new layout)"
            )
        else:
            print(f"round {i + 1}: no re-plan (no layout estimated faster by the threshold)")


if __name__ == "__main__":
    sys.exit(main())
