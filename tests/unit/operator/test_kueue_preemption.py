"""Preemption by Kueue as Kueue v0.19.2 does it (tests/helpers/operator/kueue_standin.py): eviction
only sets Evicted=True, the quota stays reserved until the job's integration has stopped the
job and released it. Holmes must do the integration's part, or the preempting workload never
fits and the HolmesJob stays suspended for ever."""

from __future__ import annotations

import copy

from holmes.contract.names import LABEL_KUEUE_QUEUE
from holmes.operator.core import kueue_pod_sets, queueing
from holmes.operator.core.capacity import PodShape
from tests.helpers.operator import kueue_standin as kueue
from tests.helpers.operator.opfixtures import FakeWorld, default_nodes, manifest, with_link_layers

NOMINAL_GPUS = 4  # the ClusterQueue's quota: one 2 x 2-GPU job at a time
FLAVORS = {
    "west-gpu": {"metadata": {"name": "west-gpu"}, "spec": {"nodeLabels": {"holmes.dev/cluster": "west"}}}
}


def nodes() -> list[dict]:
    return with_link_layers(default_nodes())


def kueue_job() -> dict:
    m = manifest("k", count=2, gpus=2)
    m["metadata"]["labels"] = {LABEL_KUEUE_QUEUE: "team-a"}
    return m


def urgent_workload() -> dict:
    """Another team's job (any Kueue integration) asking for the whole quota at a higher priority."""
    sets = kueue_pod_sets.one_pod_set(2, PodShape({"nvidia.com/gpu": 2.0}), None)
    wl = queueing.build_workload("urgent", "ns", "team-b", sets, 1000)
    wl["metadata"]["name"] = "urgent"
    return wl


def test_a_preempted_job_releases_its_quota_the_preemptor_runs_and_the_job_resumes():
    w = FakeWorld(kueue_job(), nodes=nodes())
    w.flavors = FLAVORS
    w.step()
    assert kueue.admit_pending([w.workload], NOMINAL_GPUS) == [w.workload["metadata"]["name"]]
    w.workload["status"] = kueue.reserve_quota(w.workload, "west-gpu", "2026-01-01T00:00:00Z")
    w.step()
    assert w.status["launched"] and len(w.pods) == 2
    attempt = w.status["attempt"]
    w.set_phase("Running")
    w.step()

    urgent = urgent_workload()
    assert kueue.admit_pending([w.workload, urgent], NOMINAL_GPUS) == []  # no room: Kueue preempts
    w.workload["status"] = kueue.evict(
        w.workload, "Preempted", "Preempted to accommodate urgent", "2026-01-01T00:01:00Z"
    )
    assert kueue.admit_pending([w.workload, urgent], NOMINAL_GPUS) == []  # evicted, but still holding quota

    w.step()  # Holmes stops the job: pods deleted, Suspended (Requeued)
    assert not w.pods and w.status["phase"] == "Suspended"
    assert w.condition("Suspended")["reason"] == "Requeued"
    assert queueing.holds_quota(w.workload)  # its pods were active when it decided: not yet
    w.step()  # no pod active any more: the integration's release, as Kueue's job framework writes it
    status = w.workload["status"]
    assert "admission" not in status
    assert kueue.condition(w.workload, "QuotaReserved")["status"] == "False"
    assert kueue.condition(w.workload, "QuotaReserved")["reason"] == "Pending"
    assert kueue.condition(w.workload, "Requeued")["status"] == "True"
    assert kueue.condition(w.workload, "Requeued")["reason"] == "Preempted"
    assert kueue.condition(w.workload, "Admitted")["reason"] == "NoReservation"
    assert kueue.condition(w.workload, "Evicted")["status"] == "True"  # Kueue resets it, not Holmes
    before = copy.deepcopy(w.workload)
    w.step()
    assert w.workload == before  # released once: no write on every reconcile

    assert kueue.admit_pending([w.workload, urgent], NOMINAL_GPUS) == ["urgent"]  # the preemptor runs
    urgent["status"] = kueue.reserve_quota(urgent, "west-gpu", "2026-01-01T00:02:00Z")
    w.step()
    assert w.condition("Suspended")["reason"] == "Requeued" and not w.pods
    assert "waiting for Kueue to admit it again" in w.condition("Suspended")["message"]

    urgent["status"]["conditions"].append({"type": "Finished", "status": "True", "reason": "Succeeded"})
    assert kueue.admit_pending([w.workload, urgent], NOMINAL_GPUS) == [w.workload["metadata"]["name"]]
    w.workload["status"] = kueue.reserve_quota(w.workload, "west-gpu", "2026-01-01T00:03:00Z")
    assert kueue.condition(w.workload, "Evicted")["status"] == "False"
    w.step()  # re-admitted: a new attempt (the trainers resume from the newest checkpoint)
    assert w.status["launched"] and w.status["attempt"] > attempt and len(w.pods) == 2
    assert w.status["restarts"] == 0  # a preemption is not a failure


def test_an_eviction_that_is_not_a_preemption_is_released_without_requeueing():
    """Kueue's job framework sets Requeued=True only after a preemption or node failures; after
    e.g. a stopped ClusterQueue the Workload waits (Requeued=False) until Kueue requeues it."""
    w = FakeWorld(kueue_job(), nodes=nodes())
    w.flavors = FLAVORS
    w.step()
    w.workload["status"] = kueue.reserve_quota(w.workload, "west-gpu", "2026-01-01T00:00:00Z")
    w.step()
    w.workload["status"] = kueue.evict(w.workload, "ClusterQueueStopped", "The ClusterQueue is stopped", "t1")
    w.step()
    w.step()
    assert kueue.condition(w.workload, "Requeued")["status"] == "False"
    assert not queueing.holds_quota(w.workload) and "admission" not in w.workload["status"]
    assert kueue.admit_pending([w.workload], NOMINAL_GPUS) == []  # not requeued: not admitted
    assert w.status["phase"] == "Suspended" and not w.pods


def test_the_release_patch_follows_kueues_condition_rules():
    wl = {"metadata": {"name": "holmesjob-k"}, "spec": {"podSets": [{"count": 2}]}}
    wl["status"] = kueue.reserve_quota(wl, "west-gpu", "t0")
    assert queueing.release_after_eviction(wl, "t1") is None  # not evicted: nothing to release
    wl["status"] = kueue.evict(wl, "Preempted", "by urgent", "t1")
    patch = queueing.release_after_eviction(wl, "t2")
    assert patch is not None and patch["admission"] is None  # a merge patch: null removes it
    by_type = {c["type"]: c for c in patch["conditions"]}
    assert by_type["Evicted"] == kueue.condition(wl, "Evicted")  # untouched
    assert by_type["QuotaReserved"]["lastTransitionTime"] == "t2"  # True -> False moves the time
    assert by_type["QuotaReserved"]["message"] == "by urgent"
    assert by_type["Requeued"] == {
        "type": "Requeued",
        "status": "True",
        "reason": "Preempted",
        "message": "by urgent",
        "lastTransitionTime": "t2",
    }
    wl["status"] = {**wl["status"], "conditions": patch["conditions"]}
    wl["status"].pop("admission")
    assert queueing.release_after_eviction(wl, "t3") is None  # released: never twice


def test_pods_ready_follows_kueues_job_framework():
    """PodsReady as jobframework's generatePodsReadyCondition (v0.17.1) writes it for Kueue's
    waitForPodsReady: WaitForStart until every pod is ready, Started, then WaitForRecovery when
    one is lost and Recovered once all are ready again; no write when it already says so."""
    wl = {"metadata": {"name": "holmesjob-k"}, "spec": {"podSets": [{"count": 2}]}}
    wl["status"] = kueue.reserve_quota(wl, "west-gpu", "t0")
    steps = [(False, "False", "WaitForStart"), (True, "True", "Started"), (False, "False", "WaitForRecovery")]
    steps.append((True, "True", "Recovered"))
    for ready, status, reason in steps:
        patch = queueing.pods_ready_patch(wl, ready, "t1")
        wl["status"]["conditions"] = patch["conditions"]
        c = kueue.condition(wl, "PodsReady")
        assert (c["status"], c["reason"]) == (status, reason)
        assert queueing.pods_ready_patch(wl, ready, "t2") is None
    # an eviction's release says the pods are to start again, as Kueue does for a Workload not admitted
    wl["status"] = kueue.evict(wl, "Preempted", "preempted", "t3")
    released = queueing.release_after_eviction(wl, "t4")
    ready = next(c for c in released["conditions"] if c["type"] == "PodsReady")
    assert (ready["status"], ready["reason"]) == ("False", "WaitForStart")


def test_pods_kueues_pod_integration_took_are_named_with_the_fix():
    pods = [
        {"metadata": {"name": "k-1-1", "labels": {"kueue.x-k8s.io/managed": "true"}}},
        {"metadata": {"name": "k-1-0", "labels": {"kueue.x-k8s.io/managed": "true"}}},
        {"metadata": {"name": "other", "labels": {}}},
    ]
    assert queueing.taken_by_kueue(pods) == ["k-1-0", "k-1-1"]
    msg = queueing.taken_message(["k-1-0", "k-1-1"])
    assert "integrations.externalFrameworks" in msg and "HolmesJob.v1alpha1.holmes.dev" in msg
