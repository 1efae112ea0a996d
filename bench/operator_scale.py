"""Operator at cluster scale: N hollow nodes in K islands, J HolmesJobs of mixed sizes created
over a ramp, with churn, against the real local control plane (API server, etcd, scheduler,
controller manager) and the operator as a process.

The hollow nodes are a topology's ``playedBy: kwok`` nodes (hack/localkube/topology.py; the bench
writes it from hollow_nodes.py: islands of InfiniBand, RoCE and Ethernet, labelled the labeller's
way or NFD's, three GPU types) on a private cluster the bench starts with it: the cluster's kwok,
with Holmes' Stages, renews their Leases and reports their pods Running, then Succeeded when the
bench finishes them, without running anything. Jobs spread over a
few namespaces (teams); half select any hollow node, half one island. Churn, after the ramp:
nodes going NotReady and back, running pods failing, jobs deleted, specs edited (a relaunch),
and a few bad specs (refused with a condition, never a crash). Then a steady window measures
the operator's own requests per running job; then every job ends.

Measured: the hollow nodes' readiness (the cluster's kwok started -> every node Ready,
``nodesReadyS``),
launch (the bench's create call -> the API server's creationTimestamp of the last pod of its
first attempt, + 1 s as that stamp is in whole seconds: an upper bound; ``launchSeen*``: ->
the bench's pod watch delivering it, which adds that watch's lag on a loaded machine; bad
specs and jobs edited or deleted before their launch excluded; ``atLaunch``: the operator's
worker waits, reconciles, planning and lost races when the last job launched), the
operator's reconcile time (its histogram), its own API requests (holmes_api_requests_total:
the kubernetes client's, and the Events it posts), its RSS (peak, sampled each second) and CPU.
Judged from one watch of the jobs and one of their pods: ``duplicatePods`` (two live pods, not
terminating nor ended, for one rank of a job, at any moment), ``orphanPods`` (at the end: a live pod
whose job is gone or whose attempt is not the job's), ``lostJobs`` (a job whose phase went from
ended back, whose attempt, restarts or observedGeneration went down, or that vanished without the
bench deleting it), ``wrongPhase`` (at the end: a good job not Succeeded, a bad spec not Pending
with Stalled=True).

    .venv/bin/python bench/operator_scale.py --nodes 2000 --jobs 200     # ~15 minutes
    .venv/bin/python bench/operator_scale.py --small     # the small mode make test runs

With ``$HOLMES_KUBECONFIG`` the bench uses that cluster instead, which must already play its
nodes: ``--write-topology FILE`` writes them, then ``make cluster-up TOPOLOGY=FILE`` (the same
``--nodes``/``--islands``/``--lease-seconds``; ``nodesReadyS`` is then not measured).

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "hack")]
import yaml  # noqa: E402
from holmes_dev.jobs import holmes_job  # noqa: E402
from kubernetes import client  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402
from kubernetes.watch.watch import iter_resp_lines  # noqa: E402
from operator_apply import Bench, OperatorProcess, hollow_cluster, stop_cluster  # noqa: E402
from operator_load import TrainerStandIn  # noqa: E402

from localkube import hollow_nodes as hn  # noqa: E402
from localkube.hollow import fail_pod, finish_pod, set_not_ready  # noqa: E402

GROUP, VERSION, PLURAL = "holmes.dev", "v1alpha1", "holmesjobs"
LABEL_JOB, LABEL_ATTEMPT, LABEL_RANK = "holmes.dev/job-name", "holmes.dev/attempt", "holmes.dev/node-rank"
SIZES = (1, 1, 2, 2, 2, 4, 4, 8, 8, 16, 32)  # nodes per job, drawn evenly
ENDED = ("Succeeded", "Failed")
TARGETS = {"launchP99S": 10.0, "reconcileP99S": 2.0, "apiRequestsPerSecondPerJob": 0.1, "operatorRssMiB": 400}
_SAMPLE = re.compile(
    r'^holmes_api_requests_total\{code="[^"]*",resource="([^"]*)",verb="([^"]*)"\} ([0-9.e+]+)$'
)
_LINE = re.compile(r"^([a-z_:]+)(?:\{([^}]*)\})? ([0-9.e+-]+|[+-]Inf|NaN)$")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the jobs ------------------------------------------------------------------------------------
def scale_job(name: str, ns: str, nodes: int, islands: list[str]) -> dict:
    """A small model on ``nodes`` hollow nodes of these islands, 3 failures allowed; its pods run
    until the bench finishes them (hollow.finish_pod) and report the loopback IP the trainer
    stand-in listens on."""
    selector: dict = {"matchLabels": {hn.HOLLOW: "true"}}
    if islands:
        selector["matchExpressions"] = [{"key": "holmes.dev/cluster", "operator": "In", "values": islands}]
    return holmes_job(
        name,
        {
            "model": {
                "layers": 16,
                "hiddenSize": 1024,
                "attentionHeads": 16,
                "seqLength": 1024,
                "vocabSize": 32000,
            },
            "training": {
                "globalBatchSize": max(64, 64 * nodes),
                "microBatchSize": 1,
                "iterations": 100,
                "learningRate": 1.0e-4,
            },
            "nodes": {"count": nodes, "gpusPerNode": 8, "selector": selector},
            "template": {
                "metadata": {"annotations": {hn.POD_IP: "127.0.0.1"}},
                "spec": {
                    "tolerations": [{"key": hn.HOLLOW, "operator": "Exists"}],
                    "containers": [{"name": "trainer", "command": ["sleep", "infinity"]}],
                },
            },
            "runPolicy": {"backoffLimit": 3},
        },
        ns,
    )


def bad_jobs(ns: str) -> list[tuple[dict, bool]]:
    """Bad specs, each with whether the CRD's CEL rules refuse it at admission; the operator must
    refuse the others with a condition."""
    long_name = scale_job("x" * 60, ns, 1, [])  # over the CRD's 50 characters (pod hostnames)
    pinned = scale_job("bad-pinned", ns, 1, [])
    pinned["spec"]["template"] = {"spec": {"nodeName": "node-0000"}}  # the planner places pods
    heads = scale_job("bad-heads", ns, 1, [])
    heads["spec"]["model"]["attentionHeads"] = 7  # 1024 hidden is not divisible by 7 heads
    pipeline = scale_job("bad-pipeline", ns, 2, [])
    pipeline["spec"]["parallelism"] = {"pipeline": 64}  # more stages than the model's 16 layers
    return [(long_name, True), (pinned, False), (heads, True), (pipeline, True)]


def plan_sizes(
    jobs: int, nodes: int, islands: int, rng: random.Random, sizes: tuple[int, ...] = SIZES
) -> list[tuple[int, list[str]]]:
    """(nodes, the islands it may use) per job: one island, or two for a quarter of them; all
    fitting at once in 80% of each island (so launch measures the operator, not a queue). A
    two-island job is counted against both though it holds one: the room that leaves is what
    the jobs of 1 node drawn once the count is full take. Many jobs on few nodes need smaller
    ``sizes`` (at 600 nodes and 150 jobs the default mix left two jobs waiting for capacity)."""
    free = [int(0.8 * (nodes // islands))] * islands
    out = []
    for _ in range(jobs):
        order = sorted(range(islands), key=lambda i: (-free[i], rng.random()))
        pick = order[:2] if islands > 1 and rng.random() < 0.25 else order[:1]
        n = max(1, min(rng.choice(sizes), sum(free[i] for i in pick) // len(pick)))
        for i in pick:  # a two-island job may land on either: count it against both
            free[i] = max(0, free[i] - n)
        out.append((n, [f"island-{i}" for i in sorted(pick)]))
    return out


# ---- what the bench sees -------------------------------------------------------------------------
class Observer:
    """One watch of the bench's HolmesJobs and one of their pods; judges as events come."""

    def __init__(self, api: client.ApiClient, prefix: str) -> None:
        self.api, self.prefix = api, prefix
        self.lock = threading.Lock()
        self.jobs: dict[tuple[str, str], dict] = {}  # key -> last status
        self.pods: dict[tuple[str, str], dict] = {}  # live view of every pod of the bench
        self.by_job: dict[tuple[str, str], set] = defaultdict(set)  # job -> its pods' keys
        self.created: dict[tuple[str, str], float] = {}  # key -> when the bench created it
        self.expected: dict[tuple[str, str], int] = {}  # key -> pods of its first attempt
        # key -> seconds from the create call to its last first-attempt pod's creationTimestamp
        # (the API server's: whole seconds, so + 1 s, an upper bound), whatever the watch's lag
        self.launched: dict[tuple[str, str], float] = {}
        self.seen: dict[tuple[str, str], float] = {}  # ... to this watch delivering that pod
        self.created_wall: dict[tuple[str, str], float] = {}  # key -> time.time() of its create
        self.last_pod: dict[tuple[str, str], float] = {}  # key -> its newest creationTimestamp
        self.trace: dict[str, list[float]] = {}  # "ns/name" -> [created, seen, launched] (wall)
        self.first_pods: dict[tuple[str, str], set[str]] = defaultdict(set)
        self.deleted_by_bench: set[tuple[str, str]] = set()
        self.excluded: set[tuple[str, str]] = set()  # no launch time: edited/deleted/bad
        self.duplicates: set[tuple[str, str, str]] = set()
        self.lost: dict[tuple[str, str], str] = {}
        self.stop = threading.Event()
        self.synced = threading.Event()
        self.finishing: set[str] = set()  # namespaces whose pods end (now, or as they start)
        self.finish_sent: set[tuple[str, str]] = set()
        self.finisher = ThreadPoolExecutor(8, thread_name_prefix="finish")

    def finish(self, namespaces: list[str]) -> None:
        """Every live pod of these namespaces ends (exit 0), and any created later as it starts
        (a bench ends its jobs when it has measured them)."""
        with self.lock:
            self.finishing.update(namespaces)
            for pod in list(self.pods.values()):
                self._finish_pod(pod)

    def _finish_pod(self, pod: dict) -> None:  # under self.lock
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        if meta["namespace"] in self.finishing and live(pod) and key not in self.finish_sent:
            self.finish_sent.add(key)
            self.finisher.submit(finish_pod, client.CoreV1Api(self.api), *key)

    def ours(self, obj: dict) -> bool:
        return (obj.get("metadata") or {}).get("namespace", "").startswith(self.prefix)

    def start(self) -> Observer:
        custom, core = client.CustomObjectsApi(self.api), client.CoreV1Api(self.api)
        jobs = lambda **kw: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kw)  # noqa: E731
        pods = lambda **kw: core.list_pod_for_all_namespaces(label_selector=LABEL_JOB, **kw)  # noqa: E731
        threading.Thread(target=self._follow, args=(jobs, self.on_job), daemon=True).start()
        threading.Thread(target=self._follow, args=(pods, self.on_pod), daemon=True).start()
        svcs = lambda **kw: core.list_service_for_all_namespaces(label_selector=LABEL_JOB, **kw)  # noqa: E731
        threading.Thread(target=self._follow, args=(svcs, self.unselect), daemon=True).start()
        return self

    def unselect(self, kind: str, svc: dict) -> None:
        """Drop a job's Service selector (as bench/operator_load.py does): hollow pods report
        the loopback IP the trainer stand-in listens on, which Endpoints refuse; the endpoints
        controller would retry for the whole run. The operator only checks the Service exists."""
        if kind != "DELETED" and (svc.get("spec") or {}).get("selector"):
            client.CoreV1Api(self.api).patch_namespaced_service(
                svc["metadata"]["name"],
                svc["metadata"]["namespace"],
                {"spec": {"selector": None}},
                _preload_content=False,
            )

    def _follow(self, fn, on) -> None:
        while not self.stop.is_set():
            try:
                lst = json.loads(fn(_preload_content=False).data)
                for o in lst["items"]:
                    if self.ours(o):
                        on("ADDED", o)
                self.synced.set()
                rv = lst["metadata"]["resourceVersion"]
                while not self.stop.is_set():
                    resp = fn(
                        watch=True,
                        resource_version=rv,
                        allow_watch_bookmarks=True,
                        timeout_seconds=240,
                        _preload_content=False,
                        _request_timeout=(10, 300),
                    )
                    for line in iter_resp_lines(resp):
                        if not line or line.isspace():
                            continue
                        ev = json.loads(line)
                        obj = ev.get("object") or {}
                        if ev["type"] == "ERROR":
                            raise RuntimeError(obj.get("message"))
                        rv = obj["metadata"].get("resourceVersion") or rv
                        if ev["type"] != "BOOKMARK" and self.ours(obj):
                            on(ev["type"], obj)
            except Exception as e:  # noqa: BLE001 (list again: judged on the fresh list)
                if not self.stop.is_set():
                    log(f"observer: {e}; listing again")
                    time.sleep(1)

    def on_job(self, kind: str, job: dict) -> None:
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        with self.lock:
            if kind == "DELETED":
                self.jobs.pop(key, None)
                if key not in self.deleted_by_bench:
                    self.lost[key] = "vanished without being deleted"
                return
            st = dict(job.get("status") or {})
            st["generation"] = job["metadata"].get("generation")
            old = self.jobs.get(key)
            if old is not None:
                why = went_backwards(old, st)
                if why:
                    self.lost.setdefault(key, why)
            self.jobs[key] = st

    def on_pod(self, kind: str, pod: dict) -> None:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        key = (meta["namespace"], meta["name"])
        job = (meta["namespace"], labels.get(LABEL_JOB, ""))
        now = time.monotonic()
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(key, None)
                self.by_job[job].discard(key)
                return
            self.pods[key] = pod
            if labels.get(LABEL_ATTEMPT) == "1" and job in self.expected and job not in self.launched:
                self.first_pods[job].add(meta["name"])
                at = server_time(meta["creationTimestamp"]) + 1.0
                self.last_pod[job] = max(self.last_pod.get(job, at), at)
                if len(self.first_pods[job]) >= self.expected[job] and job in self.created:
                    self.seen[job] = now - self.created[job]
                    self.launched[job] = self.last_pod[job] - self.created_wall[job]
                    self.trace["/".join(job)] += [time.time(), self.last_pod[job]]
            self.by_job[job].add(key)
            self._finish_pod(pod)
            if live(pod):
                rank = labels.get(LABEL_RANK)
                twins = [
                    n
                    for k in self.by_job[job]
                    if (n := k[1]) != meta["name"]
                    and (p := self.pods.get(k)) is not None
                    and (p["metadata"].get("labels") or {}).get(LABEL_RANK) == rank
                    and live(p)
                ]
                for t in twins:
                    self.duplicates.add((job[0], *sorted((meta["name"], t))))


def server_time(stamp: str) -> float:
    """An API server timestamp ("2026-11-29T20:13:01Z") as seconds since the epoch."""
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def live(pod: dict) -> bool:
    return (
        not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in ENDED
    )


def went_backwards(old: dict, new: dict) -> str:
    """Why a job's status went backwards ('' when it did not)."""
    if old.get("phase") in ENDED and new.get("phase") != old.get("phase"):
        return f"phase {old.get('phase')} -> {new.get('phase')}"
    for k in ("attempt", "restarts", "observedGeneration"):
        a, b = old.get(k), new.get(k)
        if isinstance(a, int) and isinstance(b, int) and b < a:
            return f"{k} {a} -> {b}"
        if isinstance(a, int) and b is None and k != "observedGeneration":
            return f"{k} {a} -> unset"
    return ""


# ---- the operator's numbers ----------------------------------------------------------------------
def operator_requests(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:  # every answer's code together
            key = (m.group(2), m.group(1))
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def samples(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric ``name`` whose labels include ``labels`` (Prometheus' text format)."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'([a-zA-Z_]+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            out.append((got, float(m.group(3))))
    return out


def histogram_quantile(
    text: str, q: float, name: str = "holmes_reconcile_duration_seconds", **labels: str
) -> float:
    """Prometheus' histogram_quantile on one histogram (linear within a bucket)."""
    buckets = sorted(
        (math.inf if got["le"] == "+Inf" else float(got["le"]), count)
        for got, count in samples(text, f"{name}_bucket", **labels)
    )
    if not buckets or buckets[-1][1] == 0:
        return 0.0
    rank = q * buckets[-1][1]
    lo_bound, lo_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == math.inf:
                return lo_bound
            return lo_bound + (bound - lo_bound) * (rank - lo_count) / max(count - lo_count, 1e-9)
        lo_bound, lo_count = bound, count
    return buckets[-1][0]


def histogram_mean(text: str, name: str, **labels: str) -> float:
    total = sum(v for _, v in samples(text, f"{name}_sum", **labels))
    count = sum(v for _, v in samples(text, f"{name}_count", **labels))
    return total / count if count else 0.0


def launch_breakdown(text: str) -> dict:
    """Where the launches' time went, from the operator's metrics when the last job launched:
    the wait for a launching worker, the reconciles, the planning, the lost races."""
    wait = "holmes_reconcile_wait_seconds"
    return {
        "launchingWaitP50S": round(histogram_quantile(text, 0.5, wait, pool="launching"), 3),
        "launchingWaitP99S": round(histogram_quantile(text, 0.99, wait, pool="launching"), 3),
        "trackingWaitP99S": round(histogram_quantile(text, 0.99, wait, pool="tracking"), 3),
        "reconcileP50S": round(histogram_quantile(text, 0.5), 3),
        "reconcileP99S": round(histogram_quantile(text, 0.99), 3),
        "planningMeanS": round(histogram_mean(text, "holmes_planning_duration_seconds"), 3),
        "placementRetries": int(sum(v for _, v in samples(text, "holmes_placement_retries_total"))),
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


class Sampler(threading.Thread):
    """The operator's peak RSS, sampled every second."""

    def __init__(self, op: OperatorProcess) -> None:
        super().__init__(daemon=True)
        self.op, self.peak, self.stop = op, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                self.peak = max(self.peak, self.op.rss_bytes())
            except OSError:
                return


# ---- the run -------------------------------------------------------------------------------------
def wait_for(what: str, ok, timeout: float, every: float = 1.0, fatal: bool = False) -> bool:
    """Wait until ``ok()``; on time-out, raise when ``fatal``, else say so and go on (what was
    not reached shows in the figures: unlaunched jobs, wrong phases)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ok():
            return True
        time.sleep(every)
    if fatal:
        raise TimeoutError(f"{what} after {timeout:.0f}s")
    log(f"not reached: {what} after {timeout:.0f}s; going on")
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--islands", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--namespaces", type=int, default=0, help="teams (default: one per 25 jobs)")
    ap.add_argument(
        "--ramp", type=float, default=0, help="seconds over which jobs are created (default: J/2)"
    )
    ap.add_argument("--window", type=float, default=60.0, help="seconds of the steady window")
    ap.add_argument("--churn", type=int, default=0, help="events of each churn kind (default: J/20, >= 1)")
    ap.add_argument("--lease-seconds", type=float, default=10.0)
    ap.add_argument("--progress-interval", type=float, default=10.0, help="the operator's flag")
    ap.add_argument("--seed", type=int, default=39)
    ap.add_argument(
        "--sizes",
        default=",".join(map(str, SIZES)),
        metavar="N,N,...",
        help="nodes per job, drawn evenly (a compressed ramp of many jobs on few nodes: 1,1,2,2,2,4)",
    )
    ap.add_argument("--small", action="store_true", help="make test's mode: 40 nodes, 8 jobs, short windows")
    ap.add_argument(
        "--write-topology", metavar="FILE", help="write the hollow nodes' topology (playedBy: kwok) and exit"
    )
    a = ap.parse_args()
    try:
        a.sizes = tuple(int(x) for x in a.sizes.split(","))
    except ValueError:
        ap.error(f"--sizes {a.sizes!r}: expected whole numbers of nodes separated by commas")
    if not a.sizes or min(a.sizes) < 1:
        ap.error(f"--sizes {a.sizes!r}: every size must be at least 1 node")
    if a.small:
        # the window two progress intervals: one interval long, all of a tick's patches can fall
        # just outside it (a steady rate of 0.0 was measured so)
        a.nodes, a.islands, a.jobs, a.window, a.churn = 40, 4, 8, 2 * a.progress_interval, 1
        a.ramp = a.ramp or 4.0
    a.namespaces = a.namespaces or max(1, math.ceil(a.jobs / 25))
    a.ramp = a.ramp or a.jobs / 2
    a.churn = a.churn or max(1, a.jobs // 20)
    rng = random.Random(a.seed)
    try:
        topology = hn.topology_doc(hn.hollow_nodes(a.nodes, a.islands), leaseSeconds=a.lease_seconds)
    except hn.HollowError as e:
        ap.error(str(e))
    if a.write_topology:
        Path(a.write_topology).write_text(yaml.safe_dump(topology, sort_keys=False))
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="holmes-bench-scale-"))
    result: dict = {"nodes": a.nodes, "islands": a.islands, "jobs": a.jobs}
    # the cluster's kwok plays the nodes (cluster-up waits until every one is Ready)
    cp, kubeconfig = hollow_cluster("bench-scale", topology, tmp, "operator_scale")
    result["nodesReadyS"] = cp.state()["kwok"]["readyS"] if cp else None
    b = Bench(kubeconfig)
    core = b.core
    custom = client.CustomObjectsApi(b.api)
    prefix = f"scale-{os.getpid()}-"
    namespaces = [f"{prefix}{i}" for i in range(a.namespaces)]
    op = sampler = observer = None
    stand_in = TrainerStandIn()  # every rank-0 trainer's metrics, its iteration moving with time
    t_start = time.monotonic()
    try:
        log(f"{a.nodes} hollow nodes Ready {result['nodesReadyS']}s after the cluster's kwok started")
        try:
            b.install_crd()
        except subprocess.CalledProcessError:  # `kubectl wait` before the CRD is listed: once more
            time.sleep(5)
            b.install_crd()
        kinds = [f"--cluster-rdma-kind={c}={k}" for c, k in hn.rdma_kinds(a.islands).items()]
        op = OperatorProcess(
            kubeconfig,
            [f"{prefix}*"],
            tmp / "operator.log",
            extra=[
                *kinds,
                f"--progress-interval={a.progress_interval}",
                f"--trainer-metrics-port={stand_in.port}",
            ],
            port_range=None,
        ).start(timeout=300)
        cpu0 = op.cpu_seconds()
        sampler = Sampler(op)
        sampler.start()
        for ns in namespaces:
            b.create_namespace(ns)
        observer = Observer(b.api, prefix).start()
        observer.synced.wait(60)

        # ramp: J jobs evenly over the ramp; they all end together after churn and the window
        sizes = plan_sizes(a.jobs, a.nodes, a.islands, rng, a.sizes)
        churn_s = 30.0 if not a.small else 10.0
        keys: list[tuple[str, str]] = []
        t_ramp = time.monotonic()
        for i, (n, island) in enumerate(sizes):
            due = t_ramp + a.ramp * i / max(1, a.jobs)
            time.sleep(max(0.0, due - time.monotonic()))
            ns = namespaces[i % len(namespaces)]
            key = (ns, f"job-{i:04d}")
            with observer.lock:
                observer.expected[key] = n
                observer.created[key] = time.monotonic()
                observer.created_wall[key] = time.time()
                observer.trace["/".join(key)] = [observer.created_wall[key]]
            custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, scale_job(key[1], ns, n, island), _preload_content=False
            )
            keys.append(key)
        bad, refused = [], 0
        for j, at_admission in bad_jobs(namespaces[0]):
            try:
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespaces[0], PLURAL, j, _preload_content=False
                )
            except ApiException as e:
                if e.status == 422 and at_admission:
                    refused += 1
                    continue
                raise
            if at_admission:
                raise RuntimeError(f"{j['metadata']['name']}: the CRD's CEL rules admitted it")
            bad.append((namespaces[0], j["metadata"]["name"]))
        result["refusedAtAdmission"] = refused
        observer.excluded.update(bad)
        log(f"{a.jobs} jobs created over {time.monotonic() - t_ramp:.0f}s")
        wait_for("every job launched", lambda: len(observer.launched) >= len(keys), 300 + 3 * a.jobs)
        with observer.lock:  # one not launched counts as launched now (a lower bound of its time)
            unlaunched = [k for k in keys if k not in observer.launched]
            for k in unlaunched:
                observer.launched[k] = observer.seen[k] = time.monotonic() - observer.created[k]
        result["unlaunchedJobs"] = len(unlaunched)
        result["atLaunch"] = launch_breakdown(op.metrics())
        log(f"at launch: {result['atLaunch']}")
        log(f"launched; launch p99 {percentile(list(observer.launched.values()), 0.99):.2f}s")

        # churn
        wait_for("pods running", lambda: running_pods(observer) >= sum(n for n, _ in sizes) * 0.9, 600)
        victims = rng.sample(keys, min(len(keys), 4 * a.churn))
        deleted, edited, failed, dark = (victims[i::4] for i in range(4))
        for key in deleted:
            observer.deleted_by_bench.add(key)
            custom.delete_namespaced_custom_object(
                GROUP, VERSION, *key[:1], PLURAL, key[1], _preload_content=False
            )
        for key in edited:
            custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                key[0],
                PLURAL,
                key[1],
                {"spec": {"training": {"iterations": 101}}},
                _preload_content=False,
            )
        fail = [p for p in pods_of(observer, failed) if live(p)][: len(failed)]
        for p in fail:
            fail_pod(core, p["metadata"]["namespace"], p["metadata"]["name"])
        dark_nodes = sorted({p["spec"].get("nodeName") for p in pods_of(observer, dark) if live(p)} - {None})[
            : len(dark)
        ]
        for n in dark_nodes:
            set_not_ready(core, n, True)
        churn = {
            "deleted": len(deleted),
            "edited": len(edited),
            "podsFailed": len(fail),
            "nodesNotReady": len(dark_nodes),
            "badSpecs": len(bad),
        }
        log(f"churn: {churn}")
        time.sleep(churn_s)
        for n in dark_nodes:
            set_not_ready(core, n, False)
        log("nodes Ready again")
        good = [k for k in keys if k not in set(deleted)]
        wait_for(
            "every job Running again",
            lambda: all((observer.jobs.get(k) or {}).get("phase") == "Running" for k in good),
            3 * churn_s + 60 + 3 * a.jobs,
        )

        # steady window: the operator's own requests per running job
        before = operator_requests(op.metrics())
        t0 = time.monotonic()
        time.sleep(a.window)
        after = operator_requests(op.metrics())
        window = time.monotonic() - t0
        running = sum(1 for k in good if (observer.jobs.get(k) or {}).get("phase") == "Running")
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        steady = sum(v for (verb, _), v in delta.items() if verb != "WATCH") / window / max(1, running)
        log(f"steady: {running} running jobs, {sum(delta.values()) / window:.2f} operator requests/s")

        # the end: every pod finishes, every good job Succeeds
        observer.finish(namespaces)
        wait_for(
            "every job ended",
            lambda: all((observer.jobs.get(k) or {}).get("phase") in ENDED for k in good),
            120 + a.jobs,
            2.0,
        )
        time.sleep(3.0)  # the last deletions' events
        metrics_text = op.metrics()
        with observer.lock:
            jobs = dict(observer.jobs)
            pods = list(observer.pods.values())
            measured = [k for k in observer.launched if k not in observer.excluded and k not in set(edited)]
            launches = [observer.launched[k] for k in measured]
            seen = [observer.seen[k] for k in measured]
        orphans = [
            p["metadata"]["name"]
            for p in pods
            if live(p)
            and (
                (p["metadata"]["namespace"], p["metadata"]["labels"].get(LABEL_JOB)) not in jobs
                or p["metadata"]["labels"].get(LABEL_ATTEMPT)
                != str(jobs[(p["metadata"]["namespace"], p["metadata"]["labels"][LABEL_JOB])].get("attempt"))
            )
        ]
        wrong = [k for k in good if jobs.get(k, {}).get("phase") != "Succeeded"]
        wrong += [k for k in bad if not stalled(jobs.get(k, {}))]
        total = operator_requests(metrics_text)
        result.update(
            launchP50S=round(percentile(launches, 0.5), 3),
            launchP99S=round(percentile(launches, 0.99), 3),
            launchSeenP50S=round(percentile(seen, 0.5), 3),
            launchSeenP99S=round(percentile(seen, 0.99), 3),
            reconcileP99S=round(histogram_quantile(metrics_text, 0.99), 3),
            apiRequestsPerSecondPerJob=round(steady, 4),
            operatorRssMiB=round(sampler.peak / 2**20, 1),
            operatorCpuSeconds=round(op.cpu_seconds() - cpu0, 1),
            orphanPods=len(orphans),
            duplicatePods=len(observer.duplicates),
            lostJobs=len(observer.lost),
            wrongPhase=len(wrong),
            operatorRequests=int(sum(v for (verb, _), v in total.items() if verb != "WATCH")),
            operatorRequestsBy={f"{v} {r}": int(n) for (v, r), n in top(total)},
            churn=churn,
            seconds=round(time.monotonic() - t_start),
        )  # fmt: skip
        for what, items in (
            ("orphan", orphans),
            ("duplicate", sorted(observer.duplicates)),
            ("lost", sorted(observer.lost.items())),
            ("wrong phase", [(k, jobs.get(k, {}).get("phase")) for k in wrong]),
        ):
            if items:
                log(f"{what}: {items[:10]}")  # fmt: skip
    finally:
        stand_in.stop()
        if observer:
            observer.stop.set()
            observer.finisher.shutdown(wait=False, cancel_futures=True)
        if sampler:
            sampler.stop.set()
        if op:
            op.stop()
        for ns in namespaces:
            try:
                b.cleanup_ns(ns)
            except ApiException as e:
                if e.status != 404:
                    log(f"cleanup {ns}: {e.reason}")
        if cp and (cp.dir / "logs" / "kwok.log").exists():  # kept with the operator's log
            shutil.copy(cp.dir / "logs" / "kwok.log", tmp / "kwok.log")
        stop_cluster(cp)
        if observer:  # each launch as the bench saw it, to join with the operator's log
            (tmp / "launches.json").write_text(json.dumps(observer.trace))
    met = {k: result[k] <= v for k, v in TARGETS.items()}
    clean = all(result[k] == 0 for k in ("orphanPods", "duplicatePods", "lostJobs", "wrongPhase"))
    if clean and all(met.values()):
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        log(f"the operator's and kwok's logs are kept in {tmp}")
    log("targets: " + ", ".join(f"{k} <= {v}: {'met' if met[k] else 'MISSED'}" for k, v in TARGETS.items()))
    print(json.dumps(result))
    return 0 if clean and (all(met.values()) or a.small) else 1


def top(counts: dict, n: int = 10) -> list:
    return sorted(counts.items(), key=lambda x: -x[1])[:n]


def running_pods(observer: Observer) -> int:
    with observer.lock:
        return sum(1 for p in observer.pods.values() if (p.get("status") or {}).get("phase") == "Running")


def pods_of(observer: Observer, keys: list[tuple[str, str]]) -> list[dict]:
    want = set(keys)
    with observer.lock:
        return [
            p
            for p in observer.pods.values()
            if (p["metadata"]["namespace"], (p["metadata"].get("labels") or {}).get(LABEL_JOB)) in want
        ]


def stalled(status: dict) -> bool:
    return status.get("phase") in (None, "Pending") and any(
        c.get("type") == "Stalled" and c.get("status") == "True" for c in status.get("conditions") or []
    )


if __name__ == "__main__":
    sys.exit(main())
