"""Shared-cluster benchmark: N small HolmesJobs (default 20) submitted at once onto the local
cluster's 6 nodes x 2 GPUs (hack/topologies/default.yaml, pods run by the node agent as `sleep`
processes), against the real control plane and the operator.

Reports the makespan (first apply -> every job Succeeded) against the ideal makespan (total
node-seconds of work / nodes: a perfect packing with no start-up cost), their ratio (target
<= 1.25, exit 1 if missed), each job's wait, and checks from the pods' container start/finish
times that no two jobs' pods ever held the same GPUs (per node, the GPUs of the pods running at
once never exceed the node's 2).

    .venv/bin/python bench/shared_queue.py                 # starts a private local cluster
    HOLMES_KUBECONFIG=.holmes/kubeconfig .venv/bin/python bench/shared_queue.py --jobs 10
    HOLMES_KUBECONFIG=... .venv/bin/python bench/shared_queue.py --jobs 3 --scale 0.1   # the small mode
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "hack")]  # operator_apply; holmes_dev and localkube
import yaml  # noqa: E402
from holmes_dev.jobs import tiny_job  # noqa: E402
from operator_apply import Bench, OperatorProcess, cluster_kubeconfig, stop_cluster  # noqa: E402

NODES, GPUS = 6, 2
TARGET = 1.25


def shape(i: int) -> tuple[int, int]:
    """(nodes, seconds) of job i: a deterministic mix of 1- and 2-node jobs of 20 to 40 s."""
    return (2 if i % 3 == 0 else 1), (20, 30, 40, 25, 35)[i % 5]


def manifest(name: str, ns: str, nodes: int, seconds: int) -> dict:
    return tiny_job(name, ns, nodes, GPUS, command=["sleep", str(seconds)], run_policy={"backoffLimit": 0})


def ts(s: str | None) -> float | None:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() if s else None


def overlaps(pods: list[dict]) -> tuple[int, list[str]]:
    """(most GPUs ever held at once on one node, descriptions of any over-subscription), from the
    containers' own start/finish times."""
    by_node: dict[str, list[tuple[float, float, str]]] = {}
    for p in pods:
        cs = (p.get("status", {}).get("containerStatuses") or [{}])[0].get("state", {})
        run = cs.get("terminated") or cs.get("running") or {}
        start, end = ts(run.get("startedAt")), ts(run.get("finishedAt")) or time.time()
        node = p["spec"].get("nodeName")
        if start is None or not node:
            continue
        by_node.setdefault(node, []).append((start, end, p["metadata"]["name"]))
    worst, bad = 0, []
    for node, spans in by_node.items():
        for s, _, _ in spans:  # the load at each start instant (timestamps are whole seconds)
            at = [w for (a, b, w) in spans if a <= s < b]
            gpus = GPUS * len(at)
            worst = max(worst, gpus)
            if gpus > GPUS:
                bad.append(f"{node} at {s:.0f}: {', '.join(at)}")
    return worst, bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every job's seconds (0.1: the small mode `make test` runs, where start-up "
        "dominates and the makespan target is not expected to hold)",
    )
    a = ap.parse_args()
    cp, kubeconfig = cluster_kubeconfig("bench-shared")
    b = Bench(kubeconfig)
    tmp = Path(tempfile.mkdtemp(prefix="holmes-bench-"))
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    op = None
    try:
        b.install_crd()
        b.kubectl("create", "namespace", ns)
        for _ in range(60):  # pods need the namespace's default service account
            if b.kubectl("get", "serviceaccounts", "-n", ns, "-o", "name").strip():
                break
            time.sleep(0.5)
        op = OperatorProcess(kubeconfig, [ns], tmp / "operator.log").start()
        time.sleep(1)  # the node index fills
        jobs = {f"j{i:02d}": (n, max(1, round(s * a.scale))) for i in range(a.jobs) for n, s in [shape(i)]}
        work = sum(n * s for n, s in jobs.values())
        ideal = work / NODES

        docs = [manifest(name, ns, n, s) for name, (n, s) in jobs.items()]
        t0 = time.time()
        b.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        started: dict[str, float] = {}
        done: dict[str, str] = {}
        deadline = t0 + 10 * ideal + 120
        while len(done) < len(jobs) and time.time() < deadline:
            items = json.loads(b.kubectl("get", "holmesjobs", "-n", ns, "-o", "json"))["items"]
            for j in items:
                st, name = j.get("status") or {}, j["metadata"]["name"]
                if st.get("phase") == "Running" and name not in started:
                    started[name] = time.time()
                if st.get("phase") in ("Succeeded", "Failed"):
                    done.setdefault(name, st["phase"])
            time.sleep(0.5)
        makespan = time.time() - t0
        pods = json.loads(b.kubectl("get", "pods", "-n", ns, "-o", "json"))["items"]
        worst, bad = overlaps(pods)
        failed = sorted(n for n, ph in done.items() if ph != "Succeeded")
        missing = sorted(set(jobs) - set(done))
        ratio = makespan / ideal
        waits = sorted(started[n] - t0 for n in started)
        print(
            f"{'jobs':>5} {'nodes':>5} {'work node-s':>11} {'ideal s':>8} {'makespan s':>10} {'ratio':>6} "
            f"{'max GPUs/node':>13} {'oversubscribed':>14} {'median wait s':>13}"
        )
        print(
            f"{len(jobs):>5} {NODES:>5} {work:>11} {ideal:>8.1f} {makespan:>10.1f} {ratio:>6.2f} "
            f"{worst:>13} {len(bad):>14} {waits[len(waits) // 2] if waits else float('nan'):>13.1f}"
        )
        ok = ratio <= TARGET and not bad and not failed and not missing
        print(
            f"target makespan/ideal <= {TARGET}, no GPU held twice, every job Succeeded: "
            + ("met" if ok else f"MISSED (failed {failed}, unfinished {missing}, oversubscribed {bad[:3]})")
        )
        return 0 if ok else 1
    finally:
        if op:
            op.stop()
        b.kubectl("delete", "namespace", ns, "--wait=false")
        stop_cluster(cp)


if __name__ == "__main__":
    sys.exit(main())
