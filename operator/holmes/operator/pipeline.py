"""One reconcile of one job, read top to bottom: observe (from the caches) -> decide (pure,
core/reconcile.py) -> write (kube.py) -> status. Synchronous; the job's loop runs it in a worker
thread (handlers.py).

Where a job's children live is the only thing that differs between a job on this cluster and
one across member clusters (core/members.py), so each is a ``Children``:
- ``HubChildren``: in the hub's caches; writes go to the hub, adopted through ownerReferences.
- ``MemberChildren``: in the members' caches, planned over the union of the members' nodes;
  the decision's writes are split per member (``members.route``), an unreachable member is
  skipped (redone once it answers), and the job carries a finalizer (no ownerReference crosses
  clusters).

Jobs decide (and plan) concurrently on a snapshot of the caches and take the ``placement`` lock
only to write (commit.py): a decision that claims capacity made before another job's claim is
decided again, so each launch sees the pods the previous one created (core/capacity.py) and no
slow plan holds the others' launches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Protocol

from holmes.plan import dra
from holmes.plan.costmodel_file import CostModelFile

from . import commit, metrics, placement_facts
from .core import capacity, child_names, dispatching, members, prebuilt, queueing
from .core.reconcile import ChildRefusal, Decision, Observed, RestartBackoff, decide
from .core.render import RenderSettings
from .core.summary import pod_attempt
from .kube import Caches, KubeIO
from .member_clusters import MemberRegistry
from .progress import ProgressReader, rank0
from .watches import Watches


class Children(Protocol):
    """Where one job's children live, and how its writes reach them."""

    @property
    def states(self) -> Mapping[str, members.MemberState] | None:
        """The members' states; None on the hub."""

    def nodes(self, hub_nodes: list[dict]) -> list[dict]: ...
    def pods(self, ns: str, name: str) -> list[dict]: ...
    def configmap(self, ns: str, name: str, uid: str) -> dict | None: ...
    def service(self, ns: str, name: str, uid: str) -> dict | None: ...
    def capacity_view(self) -> tuple[list[dict], Callable[[str, str], Mapping | None]]: ...
    def claims(self) -> list[dict]: ...
    def quotas(self, ns: str) -> list[dict] | None: ...
    def log_tail(self, job: Mapping, pods: list[dict]) -> Callable[[dict], str]: ...
    def write(self, d: Decision, job: dict, pods: list[dict], nodes: list[dict]): ...


@dataclass
class HubChildren:
    caches: Caches
    io: KubeIO
    states: Mapping[str, members.MemberState] | None = None  # a hub job has no members

    def nodes(self, hub_nodes: list[dict]) -> list[dict]:
        """The hub's nodes, with their DRA devices (ResourceSlices) joined on (holmes.plan.dra)."""
        slices = self.caches.resource_slices.values()
        return dra.join(hub_nodes, slices) if slices else hub_nodes

    def pods(self, ns: str, name: str) -> list[dict]:
        return self.caches.pods.by_label(ns, name)

    def configmap(self, ns: str, name: str, uid: str) -> dict | None:
        return self.caches.configmaps.get(ns, child_names.layout_configmap_name(name))

    def service(self, ns: str, name: str, uid: str) -> dict | None:
        return self.caches.services.get(ns, child_names.service_name(name))

    def capacity_view(self) -> tuple[list[dict], Callable[[str, str], Mapping | None]]:
        def layout(ns: str, job: str) -> Mapping | None:
            return self.caches.configmaps.get(ns, child_names.layout_configmap_name(job))

        # every reconcile asks (running jobs' too); the pods change far less often: kept per
        # version of the two stores it is made of
        versions = (self.caches.cluster_pods.version, self.caches.pods.version)
        kept = self.caches.capacity_view
        if kept is not None and kept[0] == versions:
            return kept[1], layout
        pods = {_key(p): p for p in self.caches.cluster_pods.values()}
        # Holmes' own pods slimmed once per version (their two watches deliver a change at
        # different moments, and a launch's pods reach the shared cache last)
        slims, self.caches.slim_pods = self.caches.slim_pods, {}
        for p in self.caches.pods.values():  # Holmes' own pods, including those just created
            key, rv = _key(p), _rv(p)
            seen = pods.get(key)
            if seen is not None and _rv(seen) == rv:
                continue  # the same version, slim already: no work per pod per reconcile
            if (p.get("status") or {}).get("phase") in capacity.ENDED:
                pods.pop(key, None)  # holds nothing (the shared cache keeps no ended pods)
                continue
            slim = slims.get(key)
            if slim is None or _rv(slim) != rv:
                slim = capacity.slim_pod(p)
            pods[key] = self.caches.slim_pods[key] = slim
        view = list(pods.values())
        self.caches.capacity_view = (versions, view)
        return view, layout

    def claims(self) -> list[dict]:
        """The DRA ResourceClaims (slim), whose allocations hold devices (core/device_claims.py)."""
        return list(self.caches.resource_claims.values())

    def quotas(self, ns: str) -> list[dict] | None:
        """The namespace's ResourceQuotas (core/quota.py)."""
        return [q for q in self.caches.resource_quotas.values() if q["metadata"].get("namespace") == ns]

    def log_tail(self, job: Mapping, pods: list[dict]) -> Callable[[dict], str]:
        return self.io.log_tail

    def write(self, d: Decision, job: dict, pods: list[dict], nodes: list[dict]):
        return self.io.apply(d, job)


class MemberChildren:
    """A job across the member clusters (the hub's own nodes are not used: register the hub as
    a member too to plan on them)."""

    def __init__(
        self, registry: MemberRegistry, hub_io: KubeIO, say_once: Callable[[tuple, str], bool]
    ) -> None:
        self.registry, self.hub_io = registry, hub_io
        self.regs = registry.all()
        self.states = {m: r.state() for m, r in self.regs.items()}
        self.usable = [m for m, st in self.states.items() if st.reachable]
        self.say_once = say_once
        self.pod_member: dict[str, str] = {}

    def nodes(self, hub_nodes: list[dict]) -> list[dict]:
        nodes, problems = members.union_nodes({m: r.node_list() for m, r in self.regs.items()}, self.usable)
        self.say_once(("nodes",), "; ".join(problems))
        return nodes

    def pods(self, ns: str, name: str) -> list[dict]:
        pods, self.pod_member = self.registry.job_pods(ns, name)
        return pods

    def configmap(self, ns: str, name: str, uid: str) -> dict | None:
        return self.registry.child(
            self.usable, "configmaps", ns, child_names.layout_configmap_name(name), uid
        )

    def service(self, ns: str, name: str, uid: str) -> dict | None:
        return self.registry.child(self.usable, "services", ns, child_names.service_name(name), uid)

    def capacity_view(self) -> tuple[list[dict], Callable[[str, str], Mapping | None]]:
        return self.registry.capacity_view()

    def claims(self) -> list[dict]:
        return []  # members' DRA objects are not watched (nor their ResourceSlices)

    def quotas(self, ns: str) -> list[dict] | None:
        return None  # members' ResourceQuotas are not watched: their API servers judge the pods

    def log_tail(self, job: Mapping, pods: list[dict]) -> Callable[[dict], str]:
        pod = rank0(job, pods)
        at = self.regs.get(self.pod_member.get(pod["metadata"]["name"], "")) if pod else None
        return (at.io if at is not None and at.io is not None else self.hub_io).log_tail

    def write(self, d: Decision, job: dict, pods: list[dict], nodes: list[dict]):
        uid = job["metadata"]["uid"]
        attempt = d.status.get("attempt")
        current = {self.pod_member[p["metadata"]["name"]] for p in pods if pod_attempt(p) == attempt}
        node_member = {n["metadata"]["name"]: members.member_of(n) or "" for n in nodes}
        routed = members.route(d, uid, self.pod_member, node_member, current)
        created, refusals = 0, []
        for m, writes in sorted(routed.items()):
            if m not in self.usable:  # redone once it answers again (stale pods are deleted then)
                continue
            part = Decision(
                status={},
                delete_pods=writes.delete_pods,
                configmap=writes.configmap,
                service=writes.service,
                create_pods=writes.create_pods,
            )
            io = self.regs[m].io
            if io is None:  # a member whose kubeconfig cannot be used is never usable
                continue
            made, no = io.apply(part, job, adopt=False)
            created += made
            refusals += [replace(r, message=f"in member cluster {m}: {r.message}") for r in no]
        return created, refusals


@dataclass
class Pipeline:
    """What every reconcile shares: the caches and writers, the cost model, the settings."""

    caches: Caches
    io: KubeIO
    watches: Watches
    cost_model: CostModelFile
    settings: RenderSettings
    backoff: RestartBackoff
    progress: ProgressReader
    say_once: Callable[[tuple, str], bool]

    def __post_init__(self) -> None:
        self.placement = commit.PlacementLock()
        self._layouts: tuple[tuple[int, int], dict] | None = None  # the hub's, by store versions
        self._view_keys: tuple[list[dict], frozenset] | None = None  # a capacity view's pod keys

    def children(self, job: dict) -> tuple[Children, dict]:
        """Where the job's children live (and the job, with the members' finalizer set first)."""
        registry = self.watches.members
        if registry is None or not registry.active():
            return HubChildren(self.caches, self.io), job
        finalizers = list(job["metadata"].get("finalizers") or [])
        if members.FINALIZER not in finalizers:  # before any child exists in a member
            job = self.io.set_finalizers(job, finalizers + [members.FINALIZER])
        return MemberChildren(registry, self.io, self.say_once), job

    def run(
        self, job: dict, hub_nodes: list[dict], refused: list[ChildRefusal]
    ) -> tuple[Decision, dict, dict, int, list[ChildRefusal]]:
        """Observe, decide, write: (decision, job, old status, pods created, refusals)."""
        ns, name, uid = job["metadata"]["namespace"], job["metadata"]["name"], job["metadata"].get("uid")
        where, job = self.children(job)
        nodes = where.nodes(hub_nodes)
        pods = where.pods(ns, name)
        found = self.progress.read(job, pods, where.log_tail(job, pods))

        def observe_and_decide() -> tuple[Decision, tuple[dict, list[dict]]]:
            fresh = self.caches.jobs.get(ns, name) or job
            mine = where.pods(ns, name)
            obs = Observed(
                job=fresh,
                pods=mine,
                configmap=where.configmap(ns, name, uid),
                service=where.service(ns, name, uid),
                nodes=nodes,
                now=datetime.now(timezone.utc),
                progress=found,
                refused=refused,
                workload=self.caches.workloads.get(ns, prebuilt.job_workload_name(fresh)),
                flavors=self.watches.flavors(),
                queue_topology=self.watches.queue_topology(fresh),
                priority_classes=self.watches.priority_classes(),
                workload_priority_classes=self.watches.workload_priority_classes(),
                podgroup=self.caches.podgroups.get(ns, queueing.podgroup_name(name)),
                quotas=where.quotas(ns),
                volcano=self.watches.volcano,
                compute_domains=self.watches.compute_domains,
                members=where.states,
                namespace_labels=self.watches.namespace_labels(ns),
            )
            facts = placement_facts.gather(self.cost_model, lambda: self.workloads(where))
            started = time.perf_counter()
            d = decide(obs, facts, self.settings, self.backoff)
            if d.placed:
                metrics.PLANNING_SECONDS.observe(time.perf_counter() - started)
            return d, (fresh, mine)

        def write(d: Decision, on: tuple[dict, list[dict]]) -> tuple[int, list[ChildRefusal]]:
            seen_job, seen_pods = on
            self.io.apply_queueing(d, seen_job)
            made = where.write(d, seen_job, seen_pods, nodes)
            self.io.patch_status(seen_job, seen_job.get("status") or {}, d.status)
            return made

        key = f"{ns}/{name}"
        d, (job, _), (created, refusals) = self.placement.decide_and_write(key, observe_and_decide, write)
        return d, job, job.get("status") or {}, created, refusals

    def dispatch(self, job: dict) -> Decision:
        """A job MultiKueue dispatches from this cluster (core/dispatching.py): its Workload's
        writes only; the Decision's Events are the caller's to send."""
        ns = job["metadata"]["namespace"]
        obs = Observed(
            job=job,
            pods=[],
            configmap=None,
            service=None,
            nodes=[],
            now=datetime.now(timezone.utc),
            workload=self.caches.workloads.get(ns, prebuilt.job_workload_name(job)),
            flavors=self.watches.flavors(),
            priority_classes=self.watches.priority_classes(),
            workload_priority_classes=self.watches.workload_priority_classes(),
        )
        gpu = self.cost_model.refresh().nic_mapping.gpu_resource
        d = dispatching.dispatch(obs, frozenset(self.settings.raw_priority_namespaces), gpu)
        self.io.apply_queueing(d, job)
        return d

    def workloads(self, where: Children) -> capacity.Workloads:
        """What the other workloads hold and want, from the caches: every pod that may hold
        resources (with those of claims being written: commit.py), every HolmesJob, the layout
        ConfigMap of each launched one, the DRA ResourceClaims."""
        creating, launching = self.placement.in_flight()  # before the caches they land in
        pods, layout = where.capacity_view()
        if creating:
            keys = self._view_keys  # the same view (no pod changed since) is common in a burst
            if keys is None or keys[0] is not pods:
                keys = self._view_keys = (pods, frozenset(map(_key, pods)))
            pods = pods + [capacity.slim_pod(p) for p in creating if _key(p) not in keys[1]]
        jobs = self.caches.jobs.snapshot()
        # every reconcile asks, running jobs' too: the hub's kept per version of the stores read
        # (a member's ConfigMaps are in its own caches)
        hub = isinstance(where, HubChildren)
        versions = (self.caches.jobs.version, self.caches.configmaps.version)
        kept = self._layouts
        if hub and kept is not None and kept[0] == versions:
            layouts = kept[1]
        else:
            layouts = {}
            for j in jobs:
                if (j.get("status") or {}).get("launched"):
                    key = (j["metadata"].get("namespace"), j["metadata"].get("name"))
                    cm = layout(*key)
                    if cm is not None:
                        layouts[key] = cm
            self._layouts = (versions, layouts) if hub else None
        return capacity.Workloads(
            pods=pods, jobs=jobs, layouts=layouts, launching=launching, claims=where.claims()
        )


def _key(obj: Mapping) -> tuple[str, str]:
    return obj["metadata"].get("namespace"), obj["metadata"].get("name")


def _rv(obj: Mapping) -> str | None:
    return obj["metadata"].get("resourceVersion")
