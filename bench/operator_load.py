"""Operator benchmark: the API load of steady running HolmesJobs, and the operator's CPU and
memory, against the real local control plane; then apply -> all pods of a 1,024-node job.

Part 1. N jobs (default 50) of 2 nodes each run on hollow nodes (operator_apply.bench_nodes: a
topology's ``playedBy: kwok`` nodes on the private cluster the bench starts with them, one pair
of nodes per job so that every job is placed). The cluster's kwok plays their kubelets: it
reports each pod Running with the IP its annotation names (127.0.0.1) without running it; the
bench serves one Prometheus endpoint on loopback that stands for every rank-0 trainer, its
iteration counter moving with time, so each job's progress changes between reads. (Loopback
pod IPs are invalid in Endpoints: the bench drops the jobs' Service selectors, see
``unselect_services``.) Then it reads
the API server's own counter (apiserver_request_total) over a window, before the jobs and while
they run, with the same operator, and reports requests per second per running job (target
<= 0.1), broken down by verb and resource, and the operator's CPU and memory.

Part 2 (--apply-nodes, default 1024; 0 skips): operator_apply's measure for that size (the
cluster's hollow nodes are as many as the larger part needs).

    .venv/bin/python bench/operator_load.py                 # starts a private local cluster
    .venv/bin/python bench/operator_load.py --jobs 10 --window 30 --apply-nodes 0   # quicker

With ``$HOLMES_KUBECONFIG`` the bench uses that cluster instead, which must already play its
nodes: ``--write-topology FILE`` writes them (the same ``--jobs``, ``--nodes-per-job`` and
``--apply-nodes``), then ``make cluster-up TOPOLOGY=FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]
import yaml  # noqa: E402
from operator_apply import (  # noqa: E402
    Bench,
    OperatorProcess,
    bench_nodes,
    hollow_cluster,
    job,
    measure_apply,
    print_apply,
    rdma_kind_flags,
    stop_cluster,
)

from localkube import hollow_nodes as hn  # noqa: E402

TARGET_PER_JOB = 0.1  # API requests per second per steady running job
# The (verb, resource) requests the operator makes per job (its RBAC, docs/api.md); the target
# is judged on these. Its LISTs and WATCHes are per operator, not per job (one watch per kind,
# listed again only when a watch expires), and the control plane's background (the hollow
# nodes' Leases and statuses, kwok's pod status writes) is not the operator's: both are in the "all" column.
PER_JOB_CALLS = {
    ("PATCH", "holmesjobs"),
    ("DELETE", "holmesjobs"),
    ("PATCH", "holmesjobs/status"),
    ("POST", "pods"),
    ("DELETE", "pods"),
    ("GET", "pods/log"),
    ("POST", "configmaps"),
    ("PUT", "configmaps"),
    ("POST", "services"),
    ("POST", "events"),
}
SLOT = "bench.holmes.dev/slot"
_SAMPLE = re.compile(r"^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$")


def load_job(name: str, ns: str, slot: int, nodes: int) -> dict:
    """operator_apply's job with a small model, on its own pair of nodes, running for ever."""
    j = job(name, ns, nodes)
    spec = j["spec"]
    spec["model"].update(layers=8, hiddenSize=512, attentionHeads=8, seqLength=512, vocabSize=32000)
    spec["training"].update(globalBatchSize=64, iterations=10**9)
    spec["nodes"]["selector"]["matchLabels"][SLOT] = str(slot)
    # kwok reports the pod Running on the address the trainer stand-in listens on
    spec["template"]["metadata"] = {"annotations": {hn.POD_IP: "127.0.0.1"}}
    spec["template"]["spec"]["containers"][0]["command"] = ["sleep", "infinity"]
    return j


class TrainerStandIn:
    """One loopback Prometheus endpoint answering for every rank-0 trainer."""

    def __init__(self) -> None:
        t0 = time.monotonic()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                it = int((time.monotonic() - t0) * 2)
                body = (
                    f"holmes_trainer_iteration {it}\nholmes_trainer_loss {10.0 / (1 + it):.6f}\n"
                    "holmes_trainer_tokens_per_second 1000\nholmes_trainer_tflops_per_gpu 1.0\n"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_pods_running(b: Bench, ns: str, expected: int, timeout: float = 600) -> None:
    """Until ``expected`` pods of ``ns`` are Running (kwok reports them so once bound)."""
    end = time.monotonic() + timeout
    running = 0
    while time.monotonic() < end:
        pods = json.loads(b.core.list_namespaced_pod(ns, _preload_content=False).data)["items"]
        running = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
        if running >= expected:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{running}/{expected} pods running in {timeout}s")


def unselect_services(b: Bench, ns: str) -> None:
    """Drop the selector of the jobs' headless Services. Their pods' IP here is loopback, which
    Endpoints refuse: the endpoints controller would retry (PUT endpoints, a Warning event each
    time) for minutes, load that real pod IPs never cause. The operator only checks that the
    Service exists, so it does not notice."""
    for svc in json.loads(b.core.list_namespaced_service(ns, _preload_content=False).data)["items"]:
        b.core.patch_namespaced_service(
            svc["metadata"]["name"], ns, {"spec": {"selector": None}}, _preload_content=False
        )


def request_counts(b: Bench) -> Counter:
    """apiserver_request_total summed by (verb, resource), resource requests only (the bench's
    own reads of /metrics are non-resource requests and so left out)."""
    out: Counter = Counter()
    for line in b.kubectl("get", "--raw", "/metrics").splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(kv.split("=", 1) for kv in re.findall(r'(\w+="[^"]*")', m.group(1)))
        labels = {k: v.strip('"') for k, v in labels.items()}
        if labels.get("resource"):
            sub = labels.get("subresource")
            res = labels["resource"] + (f"/{sub}" if sub else "")
            out[(labels.get("verb", "?"), res)] += float(m.group(2))
    return out


def measure_window(b: Bench, op: OperatorProcess | None, seconds: float) -> dict:
    """Requests/s over ``seconds`` (all, the operator's per-job calls, by verb and resource) and,
    with an operator, its CPU share and RSS."""
    c0, cpu0, t0 = request_counts(b), op.cpu_seconds() if op else 0.0, time.monotonic()
    time.sleep(seconds)
    c1, cpu1, t1 = request_counts(b), op.cpu_seconds() if op else 0.0, time.monotonic()
    dt = t1 - t0
    delta = c1 - c0  # positive changes only
    return {
        "seconds": dt,
        "rate": sum(delta.values()) / dt,
        "operator_rate": sum(n for call, n in delta.items() if call in PER_JOB_CALLS) / dt,
        "by": {f"{v} {r}": n / dt for (v, r), n in delta.most_common()},
        "cpu": (cpu1 - cpu0) / dt,
        "rss": op.rss_bytes() if op else 0,
    }


def settle(b: Bench, op: OperatorProcess, quiet: float, most: float = 300.0) -> None:
    """Wait until the control plane is back near ``quiet``: many nodes new to it set its
    controllers off for minutes (the TTL controller patches every node at 10/s), and the jobs'
    deletion ends in a burst of pod deletions; neither may count in the baseline nor against an
    apply."""
    end = time.monotonic() + most
    while time.monotonic() < end:
        rate = measure_window(b, op, 10.0)["rate"]
        print(f"  settling: {rate:.2f} requests/s (quiet: {quiet:.2f})", file=sys.stderr)
        if rate <= max(1.5 * quiet, quiet + 2.0):
            return
    print("  the control plane did not settle; measuring anyway", file=sys.stderr)


def wait_all_running(b: Bench, ns: str, jobs: int, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        items = json.loads(b.kubectl("get", "holmesjobs", "-n", ns, "-o", "json"))["items"]
        ok = [
            j
            for j in items
            if (j.get("status") or {}).get("phase") == "Running" and (j["status"].get("progress") or {})
        ]
        if len(ok) == jobs:
            return
        time.sleep(1)
    raise TimeoutError(f"{len(ok)}/{jobs} jobs Running with progress after {timeout}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--nodes-per-job", type=int, default=2)
    ap.add_argument("--window", type=float, default=60.0, help="seconds of each measurement window")
    ap.add_argument("--progress-interval", type=float, default=10.0, help="the operator's flag")
    ap.add_argument("--apply-nodes", type=int, default=1024, help="part 2's job size (0 skips)")
    ap.add_argument("--repeats", type=int, default=2, help="part 2's runs (the best counts)")
    ap.add_argument("--lease-seconds", type=float, default=10.0, help="the hollow nodes' Lease renewal")
    ap.add_argument(
        "--write-topology", metavar="FILE", help="write the hollow nodes' topology (playedBy: kwok) and exit"
    )
    a = ap.parse_args()
    nodes = a.jobs * a.nodes_per_job
    slots = lambda i: {SLOT: str(i // a.nodes_per_job)} if i < nodes else {}  # noqa: E731
    topology = bench_nodes(max(nodes, a.apply_nodes), slots, a.lease_seconds)
    if a.write_topology:
        Path(a.write_topology).write_text(yaml.safe_dump(topology, sort_keys=False))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="holmes-bench-load-"))
    t = time.monotonic()
    cp, kubeconfig = hollow_cluster("bench-load", topology, tmp, "operator_load")
    print(f"{len(topology['nodes'])} hollow nodes Ready after {time.monotonic() - t:.1f}s", file=sys.stderr)
    b = Bench(kubeconfig)
    paired = json.loads(b.core.list_node(label_selector=SLOT, _preload_content=False).data)["items"]
    if len(paired) < nodes:  # $HOLMES_KUBECONFIG's cluster, its topology written for other options
        raise RuntimeError(
            f"{len(paired)} nodes labelled {SLOT}, fewer than --jobs x --nodes-per-job = {nodes}: write "
            "the topology with these options (--write-topology FILE) and start the cluster with it"
        )
    stand_in = TrainerStandIn()
    op = None
    ns = f"load-{os.getpid()}"
    ok = True
    try:
        b.install_crd()
        quiet = measure_window(b, None, 10.0)["rate"]  # the control plane and its nodes, no operator
        op = OperatorProcess(
            kubeconfig,
            None,
            tmp / "operator.log",
            extra=[
                *rdma_kind_flags(),
                f"--trainer-metrics-port={stand_in.port}",
                f"--progress-interval={a.progress_interval}",
            ],
            port_range=None,
        ).start()
        b.create_namespace(ns)
        settle(b, op, quiet)
        print(f"baseline: the control plane and an idle operator, {a.window:g}s ...", file=sys.stderr)
        base = measure_window(b, op, a.window)
        t0 = time.monotonic()
        docs = "---\n".join(
            yaml.safe_dump(load_job(f"job-{i:03d}", ns, i, a.nodes_per_job)) for i in range(a.jobs)
        )
        b.kubectl("apply", "-f", "-", input=docs)
        wait_pods_running(b, ns, nodes)
        unselect_services(b, ns)
        wait_all_running(b, ns, a.jobs)
        print(f"{a.jobs} jobs running with progress after {time.monotonic() - t0:.0f}s", file=sys.stderr)
        time.sleep(max(15.0, a.progress_interval * 1.5))  # past the launch's own writes
        print(f"steady: {a.jobs} running jobs, {a.window:g}s ...", file=sys.stderr)
        load = measure_window(b, op, a.window)
        per_job = (load["operator_rate"] - base["operator_rate"]) / a.jobs
        per_job_all = (load["rate"] - base["rate"]) / a.jobs
        print(
            f"\nAPI requests/s (apiserver_request_total; {a.window:g}s windows; "
            f"progress every {a.progress_interval:g}s)"
        )
        print(f"{'':32} {'all':>8} {'operator, per-job calls':>24}")
        print(f"  control plane + idle operator  {base['rate']:8.2f} {base['operator_rate']:24.2f}")
        print(f"  with {a.jobs:>3} running jobs          {load['rate']:8.2f} {load['operator_rate']:24.2f}")
        print(
            f"  per running job                {per_job_all:8.4f} {per_job:24.4f}  "
            f"(target <= {TARGET_PER_JOB}: {'met' if per_job <= TARGET_PER_JOB else 'MISSED'})"
        )
        print("  by verb and resource, running minus idle (largest changes):")
        keys = sorted(
            set(load["by"]) | set(base["by"]),
            key=lambda k: -abs(load["by"].get(k, 0) - base["by"].get(k, 0)),
        )
        for k in keys[:8]:
            print(f"    {k:<40} {load['by'].get(k, 0) - base['by'].get(k, 0):+7.3f}")
        print(
            f"operator: CPU {base['cpu'] * 100:.1f}% idle, {load['cpu'] * 100:.1f}% with {a.jobs} jobs "
            "(of one core); "
            f"RSS {base['rss'] / 2**20:.0f} MiB idle, {load['rss'] / 2**20:.0f} MiB with {a.jobs} jobs"
        )
        ok = per_job <= TARGET_PER_JOB
        b.kubectl("delete", "holmesjobs", "--all", "-n", ns, "--wait=false")
        b.cleanup_ns(ns, wait=300)
        if a.apply_nodes:
            settle(b, op, quiet)
            rows = measure_apply(b, op, [a.apply_nodes], a.repeats)
            ok = print_apply(rows, a.repeats) and ok
    finally:
        stand_in.stop()
        if op:
            op.stop()
        stop_cluster(cp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
