"""Member clusters, the I/O side (the decisions are members.py's): the registry of members read
from the hub's Secrets, and for each member its own API client, informers and health probe.

- ``MemberRegistry`` watches Secrets labelled ``holmes.dev/member-cluster`` in one namespace of the hub
  (the operator's ``--members-namespace``); each holds a kubeconfig under the key ``kubeconfig``.
  A new Secret starts a member, a changed kubeconfig restarts it, a deleted Secret stops it (and
  jobs stop waiting for it).
- ``Member``: an API client built from that kubeconfig, with a default timeout on every request
  (a hung API server must not hold a reconcile), and informers of its own: the nodes (slimmed;
  a heartbeat wakes no job), Holmes' children (pods, ConfigMaps, Services, by label selector)
  and every pod that has not ended (capacity, as in the hub). A probe reads /version every few
  seconds; a member is reachable while its probe answers and its informers have listed once.
  Informers of an unreachable member back off on their own (informer.py); nothing waits on them.
"""

from __future__ import annotations

import base64
import binascii
import copy
import functools
import hashlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .core import capacity, child_names, members
from .core.members import KUBECONFIG_KEY, LABEL_MEMBER_CLUSTER, MemberState
from .informer import Informer, Store
from .kube import Caches, KubeIO

log = logging.getLogger("holmes.operator.core.members")
PROBE_SECONDS = 3.0  # between health probes of a member
PROBE_TIMEOUT = (3, 3)  # (connect, read); the client ignores a float, so never write 3.0 here
PROBE_FAILURES = 2  # consecutive failed probes before a member counts as unreachable
REQUEST_TIMEOUT = (5, 15)  # (connect, read) seconds of a member request that names none
REQUEST_RETRIES = 1  # urllib3's retries of a failed member request (its default is 3)


def with_default_timeout(
    api: client.ApiClient, timeout: tuple[float, float] = REQUEST_TIMEOUT
) -> client.ApiClient:
    """Every request of ``api`` that gives no ``_request_timeout`` gets ``timeout`` (the client's
    own default is to wait for ever)."""
    rest = api.rest_client
    inner = rest.request

    @functools.wraps(inner)
    def request(*args: Any, **kw: Any) -> Any:
        if not kw.get("_request_timeout"):
            kw["_request_timeout"] = timeout
        return inner(*args, **kw)

    rest.request = request
    return api


def short_error(e: BaseException) -> str:
    if isinstance(e, ApiException):
        return f"{e.status} {e.reason}"
    reason = getattr(e, "reason", None)  # urllib3's MaxRetryError
    text = str(reason if reason is not None else e)
    return f"{type(e).__name__}: {text}"[:300]


class NodeStore(Store):
    """Nodes by name; ``put`` says 'changed' only when what planning reads changed."""

    def __init__(self, fingerprint: Callable[[Mapping], tuple]) -> None:
        super().__init__(index_label=None)
        self.fingerprint = fingerprint

    def put(self, obj: dict) -> bool:
        old = self.get("", obj["metadata"]["name"])
        stored = super().put(obj)
        return stored and (old is None or self.fingerprint(old) != self.fingerprint(obj))


class Member:
    """One member cluster: API client, caches, informers, health."""

    def __init__(
        self,
        name: str,
        kubeconfig: Mapping | None,
        problem: str,
        notify: Callable[[str, str, str], None],
        slim_node: Callable[[Mapping], dict],
        fingerprint: Callable[[Mapping], tuple],
        namespace_ok: Callable[[str], bool],
    ) -> None:
        """``notify(what, namespace, job)`` from the member's threads: what is "child" (a child
        of job changed), "capacity" (a pod anywhere), "nodes" (what planning reads of a node)
        or "state" (reachability)."""
        self.name, self.notify, self.problem = name, notify, problem
        self.caches = Caches()
        self.nodes = NodeStore(fingerprint)
        self.informers: list[Informer] = []
        self.api: client.ApiClient | None = None
        self.io: KubeIO | None = None
        self._failures = 0
        self._probe_error = ""
        self._stop = threading.Event()
        self._slim_node, self._namespace_ok = slim_node, namespace_ok
        self._reachable = False
        if kubeconfig is not None and not problem:
            try:
                cfg = client.Configuration()
                config.load_kube_config_from_dict(dict(kubeconfig), client_configuration=cfg)
                cfg.connection_pool_maxsize = 32
                cfg.retries = REQUEST_RETRIES
                self.api = with_default_timeout(client.ApiClient(cfg))
                probe = copy.copy(cfg)
                probe.retries = 0  # one failed probe is one failure, after PROBE_TIMEOUT
                self.probe_api = client.ApiClient(probe)
                self.io = KubeIO(self.api, self.caches)
            except Exception as e:  # a kubeconfig that parses as YAML but not as a kubeconfig
                self.problem = f"the kubeconfig cannot be used: {short_error(e)}"

    # ---- state --------------------------------------------------------------------------------
    @property
    def synced(self) -> bool:
        return bool(self.informers) and all(i.synced.is_set() for i in self.informers)

    def state(self) -> MemberState:
        if self.problem:
            return MemberState(self.name, False, self.problem)
        if self._failures >= PROBE_FAILURES:
            return MemberState(self.name, False, self._probe_error)
        if not self.synced:
            return MemberState(self.name, False, self._probe_error or "its caches are not filled yet")
        return MemberState(self.name, True)

    def node_list(self) -> list[dict]:
        return self.nodes.values()

    # ---- start / stop -------------------------------------------------------------------------
    def start(self) -> Member:
        if self.api is None:
            log.warning("member cluster %s not started: %s", self.name, self.problem)
            return self
        # Watches hold their connection for minutes: a pool of their own, apart from the writes'.
        watch_api = with_default_timeout(client.ApiClient(self.api.configuration))
        core = client.CoreV1Api(watch_api)
        selector = f"{child_names.LABEL_MANAGED_BY}={child_names.MANAGED_BY},{child_names.LABEL_JOB}"

        def changed(ns: str, label: str) -> None:
            self.notify("child", ns, label)

        for kind, store, fn in (
            ("pods", self.caches.pods, core.list_pod_for_all_namespaces),
            ("configmaps", self.caches.configmaps, core.list_config_map_for_all_namespaces),
            ("services", self.caches.services, core.list_service_for_all_namespaces),
        ):
            self.informers.append(
                Informer(f"{self.name}/{kind}", fn, selector, store, changed, self._namespace_ok).start()
            )
        self.informers.append(
            Informer(
                f"{self.name}/nodes",
                core.list_node,
                "",
                self.nodes,
                lambda ns, label: self.notify("nodes", "", ""),
                transform=self._slim_node,
            ).start()
        )
        self.informers.append(
            Informer(
                f"{self.name}/pods-all",
                core.list_pod_for_all_namespaces,
                "",
                self.caches.cluster_pods,
                lambda ns, label: self.notify("capacity", "", ""),
                field_selector="status.phase!=Succeeded,status.phase!=Failed",
                transform=capacity.slim_pod,
            ).start()
        )
        threading.Thread(target=self._probe, name=f"member-probe-{self.name}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for inf in self.informers:
            inf.stop()

    def _probe(self) -> None:
        version = client.VersionApi(self.probe_api)
        was = None
        while not self._stop.is_set():
            try:
                version.get_code(_request_timeout=PROBE_TIMEOUT)
                self._failures, self._probe_error = 0, ""
            except Exception as e:  # refused, timed out, TLS, 5xx: all mean "not reachable now"
                self._failures += 1
                self._probe_error = short_error(e)
            now = self.state().reachable
            if now != was and (was is not None or self._failures):  # not the start-up fill
                log.log(
                    logging.INFO if now else logging.WARNING,
                    "member cluster %s is %s%s",
                    self.name,
                    "reachable" if now else "unreachable",
                    "" if now else f": {self.state().message}",
                )
            if now != was:
                was = now
                self.notify("state", "", "")
            self._stop.wait(PROBE_SECONDS if now or self.synced else 1.0)


class MemberRegistry:
    """The registered members, kept equal to the hub's member Secrets."""

    def __init__(
        self,
        core: client.CoreV1Api,
        namespace: str,
        notify: Callable[[str, str, str], None],
        slim_node: Callable[[Mapping], dict],
        fingerprint: Callable[[Mapping], tuple],
        namespace_ok: Callable[[str], bool] = lambda ns: True,
        secret_names: Sequence[str] = (),
    ) -> None:
        self.namespace = namespace
        self.notify = notify
        self._make = functools.partial(
            Member, notify=notify, slim_node=slim_node, fingerprint=fingerprint, namespace_ok=namespace_ok
        )
        self._lock = threading.Lock()
        self._members: dict[str, Member] = {}
        self._digests: dict[str, str] = {}
        # Every labelled Secret of the namespace, or (secret_names) each named one through a
        # field selector on its name: RBAC's resourceNames then limits the operator to exactly
        # those Secrets. A store each: one's LIST replaces only its own.
        lists: list[tuple[str, str | None]] = [(n, f"metadata.name={n}") for n in secret_names]
        lists = lists or [("", None)]
        self.stores = [Store(index_label=None) for _ in lists]
        self.informers = [
            Informer(
                f"member-secrets/{n}" if n else "member-secrets",
                functools.partial(core.list_namespaced_secret, namespace),
                LABEL_MEMBER_CLUSTER,
                store,
                lambda ns, label: self.sync(),
                field_selector=fields,
            )
            for (n, fields), store in zip(lists, self.stores, strict=True)
        ]

    def start(self) -> MemberRegistry:
        for informer in self.informers:
            informer.start()
        return self

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()
        with self._lock:
            for m in self._members.values():
                m.stop()
            self._members.clear()

    # ---- the registry -------------------------------------------------------------------------
    def sync(self) -> None:
        """Start, restart or stop members to match the Secrets (from the informer's thread)."""
        wanted: dict[str, tuple[Mapping | None, str, str]] = {}
        for s in (s for store in self.stores for s in store.values()):
            meta = s.get("metadata") or {}
            name = (meta.get("labels") or {}).get(LABEL_MEMBER_CLUSTER) or ""
            where = f"Secret {self.namespace}/{meta.get('name')}"
            if not name:
                continue
            if name in wanted:
                log.warning("%s registers member %s again: ignored (one Secret per member)", where, name)
                continue
            kubeconfig, problem = parse_secret(s, where)
            digest = hashlib.sha256(repr((kubeconfig, problem)).encode()).hexdigest()
            wanted[name] = (kubeconfig, problem, digest)
        started = []
        with self._lock:
            for name in list(self._members):
                if name not in wanted or wanted[name][2] != self._digests.get(name):
                    log.info("member cluster %s deregistered or changed: stopping its watches", name)
                    self._members.pop(name).stop()
                    self._digests.pop(name, None)
            for name, (kubeconfig, problem, digest) in wanted.items():
                if name not in self._members:
                    log.info("member cluster %s registered", name)
                    self._members[name] = self._make(name, kubeconfig, problem)
                    self._digests[name] = digest
                    started.append(self._members[name])
        for m in started:
            m.start()
        self.notify("state", "", "")

    def active(self) -> bool:
        with self._lock:
            return bool(self._members)

    def get(self, name: str) -> Member | None:
        with self._lock:
            return self._members.get(name)

    def all(self) -> dict[str, Member]:
        with self._lock:
            return dict(self._members)

    def states(self) -> dict[str, MemberState]:
        return {name: m.state() for name, m in self.all().items()}

    def wait_synced(self, timeout: float) -> None:
        """Block until the Secrets are listed and every member's caches are filled (at most
        ``timeout`` seconds for the members: an unreachable one must not keep the operator idle)."""
        for informer in self.informers:
            informer.synced.wait()
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.start()
        try:
            while not deadline.is_set():
                if all(m.synced or m.problem for m in self.all().values()):
                    return
                deadline.wait(0.2)
        finally:
            timer.cancel()

    # ---- one job's view across the members ----------------------------------------------------
    def job_pods(self, ns: str, name: str) -> tuple[list[dict], dict[str, str]]:
        """The job's pods in every member (also an unreachable one's, as last seen), each tagged
        with its member; and pod name -> member."""
        pods, where = [], {}
        for m, r in sorted(self.all().items()):
            for p in r.caches.pods.by_label(ns, name):
                pods.append(members.tag(p, m))
                where[p["metadata"]["name"]] = m
        return pods, where

    def child(self, usable: list[str], kind: str, ns: str, name: str, uid: str) -> dict | None:
        """The job's ConfigMap or Service as the members hold it: the copy of the newest attempt."""
        regs, found = self.all(), []
        for m in usable:
            obj = getattr(regs[m].caches, kind).get(ns, name) if m in regs else None
            if obj is not None and members.owned_children([obj], uid):
                ann = obj["metadata"].get("annotations") or {}
                attempt = ann.get(child_names.ANN_ATTEMPT) or ""
                found.append((int(attempt) if attempt.isdigit() else -1, m, obj))
        return max(found, key=lambda x: (x[0], x[1]))[2] if found else None

    def capacity_view(self) -> tuple[list[dict], Callable[[str, str], Mapping | None]]:
        """Capacity across members: what every pod in every member holds on its node (node names
        are unique across members), and the layout of a job launched there (newest attempt)."""
        regs = self.all()
        pods: dict[tuple, dict] = {}
        for m, r in regs.items():
            for p in r.caches.cluster_pods.values():
                pods[(m, _key(p))] = p
            for p in r.caches.pods.values():
                pods[(m, _key(p))] = capacity.slim_pod(p)

        def layout(ns: str, job: str) -> Mapping | None:
            cms = [r.caches.configmaps.get(ns, child_names.layout_configmap_name(job)) for r in regs.values()]
            return max(
                (c for c in cms if c is not None),
                key=lambda c: int((c["metadata"].get("annotations") or {}).get(child_names.ANN_ATTEMPT) or 0),
                default=None,
            )

        return list(pods.values()), layout

    def delete_children(self, job: Mapping) -> members.Cleanup:
        """Delete a job's children in every member that answers; what is left says whether the
        finalizer may go. The children are listed from each API server, not the caches: "gone"
        must be certain here."""
        ns, name, uid = job["metadata"]["namespace"], job["metadata"]["name"], job["metadata"]["uid"]
        regs = self.all()
        states = {m: r.state() for m, r in regs.items()}
        children = {}
        for m, r in regs.items():
            if not states[m].reachable or r.io is None:
                continue
            try:
                children[m] = r.io.list_children(ns, name)
            except Exception as e:  # this member does not answer now: wait for it
                states[m] = MemberState(m, False, short_error(e))
        plan = members.cleanup(uid, states, children)
        for m, items in plan.deletes.items():
            io = regs[m].io
            if io is None:  # never usable: its children were not listed either
                continue
            try:
                io.delete_children(ns, items)
            except Exception as e:  # this member now; the others still get their deletes
                log.warning("deleting children in member %s failed: %s", m, e, extra={"job": f"{ns}/{name}"})
        return plan


def _key(obj: Mapping) -> tuple[str, str]:
    return obj["metadata"].get("namespace"), obj["metadata"].get("name")


def parse_secret(secret: Mapping, where: str) -> tuple[Mapping | None, str]:
    """The kubeconfig a member Secret holds, or why it cannot be read."""
    data = secret.get("data") or {}
    raw = data.get(KUBECONFIG_KEY)
    if not raw:
        return None, f"{where} has no key {KUBECONFIG_KEY!r} (the member's kubeconfig)"
    try:
        doc = yaml.safe_load(base64.b64decode(raw))
    except (binascii.Error, ValueError, yaml.YAMLError) as e:
        return None, f"{where}: key {KUBECONFIG_KEY!r} is not a kubeconfig (YAML): {str(e)[:200]}"
    if not isinstance(doc, Mapping) or not doc.get("clusters"):
        return None, f"{where}: key {KUBECONFIG_KEY!r} holds no kubeconfig (no clusters)"
    return doc, ""
