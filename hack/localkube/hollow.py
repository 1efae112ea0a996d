"""Hollow kubelets (kubemark's idea): thousands of Nodes against the real API server, etcd,
scheduler and controller manager, whose pods are reported Running and then Succeeded or Failed
on a schedule without any process being started.

    PYTHONPATH=hack .venv/bin/python -m localkube.hollow --kubeconfig K --nodes 2000 --islands 8 \
        --control-dir DIR

What it costs the control plane, and why it stays cheap at 2,000 nodes on 2 cores:

- Registration: one create per node (status included) and one patch lifting the not-ready taint
  the TaintNodesByCondition admission puts on new nodes (the node lifecycle controller that
  would lift it is off in the local control plane), 16 in flight; one Lease per node.
- Heartbeats as the 1.20 kubelet sends them: the node's Lease in ``kube-node-lease`` renewed
  every ``--lease-seconds`` (one small merge patch, spread evenly over the period), and the
  Node's status only every ``--status-seconds`` (the kubelet's nodeStatusReportFrequency, 5
  minutes) or when readiness changes. Node watchers (the scheduler, the operator) therefore
  see a node event every few minutes rather than every 10 s.
- Pods: ONE list+watch for every bound pod (field selector ``spec.nodeName!=``), filtered to
  hollow nodes here; one status merge patch per transition (Running, then Succeeded/Failed;
  a pod that ends before its Running report was sent skips it), sent from a pool of
  ``--workers`` threads. Hollow pods have no IP (no network: the endpoints controller and the
  operator's metrics scrape skip them) unless ``--pod-ip`` gives one; a finished pod's
  termination message is the trainer's last metric line.

Control files in ``--control-dir`` (read every 0.5 s), so a bench can churn from outside:
- ``hollow-not-ready``: node names, one a line; each reports Ready=False (a kubelet whose
  container runtime is down) and does nothing for its pods (no status, no deletion confirmed)
  until its name is removed.
- ``hollow-fail-pods``: ``namespace/name`` lines; each such pod, when running, fails (exit 1).
- ``hollow-finish``: namespaces, one a line; their pods end (exit 0) now, and any started
  later ends as it starts (a bench ends its jobs when it has measured them).
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import queue
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from . import hollow_nodes as hn
from . import podspec as ps
from .topology import SimNode

log = logging.getLogger("localkube.hollow")
NOT_READY_FILE = "hollow-not-ready"
FAIL_PODS_FILE = "hollow-fail-pods"
FINISH_FILE = "hollow-finish"
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
TICK = 0.5
LEASE_NS = "kube-node-lease"


def micro_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class HollowPod:
    ns: str
    name: str
    uid: str
    node: str
    pod: dict  # as first seen: its containers and annotations
    phase: str = "Pending"  # what this kubelet reported last
    started: str = ""
    deleting: bool = False


class HollowKubelets:
    def __init__(
        self,
        api: client.ApiClient,
        nodes: list[SimNode],
        control_dir: Path,
        lease_seconds: float = 10.0,
        status_seconds: float = 300.0,
        start_seconds: float = 1.0,
        default_run: float | None = None,
        workers: int = 8,
        pod_ip: str = "",
    ) -> None:
        self.api, self.core = api, client.CoreV1Api(api)
        self.nodes = {n.name: n for n in nodes}
        self.order = [n.name for n in nodes]
        self.control_dir = control_dir
        self.lease_seconds, self.status_seconds = lease_seconds, status_seconds
        self.start_seconds, self.default_run = start_seconds, default_run
        self.pod_ip = pod_ip
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="hollow-write")  # pods
        # heartbeats apart, one batch at a time: a slow API server delays them (as a kubelet's
        # renewals lag) but never queues pods' reports behind a backlog of renewals
        self.beats = ThreadPoolExecutor(1, thread_name_prefix="hollow-beat")
        self.beating: Future | None = None
        self.pods: dict[str, HollowPod] = {}
        self.due: list[tuple[float, int, str, str]] = []  # (when, seq, uid, "run" | "end")
        self.seq = 0
        self.events: queue.Queue = queue.Queue()
        self.not_ready: set[str] = set()
        self.failed_lines: set[str] = set()
        self.finished_ns: set[str] = set()
        self.stop = threading.Event()
        self.writes = 0  # requests sent (for the log line; the bench reads the API server's count)
        self._lock = threading.Lock()

    # ---- requests --------------------------------------------------------------------------
    def _merge_patch(self, path: str, body: dict) -> None:
        with self._lock:
            self.writes += 1
        self.api.call_api(
            path,
            "PATCH",
            header_params={"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
        )

    def _quiet(self, what: str, fn, *args) -> None:
        try:
            fn(*args)
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("%s: %s %s", what, e.status, e.reason)
        except Exception as e:  # noqa: BLE001 (an API server restart: the next period retries)
            log.warning("%s: %s", what, e)

    def submit(self, what: str, fn, *args) -> None:
        self.pool.submit(self._quiet, what, fn, *args)

    # ---- nodes -----------------------------------------------------------------------------
    def register(self) -> None:
        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(self._register_one, self.order))
        log.info("registered %d hollow nodes in %.1fs", len(self.order), time.monotonic() - t0)

    def _register_one(self, name: str) -> None:
        n = self.nodes[name]
        body = hn.node_body(n, ps.now_iso())
        try:
            got = json.loads(self.core.create_node(body, _preload_content=False).data)
        except ApiException as e:
            if e.status != 409:
                raise
            self.core.patch_node(name, {"metadata": {"labels": body["metadata"]["labels"]}})
            got = json.loads(self.core.read_node(name, _preload_content=False).data)
            self._merge_patch(f"/api/v1/nodes/{name}/status", {"status": body["status"]})
        taints = (got.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if t["key"] not in NOT_READY_TAINTS]
        if kept != taints:
            self._merge_patch(f"/api/v1/nodes/{name}", {"spec": {"taints": kept}})
        lease = hn.lease_body(name, micro_now(), int(max(40, 4 * self.lease_seconds)))
        try:
            client.CoordinationV1Api(self.api).create_namespaced_lease(
                LEASE_NS, lease, _preload_content=False
            )
        except ApiException as e:
            if e.status != 409:
                raise

    def unregister(self) -> None:
        """Delete the hollow Nodes and their Leases (their pods are the caller's to delete)."""
        leases = client.CoordinationV1Api(self.api)

        def one(name: str) -> None:
            self._quiet("delete node", self.core.delete_node, name)
            self._quiet("delete lease", leases.delete_namespaced_lease, name, LEASE_NS)

        with ThreadPoolExecutor(16) as ex:
            list(ex.map(one, self.order))

    def _renew(self, names: list[str]) -> None:
        now = micro_now()
        for name in names:
            self._quiet(
                "lease",
                self._merge_patch,
                f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{name}",
                {"spec": {"renewTime": now}},
            )

    def _beat(self, leases: list[str], statuses: list[str]) -> None:
        self._quiet("leases", self._renew, leases)
        self._quiet("node status", self._report_node, statuses)

    def _report_node(self, names: list[str]) -> None:
        now = ps.now_iso()
        for name in names:
            conds = hn.node_conditions(name not in self.not_ready, now)
            self._quiet(
                "node status",
                self._merge_patch,
                f"/api/v1/nodes/{name}/status",
                {"status": {"conditions": conds}},
            )

    # ---- control files ---------------------------------------------------------------------
    def _lines(self, name: str) -> set[str]:
        try:
            return set((self.control_dir / name).read_text().split())
        except OSError:
            return set()

    def read_control(self) -> None:
        off = self._lines(NOT_READY_FILE) & set(self.nodes)
        changed = sorted(off ^ self.not_ready)
        self.not_ready = off
        if changed:
            self.submit("readiness", self._report_node, changed)
        for back in set(changed) - off:  # the node's kubelet acts again: what it owes its pods
            for p in list(self.pods.values()):
                if p.node == back and p.deleting:
                    self.submit("confirm delete", self._confirm_delete, p)
        for line in self._lines(FAIL_PODS_FILE) - self.failed_lines:
            self.failed_lines.add(line)
            ns, _, name = line.partition("/")
            for p in list(self.pods.values()):
                if (p.ns, p.name) == (ns, name) and p.phase == "Running" and p.node not in self.not_ready:
                    self._finish(p, 1)

        for ns in self._lines(FINISH_FILE) - self.finished_ns:
            self.finished_ns.add(ns)
            for p in list(self.pods.values()):
                if p.ns == ns and p.phase == "Running" and not p.deleting and p.node not in self.not_ready:
                    self._finish(p, 0)

    # ---- pods ------------------------------------------------------------------------------
    def watch_pods(self) -> None:
        """One list+watch of every bound pod, as ("sync", pods) then ("event", type, pod)."""
        while not self.stop.is_set():
            try:
                lst = json.loads(
                    self.core.list_pod_for_all_namespaces(
                        field_selector="spec.nodeName!=", _preload_content=False, _request_timeout=60
                    ).data
                )
                self.events.put(("sync", [p for p in lst["items"] if self._ours(p)]))
                rv = lst["metadata"]["resourceVersion"]
                while not self.stop.is_set():
                    rv = self._watch(rv)
            except _Expired:
                continue
            except Exception as e:  # noqa: BLE001 (API server restarts: list again)
                if not self.stop.is_set():
                    log.warning("pod watch: %s; listing again", e)
                    self.stop.wait(1.0)

    def _watch(self, rv: str) -> str:
        resp = self.core.list_pod_for_all_namespaces(
            field_selector="spec.nodeName!=",
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=270,
            _preload_content=False,
            _request_timeout=(10, 300),
        )
        try:
            for line in iter_resp_lines(resp):
                if self.stop.is_set():
                    break
                if not line or line.isspace():
                    continue
                ev = json.loads(line)
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    raise _Expired() if obj.get("code") == 410 else RuntimeError(obj.get("message"))
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if ev.get("type") != "BOOKMARK" and self._ours(obj):
                    self.events.put(("event", ev["type"], obj))
        finally:
            resp.close()
            resp.release_conn()
        return rv

    def _ours(self, pod: dict) -> bool:
        return (pod.get("spec") or {}).get("nodeName") in self.nodes

    def _at(self, when: float, uid: str, what: str) -> None:
        self.seq += 1
        heapq.heappush(self.due, (when, self.seq, uid, what))

    def on_pod(self, kind: str, pod: dict) -> None:
        meta, uid = pod["metadata"], pod["metadata"]["uid"]
        if kind == "DELETED":
            self.pods.pop(uid, None)
            return
        p = self.pods.get(uid)
        phase = (pod.get("status") or {}).get("phase")
        if p is None:
            if phase in ("Succeeded", "Failed") and not meta.get("deletionTimestamp"):
                return  # ended before this kubelet started: nothing to report
            p = self.pods[uid] = HollowPod(meta["namespace"], meta["name"], uid, pod["spec"]["nodeName"], pod)
            p.phase = phase or "Pending"
            if p.phase == "Running":  # reported by this kubelet before a restart: runs on
                p.started = (pod.get("status") or {}).get("startTime") or ps.now_iso()
                self._schedule_end(p)
            elif p.phase == "Pending":
                self._at(time.monotonic() + self.start_seconds, uid, "run")
        if meta.get("deletionTimestamp") and not p.deleting:
            p.deleting = True
            if p.node not in self.not_ready:
                self.submit("confirm delete", self._confirm_delete, p)

    def sync(self, pods: list[dict]) -> None:
        seen = {p["metadata"]["uid"] for p in pods}
        for uid in set(self.pods) - seen:
            self.pods.pop(uid)
        for pod in pods:
            self.on_pod("ADDED", pod)

    def _schedule_end(self, p: HollowPod) -> None:
        sched = hn.schedule(p.pod, self.default_run, time.time())
        if sched.run_seconds is not None:
            self._at(time.monotonic() + sched.run_seconds, p.uid, "end")

    def _confirm_delete(self, p: HollowPod) -> None:
        """What a kubelet does once the containers are gone: delete the pod for good."""
        with self._lock:
            self.writes += 1
        self.core.delete_namespaced_pod(
            p.name,
            p.ns,
            body=client.V1DeleteOptions(
                grace_period_seconds=0, preconditions=client.V1Preconditions(uid=p.uid)
            ),
            _preload_content=False,
        )

    def _status(self, p: HollowPod, status: dict) -> None:
        self._merge_patch(f"/api/v1/namespaces/{p.ns}/pods/{p.name}/status", {"status": status})

    def _finish(self, p: HollowPod, code: int) -> None:
        p.phase = "Succeeded" if code == 0 else "Failed"
        st = hn.finished_status(p.pod, p.started or ps.now_iso(), ps.now_iso(), code, self.pod_ip)
        self.submit("pod status", self._status, p, st)

    def fire(self, uid: str, what: str) -> None:
        p = self.pods.get(uid)
        if p is None or p.deleting or p.phase in ("Succeeded", "Failed"):
            return
        if p.node not in self.not_ready:
            if what == "run" and p.phase == "Pending":
                p.started, p.phase = ps.now_iso(), "Running"
                sched = hn.schedule(p.pod, self.default_run, time.time())
                if p.ns in self.finished_ns or sched.run_seconds == 0:  # ends at once: one report
                    self._finish(p, sched.exit_code)
                    return
                self.submit("pod status", self._status, p, hn.running_status(p.pod, p.started, self.pod_ip))
                self._schedule_end(p)
            elif what == "end" and p.phase == "Running":
                self._finish(p, hn.schedule(p.pod, self.default_run, time.time()).exit_code)
            return
        self._at(time.monotonic() + 1.0, uid, what)  # its kubelet is down: try again later

    # ---- the loop --------------------------------------------------------------------------
    def run(self) -> None:
        self.register()
        threading.Thread(target=self.watch_pods, daemon=True, name="hollow-watch").start()
        n = len(self.order)
        lease_i = status_i = 0
        lease_per_tick = max(1, round(n * TICK / self.lease_seconds))
        status_per_tick = max(1, round(n * TICK / self.status_seconds))
        next_tick = time.monotonic()
        while not self.stop.is_set():
            try:
                item = self.events.get(timeout=max(0.0, min(TICK, next_tick - time.monotonic())))
                if item[0] == "sync":
                    self.sync(item[1])
                else:
                    self.on_pod(item[1], item[2])
            except queue.Empty:
                pass
            now = time.monotonic()
            while self.due and self.due[0][0] <= now:
                _, _, uid, what = heapq.heappop(self.due)
                self.fire(uid, what)
            if now >= next_tick:
                next_tick = now + TICK
                self.read_control()
                leases = [self.order[(lease_i + k) % n] for k in range(min(n, lease_per_tick))]
                statuses = [self.order[(status_i + k) % n] for k in range(min(n, status_per_tick))]
                if self.beating is None or self.beating.done():  # else this tick's beats are skipped
                    lease_i = (lease_i + lease_per_tick) % n
                    status_i = (status_i + status_per_tick) % n
                    self.beating = self.beats.submit(self._beat, leases, statuses)

    def shutdown(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.beats.shutdown(wait=True, cancel_futures=True)


class _Expired(Exception):
    """410 Gone: list again."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localkube.hollow", description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--islands", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--control-dir", required=True, help="where the control files are read")
    ap.add_argument("--lease-seconds", type=float, default=10.0, help="Lease renewal period per node")
    ap.add_argument("--status-seconds", type=float, default=300.0, help="Node status period per node")
    ap.add_argument("--start-seconds", type=float, default=1.0, help="bound -> Running")
    ap.add_argument(
        "--run-seconds", type=float, default=None, help="default run time (absent: until deleted)"
    )
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument(
        "--pod-ip",
        default="",
        help="report this IP for every pod (127.0.0.1: a loopback stand-in answers for the "
        "trainers' metrics; the Services' selectors must then go, Endpoints refuse loopback)",
    )
    ap.add_argument("--unregister", action="store_true", help="delete the nodes and leases, then exit")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        nodes = hn.hollow_nodes(a.nodes, a.islands, a.gpus)
    except hn.HollowError as e:
        ap.error(str(e))
    if a.lease_seconds <= 0 or a.status_seconds <= 0:
        ap.error("--lease-seconds and --status-seconds must be > 0")
    cfg = client.Configuration()
    config.load_kube_config(config_file=a.kubeconfig, client_configuration=cfg)
    # before the client exists: its connection pool is made with it (a smaller pool than the
    # writers would open a TLS connection per request)
    cfg.connection_pool_maxsize = a.workers + 4
    api = client.ApiClient(cfg)
    hk = HollowKubelets(
        api,
        nodes,
        Path(a.control_dir),
        a.lease_seconds,
        a.status_seconds,
        a.start_seconds,
        a.run_seconds,
        a.workers,
        a.pod_ip,
    )
    if a.unregister:
        hk.unregister()
        return 0
    signal.signal(signal.SIGTERM, lambda *_: hk.stop.set())
    signal.signal(signal.SIGINT, lambda *_: hk.stop.set())
    try:
        hk.run()
    finally:
        hk.shutdown()
        log.info("hollow kubelets stopped after %d requests", hk.writes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
