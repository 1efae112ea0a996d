"""The operator's CPU per launch and per running job's reconcile, without a cluster's noise.

Run: .venv/bin/python bench/placement_cpu.py [--nodes 2000] [--running 150] [--launch 40]
     .venv/bin/python bench/placement_cpu.py --against /tmp/old   # a checkout of an older commit

The real reconcile pipeline (observe, decide, write: operator/holmes/operator/pipeline.py) on the
fake world the placement tests use (tests/helpers/operator/pipeline_world.py: the real caches and
placement lock, the API server's part played in memory), with nodes slimmed as the node informer
keeps them: N 8-GPU nodes in 8 islands; ``--running`` jobs of bench/operator_scale.py's size mix
(each on the island with the most room, at most as many nodes as are left there) launched first,
then ``--launch`` more, each reconciled until it launches (the CPU seconds of those reconciles,
per job), then one reconcile of every launched job (per reconcile). One thread: this is the CPU
a decision costs, which the operator's threads share under one GIL (bench/operator_scale.py
measures the launches on a real control plane).

``--against DIR``: the same runs with ``holmes`` imported from the checkout DIR (e.g. made with
``git worktree add DIR HEAD~3``), in fresh processes alternating with this checkout's so both
see the same load; the last lines give both medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIZES = (1, 1, 2, 2, 2, 4, 4, 8, 8, 16, 32)  # bench/operator_scale.py's mix
ISLANDS = 8
KINDS = ("infiniband", "roce", "ethernet")


def measure(nodes: int, running: int, launch: int, seed: int) -> dict:
    """CPU ms per launch and per running job's reconcile, in this process."""
    from holmes.operator.core import capacity
    from holmes.operator.kube import Caches
    from holmes.operator.watches import slim_node
    from localkube.operatorproc import api_node
    from tests.helpers.operator.pipeline_world import WorldIO, pipeline, waiting_job

    rng = random.Random(seed)
    caches = Caches()
    for i in range(nodes):
        island, nic = i % ISLANDS, KINDS[i % ISLANDS % 3]
        alloc = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}
        if nic != "ethernet":
            alloc[f"rdma/{nic}"] = "1k"
        labels = {"hollow": "true", "holmes.dev/nic": nic, "holmes.dev/cluster": f"island-{island}"}
        node = slim_node(
            api_node(f"n-{i:05d}", labels, alloc, {"key": "hollow", "value": "1", "effect": "NoSchedule"})
        )
        caches.nodes.put(node)

    class IO(WorldIO):  # the pod informer's slim copy too, as the operator's shared cache holds
        def stamp(self, obj: dict) -> dict:
            obj = super().stamp(obj)
            if "containers" in (obj.get("spec") or {}):
                self.caches.cluster_pods.put(capacity.slim_pod(obj))
            return obj

    pl = pipeline(caches, IO(caches))
    # the node list a job loop hands its reconcile (a checkout before Store.snapshot: a fresh list)
    listing = getattr(caches.nodes, "snapshot", caches.nodes.values)

    free = [len(range(i, nodes, ISLANDS)) for i in range(ISLANDS)]  # nodes per island not asked for

    def job(i: int) -> dict:  # on the island with the most room, at most what is left there
        island = max(range(ISLANDS), key=lambda k: (free[k], rng.random()))
        n = max(1, min(rng.choice(SIZES), free[island]))
        free[island] = max(0, free[island] - n)
        return waiting_job(
            f"j{i:04d}",
            i,
            count=n,
            gpus=8,
            model={
                "layers": 16,
                "hiddenSize": 1024,
                "attentionHeads": 16,
                "seqLength": 1024,
                "vocabSize": 32000,
            },
            training={
                "globalBatchSize": 64 * n,
                "microBatchSize": 1,
                "iterations": 100,
                "learningRate": 1e-4,
            },
            nodes={
                "count": n,
                "gpusPerNode": 8,
                "selector": {
                    "matchLabels": {"hollow": "true"},
                    "matchExpressions": [
                        {"key": "holmes.dev/cluster", "operator": "In", "values": [f"island-{island}"]}
                    ],
                },
            },
            template={
                "spec": {
                    "tolerations": [{"key": "hollow", "operator": "Exists"}],
                    "containers": [{"name": "trainer"}],
                }
            },
        )

    def launched(name: str) -> bool:
        return bool((caches.jobs.get("ns", name).get("status") or {}).get("launched"))

    def place(m: dict) -> bool:
        caches.jobs.put(m)
        name = m["metadata"]["name"]
        for _ in range(4):  # the first reconciles may only write the status
            pl.run(caches.jobs.get("ns", name), listing(), [])
            if launched(name):
                return True
        return False

    for i in range(running):
        place(job(i))
    start = time.process_time()
    placed = sum(place(job(i)) for i in range(running, running + launch))
    per_launch = (time.process_time() - start) / max(launch, 1)
    names = [j["metadata"]["name"] for j in caches.jobs.values() if launched(j["metadata"]["name"])]
    start = time.process_time()
    for name in names:
        pl.run(caches.jobs.get("ns", name), listing(), [])
    per_reconcile = (time.process_time() - start) / max(len(names), 1)
    return {
        "nodes": nodes,
        "running": running,
        "launched": placed,
        "launchCpuMs": round(1000 * per_launch, 2),
        "reconcileCpuMs": round(1000 * per_reconcile, 3),
    }


def run_in(root: Path, a: argparse.Namespace) -> dict:
    """One measurement in a fresh process, ``holmes`` imported from the checkout ``root``."""
    args = [
        "--nodes",
        str(a.nodes),
        "--running",
        str(a.running),
        "--launch",
        str(a.launch),
        "--seed",
        str(a.seed),
    ]
    env = dict(os.environ, HOLMES_BENCH_ROOT=str(root))
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--once", *args],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode:
        raise SystemExit(f"the run in {root} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--running", type=int, default=150, help="jobs launched before measuring")
    ap.add_argument("--launch", type=int, default=40, help="jobs whose launches are measured")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--against", type=Path, help="a checkout of another commit, run alternately")
    ap.add_argument("--small", action="store_true", help="make test's mode: 200 nodes, 20 + 8 jobs, once")
    ap.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.small:
        a.nodes, a.running, a.launch, a.repeat = 200, 20, 8, 1
    if min(a.nodes, a.launch, a.repeat) < 1 or a.running < 0:
        ap.error("--nodes, --launch and --repeat must be at least 1, --running at least 0")
    if a.against is not None and not (a.against / "operator" / "holmes" / "operator").is_dir():
        ap.error(f"--against {a.against}: not a Holmes checkout (no operator/holmes/operator in it)")
    if a.once:
        print(json.dumps(measure(a.nodes, a.running, a.launch, a.seed)))
        return
    roots = [REPO] + ([a.against.resolve()] if a.against else [])
    runs: dict[Path, list[dict]] = {r: [] for r in roots}
    for i in range(a.repeat):
        for root in roots:
            r = run_in(root, a)
            runs[root].append(r)
            print(f"[{i + 1}/{a.repeat}] {root}: {json.dumps(r)}", file=sys.stderr, flush=True)
    summary = {}
    for root, rs in runs.items():
        summary[str(root)] = {
            "launchCpuMs": statistics.median(r["launchCpuMs"] for r in rs),
            "reconcileCpuMs": statistics.median(r["reconcileCpuMs"] for r in rs),
            "launched": min(r["launched"] for r in rs),
        }
    if a.against:
        new, old = summary[str(REPO)], summary[str(roots[1])]
        summary["ratio"] = {
            k: round(old[k] / new[k], 2) if new[k] else None for k in ("launchCpuMs", "reconcileCpuMs")
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    root = Path(os.environ.get("HOLMES_BENCH_ROOT") or REPO)
    # the checkout measured: its distributions' folders before the installed ones (a namespace
    # package takes the first ``holmes/operator`` found), the harness folders of this checkout
    sys.path[:0] = [str(root / d) for d in ("operator", "contract", "trainer")] + [
        str(REPO),
        str(REPO / "hack"),
        str(REPO / "bench"),
    ]
    main()
