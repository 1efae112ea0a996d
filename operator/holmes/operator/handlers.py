"""kopf wiring: one asyncio task per HolmesJob runs its reconcile loop; watch events on the job,
its pods and the nodes only wake that loop up (many events coalesce into one reconcile).

- ``holmes_nodes`` (kopf index): every node, slimmed to what planning needs.
- ``job_changed`` (kopf event handler on HolmesJobs): starts the job's loop on first sight (also
  for every existing job when the operator starts), wakes it on changes, ends it on deletion.
- The loop: read -> decide (pure) -> apply -> status -> Events, then sleep until woken or until
  the decision's requeue time. It is started from inside kopf's per-object handler context, so
  ``kopf.event`` posts the Kubernetes Events of each transition.
- Node changes that matter (labels, allocatable, readiness, cordon) wake the jobs waiting for nodes;
  jobs with pods still starting re-read the nodes every few seconds anyway (a lost node is noticed).

Why not a kopf daemon: daemons make kopf put a finalizer on every HolmesJob, and a job could then
not be deleted while the operator is down. Children go away through their ownerReferences, so
Holmes needs no finalizer at all.

Reconciles of one job never overlap (one loop per job); different jobs run concurrently.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import kopf
from kubernetes import client

from . import metrics, names, progress
from .kube import KubeIO
from .reconcile import ChildRefusal, Decision, Observed, Planner, RestartBackoff, decide, owned_by
from .render import RenderSettings
from .summary import pod_attempt, pod_node_rank

log = logging.getLogger("holmes.operator")
IDLE_RESYNC = 300.0  # a quiet job is still re-read this often


class Waker:
    """Wakes one job's loop; set() from the event loop only."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.waiting_for_nodes = False

    async def sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.event.wait(), timeout=max(0.0, seconds))
        except asyncio.TimeoutError:
            pass
        self.event.clear()


@dataclass
class Runtime:
    """Everything the handlers share: API access, planner, rendering settings, wakers."""

    api: client.ApiClient
    planner: Planner
    settings: RenderSettings = field(default_factory=RenderSettings)
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    wakers: dict = field(default_factory=dict)  # (ns, name) -> Waker
    loops: dict = field(default_factory=dict)  # (ns, name) -> asyncio.Task
    node_facts: dict = field(default_factory=dict)  # node name -> fingerprint
    phases: metrics.PhaseTracker = field(default_factory=metrics.PhaseTracker)

    def __post_init__(self) -> None:
        self.io = KubeIO(self.api)

    def wake(self, key: tuple[str, str]) -> None:
        w = self.wakers.get(key)
        if w is not None:
            w.event.set()

    def wake_waiting(self) -> None:
        for w in self.wakers.values():
            if w.waiting_for_nodes:
                w.event.set()

    # ---- one reconcile (sync; runs in a worker thread) ------------------------------------
    def reconcile(
        self, ns: str, name: str, nodes: list[dict], refused: list[ChildRefusal] | None = None
    ) -> Decision | None:
        started = time.monotonic()
        job = self.io.read_job(ns, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return None
        pods = self.io.list_pods(ns, name)
        obs = Observed(
            job=job,
            pods=pods,
            configmap=self.io.read_configmap(ns, name),
            service=self.io.read_service(ns, name),
            nodes=nodes,
            now=datetime.now(timezone.utc),
            progress=self._progress(job, pods),
            refused=refused or [],
        )
        d = decide(obs, self.planner, self.settings, self.backoff)
        created, refusals = self.io.apply(d, job)
        old = job.get("status") or {}
        self.io.patch_status(job, old, d.status)
        self._account(job, old, d, created)
        for ev in d.events:
            kopf.event(job, type=ev.type, reason=ev.reason, message=ev.message[:1000])
            level = logging.WARNING if ev.type == "Warning" else logging.INFO
            log.log(
                level,
                ev.message,
                extra={
                    "job": f"{ns}/{name}",
                    "reason": ev.reason,
                    "phase": d.status.get("phase"),
                    "attempt": d.status.get("attempt"),
                },
            )
        if d.delete_job:
            self.io.delete_job(ns, name)
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
        if refusals:  # decide again at once, knowing what the API server refused
            return self.reconcile(ns, name, nodes, refusals)
        return d

    def _progress(self, job: Mapping, pods: list[dict]) -> dict | None:
        st = job.get("status") or {}
        if not st.get("launched"):
            return None
        uid = job["metadata"].get("uid")
        rank0 = [
            p
            for p in pods
            if pod_attempt(p) == st.get("attempt") and pod_node_rank(p) == 0 and (not uid or owned_by(p, uid))
        ]
        if not rank0:
            return None
        found = progress.from_pod(rank0[0], self.settings.metrics_port)
        if not found and progress.terminated(rank0[0]):  # the trainer's last line, from its log
            found = progress.from_json_lines(self.io.log_tail(rank0[0]))
        return found

    def _account(self, job: Mapping, old: Mapping, d: Decision, created: int) -> None:
        metrics.PODS_CREATED.inc(created)
        if int(d.status.get("restarts") or 0) > int(old.get("restarts") or 0):
            metrics.RESTARTS.inc()
        if d.status.get("phase") == "Failed" and old.get("phase") != "Failed":
            reason = next(
                (c.get("reason") for c in d.status.get("conditions") or [] if c.get("type") == "Failed"), ""
            )
            metrics.FAILURES.labels(reason or "Unknown").inc()


def node_fingerprint(body: Mapping) -> tuple:
    """What of a node matters to planning (heartbeats change none of it)."""
    meta, spec, st = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    ready = next((c.get("status") for c in st.get("conditions") or [] if c.get("type") == "Ready"), None)
    return (
        tuple(sorted((meta.get("labels") or {}).items())),
        tuple(sorted((st.get("allocatable") or {}).items())),
        bool(spec.get("unschedulable")),
        ready,
        tuple(str(t) for t in spec.get("taints") or []),
    )


def slim_node(body: Mapping) -> dict:
    meta, spec, st = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": meta.get("name"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": {
                k: v
                for k, v in (meta.get("annotations") or {}).items()
                if k.startswith(("holmes.dev/", "nvidia.com/"))
            },
        },
        "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
        "status": {
            "allocatable": dict(st.get("allocatable") or {}),
            "capacity": dict(st.get("capacity") or {}),
            "conditions": [dict(c) for c in st.get("conditions") or [] if c.get("type") == "Ready"],
        },
    }


def register(rt: Runtime, registry: kopf.OperatorRegistry) -> None:
    """Register the handlers on ``registry`` (one registry per operator instance)."""

    @kopf.index("", "v1", "nodes", registry=registry, id="holmes_nodes")
    async def holmes_nodes(name: str, body: kopf.Body, **_: Any) -> dict:
        return {name: slim_node(body)}

    @kopf.on.event("", "v1", "nodes", registry=registry, id="node_changed")
    async def node_changed(name: str, body: kopf.Body, type: str | None, **_: Any) -> None:
        fp = None if type == "DELETED" else node_fingerprint(body)
        if rt.node_facts.get(name) != fp:
            if fp is None:
                rt.node_facts.pop(name, None)
            else:
                rt.node_facts[name] = fp
            rt.wake_waiting()

    @kopf.on.event(
        "", "v1", "pods", labels={names.LABEL_JOB: kopf.PRESENT}, registry=registry, id="pod_changed"
    )
    async def pod_changed(namespace: str, labels: Mapping[str, str], **_: Any) -> None:
        rt.wake((namespace, labels[names.LABEL_JOB]))

    @kopf.on.event(names.GROUP, names.VERSION, names.PLURAL, registry=registry, id="job_changed")
    async def job_changed(
        namespace: str, name: str, type: str | None, holmes_nodes: kopf.Index, **_: Any
    ) -> None:
        key = (namespace, name)
        if type == "DELETED":
            task = rt.loops.pop(key, None)
            if task is not None:
                task.cancel()
            return
        task = rt.loops.get(key)
        if task is None or task.done():
            # Created here, the task inherits kopf's per-object context (Event posting).
            rt.loops[key] = asyncio.create_task(
                job_loop(namespace, name, holmes_nodes), name=f"holmesjob {namespace}/{name}"
            )
        else:
            rt.wake(key)

    async def job_loop(namespace: str, name: str, holmes_nodes: kopf.Index) -> None:
        key = (namespace, name)
        # A fresh waker: a cancelled loop of a deleted job of the same name may not have ended yet.
        waker = rt.wakers[key] = Waker()
        backoff = 1.0
        try:
            while True:
                nodes = [v for store in holmes_nodes.values() for v in store]
                try:
                    d = await asyncio.to_thread(rt.reconcile, namespace, name, nodes)
                    if d is None:  # deleted (or being deleted): nothing left to do
                        return
                    backoff = 1.0
                    delay = IDLE_RESYNC if d.requeue_after is None else d.requeue_after
                    rt.phases.set(key, d.status.get("phase"))
                    waker.waiting_for_nodes = d.waiting_for_nodes
                except Exception as e:  # an API hiccup must not end the job's loop
                    metrics.RECONCILE_ERRORS.inc()
                    log.exception(
                        "reconcile failed; retrying in %.0fs",
                        backoff,
                        extra={"job": f"{namespace}/{name}", "error": str(e)},
                    )
                    delay, backoff = backoff, min(backoff * 2, 60.0)
                await waker.sleep(delay)
        finally:
            if rt.wakers.get(key) is waker:  # else a newer loop serves this key: leave it its waker
                rt.wakers.pop(key)
                rt.phases.set(key, None)
            if rt.loops.get(key) is asyncio.current_task():
                rt.loops.pop(key, None)

    @kopf.on.cleanup(registry=registry, id="stop_loops")
    async def stop_loops(**_: Any) -> None:
        loops = list(rt.loops.values())
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)

    @kopf.on.probe(id="jobs", registry=registry)
    async def jobs_probe(**_: Any) -> dict:
        return rt.phases.counts()
