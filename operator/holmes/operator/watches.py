"""What the operator watches, and when it may act on it: Holmes' informers on the hub, and the
member clusters' (member_clusters.py). No job loop decides anything before every informer holds a
full LIST (a partly filled cache would look like deleted pods).

- Children (pods, ConfigMaps, Services) by a server-side label selector; a change wakes the
  loop of the job it belongs to. Exact namespaces get one watch each; patterns ("team-*",
  "!kube-*") one cluster-wide watch, filtered here.
- Shared clusters (core/capacity.py): every pod that has not ended (slimmed, field selector on
  the phase), PriorityClasses, and the served namespaces' ResourceQuotas (core/quota.py); a
  change wakes the jobs that have not launched yet.
- Kueue (core/queueing.py, kueue_version.py): while the API server serves kueue.x-k8s.io
  (v1beta2, else v1beta1; looked for again every 30 s), Workloads of Holmes jobs and
  ResourceFlavors are cached too.
- Volcano (core/queueing.py): while the API server serves scheduling.volcano.sh/v1beta1
  PodGroups (looked for once at start-up, as DRA below), the PodGroups of Holmes jobs; a change
  (Volcano admitting a group: Inqueue) wakes the job's loop.
- DRA (holmes.plan.dra): while the API server serves ``resource.k8s.io/v1`` ResourceSlices
  (looked for once at start-up: a cluster that gains the API needs an operator restart), every
  ResourceSlice; a change wakes every job (a node's devices changed). The pipeline joins them onto
  the nodes before planning. And ResourceClaims (core/device_claims.py: the devices their
  allocations hold, whoever's), slimmed, read where the pods are (every namespace, or the served
  ones); a change wakes the jobs that have not launched yet, as a pod's does.
- Member clusters (``--members-namespace``): the registry and each member's own informers.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from holmes.plan import discovery, dra

from . import kueue_version
from .core import capacity, child_names, device_claims, island_topology, queueing
from .informer import Informer, next_backoff
from .kube import Caches
from .member_clusters import MemberRegistry

log = logging.getLogger("holmes.operator")
MEMBER_SYNC_SECONDS = 20.0  # at start-up, wait this long at most for the members' caches


class Watches:
    """The hub's informers (and the members', with a members namespace), feeding ``caches``.
    The wake callbacks are called on the event loop: ``wake(key)`` one job, ``wake_all()`` every
    job, ``wake_waiting()`` the jobs not launched yet."""

    def __init__(
        self,
        api: client.ApiClient,
        caches: Caches,
        namespaces: tuple[str, ...],
        members_namespace: str,
        wake: Callable[[tuple[str, str]], None],
        wake_all: Callable[[], None],
        wake_waiting: Callable[[], None],
        on_kueue: Callable[[str | None], None],
        member_secrets: tuple[str, ...] = (),
    ) -> None:
        self.api, self.caches, self.namespaces = api, caches, namespaces
        self.members_namespace = members_namespace
        self.member_secrets = member_secrets  # the member Secrets by name; () = every labelled one
        self.wake, self.wake_all, self.wake_waiting = wake, wake_all, wake_waiting
        self.on_kueue = on_kueue  # called with the Kueue version chosen (None: Kueue went away)
        self.informers: list[Informer | kueue_version.KueueLink] = []  # each has .synced and .stop()
        self.kueue: str | None = None  # the Kueue version in use (kueue_version.py); None: not served
        self.members: MemberRegistry | None = None  # member clusters, with --members-namespace
        self.volcano = False  # the API server serves Volcano's PodGroups (discover(), at start-up)
        self.dra = False  # ... and DRA's ResourceSlices
        self.dra_claims = False  # ... and DRA's ResourceClaims
        self.node_facts: dict[str, tuple] = {}  # node name -> node_fingerprint (node_event)
        # told of each node that changed (topology_labels.TopologyLabels.offer), from node_event
        self.on_node: Callable[[str, dict], None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # set by start()

    def discover(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """Which optional APIs the server serves (Volcano's PodGroups, DRA's ResourceSlices),
        asked before any informer starts (in a worker thread): tried again until the API
        server answers, so an operator started while it restarts neither fails its start-up
        (kopf tried that again only 60 s later, with the informers started before the error
        started twice) nor takes an optional API for absent."""
        self.volcano, (self.dra, self.dra_claims) = until_answered(
            lambda: (serves_podgroups(self.api), serves_dra(self.api)), sleep
        )

    def start(self) -> None:
        """Start every informer (from the event loop: their threads wake jobs through it);
        ``discover`` first."""
        loop = self.loop = asyncio.get_running_loop()
        # Watches hold their connection for minutes: a pool of their own, apart from the writes'.
        core = client.CoreV1Api(client.ApiClient(self.api.configuration))
        selector = f"{child_names.LABEL_MANAGED_BY}={child_names.MANAGED_BY},{child_names.LABEL_JOB}"

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
        for kind, store, namespaced, everywhere in kinds:
            self.watch(kind, namespaced, everywhere, selector, store, changed)
        if self.volcano:  # Volcano writes the phase Holmes waits for (queueing.podgroup_wait)
            custom = client.CustomObjectsApi(core.api_client)
            g, v, plural = queueing.VOLCANO_GROUP, queueing.VOLCANO_VERSION, queueing.PODGROUPS
            self.watch(
                plural,
                lambda ns, **kw: custom.list_namespaced_custom_object(g, v, ns, plural, **kw),
                lambda **kw: custom.list_cluster_custom_object(g, v, plural, **kw),
                selector,
                self.caches.podgroups,
                changed,
            )
        self.informers.append(
            Informer(
                "nodes",
                core.list_node,
                "",
                self.caches.nodes,
                lambda ns, label: None,
                transform=slim_node,
                on_object=self.node_event,
            ).start()
        )
        self.informers.append(  # their Pod Security labels: the defaults a job's pods get
            Informer(
                "namespaces",
                core.list_namespace,
                "",
                self.caches.namespaces,
                lambda ns, label: None,
                transform=slim_namespace,
            ).start()
        )
        self._start_shared(core, changed)
        if self.members_namespace:
            self._start_members(core)

    def node_event(self, kind: str, node: dict) -> None:
        """From the node informer's thread: wake every job when what planning reads of a node
        changed (waiting jobs may fit now; a planned node may be gone); heartbeats change none
        of it. Holmes' own informer, not kopf's per-event handlers: at 2,000 nodes kopf's
        listing alone held the event loop for about 30 s before any job was reconciled."""
        name = (node.get("metadata") or {}).get("name") or ""
        fp = None if kind == "DELETED" else node_fingerprint(node)
        old = self.node_facts.get(name)
        if old == fp:
            return
        if fp is None:
            self.node_facts.pop(name, None)
        else:
            self.node_facts[name] = fp
        if self.on_node is not None:
            self.on_node(kind, node)
        # the first LIST wakes nobody (no job loop acts before it); a later one's changes do
        if (kind != "LISTED" or old is not None) and self.loop is not None:
            self.loop.call_soon_threadsafe(self.wake_all)

    def watch(self, kind: str, namespaced, everywhere, selector: str, store, changed) -> None:
        """One informer per namespace when they are exact names, else one filtered cluster-wide."""
        if self.literal:
            for ns in self.namespaces:
                fn = functools.partial(namespaced, ns)
                informer = Informer(f"{kind}/{ns}", fn, selector, store, changed, namespace=ns)
                self.informers.append(informer.start())
        else:
            ok = functools.partial(namespace_matches, self.namespaces)
            self.informers.append(Informer(kind, everywhere, selector, store, changed, ok).start())

    @property
    def literal(self) -> bool:
        return bool(self.namespaces) and all(not any(ch in p for ch in "*?[!") for p in self.namespaces)

    def _start_members(self, core: client.CoreV1Api) -> None:
        loop = asyncio.get_running_loop()
        ok = functools.partial(namespace_matches, self.namespaces)

        def notify(what: str, ns: str, job: str) -> None:  # from a member's threads
            if what == "child":
                loop.call_soon_threadsafe(self.wake, (ns, job))
            elif what == "capacity":
                loop.call_soon_threadsafe(self.wake_waiting)
            else:  # nodes, reachability, registrations
                loop.call_soon_threadsafe(self.wake_all)

        self.members = MemberRegistry(
            core, self.members_namespace, notify, slim_node, node_fingerprint, ok, self.member_secrets
        ).start()

    def _start_shared(self, core: client.CoreV1Api, changed) -> None:
        """What capacity and queueing read beyond the jobs' own children."""
        loop = asyncio.get_running_loop()
        api = core.api_client

        def capacity_changed(ns: str, label: str) -> None:  # from an informer's thread
            loop.call_soon_threadsafe(self.wake_waiting)

        # What other pods hold on the nodes. An operator serving named namespaces reads pods in
        # those only (its RBAC grants no more): pods elsewhere are then invisible to capacity.
        pod_lists: list[tuple[str, Callable[..., Any], str | None]]
        if self.literal:
            list_in = core.list_namespaced_pod
            pod_lists = [(f"pods/running/{ns}", functools.partial(list_in, ns), ns) for ns in self.namespaces]
        else:
            pod_lists = [("pods/all", core.list_pod_for_all_namespaces, None)]
        for name, list_pods, ns in pod_lists:
            self.informers.append(
                Informer(
                    name,
                    list_pods,
                    "",
                    self.caches.cluster_pods,
                    capacity_changed,
                    field_selector="status.phase!=Succeeded,status.phase!=Failed",
                    transform=capacity.slim_pod,
                    namespace=ns,
                ).start()
            )
        if self.dra_claims:  # the devices claims hold, where the pods are read
            self._start_claims(api, capacity_changed)
        # ResourceQuotas (core/quota.py): their status.used moves as pods come and go, which may
        # let a job waiting for its namespace's quota start
        self.watch(
            "resourcequotas",
            core.list_namespaced_resource_quota,
            core.list_resource_quota_for_all_namespaces,
            "",
            self.caches.resource_quotas,
            capacity_changed,
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

        # Kueue: the version the API server serves, now and when Kueue comes, changes or goes
        def wake_all_soon() -> None:  # from an informer's thread
            loop.call_soon_threadsafe(self.wake_all)

        def kueue_in_use(version: str | None) -> None:  # from the link's thread
            self.kueue = version
            self.on_kueue(version)
            loop.call_soon_threadsafe(self.wake_all)

        start = functools.partial(
            kueue_version.start_informers,
            api,
            self.caches,
            self.namespaces if self.literal else (),
            functools.partial(namespace_matches, self.namespaces),
            changed,
            wake_all_soon,
        )
        discover = functools.partial(kueue_version.served_versions, api)
        self.informers.append(kueue_version.KueueLink(discover, start, self.caches, kueue_in_use).start())
        if self.dra:
            group, version = dra.API_VERSION.split("/")
            custom = client.CustomObjectsApi(api)
            fn = functools.partial(custom.list_cluster_custom_object, group, version, SLICES)
            self.informers.append(
                Informer(
                    SLICES, fn, "", self.caches.resource_slices, lambda ns, label: wake_all_soon()
                ).start()
            )

    def _start_claims(self, api: client.ApiClient, capacity_changed) -> None:
        group, version = dra.API_VERSION.split("/")
        custom = client.CustomObjectsApi(api)
        claim_lists: list[tuple[str, Callable[..., Any], str | None]]
        if self.literal:
            claim_lists = [
                (
                    f"{device_claims.CLAIMS}/{ns}",
                    functools.partial(
                        custom.list_namespaced_custom_object, group, version, ns, device_claims.CLAIMS
                    ),
                    ns,
                )
                for ns in self.namespaces
            ]
        else:
            everywhere = functools.partial(
                custom.list_cluster_custom_object, group, version, device_claims.CLAIMS
            )
            claim_lists = [(device_claims.CLAIMS, everywhere, None)]
        for name, list_claims, ns in claim_lists:
            self.informers.append(
                Informer(
                    name,
                    list_claims,
                    "",
                    self.caches.resource_claims,
                    capacity_changed,
                    transform=device_claims.slim_claim,
                    namespace=ns,
                ).start()
            )

    async def synced(self) -> None:
        """Return once every informer has listed (members: at most MEMBER_SYNC_SECONDS; one that
        does not answer in time is unreachable, and jobs plan without it)."""
        for inf in self.informers:
            await asyncio.to_thread(inf.synced.wait)
        if self.members is not None:
            await asyncio.to_thread(self.members.wait_synced, MEMBER_SYNC_SECONDS)
        log.info("caches filled", extra={"pods": len(self.caches.pods), "jobs": len(self.caches.jobs)})

    def stop(self) -> None:
        for inf in self.informers:
            inf.stop()
        if self.members is not None:
            self.members.stop()

    def flavors(self) -> dict[str, dict] | None:
        """Kueue's ResourceFlavors by name (None: the Kueue API is not served)."""
        return {f["metadata"]["name"]: f for f in self.caches.flavors.values()} if self.kueue else None

    def queue_topology(self, job: Mapping) -> str | None:
        """The Topology a flavor of the job's ClusterQueue names (core.island_topology.queue_topology);
        None: none, the job is not queued, or the Kueue API is not served."""
        queue = queueing.queue_name(job)
        if not self.kueue or not queue:
            return None
        lq = self.caches.local_queues.get(job["metadata"].get("namespace") or "", queue)
        cqs = {c["metadata"]["name"]: c for c in self.caches.cluster_queues.values()}
        return island_topology.queue_topology(lq, cqs, self.flavors() or {})

    def workload_priority_classes(self) -> dict[str, int] | None:
        """Kueue's WorkloadPriorityClass values by name (None: the Kueue API is not served)."""
        if not self.kueue:
            return None
        return {
            p["metadata"]["name"]: int(p.get("value") or 0)
            for p in self.caches.workload_priority_classes.values()
            if isinstance(p.get("value"), int)
        }

    def namespace_labels(self, ns: str) -> dict[str, str] | None:
        """A namespace's labels (None: not seen)."""
        found = self.caches.namespaces.get("", ns)
        return None if found is None else dict(found["metadata"].get("labels") or {})

    def priority_classes(self) -> dict[str, int]:
        return {
            p["metadata"]["name"]: int(p.get("value") or 0)
            for p in self.caches.priority_classes.values()
            if isinstance(p.get("value"), int)
        }


SLICES = "resourceslices"


def serves_dra(api: client.ApiClient) -> tuple[bool, bool]:
    """Whether the API server serves DRA's ResourceSlices, and its ResourceClaims, in the
    version Holmes reads."""
    group, version = dra.API_VERSION.split("/")
    try:
        resources = client.CustomObjectsApi(api).get_api_resources(group, version).resources
    except ApiException as e:
        if e.status == 404:
            return False, False
        raise
    names = {r.name for r in resources or []}
    slices, claims = SLICES in names, device_claims.CLAIMS in names
    log.info("DRA ResourceSlices %s", "served: read for NIC and GPU discovery" if slices else "not served")
    log.info("DRA ResourceClaims %s", "served: their allocations count as held" if claims else "not served")
    return slices, claims


T = TypeVar("T")


def until_answered(ask: Callable[[], T], sleep: Callable[[float], None]) -> T:
    """``ask()``, tried again after 1, 2, 4, 5, 5... s while the API server cannot be reached or
    answers 5xx (it is restarting); other errors are raised."""
    backoff = 1.0
    while True:
        try:
            return ask()
        except ApiException as e:
            if e.status is not None and e.status < 500:
                raise
            why: Exception = e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            why = e
        log.warning("API discovery failed; asking again in %.0fs: %s", backoff, why)
        sleep(backoff)
        backoff = next_backoff(backoff)


def serves_podgroups(api: client.ApiClient) -> bool:
    """Whether the API server serves Volcano's PodGroups (scheduling.volcano.sh/v1beta1)."""
    try:
        resources = (
            client.CustomObjectsApi(api)
            .get_api_resources(queueing.VOLCANO_GROUP, queueing.VOLCANO_VERSION)
            .resources
        )
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    found = any(r.name == queueing.PODGROUPS for r in resources or [])
    log.info("Volcano PodGroups %s", "served: watched for their phase" if found else "not served")
    return found


def namespace_matches(patterns: tuple[str, ...], ns: str) -> bool:
    """kopf's namespace patterns: any positive one matches (none given: all), no "!" one does."""
    pos = [p for p in patterns if not p.startswith("!")]
    neg = [p[1:] for p in patterns if p.startswith("!")]
    return (not pos or any(fnmatch.fnmatchcase(ns, p) for p in pos)) and not any(
        fnmatch.fnmatchcase(ns, p) for p in neg
    )


def node_fingerprint(body: Mapping) -> tuple:
    """What of a node matters to planning (heartbeats change none of it; nor do Holmes' own
    topology labels, written from what is here: their patch wakes no job)."""
    meta, spec, st = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    ready = next((c.get("status") for c in st.get("conditions") or [] if c.get("type") == "Ready"), None)
    labels = meta.get("labels") or {}
    return (
        tuple(sorted((k, v) for k, v in labels.items() if k not in island_topology.LABELS)),
        tuple(sorted((st.get("allocatable") or {}).items())),
        bool(spec.get("unschedulable")),
        ready,
        tuple(str(t) for t in spec.get("taints") or []),
    )


def slim_namespace(body: Mapping) -> dict:
    """A namespace with only its name and labels."""
    meta = body.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": dict(meta.get("labels") or {}),
        },
    }


def slim_node(body: Mapping) -> dict:
    """A node with only what planning reads (labels, Holmes' and NVIDIA's annotations, taints,
    allocatable, capacity, Ready)."""
    meta, spec, st = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    node = {
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
    node[discovery.CLASSIFY_KEY] = discovery.fixed_key(node)  # once per event, not per decision
    return node
