"""Which version of Kueue's API the operator speaks, negotiated with the API server.

At start-up, then every ``DISCOVERY_SECONDS`` (Kueue installed, upgraded or removed while the
operator runs), API discovery says in which ``kueue.x-k8s.io`` versions the server serves both
Workloads and ResourceFlavors; the newest Holmes knows wins (``queueing.choose_version``:
v1beta2, else v1beta1). The Workload and ResourceFlavor informers follow that version; the
version in use is logged and exported as ``holmes_kueue_api_info{version}`` (``none`` while
Kueue's API is not served). Discovery needs no RBAC beyond what every authenticated client has.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable

from kubernetes import client

from holmes.contract.names import LABEL_KUEUE_QUEUE

from . import metrics
from .core import child_names, queueing
from .informer import Informer
from .kube import Caches

log = logging.getLogger("holmes.operator.kueue")
ENV_DISCOVERY = "HOLMES_KUEUE_DISCOVERY_SECONDS"
DISCOVERY_SECONDS = 30.0  # how often Kueue's API is looked for again (ENV_DISCOVERY overrides)
RETRY_SECONDS = 5.0  # after a failed discovery


def discovery_seconds(environ: dict | None = None) -> float:
    raw = (os.environ if environ is None else environ).get(ENV_DISCOVERY, "")
    if not raw:
        return DISCOVERY_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(
            f"{ENV_DISCOVERY}={raw!r}: give a number of seconds above 0 (default {DISCOVERY_SECONDS:g})"
        )
    return value


def served_versions(api: client.ApiClient) -> tuple[str, ...]:
    """The kueue.x-k8s.io versions Holmes knows in which the API server serves both Workloads
    and ResourceFlavors (API discovery; raises when the API server does not answer)."""
    groups = client.ApisApi(api).get_api_versions().groups or []
    group = next((g for g in groups if g.name == queueing.KUEUE_GROUP), None)
    if group is None:
        return ()
    custom = client.CustomObjectsApi(api)
    out = []
    for gv in group.versions or []:
        if gv.version in queueing.KUEUE_VERSIONS:
            resources = {r.name for r in custom.get_api_resources(queueing.KUEUE_GROUP, gv.version).resources}
            if {queueing.WORKLOADS, queueing.FLAVORS} <= resources:
                out.append(gv.version)
    return tuple(out)


def start_informers(
    api: client.ApiClient,
    caches: Caches,
    namespaces: tuple[str, ...],
    namespace_ok: Callable[[str], bool],
    changed: Callable[[str, str], None],
    wake_all: Callable[[], None],
    version: str,
) -> list[Informer]:
    """Kueue's Workloads of Holmes jobs (one watch per namespace in ``namespaces``, else one
    cluster-wide, filtered by ``namespace_ok``) and every ResourceFlavor, read in ``version``
    and cached as v1beta2."""
    custom = client.CustomObjectsApi(api)
    g, v = queueing.KUEUE_GROUP, version
    selector = f"{child_names.LABEL_MANAGED_BY}={child_names.MANAGED_BY},{child_names.LABEL_JOB}"
    store, as_v1beta2 = caches.workloads, queueing.workload_from
    out = [
        Informer(
            f"workloads/{ns}",
            functools.partial(custom.list_namespaced_custom_object, g, v, ns, queueing.WORKLOADS),
            selector,
            store,
            changed,
            transform=as_v1beta2,
        )
        for ns in namespaces
    ]
    if not namespaces:
        fn = functools.partial(custom.list_cluster_custom_object, g, v, queueing.WORKLOADS)
        out.append(Informer("workloads", fn, selector, store, changed, namespace_ok, transform=as_v1beta2))
    fn = functools.partial(custom.list_cluster_custom_object, g, v, queueing.FLAVORS)
    out.append(Informer("resourceflavors", fn, "", caches.flavors, lambda ns, label: wake_all()))
    # the queues, where served (is a job's ClusterQueue's flavor one with a Topology: TAS). A
    # change wakes no job: Kueue rewrites their status at every admission, and a job reads them
    # when it makes its Workload (a held job is looked at again every WAIT_INTERVAL anyway)
    served = {r.name for r in custom.get_api_resources(g, v).resources}
    queues = ((queueing.LOCAL_QUEUES, caches.local_queues), (queueing.CLUSTER_QUEUES, caches.cluster_queues))
    for plural, store in queues:
        if plural in served:
            fn = functools.partial(custom.list_cluster_custom_object, g, v, plural)
            out.append(Informer(plural, fn, "", store, lambda ns, label: None))
        else:
            store.replace([])
    # WorkloadPriorityClasses (the value of a job's kueue.x-k8s.io/priority-class), where served
    if queueing.PRIORITY_CLASSES in served:
        fn = functools.partial(custom.list_cluster_custom_object, g, v, queueing.PRIORITY_CLASSES)
        wpcs = caches.workload_priority_classes
        out.append(Informer("workloadpriorityclasses", fn, "", wpcs, lambda ns, label: wake_all()))
    else:
        caches.workload_priority_classes.replace([])
    return [inf.start() for inf in out]


class KueueLink:
    """Keeps the Kueue informers on the version the API server serves, re-negotiated every
    ``interval`` seconds in a thread of its own. ``on_version(version)`` (from that thread) is
    called once the informers of a newly chosen version are filled, and with None when Kueue's
    API goes away. Stands in the runtime's informer list like an Informer: ``synced`` is set once
    the first negotiation is done (and its caches filled), ``stop()`` ends it all."""

    def __init__(
        self,
        discover: Callable[[], tuple[str, ...]],
        start: Callable[[str], list[Informer]],
        caches: Caches,
        on_version: Callable[[str | None], None],
        interval: float | None = None,
    ) -> None:
        self.discover, self.start_informers, self.caches = discover, start, caches
        self.on_version = on_version
        self.interval = discovery_seconds() if interval is None else interval
        self.version: str | None = None
        self.informers: list[Informer] = []
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._said = ""
        self._thread = threading.Thread(target=self._run, name="kueue-version", daemon=True)
        metrics.set_kueue_api(None)

    def start(self) -> KueueLink:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for inf in self.informers:
            inf.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            wait = self.interval
            try:
                served = self.discover()
            except Exception as e:  # the API server restarting: keep what is in use, ask again soon
                self._say(
                    f"Kueue API discovery failed; asking again in {RETRY_SECONDS:g}s: {e}", logging.WARNING
                )
                wait = min(RETRY_SECONDS, self.interval)
            else:
                chosen = queueing.choose_version(served)
                if chosen != self.version or not self.synced.is_set():
                    self._switch(chosen, served)
            self.synced.set()
            self._stop.wait(wait)

    def _switch(self, version: str | None, served: tuple[str, ...]) -> None:
        for inf in self.informers:
            inf.stop()
        self.informers = self.start_informers(version) if version else []
        for inf in self.informers:
            while not inf.synced.wait(1.0):
                if self._stop.is_set():
                    return
        if version is None:  # what the stopped informers held is gone with the API
            self.caches.workloads.replace([])
            self.caches.flavors.replace([])
            self.caches.local_queues.replace([])
            self.caches.cluster_queues.replace([])
            self.caches.workload_priority_classes.replace([])
        self.version = version
        metrics.set_kueue_api(version)
        if version is None:
            self._say(
                f"Kueue's API ({queueing.KUEUE_GROUP} Workloads in {' or '.join(queueing.KUEUE_VERSIONS)}) "
                f"is not served: jobs labelled {LABEL_KUEUE_QUEUE} stall (KueueNotInstalled) until it is"
            )
        else:
            old = (
                ""
                if version == queueing.V1BETA2
                else " (a Kueue before 0.15; upgrade it: 0.16 deprecates v1beta1)"
            )
            self._say(
                f"Kueue's API {queueing.KUEUE_GROUP} serves Workloads in {', '.join(served)}: "
                f"using {version}{old}"
            )
        self.on_version(version)

    def _say(self, message: str, level: int = logging.INFO) -> None:
        if message != self._said:  # a repeated failure or choice is logged once
            self._said = message
            log.log(level, message)
