"""A HolmesJob Kueue's MultiKueue dispatches (issue 51), both halves as data:

- the manager (``spec.managedBy: kueue.x-k8s.io/multikueue``, in a LocalQueue): the operator
  creates the job's Workload, owned by the job, one PodSet of ``nodes.count`` pods of its shape
  whatever the manager's nodes, at the priority its own Workloads get, and nothing else (no pods,
  ConfigMap or status); an evicted Workload's quota goes back once the worker's copied status
  shows no active pod (core/dispatching.py);
- the worker (MultiKueue's copy, labelled ``kueue.x-k8s.io/prebuilt-workload-name``): the job
  waits for that Workload, takes ownership of it as Kueue's jobframework does, never rewrites
  its PodSets, runs on the admitted flavor's nodes and marks it Finished (queueing.gate,
  admitting.py).

On the real Kueue with two control planes: tests/e2e/operator/test_multikueue_cluster.py."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone

import pytest
from kubernetes import client

from holmes.contract import load_job
from holmes.contract.names import (
    LABEL_KUEUE_PREBUILT_WORKLOAD,
    LABEL_KUEUE_PRIORITY_CLASS,
    LABEL_KUEUE_QUEUE,
    MANAGED_BY_MULTIKUEUE,
)
from holmes.operator import handlers, kube, placement_facts
from holmes.operator.core import capacity, dispatching, kueue_pod_sets, prebuilt, queueing
from holmes.operator.core.reconcile import Observed
from tests.helpers.operator import kueue_standin as kueue
from tests.helpers.operator.opfixtures import FakeWorld, default_nodes, manifest, with_link_layers

FLAVORS = {
    "west-gpu": {"metadata": {"name": "west-gpu"}, "spec": {"nodeLabels": {"holmes.dev/cluster": "west"}}}
}
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def manager_job(count: int = 2, gpus: int = 2, **labels: str) -> dict:
    m = manifest("k", count=count, gpus=gpus)
    m["spec"]["managedBy"] = MANAGED_BY_MULTIKUEUE
    m["metadata"]["labels"] = {LABEL_KUEUE_QUEUE: "team-a", **labels}
    return m


def observe(job: dict, workload: dict | None = None, **kw) -> Observed:
    return Observed(
        job=job,
        pods=[],
        configmap=None,
        service=None,
        nodes=[],
        now=NOW,
        workload=workload,
        flavors=kw.pop("flavors", FLAVORS),
        **kw,
    )


def dispatch(obs: Observed, raw: frozenset[str] = frozenset()):
    return dispatching.dispatch(obs, raw, "nvidia.com/gpu")


# ---- the manager ---------------------------------------------------------------------------------


def test_the_manager_creates_the_workload_multikueue_dispatches_one_pod_set_of_the_jobs_shape():
    job = manager_job(count=3, gpus=2)
    assert dispatching.dispatched(job)
    d = dispatch(observe(job, priority_classes={}))
    wl = d.workload
    assert wl is not None and wl["metadata"]["name"] == "holmesjob-k"
    assert wl["spec"]["queueName"] == "team-a" and wl["spec"]["priority"] == 0
    shape = capacity.pod_shape(load_job(job), "nvidia.com/gpu")
    assert queueing.same_pod_sets(wl["spec"]["podSets"], kueue_pod_sets.one_pod_set(3, shape, None))
    assert [p["count"] for p in wl["spec"]["podSets"]] == [3]
    # nothing else: no pods, ConfigMap, Service; the status is the worker's (left as it is)
    assert not d.create_pods and d.configmap is None and d.service is None and d.status == {}
    assert not d.events and d.delete_workload is None


def test_the_manager_gives_the_workload_the_priority_holmes_gives_its_own():
    job = manager_job()
    job["spec"]["runPolicy"]["priorityClassName"] = "high"
    wl = dispatch(observe(job, priority_classes={"high": 500})).workload
    assert wl["spec"]["priority"] == 500
    assert wl["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "high",
    }
    job = manager_job(**{LABEL_KUEUE_PRIORITY_CLASS: "urgent"})
    wl = dispatch(observe(job, priority_classes={}, workload_priority_classes={"urgent": 900})).workload
    assert wl["spec"]["priority"] == 900 and wl["spec"]["priorityClassRef"]["kind"] == "WorkloadPriorityClass"


def test_the_manager_keeps_the_workload_it_made_and_writes_nothing_while_it_waits_or_runs():
    job = manager_job()
    wl = copy.deepcopy(dispatch(observe(job)).workload)
    wl["metadata"]["ownerReferences"] = [{"uid": "uid-1", "controller": True}]
    d = dispatch(observe(job, wl))
    assert d.workload is None and d.delete_workload is None and d.workload_status is None
    wl["status"] = kueue.reserve_quota(wl, "west-gpu", "t0")  # admitted: MultiKueue's check Ready
    job["status"] = {"phase": "Running", "pods": {"pending": 0, "running": 2, "succeeded": 0, "failed": 0}}
    d = dispatch(observe(job, wl))
    assert d.workload is None and d.workload_status is None and not d.create_pods and not d.events
    assert d.status == job["status"]  # MultiKueue's copy: never rewritten here


def test_an_evicted_dispatched_workload_is_released_once_the_workers_copy_has_no_active_pod():
    job = manager_job()
    wl = copy.deepcopy(dispatch(observe(job)).workload)
    wl["metadata"]["ownerReferences"] = [{"uid": "uid-1", "controller": True}]
    wl["status"] = kueue.reserve_quota(wl, "west-gpu", "t0")
    wl["status"] = kueue.evict(wl, "Preempted", "Preempted to accommodate urgent", "t1")
    job["status"] = {"phase": "Running", "pods": {"pending": 0, "running": 2, "succeeded": 0, "failed": 0}}
    assert dispatch(observe(job, wl)).workload_status is None  # the worker's pods still run
    job["status"] = {"phase": "Suspended", "pods": {"pending": 0, "running": 0, "succeeded": 0, "failed": 0}}
    patch = dispatch(observe(job, wl)).workload_status
    assert patch is not None and patch["admission"] is None


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda j: j["spec"]["nodes"].update(count=0), "InvalidSpec"),
        (lambda j: j["spec"]["runPolicy"].update(priority=5), "PolicyViolation"),
        (lambda j: j["spec"]["runPolicy"].update(priorityClassName="nope"), "InvalidSpec"),
    ],
)
def test_the_manager_makes_no_workload_for_a_job_it_would_refuse_and_says_why(change, reason):
    job = manager_job()
    change(job)
    d = dispatch(observe(job, priority_classes={}))
    assert d.workload is None
    assert [(e.type, e.reason) for e in d.events] == [("Warning", reason)]
    assert "no Workload: MultiKueue cannot dispatch the job" in d.events[0].message


def test_the_manager_without_kueue_says_so():
    d = dispatch(observe(manager_job(), flavors=None))
    assert d.workload is None and [e.reason for e in d.events] == ["KueueNotInstalled"]


def test_a_managed_job_outside_a_queue_or_of_another_controller_is_not_dispatched():
    no_queue = manager_job()
    no_queue["metadata"]["labels"] = {}
    other = manager_job()
    other["spec"]["managedBy"] = "example.com/dispatcher"
    assert not dispatching.dispatched(no_queue) and not dispatching.dispatched(other)


def test_the_reconcile_dispatches_a_multikueue_job_in_a_queue_and_nothing_else(monkeypatch):
    """The runtime: the pipeline's pass never runs for it; its Workload is written through
    apply_queueing, Events once; the loop goes on (woken by the Workload's changes)."""
    rt = handlers.Runtime(client.ApiClient(), placement_facts.builtin_cost_model())
    writes, events = [], []
    monkeypatch.setattr(rt.pipeline, "run", lambda *a: pytest.fail("the pass ran"))
    monkeypatch.setattr(rt.io, "apply_queueing", lambda d, job: writes.append(d))
    monkeypatch.setattr(rt.watches, "flavors", lambda: FLAVORS)
    monkeypatch.setattr(rt.watches, "priority_classes", lambda: {})
    monkeypatch.setattr(handlers.kopf, "event", lambda obj, **kw: events.append(kw))
    rt.caches.jobs.put(manager_job())
    try:
        d = rt.reconcile("ns", "k", [])
        assert d is not None and d.workload is not None and writes == [d]
        assert [e["reason"] for e in events] == ["ManagedElsewhere"]
        assert "only, in a LocalQueue, the Kueue Workload MultiKueue dispatches" in events[0]["message"]
    finally:
        for pool in rt.workers.values():
            pool.shutdown(wait=False)


# ---- the worker ----------------------------------------------------------------------------------


def worker_job() -> dict:
    """MultiKueue's copy: managedBy removed, the prebuilt Workload's name and its origin labelled."""
    m = manifest("k", count=2, gpus=2)
    m["metadata"]["uid"] = "worker-uid"
    m["metadata"]["labels"] = {
        LABEL_KUEUE_QUEUE: "team-a",
        LABEL_KUEUE_PREBUILT_WORKLOAD: "holmesjob-k",
        "kueue.x-k8s.io/multikueue-origin": "manager",
    }
    return m


def remote_workload() -> dict:
    """The manager's Workload as MultiKueue copies it: name, labels, annotations, spec; no owner."""
    wl = dispatch(observe(manager_job(count=2, gpus=2))).workload
    return {
        "apiVersion": wl["apiVersion"],
        "kind": "Workload",
        "metadata": dict(wl["metadata"]),
        "spec": wl["spec"],
    }


def worker() -> FakeWorld:
    w = FakeWorld(worker_job(), nodes=with_link_layers(default_nodes()))
    w.flavors = FLAVORS
    return w


def test_the_worker_waits_for_the_prebuilt_workload_and_creates_none():
    w = worker()
    d = w.step()
    assert d.workload is None and w.workload is None and not w.pods
    assert w.status["phase"] == "Suspended"
    msg = w.condition("Suspended")["message"]
    assert "Workload holmesjob-k (label kueue.x-k8s.io/prebuilt-workload-name" in msg
    assert "creates none" in msg


def test_the_worker_takes_the_prebuilt_workload_runs_on_its_flavor_and_finishes_it():
    w = worker()
    w.workload = remote_workload()
    spec = copy.deepcopy(w.workload["spec"])
    d = w.step()
    assert d.workload is None and d.delete_workload is None  # its PodSets are the manager's
    refs = w.workload["metadata"]["ownerReferences"]
    assert refs == [
        {
            "apiVersion": "holmes.dev/v1alpha1",
            "kind": "HolmesJob",
            "name": "k",
            "uid": "worker-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert w.workload["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == "worker-uid"
    assert w.status["phase"] == "Suspended" and not w.pods  # not admitted yet
    w.workload["status"] = kueue.reserve_quota(w.workload, "west-gpu", "t0")
    d = w.step()
    assert d.adopt_workload is None  # owned now: adopted once
    assert w.status["launched"] and len(w.pods) == 2
    for p in w.pods.values():
        assert p["spec"]["nodeSelector"]["holmes.dev/cluster"] == "west"
    w.set_phase("Succeeded")
    w.step()
    w.step()
    assert w.status["phase"] == "Succeeded"
    assert kueue.condition(w.workload, "Finished")["status"] == "True"
    assert w.workload["spec"] == spec  # never rewritten: MultiKueue would delete a drifted copy


def test_the_worker_never_rewrites_prebuilt_pod_sets_that_differ_from_its_plan():
    """Holmes re-creates its own Workload when its PodSets differ from the plan's; MultiKueue's
    copy keeps the manager's (one PodSet), whatever this cluster's islands."""
    w = worker()
    w.workload = remote_workload()
    w.workload["metadata"]["annotations"] = {kueue_pod_sets.ANN_POD_SETS: "built-elsewhere"}
    w.workload["spec"]["podSets"][0]["count"] = 2
    for _ in range(3):
        d = w.step()
        assert d.delete_workload is None and d.workload is None
    assert w.workload is not None


def test_a_prebuilt_workload_another_object_controls_is_not_taken():
    w = worker()
    w.workload = remote_workload()
    w.workload["metadata"]["ownerReferences"] = [{"uid": "someone-else", "controller": True}]
    w.workload["status"] = kueue.reserve_quota(w.workload, "west-gpu", "t0")
    d = w.step()
    assert d.adopt_workload is None and not w.pods and w.status["phase"] == "Suspended"
    assert "is controlled by another object" in w.condition("Suspended")["message"]
    assert [e.type for e in w.events if e.reason == "WaitingForAdmission"] == ["Warning"]


def test_writes_go_to_the_prebuilt_workload_by_name():
    assert prebuilt.job_workload_name(worker_job()) == "holmesjob-k"
    job = worker_job()
    job["metadata"]["labels"][LABEL_KUEUE_PREBUILT_WORKLOAD] = "job-k-3f2a1"
    assert prebuilt.job_workload_name(job) == "job-k-3f2a1"
    assert prebuilt.job_workload_name(manifest("plain")) == "holmesjob-plain"


def test_the_io_adopts_and_patches_the_prebuilt_workload_by_its_name():
    """kube.py writes the ownership patch and the status patch (Finished, PodsReady, a release)
    to the Workload the label names, not to holmesjob-<job>."""
    calls = []

    class Resp:
        def __init__(self, body: dict) -> None:
            self.data = json.dumps(body).encode()

    class Custom:
        def patch_namespaced_custom_object(self, g, v, ns, plural, name, body, **_):
            calls.append(("metadata", name, body))
            return Resp(
                {"apiVersion": f"{g}/{v}", "kind": "Workload", "metadata": {"name": name, "namespace": ns}}
            )

        def patch_namespaced_custom_object_status(self, g, v, ns, plural, name, body, **_):
            calls.append(("status", name, body))
            return Resp(
                {"apiVersion": f"{g}/{v}", "kind": "Workload", "metadata": {"name": name, "namespace": ns}}
            )

    io = kube.KubeIO(client.ApiClient())
    io.custom = Custom()
    job = worker_job()
    job["metadata"]["labels"][LABEL_KUEUE_PREBUILT_WORKLOAD] = "job-k-3f2a1"
    wl = remote_workload()
    wl["metadata"]["name"] = "job-k-3f2a1"
    d = handlers.Decision(status={})
    d.adopt_workload = prebuilt.adopt_patch(wl, job)
    d.workload_status = {"conditions": []}
    io.apply_queueing(d, job)
    assert [(c[0], c[1]) for c in calls] == [("metadata", "job-k-3f2a1"), ("status", "job-k-3f2a1")]
    assert calls[0][2]["metadata"]["ownerReferences"][0]["uid"] == "worker-uid"
    io.pool.shutdown(wait=False)
