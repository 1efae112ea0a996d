"""kopf wiring: one asyncio task per HolmesJob runs its reconcile loop; watch events on the job,
its children and the nodes only wake that loop up (many events coalesce into one reconcile).

- ``holmes_nodes`` (kopf index): every node, slimmed to what planning needs.
- ``job_changed`` (kopf event handler on HolmesJobs): keeps the job's latest body, starts the
  job's loop on first sight (also for every existing job when the operator starts), wakes it on
  changes, ends it on deletion.
- Children (pods, ConfigMaps, Services) are cached by Holmes' own informers (informer.py), which
  watch with a server-side label selector; a change wakes the loop of the job it belongs to.
- The loop: decide (pure, from the caches) -> apply -> status (patched only when it changed) ->
  Events, then sleep until woken or until the decision's requeue time. A steady running job
  makes one API request per progress interval (the progress patch), none when nothing changed.
  It is started from inside kopf's per-object handler context, so ``kopf.event`` posts the
  Kubernetes Events of each transition.
- No loop decides anything before the caches hold a full LIST and, with leader election, before
  this replica leads (leader.py): a partly filled cache would look like deleted pods.
- Node changes that matter (labels, allocatable, readiness, cordon, taints) wake every job.
- Shared clusters (capacity.py): a cluster-wide cache of every pod that has not ended (slimmed,
  field selector on the phase) feeds the capacity view; jobs plan one at a time (the placement
  lock around decide + apply), so each sees the pods the previous one created. Any pod change,
  and any HolmesJob change, wakes the jobs that have not launched yet (debounced).
- Kueue (queueing.py): when the API server serves kueue.x-k8s.io/v1beta1 at start-up, Workloads
  of Holmes jobs and ResourceFlavors are cached too; PriorityClasses always are.
- Member clusters (members.py, membership.py; ``--members-namespace``): while members are
  registered, a job plans over the union of their nodes and its children live in the members
  (each member has its own informers; a job is woken by changes there as here). Its decision is
  split per member (``members.route``); an unreachable member is skipped, never waited on.
  Such a job carries the finalizer ``holmes.dev/member-children``: deleting it deletes its
  children in every member first (``members.cleanup``).

Why not a kopf daemon: daemons make kopf put a finalizer on every HolmesJob, and a job could then
not be deleted while the operator is down. Children go away through their ownerReferences, so
a single-cluster job needs no finalizer at all (a job across members does: no ownerReference
crosses clusters).

Reconciles of one job never overlap (one loop per job); different jobs run concurrently.
"""

from __future__ import annotations

import asyncio
import copy
import fnmatch
import functools
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import kopf
from kubernetes import client

from . import capacity, framework_progress, members, metrics, names, progress, queueing
from .informer import Informer
from .kube import Caches, KubeIO
from .membership import Member, Members, short_error
from .reconcile import ChildRefusal, Decision, Observed, Planner, RestartBackoff, decide, owned
from .render import RenderSettings
from .summary import pod_attempt, pod_node_rank

log = logging.getLogger("holmes.operator")
IDLE_RESYNC = 300.0  # a quiet job is still re-read this often
MEMBER_SYNC_SECONDS = 20.0  # at start-up, wait this long at most for the members' caches
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
    """Everything the handlers share: API access, caches, planner, rendering settings, wakers."""

    api: client.ApiClient
    planner: Planner
    settings: RenderSettings = field(default_factory=RenderSettings)
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    namespaces: tuple[str, ...] = ()  # kopf's patterns ("team-*", "!kube-*"); () = every namespace
    members_namespace: str = ""  # where member clusters are registered (Secrets); "" = none
    wakers: dict = field(default_factory=dict)  # (ns, name) -> Waker
    loops: dict = field(default_factory=dict)  # (ns, name) -> asyncio.Task
    node_facts: dict = field(default_factory=dict)  # node name -> fingerprint
    phases: metrics.PhaseTracker = field(default_factory=metrics.PhaseTracker)

    def __post_init__(self) -> None:
        self.caches = Caches()
        self.io = KubeIO(self.api, self.caches)
        # job -> (when its trainer was last read, the uid of the ended rank-0 pod read last)
        self.scraped: dict[tuple[str, str], tuple] = {}
        self.informers: list[Informer] = []
        # Set once the caches are filled and (with leader election) this replica leads.
        self.ready = asyncio.Event()
        self.leading: asyncio.Event | None = None  # the leader elector's, when there is one
        self.readying: asyncio.Task | None = None
        # Jobs plan and launch one at a time against the shared view (capacity.py).
        self.placement = threading.RLock()
        self.unlaunched: set[tuple[str, str]] = set()  # woken when capacity may have freed
        self.kueue = False  # the API server serves Kueue's Workloads
        self._wake_scheduled = False
        self.members: Members | None = None  # member clusters, with --members-namespace
        self._said: dict[tuple, str] = {}  # messages logged once per change (member problems)

    def wake(self, key: tuple[str, str]) -> None:
        w = self.wakers.get(key)
        if w is not None:
            w.event.set()

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

    # ---- caches -------------------------------------------------------------------------------
    def start_informers(self) -> None:
        loop = asyncio.get_running_loop()
        # Watches hold their connection for minutes: a pool of their own, apart from the writes'.
        core = client.CoreV1Api(client.ApiClient(self.api.configuration))
        selector = f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY},{names.LABEL_JOB}"

        def changed(ns: str, job: str) -> None:  # from an informer's thread
            loop.call_soon_threadsafe(self.wake, (ns, job))

        kinds = (
            ("pods", self.caches.pods, core.list_namespaced_pod, core.list_pod_for_all_namespaces),
            (
                "configmaps",
                self.caches.configmaps,
                core.list_namespaced_config_map,
                core.list_config_map_for_all_namespaces,
            ),
            (
                "services",
                self.caches.services,
                core.list_namespaced_service,
                core.list_service_for_all_namespaces,
            ),
        )
        literal = self.namespaces and all(
            not any(ch in p for ch in "*?[!") for p in self.namespaces
        )  # exact names: one watch per namespace; patterns: one cluster-wide watch, filtered here
        for kind, store, namespaced, everywhere in kinds:
            if literal:
                for ns in self.namespaces:
                    fn = functools.partial(namespaced, ns)
                    self.informers.append(Informer(f"{kind}/{ns}", fn, selector, store, changed).start())
            else:
                ok = functools.partial(namespace_matches, self.namespaces)
                self.informers.append(Informer(kind, everywhere, selector, store, changed, ok).start())
        self.start_shared_informers(core, changed, literal)
        if self.members_namespace:
            self.start_members(core)

    def start_members(self, core: client.CoreV1Api) -> None:
        loop = asyncio.get_running_loop()
        ok = functools.partial(namespace_matches, self.namespaces)

        def notify(what: str, ns: str, job: str) -> None:  # from a member's threads
            if what == "child":
                loop.call_soon_threadsafe(self.wake, (ns, job))
            elif what == "capacity":
                loop.call_soon_threadsafe(self.wake_waiting)
            else:  # nodes, reachability, registrations
                loop.call_soon_threadsafe(self.wake_all)

        self.members = Members(core, self.members_namespace, notify, slim_node, node_fingerprint, ok).start()

    def start_shared_informers(self, core: client.CoreV1Api, changed, literal: bool) -> None:
        """What capacity and queueing read beyond the jobs' own children (see the module doc)."""
        loop = asyncio.get_running_loop()
        api = core.api_client

        def capacity_changed(ns: str, label: str) -> None:  # from an informer's thread
            loop.call_soon_threadsafe(self.wake_waiting)

        self.informers.append(
            Informer(
                "pods/all",
                core.list_pod_for_all_namespaces,
                "",
                self.caches.cluster_pods,
                capacity_changed,
                field_selector="status.phase!=Succeeded,status.phase!=Failed",
                transform=capacity.slim_pod,
            ).start()
        )
        sched = client.SchedulingV1Api(api)
        self.informers.append(
            Informer(
                "priorityclasses",
                sched.list_priority_class,
                "",
                self.caches.priority_classes,
                capacity_changed,
            ).start()
        )
        self.kueue = api_served(api, queueing.KUEUE_GROUP, queueing.KUEUE_VERSION)
        if not self.kueue:
            return
        custom = client.CustomObjectsApi(api)
        g, v = queueing.KUEUE_GROUP, queueing.KUEUE_VERSION
        selector = f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY},{names.LABEL_JOB}"
        if literal:
            for ns in self.namespaces:
                fn = functools.partial(custom.list_namespaced_custom_object, g, v, ns, queueing.WORKLOADS)
                self.informers.append(
                    Informer(f"workloads/{ns}", fn, selector, self.caches.workloads, changed).start()
                )
        else:
            fn = functools.partial(custom.list_cluster_custom_object, g, v, queueing.WORKLOADS)
            ok = functools.partial(namespace_matches, self.namespaces)
            self.informers.append(
                Informer("workloads", fn, selector, self.caches.workloads, changed, ok).start()
            )
        fn = functools.partial(custom.list_cluster_custom_object, g, v, queueing.FLAVORS)

        def flavors_changed(ns: str, label: str) -> None:
            loop.call_soon_threadsafe(self.wake_all)

        self.informers.append(
            Informer("resourceflavors", fn, "", self.caches.flavors, flavors_changed).start()
        )

    async def become_ready(self) -> None:
        for inf in self.informers:
            await asyncio.to_thread(inf.synced.wait)
        if self.members is not None:  # members that do not answer in time are unreachable
            await asyncio.to_thread(self.members.wait_synced, MEMBER_SYNC_SECONDS)
        log.info("caches filled", extra={"pods": len(self.caches.pods), "jobs": len(self.caches.jobs)})
        if self.leading is not None:
            await self.leading.wait()
        self.ready.set()

    def stop_informers(self) -> None:
        for inf in self.informers:
            inf.stop()
        if self.members is not None:
            self.members.stop()

    def remember_job(self, body: Mapping) -> None:
        self.caches.jobs.put(copy.deepcopy(dict(body)))

    # ---- one reconcile (sync; runs in a worker thread) ------------------------------------
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
        if self.members is not None and self.members.active():
            return self.reconcile_members(job, nodes, refused or [], started)
        pods = self.caches.pods.by_label(ns, name)
        found = self._progress(job, pods)
        with self.placement:  # plan + create pods, one job at a time (capacity.py)
            job = self.caches.jobs.get(ns, name) or job
            obs = Observed(
                job=job,
                pods=self.caches.pods.by_label(ns, name),
                configmap=self.caches.configmaps.get(ns, names.layout_configmap_name(name)),
                service=self.caches.services.get(ns, names.service_name(name)),
                nodes=nodes,
                now=datetime.now(timezone.utc),
                progress=found,
                refused=refused or [],
                workload=self.caches.workloads.get(ns, queueing.workload_name(name)),
                flavors=(
                    {f["metadata"]["name"]: f for f in self.caches.flavors.values()} if self.kueue else None
                ),
                priority_classes=self.priority_classes(),
            )
            planner = capacity.CapacityPlanner(
                self.planner,
                f"{ns}/{name}",
                functools.partial(self.shared_state, job, nodes),
                gpu_resource=self.settings.gpu_resource,
            )
            d = decide(obs, planner, self.settings, self.backoff)
            self.io.apply_queueing(d, job)
            created, refusals = self.io.apply(d, job)
            old = job.get("status") or {}
            self.io.patch_status(job, old, d.status)
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

    # ---- member clusters (members.py) ------------------------------------------------------------
    def reconcile_members(
        self, job: dict, hub_nodes: list[dict], refused: list[ChildRefusal], started: float
    ) -> Decision | None:
        """One reconcile of a job across the member clusters (the hub's own nodes are not used:
        register the hub as a member too to plan on them)."""
        ns, name, uid = job["metadata"]["namespace"], job["metadata"]["name"], job["metadata"]["uid"]
        finalizers = list(job["metadata"].get("finalizers") or [])
        if members.FINALIZER not in finalizers:  # before any child exists in a member
            job = self.io.set_finalizers(job, finalizers + [members.FINALIZER])
        regs = self.members.all()
        states = {m: r.state() for m, r in regs.items()}
        usable = [m for m, st in states.items() if st.reachable]
        nodes, problems = members.union_nodes({m: r.node_list() for m, r in regs.items()}, usable)
        self._say_once(("nodes",), "; ".join(problems))
        pods, pod_member = self.member_pods(ns, name, regs)
        at = regs.get(pod_member.get(self._rank0(job, pods) or ""))  # the rank-0 pod's member
        found = self._progress(job, pods, at.io if at is not None else None)
        with self.placement:
            job = self.caches.jobs.get(ns, name) or job
            pods, pod_member = self.member_pods(ns, name, regs)
            obs = Observed(
                job=job,
                pods=pods,
                configmap=self.member_child(
                    regs, usable, "configmaps", ns, names.layout_configmap_name(name), uid
                ),
                service=self.member_child(regs, usable, "services", ns, names.service_name(name), uid),
                nodes=nodes,
                now=datetime.now(timezone.utc),
                progress=found,
                refused=refused,
                workload=self.caches.workloads.get(ns, queueing.workload_name(name)),
                flavors=(
                    {f["metadata"]["name"]: f for f in self.caches.flavors.values()} if self.kueue else None
                ),
                priority_classes=self.priority_classes(),
                members=states,
            )
            planner = capacity.CapacityPlanner(
                members.MemberPlanner(self.planner),
                f"{ns}/{name}",
                functools.partial(self.member_shared_state, job, regs),
                gpu_resource=self.settings.gpu_resource,
            )
            d = decide(obs, planner, self.settings, self.backoff)
            self.io.apply_queueing(d, job)
            attempt = d.status.get("attempt")
            current = {pod_member[p["metadata"]["name"]] for p in pods if pod_attempt(p) == attempt}
            node_member = {n["metadata"]["name"]: members.member_of(n) for n in nodes}
            routed = members.route(d, uid, pod_member, node_member, current)
            created, refusals = 0, []
            for m, writes in sorted(routed.items()):
                if m not in usable:  # redone once it answers again (stale pods are deleted then)
                    continue
                part = Decision(
                    status={},
                    delete_pods=writes.delete_pods,
                    configmap=writes.configmap,
                    service=writes.service,
                    create_pods=writes.create_pods,
                )
                made, no = regs[m].io.apply(part, job, adopt=False)
                created += made
                refusals += [replace(r, message=f"in member cluster {m}: {r.message}") for r in no]
            old = job.get("status") or {}
            self.io.patch_status(job, old, d.status)
        self._after(job, old, d, created, started)
        if refusals:
            return self.reconcile_members(self.caches.jobs.get(ns, name) or job, hub_nodes, refusals, started)
        return d

    def member_pods(
        self, ns: str, name: str, regs: Mapping[str, Member]
    ) -> tuple[list[dict], dict[str, str]]:
        """The job's pods in every member (also an unreachable one's, as last seen), each tagged
        with its member; and pod name -> member."""
        pods, where = [], {}
        for m, r in sorted(regs.items()):
            for p in r.caches.pods.by_label(ns, name):
                pods.append(members.tag(p, m))
                where[p["metadata"]["name"]] = m
        return pods, where

    @staticmethod
    def member_child(
        regs: Mapping[str, Member], usable: list[str], kind: str, ns: str, name: str, uid: str
    ) -> dict | None:
        """The job's ConfigMap or Service as the members hold it: the copy of the newest attempt."""
        found = []
        for m in usable:
            obj = getattr(regs[m].caches, kind).get(ns, name)
            if obj is not None and members.owned_children([obj], uid):
                ann = obj["metadata"].get("annotations") or {}
                attempt = ann.get(names.ANN_ATTEMPT) or ""
                found.append((int(attempt) if attempt.isdigit() else -1, m, obj))
        return max(found, key=lambda x: (x[0], x[1]))[2] if found else None

    def member_shared_state(self, me: Mapping, regs: Mapping[str, Member]) -> capacity.SharedState:
        """Capacity across members: what every pod in every member holds on its node (node names
        are unique across members), and the layouts of the jobs launched there."""
        pods: dict[tuple, dict] = {}
        for m, r in regs.items():
            for p in r.caches.cluster_pods.values():
                pods[(m, *_key(p))] = p
            for p in r.caches.pods.values():
                pods[(m, *_key(p))] = capacity.slim_pod(p)

        def layout(ns: str, job: str) -> Mapping | None:
            cms = [r.caches.configmaps.get(ns, names.layout_configmap_name(job)) for r in regs.values()]
            cms = [c for c in cms if c is not None]
            return max(
                cms,
                key=lambda c: int((c["metadata"].get("annotations") or {}).get(names.ANN_ATTEMPT) or 0),
                default=None,
            )

        return capacity.shared_state(
            me,
            self.caches.jobs.values(),
            list(pods.values()),
            layout,
            self.priority_classes(),
            self.settings.gpu_resource,
        )

    def clean_members(self, job: dict) -> Decision | None:
        """A job across members is being deleted: delete its children in every member, then
        remove the finalizer (None: done). An unreachable member holds it (Event + log) until it
        answers or its Secret is deleted."""
        ns, name, uid = job["metadata"]["namespace"], job["metadata"]["name"], job["metadata"]["uid"]
        regs = self.members.all() if self.members is not None else {}
        states = {m: r.state() for m, r in regs.items()}
        children = {}
        for m, r in regs.items():
            if not states[m].reachable or r.io is None:
                continue
            try:  # from the API server, not the caches: "gone" must be certain here
                children[m] = r.io.list_children(ns, name)
            except Exception as e:  # this member does not answer now: wait for it
                states[m] = members.MemberState(m, False, short_error(e))
        plan = members.cleanup(uid, states, children)
        for m, items in plan.deletes.items():
            try:
                regs[m].io.delete_children(ns, items)
            except Exception as e:  # this member now; the others still get their deletes
                log.warning("deleting children in member %s failed: %s", m, e, extra={"job": f"{ns}/{name}"})
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

    # ---- shared clusters ------------------------------------------------------------------------
    def priority_classes(self) -> dict[str, int]:
        return {
            p["metadata"]["name"]: int(p.get("value") or 0)
            for p in self.caches.priority_classes.values()
            if isinstance(p.get("value"), int)
        }

    def shared_state(self, me: Mapping, nodes: list[dict]) -> capacity.SharedState:
        """What other workloads hold (pods, launched layouts) and the waiting jobs ahead of ``me``."""
        pods = {_key(p): p for p in self.caches.cluster_pods.values()}
        for p in self.caches.pods.values():  # Holmes' own pods, including those just created
            pods[_key(p)] = capacity.slim_pod(p)
        return capacity.shared_state(
            me,
            self.caches.jobs.values(),
            list(pods.values()),
            lambda ns, job: self.caches.configmaps.get(ns, names.layout_configmap_name(job)),
            self.priority_classes(),
            self.settings.gpu_resource,
        )

    @staticmethod
    def _rank0(job: Mapping, pods: list[dict]) -> str | None:
        st = job.get("status") or {}
        for p in owned(pods, job["metadata"].get("uid")):
            if pod_attempt(p) == st.get("attempt") and pod_node_rank(p) == 0:
                return p["metadata"]["name"]
        return None

    def _progress(self, job: Mapping, pods: list[dict], io: KubeIO | None = None) -> dict | None:
        """The rank-0 trainer's numbers, read at most once per progress interval while it runs,
        and its last line once it has ended (None: nothing new to read now). ``io``: the API
        of the rank-0 pod's cluster (a member's), default the hub's."""
        st = job.get("status") or {}
        if not st.get("launched") or st.get("phase") in ("Succeeded", "Failed"):
            return None
        framework = (job.get("spec") or {}).get("framework") or "holmes"
        reporter = 0  # spec.framework: the pod whose log carries the framework's iteration lines
        if framework != "holmes":
            nodes = int((st.get("layout") or {}).get("nodes") or 1)
            reporter = framework_progress.reporting_node_rank(framework, nodes)
        rank0 = [
            p
            for p in owned(pods, job["metadata"].get("uid"))
            if pod_attempt(p) == st.get("attempt") and pod_node_rank(p) == reporter
        ]
        if not rank0:
            return None
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        ended = progress.terminated(rank0[0])
        last, last_read = self.scraped.get(key, (None, None))
        if ended:  # its last line, once
            if last_read == rank0[0]["metadata"].get("uid"):
                return None
        elif last is not None and time.monotonic() - last < self.settings.progress_interval:
            return None
        self.scraped[key] = (time.monotonic(), rank0[0]["metadata"].get("uid") if ended else None)
        if framework != "holmes":  # no metrics port: the framework's own log lines
            return framework_progress.from_log(framework, (io or self.io).log_tail(rank0[0], lines=200))
        found = progress.from_pod(rank0[0], self.settings.metrics_port)
        if not found and ended:  # the trainer's last line, from its log
            found = progress.from_json_lines((io or self.io).log_tail(rank0[0]))
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


def _key(obj: Mapping) -> tuple[str, str]:
    return obj["metadata"].get("namespace"), obj["metadata"].get("name")


def api_served(api: client.ApiClient, group: str, version: str) -> bool:
    """Whether the API server serves group/version (a CRD installed), read once at start-up."""
    try:
        groups = client.ApisApi(api).get_api_versions()
    except Exception as e:  # not fatal: the Kueue integration stays off
        log.warning("API discovery failed; Kueue integration off: %s", e)
        return False
    return any(g.name == group and any(v.version == version for v in g.versions) for g in groups.groups)


def namespace_matches(patterns: tuple[str, ...], ns: str) -> bool:
    """kopf's namespace patterns: any positive one matches (none given: all), no "!" one does."""
    pos = [p for p in patterns if not p.startswith("!")]
    neg = [p[1:] for p in patterns if p.startswith("!")]
    return (not pos or any(fnmatch.fnmatchcase(ns, p) for p in pos)) and not any(
        fnmatch.fnmatchcase(ns, p) for p in neg
    )


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
            rt.wake_all()  # waiting jobs may fit now; a planned node may be gone

    @kopf.on.event(names.GROUP, names.VERSION, names.PLURAL, registry=registry, id="job_changed")
    async def job_changed(
        namespace: str, name: str, type: str | None, body: kopf.Body, holmes_nodes: kopf.Index, **_: Any
    ) -> None:
        key = (namespace, name)
        if type == "DELETED":
            rt.caches.jobs.remove(body)
            rt.scraped.pop(key, None)
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
            await rt.ready.wait()
            while True:
                nodes = [v for store in holmes_nodes.values() for v in store]
                try:
                    d = await asyncio.to_thread(rt.reconcile, namespace, name, nodes)
                    if d is None:  # deleted (or being deleted): nothing left to do
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
        rt.start_informers()
        rt.readying = asyncio.create_task(rt.become_ready(), name="holmes caches and lease")

    @kopf.on.cleanup(registry=registry, id="stop_loops")
    async def stop_loops(**_: Any) -> None:
        loops = list(rt.loops.values())
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        rt.stop_informers()

    @kopf.on.probe(id="jobs", registry=registry)
    async def jobs_probe(**_: Any) -> dict:
        return rt.phases.counts()
