"""Kubernetes writes for one reconcile: apply a Decision, patch the status. Synchronous (the
kubernetes client), run in a worker thread by the job's reconcile loop. Reads come from the
informers' caches (informer.py); what every write returns goes into them, so the next reconcile
sees its own writes. Responses are read as raw JSON (camelCase dicts, like the API), which is
also much faster than the client's models at 256 pods.

Every write is idempotent: creates that find the object already there are fine (deterministic
names), deletes that find nothing are fine, the ConfigMap is created or replaced.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, cast

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException

from holmes.contract.names import GROUP, PLURAL, VERSION

from .core import child_names, compute_domains, dry_run, prebuilt, queueing
from .core.reconcile import ChildRefusal, Decision
from .informer import Store

log = logging.getLogger("holmes.operator.kube")


def _adopt(obj: dict, owner: dict) -> None:
    """Owner reference, namespace and labels of ``owner`` (the HolmesJob) on ``obj``."""
    # kopf annotates the owner as its Body view, yet reads it only with .get(): a raw object works
    kopf.adopt(obj, owner=cast(kopf.Body, owner))


def _json(resp: Any) -> dict:
    return json.loads(resp.data)


def refusal(kind: str, name: str, e: ApiException) -> ChildRefusal:
    """An ApiException as a ChildRefusal, with the reason and message of the API's Status body."""
    return ChildRefusal.from_status(kind, name, e.status, e.reason, e.body)


class Caches:
    """The stores the informers keep (informer.py); KubeIO puts what its writes return in them."""

    def __init__(self) -> None:
        self.jobs = Store(index_label=None)
        # every node, slimmed to what planning reads (watches.slim_node)
        self.nodes = Store(index_label=None)
        # every namespace's labels (their Pod Security level: template.enforced_level)
        self.namespaces = Store(index_label=None)
        self.pods = Store(index_label=child_names.LABEL_JOB)
        self.configmaps = Store(index_label=child_names.LABEL_JOB)
        self.services = Store(index_label=child_names.LABEL_JOB)
        # shared clusters: every pod that has not ended, slimmed (capacity.slim_pod); Kueue's
        # Workloads of Holmes jobs and its ResourceFlavors; PriorityClasses
        self.cluster_pods = Store(index_label=None)
        self.workloads = Store(index_label=child_names.LABEL_JOB)
        self.flavors = Store(index_label=None)
        # Kueue's queues: which ClusterQueue a job's LocalQueue feeds, and its flavors (TAS)
        self.local_queues = Store(index_label=None)
        self.cluster_queues = Store(index_label=None)
        self.workload_priority_classes = Store(index_label=None)  # Kueue's, while served
        self.priority_classes = Store(index_label=None)
        # DRA: every ResourceSlice, and every ResourceClaim slimmed to what capacity counts
        # (device_claims.slim_claim), while the API server serves them (watches.py)
        self.resource_slices = Store(index_label=None)
        self.resource_claims = Store(index_label=None)
        # the ResourceQuotas of the served namespaces (core/quota.py: no pod a quota would refuse)
        self.resource_quotas = Store(index_label=None)
        # Volcano: the PodGroups of Holmes jobs, while the API server serves them (watches.py)
        self.podgroups = Store(index_label=child_names.LABEL_JOB)
        # the capacity view (pipeline.HubChildren) as of (cluster_pods, pods) versions
        self.capacity_view: tuple[tuple[int, int], list[dict]] | None = None
        self.slim_pods: dict[tuple[str, str], dict] = {}  # Holmes' own pods in it, slimmed


class KubeIO:
    def __init__(self, api: client.ApiClient, caches: Caches | None = None, workers: int = 16):
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.caches = caches or Caches()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="holmes-io")
        self.kueue_version = queueing.V1BETA2  # the Kueue version in use (kueue_version.py)

    # ---- reads (the one read that is not cached) ---------------------------------------------
    def log_tail(self, pod: dict, lines: int = 20) -> str:
        """The last lines of a pod's training container log ('' when logs are not reachable)."""
        meta = pod["metadata"]
        names_ = [c["name"] for c in pod["spec"]["containers"]]
        container = child_names.TRAINER_CONTAINER if child_names.TRAINER_CONTAINER in names_ else names_[0]
        try:
            resp = self.core.read_namespaced_pod_log(
                meta["name"],
                meta["namespace"],
                container=container,
                tail_lines=lines,
                limit_bytes=64 * 1024,  # the job author's output: bounded like the metrics scrape
                _preload_content=False,
                _request_timeout=5,
            )
            return resp.data.decode("utf-8", "replace")
        except (ApiException, OSError, ValueError) as e:
            log.debug("no log tail for %s: %s", meta["name"], e)
            return ""

    # ---- writes -----------------------------------------------------------------------------
    def apply(self, d: Decision, owner: dict, adopt: bool = True) -> tuple[int, list[ChildRefusal]]:
        """Apply a Decision's object changes in a crash-safe order; the status comes after.
        Returns the number of pods actually created and the creates the API server refused
        (quota, admission, invalid objects): the caller decides again with them. ``adopt``:
        owner references to ``owner`` (not in a member cluster: the hub's job is not there)."""
        ns = owner["metadata"]["namespace"]

        def own(obj: dict) -> None:
            if adopt:
                _adopt(obj, owner)

        self._parallel(lambda n: self._delete_pod(ns, n), d.delete_pods)
        for pod in d.create_pods:
            own(pod)
        refused = self.dry_run(ns, d.create_pods)  # the API server's check, before any child
        if refused:
            return 0, refused
        # The pods' prerequisites together, not one after another: each is a round trip of a few
        # hundred ms on a busy API server, and the launch waits for them all.
        prereqs: list[tuple[str, dict, Callable[[str, dict], Any]]] = []
        if d.configmap is not None:
            prereqs.append(("ConfigMap", d.configmap, self._create_or_replace_configmap))
        if d.service is not None:
            prereqs.append(("Service", d.service, self._create_service))
        # claim templates are named by content: one already there is the same
        prereqs += [("ResourceClaimTemplate", tpl, self._create_claim_template) for tpl in d.claim_templates]
        # ComputeDomains too (named by content: one there is the same; the driver refuses spec
        # changes): NVIDIA's DRA driver makes each one's channel template, which pods claim
        prereqs += [(compute_domains.KIND, cd, self._create_compute_domain) for cd in d.compute_domains]
        for _, body, _ in prereqs:
            own(body)
        outcomes = self._parallel(lambda p: self._attempt(p[0], p[1], p[2], ns), prereqs)
        refused = [no for _, nos in outcomes for no in nos]
        if refused:  # pods need them all: create none of them
            return 0, refused
        outcomes = self._parallel(lambda p: self._attempt("Pod", p, self._create_pod, ns), d.create_pods)
        created = sum(1 for made, _ in outcomes if made is True)
        return created, [no for _, no in outcomes for no in no]

    def dry_run(self, ns: str, pods: list[dict]) -> list[ChildRefusal]:
        """A server-side dry run (strict field validation) of one pod of each shape of the gang
        (dry_run.samples): the refusals the template can fix (the Pod schema, Pod Security,
        admission), none when the API server would take them (or cannot say on a dry run)."""
        out = []
        for pod in dry_run.samples(pods):
            try:
                self.core.create_namespaced_pod(
                    ns, pod, dry_run="All", field_validation="Strict", _preload_content=False
                )
            except ApiException as e:
                no = refusal("Pod", pod["metadata"]["name"], e)
                if dry_run.about_template(no):
                    out.append(replace(no, dry_run=True))
                else:
                    log.info("dry run of pod %s/%s not conclusive: %s", ns, no.name, no.describe())
        return out

    @staticmethod
    def _attempt(kind: str, body: dict, create: Callable[[str, dict], Any], ns: str) -> tuple[Any, list]:
        """(what ``create`` returned, []) or (None, [the API server's refusal])."""
        try:
            return create(ns, body), []
        except ApiException as e:
            return None, [refusal(kind, body["metadata"]["name"], e)]

    def _create_pod(self, ns: str, pod: dict) -> bool:
        return self._create(self.core.create_namespaced_pod, ns, pod, self.caches.pods)

    def _create_claim_template(self, ns: str, body: dict) -> bool:
        group, version = body["apiVersion"].split("/")
        try:
            self.custom.create_namespaced_custom_object(
                group, version, ns, "resourceclaimtemplates", body, _preload_content=False
            )
            return True
        except ApiException as e:
            if e.status == 409:  # created by an earlier attempt or before a restart
                return False
            raise

    def _create_compute_domain(self, ns: str, body: dict) -> bool:
        group, version = body["apiVersion"].split("/")
        try:
            self.custom.create_namespaced_custom_object(
                group, version, ns, compute_domains.PLURAL, body, _preload_content=False
            )
            return True
        except ApiException as e:
            if e.status == 409:  # created by an earlier attempt or before a restart
                return False
            raise

    def _create_service(self, ns: str, svc: dict) -> bool:
        return self._create(self.core.create_namespaced_service, ns, svc, self.caches.services)

    def patch_status(self, job: dict, old: dict, new: dict) -> bool:
        """Merge-patch the status subresource with what changed; False when nothing did."""
        patch = {k: v for k, v in new.items() if old.get(k) != v}
        patch.update({k: None for k in old if k not in new})
        if not patch:
            return False
        meta = job["metadata"]
        resp = self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            meta["namespace"],
            PLURAL,
            meta["name"],
            {"status": patch},
            _preload_content=False,
        )
        self.caches.jobs.put(_json(resp))
        return True

    def delete_children(self, ns: str, children: list[tuple[str, str]]) -> None:
        """Delete (kind, name) children: Pods (with their own grace period), ConfigMaps, Services;
        the store keeps a terminating pod until its watch says it is gone."""
        delete = {
            "ConfigMap": self.core.delete_namespaced_config_map,
            "Service": self.core.delete_namespaced_service,
        }
        stores = {"ConfigMap": self.caches.configmaps, "Service": self.caches.services}
        for kind, name in children:
            if kind == "Pod":
                self._delete_pod(ns, name)
                continue
            try:
                delete[kind](name, ns, _preload_content=False)
            except ApiException as e:
                if e.status != 404:
                    raise
            stores[kind].remove_name(ns, name)

    def list_children(self, ns: str, job: str) -> list[tuple[str, dict]]:
        """The job's pods, ConfigMaps and Services as the API server has them now (not the
        caches: a delete's response stored after the watch already said the object is gone
        would linger there), with the caches corrected to match."""
        selector = f"{child_names.LABEL_MANAGED_BY}={child_names.MANAGED_BY},{child_names.LABEL_JOB}={job}"
        out: list[tuple[str, dict]] = []
        for kind, fn, store in (
            ("Pod", self.core.list_namespaced_pod, self.caches.pods),
            ("ConfigMap", self.core.list_namespaced_config_map, self.caches.configmaps),
            ("Service", self.core.list_namespaced_service, self.caches.services),
        ):
            items = _json(fn(ns, label_selector=selector, _preload_content=False)).get("items") or []
            have = {o["metadata"]["name"] for o in items}
            for cached in store.by_label(ns, job):
                if cached["metadata"]["name"] not in have:
                    store.remove_name(ns, cached["metadata"]["name"])
            out += [(kind, o) for o in items]
        return out

    def set_finalizers(self, job: dict, finalizers: list[str]) -> dict:
        """Replace the job's metadata.finalizers (409 when the job changed since it was read)."""
        meta = job["metadata"]
        resp = self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            meta["namespace"],
            PLURAL,
            meta["name"],
            {"metadata": {"finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}},
            _preload_content=False,
        )
        body = _json(resp)
        self.caches.jobs.put(body)
        return body

    def delete_job(self, ns: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                ns,
                PLURAL,
                name,
                body=client.V1DeleteOptions(propagation_policy="Background"),
                _preload_content=False,
            )
        except ApiException as e:
            if e.status != 404:
                raise

    # ---- helpers ----------------------------------------------------------------------------
    def _parallel(self, fn: Callable, items: list) -> list:
        if len(items) <= 1:
            return [fn(x) for x in items]
        return list(self.pool.map(fn, items))

    @staticmethod
    def _create(fn: Callable, ns: str, body: dict, store: Store) -> bool:
        try:
            store.put(_json(fn(ns, body, _preload_content=False)))
            return True
        except ApiException as e:
            if e.status == 409:  # already there: created before a restart
                return False
            raise

    def _delete_pod(self, ns: str, name: str) -> None:
        try:
            resp = _json(
                # the pod's own terminationGracePeriodSeconds: a preempted trainer may be saving
                self.core.delete_namespaced_pod(name, ns, _preload_content=False)
            )
        except ApiException as e:
            if e.status != 404:
                raise
            return
        if resp.get("kind") == "Pod":  # now terminating (a Status when it went at once)
            self.caches.pods.put(resp)

    def _create_or_replace_configmap(self, ns: str, cm: dict) -> None:
        try:
            resp = self.core.create_namespaced_config_map(ns, cm, _preload_content=False)
        except ApiException as e:
            if e.status != 409:
                raise
            resp = self.core.replace_namespaced_config_map(
                cm["metadata"]["name"], ns, cm, _preload_content=False
            )
        self.caches.configmaps.put(_json(resp))

    # ---- queueing systems (queueing.py) -------------------------------------------------------
    def apply_queueing(self, d: Decision, owner: dict) -> None:
        """A Decision's Kueue Workload and Volcano PodGroup writes (before its pods); Workloads in
        the Kueue version in use (``kueue_version``), cached as v1beta2 (queueing.workload_from)."""
        ns = owner["metadata"]["namespace"]
        kueue = (queueing.KUEUE_GROUP, self.kueue_version)
        if d.delete_workload:
            try:
                self.custom.delete_namespaced_custom_object(*kueue, ns, queueing.WORKLOADS, d.delete_workload)
            except ApiException as e:
                if e.status != 404:
                    raise
            self.caches.workloads.remove_name(ns, d.delete_workload)
        if d.workload is not None:
            _adopt(d.workload, owner)
            body = queueing.workload_as(self.kueue_version, d.workload)
            self._create_custom(*kueue, queueing.WORKLOADS, ns, body)
        name = prebuilt.job_workload_name(owner)
        if d.adopt_workload is not None:  # a prebuilt Workload (MultiKueue's): the job its controller
            try:
                resp = self.custom.patch_namespaced_custom_object(
                    *kueue, ns, queueing.WORKLOADS, name, d.adopt_workload, _preload_content=False
                )
                self.caches.workloads.put(queueing.workload_from(_json(resp)))
            except ApiException as e:
                if e.status not in (404, 409):  # gone, or written since it was read: next pass
                    raise
        if d.workload_status is not None and d.workload is None:  # Finished, quota released, PodsReady
            patch: dict = {"status": d.workload_status}
            if d.workload_version:  # the conditions list is replaced whole: not over Kueue's newer write
                patch["metadata"] = {"resourceVersion": d.workload_version}
            try:
                resp = self.custom.patch_namespaced_custom_object_status(
                    *kueue, ns, queueing.WORKLOADS, name, patch, _preload_content=False
                )
                self.caches.workloads.put(queueing.workload_from(_json(resp)))
            except ApiException as e:
                # 409: Kueue wrote the Workload since it was read; its watch event brings the
                # job back with the newer one
                if e.status not in (404, 409):
                    raise
        if d.podgroup is not None:
            _adopt(d.podgroup, owner)
            group = (queueing.VOLCANO_GROUP, queueing.VOLCANO_VERSION, ns, queueing.PODGROUPS)
            try:
                self.custom.create_namespaced_custom_object(*group, d.podgroup, _preload_content=False)
            except ApiException as e:
                if e.status != 409:
                    raise
                self.custom.patch_namespaced_custom_object(
                    *group,
                    d.podgroup["metadata"]["name"],
                    {"spec": d.podgroup["spec"]},
                    _preload_content=False,
                )

    def _create_custom(self, group: str, version: str, plural: str, ns: str, body: dict) -> None:
        try:
            resp = self.custom.create_namespaced_custom_object(
                group, version, ns, plural, body, _preload_content=False
            )
        except ApiException as e:
            if e.status == 409:  # there already: created before a restart
                return
            raise
        self.caches.workloads.put(queueing.workload_from(_json(resp)))
