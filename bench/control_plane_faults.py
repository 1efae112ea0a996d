"""Control-plane faults: HolmesJobs launching, running and finishing on the local testbed while
its control plane fails under them; checks that nothing is lost, doubled or left behind.

A private local cluster (etcd, kube-apiserver, controller manager, scheduler, the node agent's
simulated GPU nodes of the default topology, and 50 hollow nodes, ``playedBy: kwok``, whose
kubelets are the cluster's kwok) and two operator replicas with --leader-elect. Workload jobs
(2 nodes, trainer ``sleep``, exit 0) keep coming on the agent's nodes, so some launch and some
finish during every fault. One fault at a time; after each, a probe job on the hollow nodes must
get all its pods: the fault's recovery time is from the fault's end to that (the leader's lease
takeover included where the leader died).

    apiserver-restart      kube-apiserver SIGTERM, started again
    apiserver-crash        kube-apiserver SIGKILL, started again
    etcd-stall             etcd SIGSTOP for --stall seconds, then SIGCONT
    etcd-restart           etcd SIGKILL, started again on the same data
    kill-mid-launch        SIGKILL the leader while a 48-pod job's pods (hollow nodes) are being created
                           (some created, others not); the other replica finishes the launch
    kill-mid-status-write  SIGKILL the leader as a 48-pod job's last pod is being created, before
                           its status says launched (``hit`` says whether the window was caught)
    node-agent-restart     the node agent SIGKILLed with its pods' processes (a node reboot)
    leader-handover        SIGTERM the leader (it releases the Lease); the other takes over
    member-cutoff          (--member-cutoff S, full mode) two member clusters; one's API server
                           stalled for S seconds under a job across both

Checked all along (a snapshot of the namespace's jobs and pods every 0.25 s while the API
answers) and at the end, after every workload job finished:

- ``duplicatePods``: (job, rank) pairs that ever had two live pods (not ended, not terminating);
- ``lostJobs``: a job that vanished, or whose status went backwards (attempt or restarts down,
  a finished phase left, the status gone);
- ``wrongPhase``: a job Succeeded with a pod of its attempt Failed, or finished while a pod of
  its attempt still runs for more than 5 s, or a workload job not Succeeded at the end;
- ``orphanPods``: at the end, live pods of no job, of an attempt that is not the job's current
  one, or of a finished job.

Last line: one JSON object: ``faults``, ``survived``, ``orphanPods``, ``duplicatePods``,
``lostJobs``, ``wrongPhase``, ``recoveryP99S``, and each fault's details.

    .venv/bin/python bench/control_plane_faults.py             # every fault, ~6 minutes
    .venv/bin/python bench/control_plane_faults.py --small     # the make-test subset, ~1 minute

Exit 0 when every fault is survived. Needs root (the node agent) and the built cluster.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "hack"), str(REPO / "bench")]  # the localkube harness, bench helpers

import yaml  # noqa: E402
from holmes_dev.jobs import holmes_job, tiny_job  # noqa: E402
from kubernetes import client, config  # noqa: E402
from kubernetes import watch as kwatch  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from holmes.contract.names import GROUP, PLURAL, VERSION  # noqa: E402
from localkube import hollow_nodes as hn  # noqa: E402
from localkube.controlplane import ControlPlane  # noqa: E402
from localkube.operatorproc import OperatorProcess, install_crd  # noqa: E402

LABEL_JOB, LABEL_ATTEMPT, LABEL_RANK = "holmes.dev/job-name", "holmes.dev/attempt", "holmes.dev/node-rank"
ENDED = ("Succeeded", "Failed")
FINISHED = ("Succeeded", "Failed")
SMALL = (
    "apiserver-crash",
    "etcd-stall",
    "kill-mid-launch",
    "kill-mid-status-write",
    "node-agent-restart",
    "leader-handover",
)
FULL = (
    "apiserver-restart",
    "apiserver-crash",
    "etcd-stall",
    "kill-mid-launch",
    "etcd-restart",
    "kill-mid-status-write",
    "node-agent-restart",
    "leader-handover",
    "apiserver-restart",
    "kill-mid-launch",
    "etcd-stall",
)
WIDE = 48  # pods of the job an operator is killed under (hollow nodes)
HOLLOW_NODES = WIDE + 2  # the wide job's and the probes'
LEASE = (
    "--leader-elect-lease-duration=4",
    "--leader-elect-renew-deadline=3",
    "--leader-elect-retry-period=0.5",
)
FINISH_GRACE = 5.0  # a finished job's pod may take this long to be seen ended


# ---- the verdict (pure: snapshots in, problems out) ------------------------------------------------


@dataclass
class Snapshot:
    t: float
    jobs: dict[str, dict]  # name -> the HolmesJob
    pods: list[dict]


def live(pod: Mapping) -> bool:
    return (pod.get("status") or {}).get("phase") not in ENDED and not pod["metadata"].get(
        "deletionTimestamp"
    )


def _labels(pod: Mapping) -> Mapping[str, str]:
    return pod["metadata"].get("labels") or {}


@dataclass
class Judge:
    """Reads snapshots in order and keeps what went wrong, each problem once."""

    expected: set[str] = field(default_factory=set)  # jobs the bench created and did not delete
    duplicates: set[tuple[str, str]] = field(default_factory=set)
    lost: dict[str, str] = field(default_factory=dict)
    wrong: dict[str, str] = field(default_factory=dict)
    last: dict[str, dict] = field(default_factory=dict)  # job -> its last status seen
    finished_at: dict[str, float] = field(default_factory=dict)
    during: str = ""  # the fault in progress (named in the problems it causes)

    def see(self, s: Snapshot) -> None:
        by_rank: dict[tuple[str, str], int] = defaultdict(int)
        pods_of: dict[str, list[dict]] = defaultdict(list)
        for p in s.pods:
            job = _labels(p).get(LABEL_JOB, "")
            pods_of[job].append(p)
            if live(p):
                by_rank[(job, _labels(p).get(LABEL_RANK, ""))] += 1
        self.duplicates |= {k for k, n in by_rank.items() if n > 1}
        for name in (self.expected & set(self.last)) - set(s.jobs):  # seen once, then gone
            self.lost.setdefault(
                name, f"the HolmesJob vanished (a list of {len(s.jobs)} jobs{self._during()})"
            )
        for name, job in s.jobs.items():
            st = job.get("status") or {}
            why = regress(self.last.get(name), st)
            if why:
                self.lost.setdefault(name, why + self._during())
            if st:
                self.last[name] = st
            why = phase_problem(
                st,
                pods_of[name],
                s.t,
                self.finished_at.setdefault(name, s.t) if st.get("phase") in FINISHED else None,
            )
            if why:
                self.wrong.setdefault(name, why + self._during())
            if st.get("phase") not in FINISHED:
                self.finished_at.pop(name, None)

    def _during(self) -> str:
        return f", during {self.during}" if self.during else ""

    def end(self, s: Snapshot, workload: Iterable[str]) -> list[str]:
        """The final snapshot: every workload job Succeeded; the orphans (pod names)."""
        self.see(s)
        for name in workload:
            phase = ((s.jobs.get(name) or {}).get("status") or {}).get("phase")
            if phase != "Succeeded":
                self.wrong.setdefault(name, f"ended {phase or 'without a phase'}, not Succeeded")
        return orphans(s)


def regress(before: Mapping | None, now: Mapping) -> str:
    """Why a job's status went backwards between two snapshots ('' if it did not)."""
    if not before:
        return ""
    if not now:
        return "its status vanished"
    for key in ("attempt", "restarts"):
        if int(now.get(key) or 0) < int(before.get(key) or 0):
            return f"status.{key} went back from {before.get(key)} to {now.get(key)}"
    if before.get("phase") in FINISHED and now.get("phase") != before.get("phase"):
        return f"phase went from {before.get('phase')} back to {now.get('phase')}"
    return ""


def phase_problem(st: Mapping, pods: list[dict], t: float, finished_since: float | None) -> str:
    """A job's phase its own pods contradict ('' if none)."""
    attempt = str(st.get("attempt"))
    mine = [p for p in pods if _labels(p).get(LABEL_ATTEMPT) == attempt]
    if st.get("phase") == "Succeeded" and any((p.get("status") or {}).get("phase") == "Failed" for p in mine):
        return "Succeeded with a pod of its attempt Failed"
    if finished_since is not None and t - finished_since > FINISH_GRACE and any(live(p) for p in mine):
        return f"{st.get('phase')} for {t - finished_since:.0f}s while a pod of its attempt still runs"
    return ""


def orphans(s: Snapshot) -> list[str]:
    """Live pods of no job, of an attempt that is not their job's current one, or of a finished job."""
    out = []
    for p in s.pods:
        if not live(p):
            continue
        job = s.jobs.get(_labels(p).get(LABEL_JOB, ""))
        st = (job or {}).get("status") or {}
        if (
            job is None
            or _labels(p).get(LABEL_ATTEMPT) != str(st.get("attempt"))
            or st.get("phase") in FINISHED
        ):
            out.append(p["metadata"]["name"])
    return sorted(out)


def p99(values: list[float]) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, math.ceil(0.99 * len(v)) - 1)]


# ---- the testbed ----------------------------------------------------------------------------------


class World:
    """The API as the bench sees it (short timeouts: the API server goes away)."""

    def __init__(self, kubeconfig: str, ns: str):
        self.api = config.new_client_from_config(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        self.ns = ns

    def snapshot(self) -> Snapshot | None:
        try:
            jobs = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, _preload_content=False, _request_timeout=3
            )
            pods = self.core.list_namespaced_pod(self.ns, _preload_content=False, _request_timeout=3)
        except Exception:  # noqa: BLE001 (the API server or etcd is down: no snapshot)
            return None
        items = json.loads(jobs.data)["items"]
        return Snapshot(
            time.monotonic(), {j["metadata"]["name"]: j for j in items}, json.loads(pods.data)["items"]
        )

    def create(self, job: dict) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, job, _request_timeout=10)

    def delete(self, name: str) -> None:
        """Delete a job; its pods go as on any cluster (kwok confirms the hollow pods' deletion)."""
        self.custom.delete_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name, _request_timeout=10
        )

    def pods(self, job: str) -> list[dict]:
        r = self.core.list_namespaced_pod(
            self.ns, label_selector=f"{LABEL_JOB}={job}", _preload_content=False, _request_timeout=3
        )
        return json.loads(r.data)["items"]

    def status(self, job: str) -> dict:
        j = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, job, _request_timeout=3)
        return j.get("status") or {}

    def leader(self) -> str:
        lease = self.coord.read_namespaced_lease("holmes-operator", self.ns, _request_timeout=3)
        return lease.spec.holder_identity or ""


def wait_until(what: str, fn: Callable, timeout: float, every: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            got = fn()
        except Exception:  # noqa: BLE001 (the API may be down meanwhile)
            got = None
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def workload_job(name: str, ns: str, seconds: int) -> dict:
    return tiny_job(
        name, ns, count=2, gpus=1, command=["sh", "-c", f"sleep {seconds}"], run_policy={"backoffLimit": 20}
    )


def hollow_job(name: str, ns: str, count: int) -> dict:
    """A job on the hollow nodes: kwok reports its pods Running until they are deleted."""
    return holmes_job(
        name,
        {
            "model": {"layers": 4, "hiddenSize": 64, "attentionHeads": 4, "seqLength": 32, "vocabSize": 128},
            "training": {
                "globalBatchSize": 8 * count,
                "microBatchSize": 1,
                "iterations": 5,
                "learningRate": 1e-3,
            },
            "nodes": {"count": count, "gpusPerNode": 8},
            "template": {
                "spec": {
                    "nodeSelector": {hn.HOLLOW: "true"},
                    "tolerations": [{"key": hn.HOLLOW, "operator": "Exists"}],
                    "containers": [{"name": "trainer", "command": ["sleep", "3600"]}],
                }
            },
            "runPolicy": {"backoffLimit": 0},
        },
        ns,
    )


class Operators:
    """Two replicas with --leader-elect; the one holding the Lease acts."""

    def __init__(self, kubeconfig: str, ns: str, logs: Path):
        self.reps = {
            rid: OperatorProcess(
                kubeconfig,
                [ns],
                logs / f"operator-{rid}.log",
                extra=[
                    "--leader-elect",
                    f"--leader-elect-namespace={ns}",
                    f"--leader-elect-identity={rid}",
                    *LEASE,
                    "--restart-backoff-seconds=1",
                ],
            )
            for rid in ("a", "b")
        }

        self.lock = threading.Lock()
        self.restarts = 0  # replicas that exited by themselves and were started again

    def start(self) -> None:
        for op in self.reps.values():
            op.start()

    def supervise(self) -> None:
        """Start again a replica that exited by itself (a leader that lost its lease exits, as
        designed), as Kubernetes restarts its container."""
        with self.lock:
            for op in self.reps.values():
                if op.proc is not None and op.proc.poll() is not None:
                    self.restarts += 1
                    try:
                        op.start()
                    except AssertionError as e:  # not live yet (the API server is down): next round
                        print(f"operator restart: {e}"[:300], file=sys.stderr)

    def stop(self) -> None:
        for op in self.reps.values():
            op.stop()

    def kill(self, rid: str, sig: int) -> None:
        with self.lock:
            op = self.reps[rid]
            if sig == signal.SIGKILL:
                op.kill()
            else:
                op.stop()
            op.start()  # back as the follower

    def freeze(self, rid: str) -> None:
        """SIGSTOP: the replica stops where it is, mid-request or not."""
        os.kill(self.reps[rid].proc.pid, signal.SIGSTOP)

    def thaw(self, rid: str) -> None:
        os.kill(self.reps[rid].proc.pid, signal.SIGCONT)

    def tail(self) -> str:
        return "\n".join(f"--- operator {r}\n{op.tail(25)}" for r, op in self.reps.items())


# ---- faults -----------------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    seconds: float = 0.0  # how long the fault lasted (until the component served again)
    recovery: float = 0.0  # the fault's end -> a new job's pods all created
    hit: bool = True  # kill-mid-*: the operator died inside the window aimed at
    note: str = ""


class Bench:
    def __init__(self, cp: ControlPlane, w: World, ops: Operators, judge: Judge, args):
        self.cp, self.w, self.ops, self.judge, self.a = cp, w, ops, judge, args
        self.n = 0
        self.workload: list[str] = []
        self.stop = threading.Event()
        self.watcher = threading.Thread(target=self.watch, daemon=True)

    def watch(self) -> None:
        while not self.stop.is_set():
            self.ops.supervise()
            s = self.w.snapshot()
            if s is not None:
                self.judge.see(s)
            time.sleep(0.25)

    def submit(self) -> None:
        self.n += 1
        name = f"work-{self.n}"
        self.w.create(workload_job(name, self.w.ns, self.a.job_seconds))
        self.judge.expected.add(name)
        self.workload.append(name)

    def probe(self, label: str) -> float:
        """Seconds until a new 2-pod job on the hollow nodes has its pods; then it is deleted."""
        name = f"probe-{label}"
        t0 = time.monotonic()
        wait_until(f"{name} created", lambda: self.w.create(hollow_job(name, self.w.ns, 2)) or True, 120)
        wait_until(f"{name}'s pods", lambda: len(self.w.pods(name)) == 2, 180)
        took = time.monotonic() - t0
        self.w.delete(name)
        return took

    def strike(self, kind: str, i: int) -> Fault:
        f = Fault(kind)
        t0 = time.monotonic()
        self.judge.during = kind
        if kind == "apiserver-restart":
            f.seconds = self.cp.restart("kube-apiserver")
        elif kind == "apiserver-crash":
            f.seconds = self.cp.restart("kube-apiserver", signal.SIGKILL)
        elif kind == "etcd-restart":
            f.seconds = self.cp.restart("etcd", signal.SIGKILL)
            wait_until("the API server on the new etcd", lambda: self.w.snapshot(), 60)
        elif kind == "etcd-stall":
            self.cp.pause("etcd")
            time.sleep(self.a.stall)
            self.cp.resume("etcd")
            f.seconds = time.monotonic() - t0
        elif kind in ("kill-mid-launch", "kill-mid-status-write"):
            f = self.kill_mid(kind, i)
        elif kind == "node-agent-restart":
            f.seconds = self.cp.restart("node-agent", signal.SIGKILL)
        elif kind == "leader-handover":
            self.ops.kill(wait_until("the leader", self.w.leader, 30), signal.SIGTERM)
            f.seconds = time.monotonic() - t0
        else:
            raise ValueError(f"unknown fault {kind!r}")
        f.recovery = self.probe(f"{i}")
        self.judge.during = ""
        return f

    def kill_mid(self, kind: str, i: int) -> Fault:
        """SIGKILL the leader inside a 48-pod launch: frozen (SIGSTOP) the moment a watch shows
        its first pod (mid-launch: some created, others not), or all but six
        (mid-status-write: the last creations in flight, the status patch that follows them,
        launched, not sent), then killed. ``hit``: the launch was cut before its status said
        launched; the note says how many pods it had created."""
        f = Fault(kind, hit=False)
        t0 = time.monotonic()
        leader = wait_until("the leader", self.w.leader, 30)
        name = f"wide-{i}"
        self.judge.expected.add(name)
        # the watch lags the leader's own writes: freezing on the last pod's event came after
        # the status patch in every run, so mid-status-write aims a few pods earlier; mid-launch
        # freezes on the first pod seen (at a quarter, a quick launch had created all 48 by then)
        aim = 1 if kind == "kill-mid-launch" else WIDE - 6
        self.freeze_at(name, aim, lambda: self.ops.freeze(leader))
        os.kill(self.ops.reps[leader].proc.pid, signal.SIGKILL)  # dead before the follower may lead
        created, launched = len(self.w.pods(name)), bool(self.w.status(name).get("launched"))
        self.ops.kill(leader, signal.SIGKILL)  # reaped and started again as the follower
        f.hit = 0 < created < WIDE or not launched
        f.note = f"{created}/{WIDE} pods, status launched={launched} after leader {leader} was killed"
        wait_until(f"{name}'s {WIDE} pods", lambda: len(self.w.pods(name)) == WIDE, 120)
        wait_until(f"{name} launched", lambda: self.w.status(name).get("launched"), 60)
        self.judge.expected.discard(name)
        self.w.delete(name)
        f.seconds = time.monotonic() - t0
        return f

    def freeze_at(self, name: str, aim: int, freeze: Callable[[], None]) -> None:
        """Create the wide job and call ``freeze`` once a watch shows ``aim`` of its pods (no
        polling delay)."""
        core = client.CoreV1Api(self.w.api)
        selector = f"{LABEL_JOB}={name}"
        listed = core.list_namespaced_pod(self.w.ns, label_selector=selector, _preload_content=False)
        rv = json.loads(listed.data)["metadata"]["resourceVersion"]
        self.w.create(hollow_job(name, self.w.ns, WIDE))
        seen: set[str] = set()
        stream = kwatch.Watch()
        for ev in stream.stream(
            core.list_namespaced_pod,
            self.w.ns,
            label_selector=selector,
            resource_version=rv,
            timeout_seconds=60,
        ):
            if ev["type"] == "ADDED":
                seen.add(ev["object"].metadata.name)
                if len(seen) >= aim:
                    break
        freeze()
        stream.stop()


def member_cutoff(seconds: float, job_seconds: int, tmp: Path, judge: Judge) -> tuple[Fault, list[str]]:
    """Two member clusters (east doubles as the hub), one operator with --members-namespace, an
    elastic job across both; west's API server stalled for ``seconds`` (SIGSTOP: the hub's
    connections hang, as on a cut network). The job's pods there cannot be seen or deleted
    meanwhile: the gang restarts on east, and west's stale pods must go once it answers.
    Recovery: west answering -> its stale pods deleted and the job's status says it is
    reachable. The job must then Succeed; the judge sees both members' pods."""
    from localkube.multicluster import MEMBERS_NAMESPACE, MultiCluster

    f = Fault("member-cutoff")
    left: list[str] = []
    mc = MultiCluster(REPO / ".holmes" / f"bench-cpfaults-multi-{os.getpid()}")
    ns, name = "faults-multi", "across"
    op = None
    try:
        mc.up(
            REPO / "hack" / "topologies" / "default.yaml",
            log=lambda m: print(f"[multicluster] {m}", file=sys.stderr),
        )
        hub = World(str(mc.kubeconfig(mc.hub)), ns)
        west = World(str(mc.kubeconfig("west")), ns)

        wait_until(
            "the HolmesJob CRD on the hub", lambda: install_crd(mc.kubeconfig(mc.hub)) or True, 120, every=2
        )
        mc.register(MEMBERS_NAMESPACE)
        mc.ensure_namespace(ns)
        op = OperatorProcess(
            str(mc.kubeconfig(mc.hub)),
            [ns],
            tmp / "operator-multi.log",
            extra=[f"--members-namespace={MEMBERS_NAMESPACE}", "--restart-backoff-seconds=1"],
        ).start()
        spec = workload_job(name, ns, job_seconds + int(seconds))
        spec["spec"]["nodes"] = {"count": 4, "minCount": 2, "gpusPerNode": 1}
        hub.create(spec)
        judge.expected, judge.last = {name}, {}  # the first testbed's jobs are not on this one

        def snapshot() -> Snapshot | None:  # the jobs on the hub, the pods in both members
            a = hub.snapshot()
            try:
                b = west.pods(name)
            except Exception:  # noqa: BLE001 (west is cut off)
                return None
            return None if a is None else Snapshot(a.t, a.jobs, a.pods + b)

        wait_until(
            f"{name} Running across both members", lambda: hub.status(name).get("phase") == "Running", 180
        )
        judge.see(wait_until("a snapshot", snapshot, 30))
        judge.during = f.kind
        plane = mc.plane("west")
        t0 = time.monotonic()
        plane.pause("kube-apiserver")
        try:
            time.sleep(seconds)
        finally:
            plane.resume("kube-apiserver")
        f.seconds = time.monotonic() - t0
        back = time.monotonic()

        def recovered() -> bool:
            st = hub.status(name)
            stale = [p for p in west.pods(name) if _labels(p).get(LABEL_ATTEMPT) != str(st.get("attempt"))]
            return bool((st.get("members") or {}).get("west", {}).get("reachable")) and not [
                p for p in stale if live(p)
            ]

        wait_until("west reachable and its stale pods gone", recovered, 180)
        f.recovery = time.monotonic() - back
        judge.see(wait_until("a snapshot", snapshot, 30))
        judge.during = ""
        st = wait_until(
            f"{name} finished",
            lambda: (lambda s: s if s.get("phase") in FINISHED else None)(hub.status(name)),
            300,
            every=1,
        )
        f.note = f"attempt {st.get('attempt')}, restarts {st.get('restartsByReason')}"
        time.sleep(3)
        left = judge.end(wait_until("a final snapshot", snapshot, 30), [name])
    finally:
        if op is not None:
            op.stop()
        mc.down(log=lambda m: None)
        import shutil

        shutil.rmtree(mc.root, ignore_errors=True)
    return f, left


def topology(path: Path) -> Path:
    """The default topology's nodes (the node agent's: the workload) and HOLLOW_NODES hollow ones
    (kwok's: the probes and the wide job), written to ``path``."""
    doc = yaml.safe_load((REPO / "hack" / "topologies" / "default.yaml").read_text())
    hollow = hn.topology_doc(hn.hollow_nodes(HOLLOW_NODES, 2))  # IB and RoCE, the labeller's labels
    doc["nodes"] += hollow["nodes"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="the make-test subset: " + ", ".join(SMALL))
    ap.add_argument("--faults", help="comma-separated fault kinds, in order (default: all, or --small's)")
    ap.add_argument("--stall", type=float, default=8.0, help="seconds etcd stays stopped")
    ap.add_argument("--job-seconds", type=int, default=20, help="how long each workload job's pods sleep")
    ap.add_argument("--jobs", type=int, default=3, help="workload jobs running at the start")
    ap.add_argument(
        "--member-cutoff", type=float, default=0.0, help="also cut a member cluster off this long"
    )
    ap.add_argument(
        "--timeout", type=float, default=300, help="seconds for the workload to finish at the end"
    )
    a = ap.parse_args()
    kinds = a.faults.split(",") if a.faults else list(SMALL if a.small else FULL)
    tmp = Path(tempfile.mkdtemp(prefix="holmes-cpfaults-"))
    cp = ControlPlane(REPO / ".holmes" / f"bench-cpfaults-{os.getpid()}")
    cp.dir.mkdir(parents=True, exist_ok=True)
    ns = "faults"
    ops = None
    b: Bench | None = None
    judge = Judge()
    faults: list[Fault] = []
    problems: list[str] = []
    left: list[str] = []
    try:
        cp.up(topology(tmp / "topology.yaml"), log=lambda m: print(f"[localkube] {m}", file=sys.stderr))
        w = World(str(cp.kubeconfig), ns)

        wait_until("the HolmesJob CRD established", lambda: install_crd(cp.kubeconfig) or True, 120, every=2)
        w.core.create_namespace({"metadata": {"name": ns}})
        wait_until(
            "the namespace's default service account",
            lambda: w.core.read_namespaced_service_account("default", ns),
            30,
        )
        ops = Operators(str(cp.kubeconfig), ns, tmp)
        ops.start()
        b = Bench(cp, w, ops, judge, a)
        b.watcher.start()
        for _ in range(a.jobs):
            b.submit()
        wait_until(
            "the first workload job running", lambda: w.status("work-1").get("phase") == "Running", 120
        )
        for i, kind in enumerate(kinds, 1):
            b.submit()  # a job launching as the fault strikes
            f = b.strike(kind, i)
            faults.append(f)
            print(
                f">> {kind}: lasted {f.seconds:.1f}s, recovered in {f.recovery:.1f}s {f.note}",
                file=sys.stderr,
                flush=True,
            )
        wait_until(
            "every workload job finished",
            lambda: all(w.status(n).get("phase") in FINISHED for n in b.workload),
            a.timeout,
            every=1,
        )
        time.sleep(3)  # what the operator still deletes
        b.stop.set()
        b.watcher.join(5)
        final = wait_until("a final snapshot", w.snapshot, 30)
        left = judge.end(final, b.workload)
    except (TimeoutError, RuntimeError, ApiException) as e:
        problems.append(f"{type(e).__name__}: {e}")
        print(f"!! {e}", file=sys.stderr)
        if ops:
            print(ops.tail(), file=sys.stderr)
    finally:
        if b is not None and b.watcher.is_alive():  # no replica started again once stopped
            b.stop.set()
            b.watcher.join(10)
        if ops:
            ops.stop()
        cp.down(log=lambda m: None)
        import shutil

        shutil.rmtree(cp.dir, ignore_errors=True)
    if a.member_cutoff and not problems:  # a testbed of its own, once the hub's is down
        try:
            f, more = member_cutoff(a.member_cutoff, a.job_seconds, tmp, judge)
            faults.append(f)
            left += more
            print(
                f">> member-cutoff: lasted {f.seconds:.1f}s, recovered in {f.recovery:.1f}s {f.note}",
                file=sys.stderr,
            )
        except (TimeoutError, RuntimeError, ApiException) as e:
            problems.append(f"member-cutoff: {type(e).__name__}: {e}")
            print(f"!! {e}", file=sys.stderr)
    dup = sorted(f"{j}/rank {r}" for j, r in judge.duplicates)
    out = {
        "faults": len(faults),
        "survived": not (problems or left or dup or judge.lost or judge.wrong)
        and len(faults) == len(kinds) + bool(a.member_cutoff),
        "orphanPods": len(left),
        "duplicatePods": len(dup),
        "lostJobs": len(judge.lost),
        "wrongPhase": len(judge.wrong),
        "recoveryP99S": round(p99([f.recovery for f in faults]), 2),
        "operatorRestarts": ops.restarts if ops else 0,
        "detail": [f.__dict__ for f in faults],
        "problems": problems + left + dup + [f"{k}: {v}" for k, v in {**judge.lost, **judge.wrong}.items()],
    }
    print(json.dumps(out))
    return 0 if out["survived"] else 1


if __name__ == "__main__":
    sys.exit(main())
