"""kopf wiring: one asyncio task per HolmesJob runs its reconcile loop; watch events on the job,
its children and the nodes only wake that loop up (many events coalesce into one reconcile).

- Nodes: Holmes' own informer (watches.py), every node slimmed to what planning needs.
- ``job_changed`` (kopf event handler on HolmesJobs): keeps the job's latest body, starts the
  job's loop on first sight (also for every existing job when the operator starts), wakes it on
  changes, ends it on deletion.
- What else is watched, and when the loops may act, is watches.py's; one reconcile is
  pipeline.py's (observe -> decide -> write -> status), the same for a job on this cluster and
  one across member clusters.
- The loop: one reconcile, then Events, then sleep until woken or until the decision's requeue
  time. A steady running job makes one API request per progress interval (the progress patch),
  none when nothing changed. It is started from inside kopf's per-object handler context, so
  ``kopf.event`` posts the Kubernetes Events of each transition.
- Node changes that matter (labels, allocatable, readiness, cordon, taints) wake every job; any
  pod change, and any HolmesJob change, wakes the jobs that have not launched yet (debounced).
- A job across member clusters carries the finalizer ``holmes.dev/member-children``: deleting
  it deletes its children in every member first (``members.cleanup``).

Why not a kopf daemon: daemons make kopf put a finalizer on every HolmesJob, and a job could then
not be deleted while the operator is down. Children go away through their ownerReferences, so
a single-cluster job needs no finalizer at all (a job across members does: no ownerReference
crosses clusters).

Reconciles of one job never overlap (one loop per job); different jobs run concurrently, in the
reconcile worker pool. Each reports to the liveness record (liveness.py), which fails the
probe when reconciles stop making progress. Every thread and lock: docs/concurrency.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import functools
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client

from holmes.contract.names import GROUP, PLURAL, VERSION
from holmes.plan.costmodel_file import CostModelFile

from . import api_count, jobset_watch, liveness, metrics, topology_labels
from .core import dispatching, managed_by, members
from .core.reconcile import ChildRefusal, Decision, RestartBackoff
from .core.render import RenderSettings
from .kube import Caches, KubeIO
from .pipeline import Pipeline
from .progress import ProgressReader
from .watches import Watches

log = logging.getLogger("holmes.operator")
IDLE_RESYNC = 300.0  # a quiet job is still re-read this often
# Reconciles run in a pool of their own (asyncio's default one serves the Lease renewals and
# discovery, which reconciles must not starve). Sized for waiting, not for cores: a launch holds
# its worker through a dry run, its children's creates and a status patch (~1.5 s of round trips
# on a busy API server), so at 2 launches/s asyncio's default (cores + 4: 6 here) queued them
# for up to 10 s (issue 46's bench at 2,000 nodes; 16 kept the wait under 0.1 s).
RECONCILE_WORKERS = 16
# ... two of them: jobs not launched yet reconcile in one, the others in the other, so a new
# job's placement never queues behind the running jobs' reconciles (which the pod events of a
# busy cluster keep due, and whose writes hold a worker while the API server answers).
POOLS = ("launching", "tracking")
WAKE_WAITING_DELAY = 0.3  # pod changes wake the waiting jobs at most this often


class Waker:
    """Wakes one job's loop; set() from the event loop only."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.event.wait(), timeout=max(0.0, seconds))
        except asyncio.TimeoutError:
            pass
        self.event.clear()


@dataclass
class Runtime:
    """What the handlers share: the caches and their watches, the reconcile pipeline, the wakers."""

    api: client.ApiClient
    cost_model: CostModelFile  # re-read at each decision when its file changed
    settings: RenderSettings = field(default_factory=RenderSettings)
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    namespaces: tuple[str, ...] = ()  # kopf's patterns ("team-*", "!kube-*"); () = every namespace
    members_namespace: str = ""  # where member clusters are registered (Secrets); "" = none
    member_secrets: tuple[str, ...] = ()  # only these Secrets there (RBAC resourceNames); () = all
    wakers: dict = field(default_factory=dict)  # (ns, name) -> Waker
    loops: dict = field(default_factory=dict)  # (ns, name) -> asyncio.Task
    phases: metrics.PhaseTracker = field(default_factory=metrics.PhaseTracker)
    # reconciles due and running: the liveness probe's verdict (liveness.py)
    reconciles: liveness.Progress = field(default_factory=liveness.Progress)
    topology_labels: bool = True  # --topology-labels

    def __post_init__(self) -> None:
        self.caches = Caches()
        self.io = KubeIO(self.api, self.caches)
        self.watches = Watches(
            self.api,
            self.caches,
            self.namespaces,
            self.members_namespace,
            self.wake,
            self.wake_all,
            self.wake_waiting,
            self._kueue_in_use,
            self.member_secrets,
        )
        # Holmes' islands as node labels for the schedulers, written while this replica leads
        self.labels: topology_labels.TopologyLabels | None = None
        if self.topology_labels:
            mapping = lambda: self.cost_model.config.nic_mapping  # noqa: E731
            self.labels = topology_labels.TopologyLabels(self.api, mapping, lambda: self.ready.is_set())
            self.watches.on_node = self.labels.start().offer
        self.loop: asyncio.AbstractEventLoop | None = None  # the operator's, once it runs
        self.progress = ProgressReader(
            self.settings.metrics_port, self.settings.progress_interval, on_read=self.wake_from_thread
        )
        self.pipeline = Pipeline(
            self.caches,
            self.io,
            self.watches,
            self.cost_model,
            self.settings,
            self.backoff,
            self.progress,
            self._say_once,
        )
        self.jobset_plans = jobset_watch.JobSetPlans(self.api, self.caches, self.watches, self.cost_model)
        # Set once the caches are filled and (with leader election) this replica leads.
        self.ready = asyncio.Event()
        self.leading: asyncio.Event | None = None  # the leader elector's, when there is one
        self.readying: asyncio.Task | None = None
        self.unlaunched: set[tuple[str, str]] = set()  # woken when capacity may have freed
        self._wake_scheduled = False
        self._said: dict[tuple, str] = {}  # messages logged once per change (member problems)
        self.workers = {
            pool: ThreadPoolExecutor(RECONCILE_WORKERS, thread_name_prefix=f"holmes-reconcile-{pool}")
            for pool in POOLS
        }
        metrics.OLDEST_RECONCILE.set_function(self.reconciles.oldest_running)

    def wake(self, key: tuple[str, str]) -> None:
        w = self.wakers.get(key)
        if w is not None:
            w.event.set()

    def wake_from_thread(self, key: tuple[str, str]) -> None:
        """``wake`` from another thread (a progress read that finished)."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.wake, key)

    def wake_all(self) -> None:
        for w in self.wakers.values():
            w.event.set()

    def wake_waiting(self) -> None:
        """Wake the jobs not launched yet, soon (many pod events coalesce into one wake)."""
        if self._wake_scheduled:
            return
        self._wake_scheduled = True

        def fire() -> None:
            self._wake_scheduled = False
            for key in list(self.unlaunched):
                self.wake(key)

        asyncio.get_running_loop().call_later(WAKE_WAITING_DELAY, fire)

    def _kueue_in_use(self, version: str | None) -> None:
        self.io.kueue_version = version or self.io.kueue_version  # writes keep the last one known

    async def become_ready(self) -> None:
        await self.watches.synced()
        if self.leading is not None:
            await self.leading.wait()
        self.ready.set()
        if self.labels is not None:  # what the nodes' events offered before went unwritten
            self.labels.resync(self.caches.nodes.snapshot())

    def remember_job(self, body: Mapping) -> None:
        self.caches.jobs.put(copy.deepcopy(dict(body)))

    # ---- one reconcile (sync; runs in a worker thread) ------------------------------------
    async def reconcile_in_worker(self, ns: str, name: str, nodes: list[dict]) -> Decision | None:
        """``reconcile`` in a worker thread, in the caller's context (kopf's per-object one,
        which ``kopf.event`` posts through), reported to the liveness record."""
        token = self.reconciles.due(f"{ns}/{name}")
        pool = self.pool_of(ns, name)
        due = time.monotonic()

        def run() -> Decision | None:
            metrics.RECONCILE_WAIT_SECONDS.labels(pool).observe(time.monotonic() - due)
            with self.reconciles.running(token):
                return self.reconcile(ns, name, nodes)

        call = functools.partial(contextvars.copy_context().run, run)
        try:
            return await asyncio.get_running_loop().run_in_executor(self.workers[pool], call)
        finally:
            self.reconciles.dropped(token)  # cancelled before a worker took it

    def pool_of(self, ns: str, name: str) -> str:
        """``launching`` for a job not launched yet (nor ended), else ``tracking``."""
        status = (self.caches.jobs.get(ns, name) or {}).get("status") or {}
        ended = status.get("phase") in ("Succeeded", "Failed")
        return "tracking" if status.get("launched") or ended else "launching"

    def reconcile(
        self, ns: str, name: str, nodes: list[dict], refused: list[ChildRefusal] | None = None
    ) -> Decision | None:
        started = time.monotonic()
        job = self.caches.jobs.get(ns, name)
        if job is None:
            return None
        if job["metadata"].get("deletionTimestamp"):
            if members.FINALIZER in (job["metadata"].get("finalizers") or []):
                return self.clean_members(job)
            return None  # ownerReferences clean up
        other = managed_by.elsewhere(job)
        if other:  # another controller runs it: nothing of ours but the Workload MultiKueue dispatches
            d = self.pipeline.dispatch(job) if dispatching.dispatched(job) else None  # woken by its changes
            for kind, reason, message in dispatching.said(other, d):  # each once
                if self._say_once(("managedBy" if kind == "Normal" else "dispatch", ns, name), message):
                    kopf.event(job, type=kind, reason=reason, message=message[:1000])
            return d
        d, job, old, created, refusals = self.pipeline.run(job, nodes, refused or [])
        self._after(job, old, d, created, started)
        if refusals:  # decide again at once, knowing what the API server refused
            return self.reconcile(ns, name, nodes, refusals)
        return d

    def _after(self, job: Mapping, old: Mapping, d: Decision, created: int, started: float) -> None:
        """What follows a reconcile's writes: bookkeeping, Events, logs, a TTL deletion."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        key = (ns, name)
        if not d.status.get("launched") and d.status.get("phase") not in ("Succeeded", "Failed"):
            self.unlaunched.add(key)
        else:
            self.unlaunched.discard(key)
        self._account(job, old, d, created)
        for ev in d.events:
            kopf.event(job, type=ev.type, reason=ev.reason, message=ev.message[:1000])
            # sent by kopf's client, which logs a refusal and tells nobody: the answer is unknown
            api_count.API_REQUESTS.labels("POST", "events", "unknown").inc()
            level = logging.WARNING if ev.type == "Warning" else logging.INFO
            extra = {"job": f"{ns}/{name}", "reason": ev.reason, "phase": d.status.get("phase")}
            log.log(level, ev.message, extra={**extra, "attempt": d.status.get("attempt")})
        if d.delete_job:
            self.io.delete_job(ns, name)
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)

    def clean_members(self, job: dict) -> Decision | None:
        """A job across members is being deleted: delete its children in every member, then
        remove the finalizer (None: done). An unreachable member holds it (Event + log) until it
        answers or its Secret is deleted."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        registry = self.watches.members
        plan = registry.delete_children(job) if registry is not None else members.cleanup("", {}, {})
        if plan.done:
            finalizers = [f for f in job["metadata"].get("finalizers") or [] if f != members.FINALIZER]
            self.io.set_finalizers(job, finalizers)
            self._said.pop(("cleanup", ns, name), None)
            log.info("children deleted in every member cluster", extra={"job": f"{ns}/{name}"})
            return None
        msg = plan.message()
        if self._say_once(("cleanup", ns, name), msg) and "unreachable" in msg:
            kopf.event(job, type="Warning", reason="MemberCleanupBlocked", message=msg[:1000])
        return Decision(status=dict(job.get("status") or {}), requeue_after=2.0)

    def _say_once(self, key: tuple, message: str) -> bool:
        """Log ``message`` when it differs from the last one under ``key`` (True then)."""
        if not message or self._said.get(key) == message:
            return False
        self._said[key] = message
        log.warning(message, extra={"key": "/".join(key)})
        return True

    def _account(self, job: Mapping, old: Mapping, d: Decision, created: int) -> None:
        ns = job["metadata"]["namespace"]
        if created:
            metrics.PODS_CREATED.labels(ns).inc(created)
        if int(d.status.get("restarts") or 0) > int(old.get("restarts") or 0):
            metrics.RESTARTS.labels(ns).inc()
        if replans(d.status) > replans(old):
            metrics.REPLANS.labels(ns).inc()
        if d.status.get("phase") == "Failed" and old.get("phase") != "Failed":
            reason = next(
                (c.get("reason") for c in d.status.get("conditions") or [] if c.get("type") == "Failed"), ""
            )
            metrics.FAILURES.labels(ns, reason or "Unknown").inc()


def replans(status: Mapping) -> int:
    return int((status.get("adaptation") or {}).get("replans") or 0)


def register(rt: Runtime, registry: kopf.OperatorRegistry) -> None:
    """Register the handlers on ``registry`` (one registry per operator instance)."""

    # type is None for the objects of the initial listing (kopf's WatchingFn says str)
    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="job_changed")  # type: ignore[arg-type]
    async def job_changed(namespace: str, name: str, type: str | None, body: kopf.Body, **_: Any) -> None:
        key = (namespace, name)
        if type == "DELETED":
            rt.caches.jobs.remove(body)
            rt.progress.forget(key)
            for said in ("managedBy", "dispatch"):
                rt._said.pop((said, *key), None)
            rt.unlaunched.discard(key)
            rt.wake_waiting()
            task = rt.loops.pop(key, None)
            if task is not None:
                task.cancel()
            return
        rt.remember_job(body)
        rt.wake_waiting()  # a job ahead in the queue may have launched, changed or gone
        task = rt.loops.get(key)
        if task is None or task.done():
            # Created here, the task inherits kopf's per-object context (Event posting).
            rt.loops[key] = asyncio.create_task(
                job_loop(namespace, name), name=f"holmesjob {namespace}/{name}"
            )
        else:
            rt.wake(key)

    async def job_loop(namespace: str, name: str) -> None:
        key = (namespace, name)
        # A fresh waker: a cancelled loop of a deleted job of the same name may not have ended yet.
        waker = rt.wakers[key] = Waker()
        backoff = 1.0
        try:
            await rt.ready.wait()
            while True:
                nodes = rt.caches.nodes.snapshot()
                try:
                    d = await rt.reconcile_in_worker(namespace, name, nodes)
                    if d is None:  # deleted, or another controller's: nothing left to do
                        return
                    backoff = 1.0
                    delay = IDLE_RESYNC if d.requeue_after is None else d.requeue_after
                    rt.phases.set(key, d.status.get("phase"))
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

    @kopf.on.startup(registry=registry, id="start_informers")
    async def start_informers(**_: Any) -> None:
        rt.loop = asyncio.get_running_loop()
        await asyncio.to_thread(rt.watches.discover)
        rt.watches.start()
        rt.readying = asyncio.create_task(rt.become_ready(), name="holmes caches and lease")
        rt.jobset_plans.start(rt.ready, rt.leading)

    @kopf.on.cleanup(registry=registry, id="stop_loops")
    async def stop_loops(**_: Any) -> None:
        for task in (loops := list(rt.loops.values()) + rt.jobset_plans.tasks):
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        rt.progress.close()
        rt.watches.stop()
        for pool in rt.workers.values():
            pool.shutdown(wait=False, cancel_futures=True)

    @kopf.on.probe(id="jobs", registry=registry)
    async def jobs_probe(**_: Any) -> dict:
        return rt.phases.counts()

    # The liveness verdict: a reconcile that does not end (a deadlock, a write that never
    # returns) fails the probe, so the kubelet restarts this replica and the standby leads.
    @kopf.on.probe(id="reconciles", registry=registry)
    async def reconciles_probe(**_: Any) -> dict:
        why = rt.reconciles.verdict()
        if why:  # permanent: kopf retries a plain error for a minute before answering
            raise kopf.PermanentError(why)
        return {"oldestSeconds": round(rt.reconciles.oldest_running(), 1)}
