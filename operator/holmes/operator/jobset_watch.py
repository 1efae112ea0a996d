"""Holmes' plan for labelled JobSets (issue 53), the I/O around core/jobset_plan.py.

While the API server serves ``jobsets.jobset.x-k8s.io`` (looked for at start-up and every 30 s
until it does: JobSet may be installed after Holmes), two informers keep the JobSets labelled
``holmes.dev/plan=enabled`` and the pods JobSet made (label ``jobset.sigs.k8s.io/jobset-name``).
A change wakes one loop that, only while this replica leads and its caches are filled:

1. for each labelled JobSet with a gated pod, reads the plan ConfigMap; an existing plan that
   still names every pod (a restarted JobSet's pods keep their hostnames) is kept, else a new
   plan is made from the JobSet, its pods and the cached nodes (only while no pod of the JobSet
   is ungated: a running gang is never re-planned under its feet);
2. writes the ConfigMap (owned by the JobSet) before any pod is ungated, so a pod never starts
   without its entry;
3. ungates each gated pod with a node selector (a JSON merge patch carrying the pod's
   resourceVersion: a pod changed meanwhile is retried on the next pass).

A JobSet queued in Kueue (label kueue.x-k8s.io/queue-name) is planned only once its Workload
(read per pass, by Kueue's label of the JobSet's uid) is admitted and Kueue's topology gate is
off every pod, on the nodes the admission allows (core/jobset_kueue.py says why).

Idempotent: a restarted (or newly leading) operator finds the gated pods and the ConfigMap and
carries on. Refusals are Events on the JobSet (once per reason and message); the state is also
the JobSet's annotation holmes.dev/plan-status (core/jobset_status.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from holmes.plan.costmodel_file import CostModelFile

from .core import jobset_kueue as jk
from .core import jobset_plan as jp
from .core import jobset_status, queueing
from .informer import Store
from .kube import Caches
from .placement_facts import NodeFacts
from .watches import Watches, until_answered

log = logging.getLogger("holmes.operator.jobset")
GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
DISCOVER_SECONDS = 30.0
PASS_SECONDS = 10.0  # a pass even without a change: nodes that became usable for a waiting plan


def serves_jobsets(api: client.ApiClient) -> bool:
    try:
        resources = client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION).resources
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return any(r.name == PLURAL for r in resources or [])


class JobSetPlans:
    def __init__(
        self, api: client.ApiClient, caches: Caches, watches: Watches, cost_model: CostModelFile
    ) -> None:
        self.api, self.caches, self.watches = api, caches, watches
        self.facts = NodeFacts(cost_model)  # NIC kind and island of a node, as HolmesJobs see them
        self.tasks: list[asyncio.Task] = []  # the loop, cancelled with the job loops
        self.jobsets = Store(index_label=None)
        self.pods = Store(index_label=jp.JS_NAME)
        self.woken = asyncio.Event()
        self._said: dict[tuple[str, str], str] = {}

    def start(self, ready: asyncio.Event, leading: asyncio.Event | None) -> None:
        self.tasks.append(asyncio.create_task(self.run(ready, leading), name="holmes labelled JobSets"))

    async def run(self, ready: asyncio.Event, leading: asyncio.Event | None) -> None:
        """Until cancelled: discover, start the informers, then a pass on every change."""
        loop = asyncio.get_running_loop()
        while not await asyncio.to_thread(self.served):
            await asyncio.sleep(DISCOVER_SECONDS)
        log.info("JobSets served: labelled ones (%s=%s) are planned", jp.LABEL_PLAN, jp.PLAN_ENABLED)

        def changed(*_: Any) -> None:  # from an informer's thread
            loop.call_soon_threadsafe(self.woken.set)

        self._start(changed)
        await ready.wait()
        while True:
            self.woken.clear()  # before the pass: a change during it brings the next one at once
            if leading is None or leading.is_set():
                try:
                    await asyncio.to_thread(self.pass_once)
                except Exception:  # one bad pass must not end the loop: the next one retries
                    log.exception("JobSet planning pass failed")
            try:
                await asyncio.wait_for(self.woken.wait(), PASS_SECONDS)
            except asyncio.TimeoutError:
                pass

    def served(self) -> bool:
        """Whether JobSets are served; an answer the discovery cannot get (403: the chart's
        rules not applied yet) counts as not yet, logged, asked again later."""
        try:
            return until_answered(lambda: serves_jobsets(self.api), time.sleep)
        except ApiException as e:
            log.warning("cannot discover JobSets (%s): asking again in %.0fs", e.reason, DISCOVER_SECONDS)
            return False

    def _start(self, changed: Callable[..., None]) -> None:
        core = client.CoreV1Api(client.ApiClient(self.api.configuration))
        custom = client.CustomObjectsApi(core.api_client)
        self.watches.watch(
            PLURAL,
            lambda ns, **kw: custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, **kw),
            lambda **kw: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kw),
            f"{jp.LABEL_PLAN}={jp.PLAN_ENABLED}",
            self.jobsets,
            changed,
        )
        self.watches.watch(
            "jobset-pods",
            core.list_namespaced_pod,
            core.list_pod_for_all_namespaces,
            jp.JS_NAME,
            self.pods,
            changed,
        )

    # ---- one pass (a worker thread) ------------------------------------------------------
    def pass_once(self) -> None:
        nodes = self.caches.nodes.snapshot()
        for js in self.jobsets.snapshot():
            meta = js["metadata"]
            pods = [p for p in self.pods.by_label(meta["namespace"], meta["name"]) if _alive(p)]
            if not jp.opted_in(js):
                continue
            if (js.get("spec") or {}).get("suspend"):  # Kueue's until admitted, when it queues it
                why = self.admission(js, pods)
                if isinstance(why, str):
                    self.say(js, "Normal", jk.WAITING_FOR_ADMISSION, why)
                if why is not None:
                    continue
            if any(jp.gated(p) for p in pods) and jp.all_pods_exist(js, pods):
                self.plan_one(js, pods, nodes)

    def plan_one(self, js: dict, pods: list[dict], nodes: list[dict]) -> None:
        meta = js["metadata"]
        ns, name = meta["namespace"], meta["name"]
        core = client.CoreV1Api(self.api)
        usable = {n["metadata"]["name"] for n in nodes if not self.facts.unusable(n)}
        cm = _get_configmap(core, ns, jp.plan_name(name))
        doc = jp.read_plan(cm) if cm is not None else None
        layout_json = ((cm or {}).get("data") or {}).get(jp.LAYOUT_FILE, "{}")
        if doc is None or not jp.plan_matches(doc, pods, usable, nodes):
            if any(not jp.gated(p) for p in pods):
                return  # part of the gang runs on the old plan: the JobSet's restart brings new pods
            admitted = self.admission(js, pods)
            if isinstance(admitted, str):
                self.say(js, "Normal", jk.WAITING_FOR_ADMISSION, admitted)
                return
            try:
                plan = jp.make_plan(js, pods, nodes, self.facts.network, self.facts.unusable, admitted)
            except jp.PlanRefused as e:
                self.say(js, "Warning", e.reason, e.message)
                return
            body = jp.configmap(js, plan)
            _write_configmap(core, ns, body, cm)
            doc, layout_json = jp.read_plan(body), body["data"][jp.LAYOUT_FILE]
            self.say(
                js,
                "Normal",
                jp.PLANNED,
                f"pipeline {plan.layout.pipeline} x data {plan.layout.data}; "
                + "; ".join(f"stage {s.index}: {', '.join(s.nodes)} ({s.island})" for s in plan.layout.stages)
                + f"; plan in ConfigMap {body['metadata']['name']}. {plan.layout.explanation[0]}",
            )
        entries = doc["pods"]
        for p in pods:
            if not jp.gated(p):
                continue
            host = jp.slot(p).hostname
            notes = jp.pod_annotations(doc, host, layout_json)
            patch = jp.ungate_patch(p, jp.node_label(nodes, entries[host]["node"]), notes)
            try:
                out = core.patch_namespaced_pod(p["metadata"]["name"], ns, patch)
            except ApiException as e:
                if e.status in (404, 409, 422):  # gone, or changed meanwhile (the test op): next pass
                    log.warning(
                        "pod %s/%s not ungated (%s): trying again", ns, p["metadata"]["name"], e.reason
                    )
                    continue
                raise
            self.pods.put(core.api_client.sanitize_for_serialization(out))  # read-your-writes
            log.info(
                "ungated %s/%s onto %s (node rank %s)",
                ns,
                p["metadata"]["name"],
                entries[host]["node"],
                entries[host]["nodeRank"],
            )

    def admission(self, js: dict, pods: list[dict]) -> jk.Admitted | str | None:
        """Kueue's admission of the JobSet, why Holmes waits for it, or None: Kueue does not
        manage it. It does when the JobSet carries the queue label, or when a Workload carries
        the uid of the TrainJob that owns it (Kueue queues the TrainJob). One Workload list."""
        if not jk.queue(js) and jk.trainjob(js) is None:
            return None
        workloads = self._workloads(js)
        if not jk.queue(js) and not workloads:
            return None
        flavors = {f["metadata"]["name"]: f for f in self.caches.flavors.snapshot()}
        return jk.admission(js, workloads, flavors, pods)

    def _workloads(self, js: dict) -> list[dict] | None:
        """The JobSet's Workloads (Kueue labels them with its uid), as v1beta2; None: Kueue's
        API is not served."""
        custom = client.CustomObjectsApi(self.api)
        for version in queueing.KUEUE_VERSIONS:
            try:
                out = custom.list_namespaced_custom_object(
                    queueing.KUEUE_GROUP,
                    version,
                    js["metadata"]["namespace"],
                    queueing.WORKLOADS,
                    label_selector=jk.workload_selector(js),
                )
            except ApiException as e:
                if e.status == 404:
                    continue
                raise
            return [queueing.workload_from(w) for w in out.get("items") or []]
        return None

    def mark(self, js: dict, reason: str, message: str) -> None:
        """The JobSet's annotation holmes.dev/plan-status, where it changed."""
        meta = js["metadata"]
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch = jobset_status.status_patch(js, reason, message, now)
        if patch is None:
            return
        try:
            out = client.CustomObjectsApi(self.api).patch_namespaced_custom_object(
                GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], patch
            )
        except ApiException as e:  # gone, or not allowed: the Event still says it
            log.warning("cannot annotate JobSet %s/%s: %s", meta["namespace"], meta["name"], e.reason)
            return
        if isinstance(out, dict):
            self.jobsets.put(out)  # read-your-writes: the next pass sees the annotation

    def say(self, js: dict, kind: str, reason: str, message: str) -> None:
        """An Event on the JobSet, once per reason and message, and its plan status."""
        meta = js["metadata"]
        key = (meta["namespace"], meta["name"])
        self.mark(js, reason, message)
        if self._said.get(key) == reason + message:
            return
        self._said[key] = reason + message
        (log.warning if kind == "Warning" else log.info)(
            "JobSet %s/%s: %s: %s", key[0], key[1], reason, message, extra={"reason": reason}
        )
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "metadata": {"generateName": meta["name"] + ".", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": js.get("apiVersion", jp.API_VERSION),
                "kind": jp.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": kind,
            "reason": reason,
            "message": message[:1000],
            "source": {"component": "holmes-operator"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            client.CoreV1Api(self.api).create_namespaced_event(meta["namespace"], event)
        except ApiException as e:
            log.warning("cannot post the Event on JobSet %s/%s: %s", key[0], key[1], e.reason)


def _alive(pod: dict) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in (
        "Succeeded",
        "Failed",
    )


def _get_configmap(core: client.CoreV1Api, ns: str, name: str) -> dict | None:
    try:
        resp = core.read_namespaced_config_map(name, ns, _preload_content=False)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return dict(json.loads(resp.data))


def _write_configmap(core: client.CoreV1Api, ns: str, body: dict, old: dict | None) -> None:
    if old is None:
        core.create_namespaced_config_map(ns, body)
    else:
        body = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": old["metadata"]["resourceVersion"]},
        }
        core.replace_namespaced_config_map(body["metadata"]["name"], ns, body)
