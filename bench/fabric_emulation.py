"""Holmes' core claim measured on an emulated heterogeneous fabric: the real planner's layouts,
run by the real trainer under torchrun, one "node" per network namespace.

    sudo .venv/bin/python bench/fabric_emulation.py [--cross-mbit 200] [--fast-mbit 2000] \
        [--rounds 2] [--iters 3]
    sudo .venv/bin/python bench/fabric_emulation.py --cleanup      # remove leftovers of a killed run
    sudo .venv/bin/python bench/fabric_emulation.py --smoke        # seconds: the code path, no numbers

Fabric (bench/fabric_netns.py): 4 namespaces, node-1/node-3 in island A (east, "InfiniBand"),
node-2/node-4 in island B (west, "RoCE"), each node's NIC shaped at --fast-mbit, one trunk
between the islands shaped at --cross-mbit (tbf). Node names interleave the islands, as
purchase order does in the paper's clusters.

Cases, each a fresh torchrun per node (`ip netns exec`, gloo, static rendezvous, 1 process per
node, pinned so that each core runs one DP replica's pipeline), same job, median step over the
iterations after --warmup, pooled over --rounds (every other round in reverse order):
  holmes      holmes.plan.plan, nicSelection auto: stage 0 on one island, stage 1 on the other;
              DP groups stay inside an island, only pipeline activations cross the trunk
  rank order  holmes.plan.megatron_default (nicSelection off, uniform layers, same degrees):
              nodes in name order, so every DP group spans both islands
  holmes sync the holmes layout with HOLMES_OVERLAP=0 (synchronous optimizer), shaped trunk
  all-fast    the holmes layout with the trunk unshaped (upper bound)
The planner's estimate for each case is printed next to the measurement, with the cost model
calibrated to this machine: the compute rate of the trainer's transformer block on one thread
(shared by the processes on a core), link rates from a TCP stream through the emulated fabric,
and gloo's reduce-scatter counted as the all-reduce it runs. "other load" is the CPU other work
used while a case ran (the machine's busy time minus ours): when it is not ~0, times are inflated.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "hack")]  # fabric_netns; holmes_dev
import fabric_netns as fab  # noqa: E402
from holmes_dev.jobs import holmes_job  # noqa: E402

from holmes.contract import Layout  # noqa: E402
from holmes.plan import CostModelConfig, compare, plan  # noqa: E402
from holmes.plan.topology import Fabric  # noqa: E402

MASTER_PORT = 29500  # inside the namespaces: no clash with anything on the host


# ---- pure: what the planner sees ------------------------------------------------------------------


def node_dicts(spec: fab.FabricSpec, nic_gbps: float) -> list[dict[str, Any]]:
    """v1 Node objects for the emulated nodes, labelled the way Holmes' labeller labels them."""
    out = []
    for n in spec.nodes:
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": n.name,
                    "labels": {
                        "kubernetes.io/hostname": n.name,
                        "holmes.dev/cluster": n.cluster,
                        "holmes.dev/nic": n.nic,
                        "holmes.dev/nic-gbps": f"{nic_gbps:.4g}",
                    },
                },
                "status": {
                    "allocatable": {"nvidia.com/gpu": "1", "cpu": "1"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
    return out


def job_manifest(a: argparse.Namespace, nodes: int) -> dict[str, Any]:
    data = nodes // 2  # PP=2 across the islands, DP inside
    return holmes_job(
        "fabric-bench",
        {
            "model": {
                "layers": a.layers,
                "hiddenSize": a.hidden,
                "attentionHeads": a.heads,
                "seqLength": a.seq,
                "vocabSize": a.vocab,
            },
            "training": {
                "globalBatchSize": data * a.micro_batch * a.micro_batches,
                "microBatchSize": a.micro_batch,
                "iterations": a.warmup + a.iters,
                "learningRate": 1e-4,
                "seed": 7,
                "activationRecompute": False,
                "data": {"synthetic": {}},
            },
            "parallelism": {
                "tensor": 1,
                "pipeline": 2,
                "data": data,
                "partition": "adaptive",
                "nicSelection": "auto",
            },
            "nodes": {"count": nodes, "gpusPerNode": 1},
        },
    )


def planner_config(
    tflops: float, intra_gbps: float, cross_gbps_per_node: float, overlap: bool = True
) -> CostModelConfig:
    """The cost model with this machine's numbers: a "GPU" is one CPU process (fp32 everywhere),
    links are measured TCP goodput, so every efficiency is 1."""
    # grad_bytes 8: gloo's reduce_scatter_tensor runs as an all-reduce (measured: same time for the
    # same buffer), twice the bytes a ring reduce-scatter of fp32 gradients moves.
    return CostModelConfig(
        gpu_peak_tflops=tflops,
        compute_efficiency=1.0,
        gpu_memory_gib=16.0,
        fabric=Fabric(
            net_efficiency=(("infiniband", 1.0), ("roce", 1.0)),
            socket_efficiency=1.0,
            socket_gbps=intra_gbps,
            cross_cluster_gbps=cross_gbps_per_node,
        ),
        overlap=overlap,
        grad_bytes=8,
        param_bytes=4,
        activation_bytes=4,
    )


def islands_of_groups(layout: Layout, spec: fab.FabricSpec, kind: str) -> list[set[str]]:
    """For each process group of ``kind``, the islands its nodes are on."""
    return [
        {spec.node(layout.rank_info(r).node).island for r in g.ranks} for g in layout.process_groups(kind)
    ]


def crosses(layout: Layout, spec: fab.FabricSpec, kind: str) -> bool:
    return any(len(s) > 1 for s in islands_of_groups(layout, spec, kind))


def launch_commands(
    layout: Layout,
    spec: fab.FabricSpec,
    job: str,
    layout_file: str,
    metrics: str,
    python: str = sys.executable,
    launcher: str = "torch.distributed.run",
) -> list[tuple[str, list[str]]]:
    """One torchrun per node in its namespace; node rank i = layout.nodes[i] (torchrun's numbering,
    the Layout contract's); rank 0's node hosts the rendezvous and is MASTER_ADDR by name.
    ``launcher``: ``holmes.trainer.run`` for a gang stopped the way a pod is (SIGTERM: the
    workers checkpoint and exit 83), plain torchrun otherwise."""
    out = []
    for rank, name in enumerate(layout.nodes):
        node = spec.node(name)
        out.append(
            (
                name,
                [
                    "ip",
                    "netns",
                    "exec",
                    node.netns,
                    python,
                    "-m",
                    launcher,
                    f"--nnodes={len(layout.nodes)}",
                    f"--nproc-per-node={layout.gpus_per_node}",
                    f"--node-rank={rank}",
                    "--rdzv-backend=static",
                    f"--master-addr={layout.nodes[0]}",
                    f"--master-port={MASTER_PORT}",
                    "--max-restarts=0",
                    "-m",
                    "holmes.trainer",
                    "--job",
                    job,
                    "--layout",
                    layout_file,
                    *(["--metrics-file", metrics] if rank == 0 else []),
                ],
            )
        )
    return out


def measured_iterations(lines: list[dict[str, Any]], warmup: int) -> list[dict[str, Any]]:
    """Rank 0's iteration lines after the warm-up ones."""
    its = [l for l in lines if l.get("holmes") == "iteration"][warmup:]
    if not its:
        raise ValueError(f"no iteration after the {warmup} warm-up ones in the metrics")
    return its


def core_of(layout: Layout, node_rank: int, cores: list[int]) -> int:
    """The core a node's processes are pinned to: one per DP replica, so each core runs one whole
    pipeline (stages alternate in 1F1B) and every layout gets the same placement by role. Left to
    the scheduler, which two of the four processes share a core changes from run to run and so
    does the step time."""
    dp = layout.rank_info(node_rank * layout.gpus_per_node).dp_index
    return cores[dp % len(cores)]


def summarize_run(its: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over measured iteration lines (pooled over rounds)."""
    med = statistics.median
    return {
        "seconds": med([l["iterationSeconds"] for l in its]),
        "tokensPerSecond": med([l["tokensPerSecond"] for l in its]),
        "exposedComm": med([l["time"]["exposedComm"] for l in its]),
        "bubble": med([l["time"]["bubble"] for l in its]),
        "compute": med([l["time"]["compute"] for l in its]),
        "loss": its[-1]["loss"],
        "iterations": len(its),
    }


# ---- processes ------------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Every process below pid (torchrun starts its workers in new sessions: no group kill)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(procs: list[subprocess.Popen]) -> None:
    """SIGTERM, then SIGKILL, every launched process and its descendants, by PID."""
    pids = []
    for p in procs:
        if p.poll() is None:
            pids += [p.pid]
        pids += descendants(p.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 3
        while time.time() < deadline and any(
            os.path.exists(f"/proc/{pid}") and not _zombie(pid) for pid in pids
        ):
            time.sleep(0.1)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def machine_busy_seconds() -> float:
    """CPU seconds all cores have spent busy since boot (/proc/stat: everything but idle, iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of its waited-for descendants (the trainers, once reaped)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


LIVE: list[subprocess.Popen] = []  # what the signal handlers and finally blocks must stop


@dataclass
class Case:
    name: str
    layout: Layout
    estimate: dict[str, Any]
    trunk_shaped: bool = True
    env: dict[str, str] = field(default_factory=dict)
    iterations: list[dict[str, Any]] = field(default_factory=list)  # measured, all rounds
    error: str | None = None
    other_cores: list[float] = field(default_factory=list)  # per run: CPU others used meanwhile

    @property
    def result(self) -> dict[str, float] | None:
        return summarize_run(self.iterations) if self.iterations and not self.error else None


def trainer_env(timeout: float, bucket_elements: int, logdir: str, extra: dict[str, str]) -> dict[str, str]:
    """The trainers' environment: one thread, gloo over the namespace's eth0, the bench's limits."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "eth0",
        "HOLMES_BACKEND": "gloo",
        "HOLMES_TIMEOUT_SECONDS": str(timeout),
        "HOLMES_BUCKET_ELEMENTS": str(bucket_elements),
        "HOLMES_TERMINATION_LOG": os.path.join(logdir, "termination-log"),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def start_gang(
    commands: list[tuple[str, list[str]]],
    env: dict[str, str],
    logdir: str,
    cwd: str,
    wrap=lambda rank, cmd: cmd,
) -> list[tuple[str, subprocess.Popen, Any]]:
    """Start every node's command (``wrap``ped: pinning, a CPU budget), its output in
    ``logdir/<node>.log``; each process is in LIVE until the caller stops it (kill_tree)."""
    gang = []
    for rank, (name, cmd) in enumerate(commands):
        p, log = start(name, wrap(rank, cmd), env, logdir, cwd)
        gang.append((name, p, log))
    return gang


def start(name: str, cmd: list[str], env: dict[str, str], logdir: str, cwd: str | None = None):
    """One process in a session of its own, its output in ``logdir/<name>.log``; in LIVE until
    the caller stops it (kill_tree). Returns the process and its open log."""
    log = open(os.path.join(logdir, f"{name}.log"), "w")
    p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
    LIVE.append(p)
    return p, log


def run_case(
    case: Case, spec: fab.FabricSpec, job: dict, a: argparse.Namespace, workdir: str, round_: int = 0
) -> list[dict[str, Any]]:
    """One torchrun per node for this case; returns rank 0's measured iteration lines (also
    appended to case.iterations), or [] with case.error set."""
    d = os.path.join(workdir, f"{case.name.replace(' ', '-')}-{round_}")
    os.makedirs(d)
    job_file, lay_file, metrics = (os.path.join(d, x) for x in ("job.yaml", "layout.json", "metrics.jsonl"))
    with open(job_file, "w") as f:
        yaml.safe_dump(job, f)
    with open(lay_file, "w") as f:
        f.write(case.layout.to_json())
    env = trainer_env(a.timeout, a.bucket_elements, d, case.env)
    procs, logs = [], []
    t0, busy0, own0 = time.time(), machine_busy_seconds(), own_cpu_seconds()
    try:
        cores = sorted(os.sched_getaffinity(0))

        def pin(rank: int, cmd: list[str]) -> list[str]:
            # taskset, not preexec_fn: this process has torch's threads by now
            return ["taskset", "-c", str(core_of(case.layout, rank, cores))] + cmd if a.pin else cmd

        gang = start_gang(
            launch_commands(case.layout, spec, job_file, lay_file, metrics), env, d, workdir, pin
        )
        logs = [(name, log) for name, _, log in gang]
        procs = [p for _, p, _ in gang]
        deadline = time.time() + a.timeout
        while any(p.poll() is None for p in procs):
            if time.time() > deadline:
                case.error = f"timed out after {a.timeout} s"
                break
            if any(p.returncode for p in procs if p.poll() is not None):
                time.sleep(2)  # let the others report why, then stop them
                break
            time.sleep(0.2)
    finally:
        kill_tree(procs)
        for p in procs:
            LIVE.remove(p)
        for _, log in logs:
            log.close()
    # other work on the machine while this case ran, in cores: it slows the case down
    case.other_cores.append(
        max(0.0, (machine_busy_seconds() - busy0) - (own_cpu_seconds() - own0)) / max(time.time() - t0, 1e-9)
    )
    bad = [(name, p.returncode) for (name, _), p in zip(logs, procs) if p.returncode]
    if bad and not case.error:
        case.error = "exit codes " + ", ".join(f"{n}={c}" for n, c in bad)
    if case.error:
        tail = open(os.path.join(d, f"{bad[0][0] if bad else logs[0][0]}.log")).read()[-1500:]
        case.error += f" (logs in {d}):\n{tail}"
        return []
    try:
        with open(metrics) as f:
            its = measured_iterations([json.loads(l) for l in f if l.strip()], a.warmup)
    except (OSError, ValueError) as e:
        case.error = f"rank 0's metrics unusable: {e} (logs in {d})"
        return []
    case.iterations += its
    return its


# ---- calibration ------------------------------------------------------------------------------------


def block_gflops(a: argparse.Namespace, windows: int = 5, seconds: float = 0.25) -> float:
    """Single-thread rate of the trainer's own transformer block (forward + backward) at the job's
    micro-batch shape, in the planner's FLOP count: what one trainer process computes at when it
    has a core to itself. Only compute is timed here; the network is what the cases measure."""
    import torch

    from holmes.contract import ModelSpec
    from holmes.contract.flops import layer_fwd_flops_per_token
    from holmes.trainer.models.gpt import Block
    from holmes.trainer.tensor_parallel import TensorParallel

    torch.set_num_threads(1)
    cfg = ModelSpec(
        layers=1, hidden_size=a.hidden, attention_heads=a.heads, seq_length=a.seq, vocab_size=a.vocab
    )
    block = Block(cfg, TensorParallel())  # one rank: no tensor parallelism
    x = torch.randn(a.micro_batch, a.seq, a.hidden, requires_grad=True)
    step = lambda: block(x).sum().backward()  # noqa: E731
    step()
    flops = 3 * a.micro_batch * a.seq * layer_fwd_flops_per_token(a.hidden, cfg.ffn_hidden_size, a.seq)
    best = 0.0
    for _ in range(windows):  # the best window: other work on the cores only slows it
        reps, t = 0, time.perf_counter()
        while time.perf_counter() - t < seconds:
            step()
            reps += 1
        best = max(best, flops * reps / (time.perf_counter() - t) / 1e9)
    return best


# ---- main --------------------------------------------------------------------------------------------


def plans(spec: fab.FabricSpec, job: dict, tflops: float, intra_gbps: float, cross_gbps: float) -> list[Case]:
    nodes = node_dicts(spec, intra_gbps)
    per_island = len(spec.nodes) // 2  # all of an island's nodes share the trunk at once
    shaped = planner_config(tflops, intra_gbps, cross_gbps / per_island)
    holmes, rank_order, _ = compare(nodes, job, shaped)
    same = json.loads(json.dumps(job))  # the holmes layout, re-estimated on other settings
    same["spec"]["parallelism"]["partition"] = [s.num_layers for s in holmes.stages]
    sync_est = plan(nodes, same, replace(shaped, overlap=False))
    fast_est = plan(nodes, same, planner_config(tflops, intra_gbps, intra_gbps))
    return [
        Case("holmes", holmes, holmes.estimate),
        Case("rank order", rank_order, rank_order.estimate),
        Case("holmes sync", holmes, sync_est.estimate, env={"HOLMES_OVERLAP": "0"}),
        Case("all-fast", holmes, fast_est.estimate, trunk_shaped=False),
    ]


def describe(case: Case, spec: fab.FabricSpec) -> str:
    """Per stage: layers and nodes with their island, e.g. ``3L node-1(A)+node-3(A) | 1L ...``."""
    return " | ".join(
        f"{s.num_layers}L " + "+".join(f"{n}({spec.node(n).island.upper()})" for n in s.nodes)
        for s in case.layout.stages
    )


def add_job_arguments(
    ap: argparse.ArgumentParser, *, layers: int, hidden: int, heads: int, vocab: int
) -> None:
    """The job's model and batch flags, shared by the fabric benches (block_gflops reads them)."""
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--hidden", type=int, default=hidden)
    ap.add_argument("--heads", type=int, default=heads)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=vocab)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--micro-batches", type=int, default=4, help="per DP rank and iteration")
    ap.add_argument(
        "--bucket-elements",
        type=int,
        default=2_000_000,
        help="gradient bucket size (HOLMES_BUCKET_ELEMENTS): several buckets per stage so "
        "the overlapped optimizer has something to overlap",
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cross-mbit", type=float, default=200, help="trunk between the islands (tbf)")
    ap.add_argument("--fast-mbit", type=float, default=2000, help="each node's NIC (tbf); 0 = unshaped veth")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3, help="measured iterations per case and round")
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="run every case this many times, order reversed every other round; iterations pooled",
    )
    add_job_arguments(ap, layers=4, hidden=512, heads=8, vocab=8192)
    ap.add_argument("--timeout", type=int, default=180, help="seconds per case before it is killed")
    ap.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="let the scheduler place the processes (default: one core per DP replica)",
    )
    ap.add_argument("--skip-sync", action="store_true", help="leave out the synchronous-optimizer case")
    ap.add_argument("--keep-logs", action="store_true", help="keep the per-case logs and metrics")
    ap.add_argument(
        "--cleanup", action="store_true", help="only remove leftovers (namespaces, /etc/netns dirs)"
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the small mode `make test` runs: a toy model, the holmes case only, one measured "
        "iteration (its numbers mean nothing)",
    )
    return ap


SMOKE = dict(layers=4, hidden=64, heads=4, seq=32, vocab=256, warmup=1, iters=1, rounds=1, timeout=120)
SMOKE_CASES = ("holmes",)  # each case starts 8 Pythons: one is enough to prove the path


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.smoke:
        vars(a).update(SMOKE)
    if min(a.warmup, a.iters - 1, a.rounds - 1, a.timeout - 1) < 0:
        print(
            "fabric_emulation: --iters, --rounds and --timeout must be >= 1, --warmup >= 0", file=sys.stderr
        )
        return 2
    spec = fab.two_islands(per_island=2, fast_mbit=a.fast_mbit, cross_mbit=a.cross_mbit)
    with fab.exclusive():
        problems = fab.missing_prerequisites()
        if a.pin and shutil.which("taskset") is None:
            problems.append("`taskset` not found: install util-linux, or pass --no-pin")
        if problems:
            print(
                "fabric_emulation: cannot emulate the fabric on this machine:\n  - "
                + "\n  - ".join(problems),
                file=sys.stderr,
            )
            return 2
        return run_bench(a, spec)


def run_bench(a: argparse.Namespace, spec: fab.FabricSpec) -> int:
    """Build the fabric, run the cases, print the table; the fabric is removed on every way out."""
    removed = fab.destroy(spec)  # leftovers of a killed run, by exact name
    if a.cleanup:
        print("removed: " + (", ".join(removed) if removed else "nothing (no leftovers)"))
        return 0
    if removed:
        print("removed leftovers: " + ", ".join(removed))

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
    ):  # SIGINT too: a background job starts with it ignored
        signal.signal(sig, on_signal)

    workdir = tempfile.mkdtemp(prefix="holmes-fabric-")
    t_start = time.time()
    cases: list[Case] = []
    try:
        fab.build(spec)
        by_island = {isl: [n for n in spec.nodes if n.island == isl] for isl in "ab"}
        intra = fab.measure_mbit(by_island["a"][0], by_island["a"][1], megabytes=48) / 1000
        cross = fab.measure_mbit(by_island["a"][0], by_island["b"][0], megabytes=8) / 1000
        world = len(spec.nodes)
        gflops = block_gflops(a)
        ncores = len(os.sched_getaffinity(0))
        share = min(1.0, ncores / world)  # processes share the cores
        job = job_manifest(a, world)
        cases = plans(spec, job, gflops * share / 1000, intra, cross)
        if a.skip_sync:
            cases = [c for c in cases if c.name != "holmes sync"]
        if a.smoke:
            cases = [c for c in cases if c.name in SMOKE_CASES]
        h = cases[0].layout
        print(
            f"fabric: 2 islands x 2 nodes (network namespaces); node NIC {a.fast_mbit:g} Mbit/s tbf "
            f"(measured {intra * 1000:.0f}), trunk between islands {a.cross_mbit:g} Mbit/s tbf "
            f"(measured {cross * 1000:.0f}) shared by each island's 2 nodes"
        )
        print(
            f"job: GPT {a.layers}L h={a.hidden} s={a.seq} V={a.vocab}, PP={h.pipeline} x DP={h.data}, "
            f"micro-batch {a.micro_batch} x {h.micro_batches}, fp32, gloo, 1 process/node on "
            f"{ncores} cores{' (one per DP replica)' if a.pin else ''}; "
            f"{a.warmup} warm-up + {a.iters} measured iterations per case "
            f"x {a.rounds} round(s)"
        )
        print(
            f"load average at start: {os.getloadavg()[0]:.1f} (other work on the cores inflates and "
            f"scatters the times)"
        )
        print(
            f"planner calibration: a transformer block computes at {gflops:.1f} GFLOP/s per thread, "
            f"x {share:.2f} core share per process; links as measured; gloo reduce-scatter = all-reduce "
            f"(twice the bytes)"
        )
        for r in range(a.rounds):
            for case in cases if r % 2 == 0 else cases[::-1]:  # alternate to spread drift
                if case.error:
                    continue
                fab.set_trunk(a.cross_mbit if case.trunk_shaped else 0)
                t = time.time()
                its = run_case(case, spec, job, a, workdir, r)
                status = (
                    f"{statistics.median(i['iterationSeconds'] for i in its):.3f} s/iter" if its else "FAILED"
                )
                print(
                    f"  round {r + 1} {case.name:12} {status:14} ({time.time() - t:.0f} s, other load "
                    f"{case.other_cores[-1]:.2f} cores)  {describe(case, spec)}",
                    flush=True,
                )
                if case.error:
                    print(f"    {case.error}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted: stopping the trainers and removing the fabric", file=sys.stderr)
        return 130
    except fab.FabricError as e:
        print(f"fabric_emulation: {e}", file=sys.stderr)
        return 1
    finally:
        kill_tree(list(LIVE))
        fab.destroy(spec)
        if not a.keep_logs and not any(c.error for c in cases):
            shutil.rmtree(workdir, ignore_errors=True)
        elif os.path.isdir(workdir):
            print(f"logs kept in {workdir}", file=sys.stderr)

    print_table(cases, spec)
    print(f"total {time.time() - t_start:.0f} s, load average at the end: {os.getloadavg()[0]:.1f}")
    return 0 if all(c.result for c in cases) else 1


def print_table(cases: list[Case], spec: fab.FabricSpec) -> None:
    sys.path.insert(0, HERE)
    from trainer_common import table

    ok = {c.name: c for c in cases if c.result}
    rows = []
    for c in cases:
        r = c.result or {}
        est = c.estimate.get("iterationSeconds")
        rows.append(
            [
                c.name,
                "yes" if crosses(c.layout, spec, "dp") else "no",
                "/".join(str(s.num_layers) for s in c.layout.stages),
                r.get("seconds", float("nan")),
                r.get("tokensPerSecond", float("nan")),
                r.get("exposedComm", float("nan")),
                est if est is not None else float("nan"),
                (r["seconds"] / est) if r and est else float("nan"),
                statistics.mean(c.other_cores) if c.other_cores else float("nan"),
            ]
        )
    print()
    print(
        table(
            [
                "case",
                "DP crosses trunk",
                "layers",
                "s/iter",
                "tokens/s",
                "exposed comm s",
                "planner est s",
                "measured/est",
                "other load",
            ],
            rows,
        )
    )
    busiest = max((x for c in cases for x in c.other_cores), default=0.0)
    if busiest > 0.25:
        print(
            f"warning: other work used up to {busiest:.2f} cores while a case ran (column 'other load'); "
            "those times are inflated, rerun on a quiet machine to compare"
        )
    hol = ok.get("holmes")

    def ratio(other: str, label: str) -> None:
        if hol and other in ok:
            m = ok[other].result["seconds"] / hol.result["seconds"]
            e = ok[other].estimate["iterationSeconds"] / hol.estimate["iterationSeconds"]
            print(f"{label}: measured {m:.2f}x   planner estimate {e:.2f}x")

    print()
    ratio("rank order", "Holmes speed-up over rank order (rank-order s/iter / Holmes s/iter)")
    ratio("all-fast", "Holmes vs all-fast upper bound (all-fast s/iter / Holmes s/iter, 1.0 = no loss)")
    ratio("holmes sync", "overlapped optimizer speed-up (sync s/iter / overlapped s/iter)")


if __name__ == "__main__":
    sys.exit(main())
