"""Kueue's two API versions, pure: which one is chosen, v1beta1 <-> v1beta2 of the fields Holmes
uses, and the link that re-negotiates the version while the operator runs (fed a scripted
discovery; tests/e2e/operator/test_shared_cluster.py runs it against the local API server)."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import REGISTRY

from holmes.operator import kueue_version
from holmes.operator.core import kueue_pod_sets, queueing
from holmes.operator.core.capacity import PodShape
from holmes.operator.kube import Caches

V1, V2 = "kueue.x-k8s.io/v1beta1", "kueue.x-k8s.io/v1beta2"


def built(priority_class=None):
    shape = PodShape(requests={"nvidia.com/gpu": 2.0})
    return queueing.build_workload(
        "j", "ns", "q", kueue_pod_sets.one_pod_set(2, shape, None), 100, priority_class
    )


def test_the_newest_served_version_holmes_knows_is_chosen():
    assert queueing.choose_version(["v1beta1", "v1beta2"]) == "v1beta2"  # Kueue 0.15 on
    assert queueing.choose_version(["v1beta1"]) == "v1beta1"  # Kueue before 0.15
    assert queueing.choose_version(["v1beta2"]) == "v1beta2"  # a Kueue that removed v1beta1
    assert queueing.choose_version(["v1alpha1", "v1"]) is None  # nothing Holmes speaks
    assert queueing.choose_version([]) is None


def test_holmes_builds_v1beta2_and_writes_v1beta1_with_the_priority_class_renamed():
    wl = built("high")
    assert wl["apiVersion"] == V2
    ref = {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "high"}
    assert wl["spec"]["priorityClassRef"] == ref and wl["spec"]["priority"] == 100
    old = queueing.workload_as("v1beta1", wl)
    assert old["apiVersion"] == V1 and "priorityClassRef" not in old["spec"]
    assert old["spec"]["priorityClassSource"] == "scheduling.k8s.io/priorityclass"
    assert old["spec"]["priorityClassName"] == "high" and old["spec"]["priority"] == 100
    assert old["spec"]["podSets"] == wl["spec"]["podSets"] and old["metadata"] == wl["metadata"]
    assert wl["spec"]["priorityClassRef"] == ref  # the built one is left as it was
    assert queueing.workload_as("v1beta2", wl) == wl
    for w in (wl, built()):  # read back, it is what was built
        assert queueing.workload_from(queueing.workload_as("v1beta1", w)) == w
    assert "priorityClassSource" not in queueing.workload_as("v1beta1", built())["spec"]
    with pytest.raises(ValueError, match="Kueue version 'v1': Holmes speaks v1beta2, v1beta1"):
        queueing.workload_as("v1", wl)


def test_a_v1beta1_workload_reads_as_v1beta2():
    wl = {
        "apiVersion": V1,
        "kind": "Workload",
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {
            "queueName": "q",
            "priority": 5,
            "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass",
            "priorityClassName": "batch",
            "podSets": [{"name": "workers", "count": 3, "template": {"spec": {}}}],
        },
        "status": {
            "accumulatedPastExexcutionTimeSeconds": 42,
            "requeueState": {"count": 2, "requeueAt": "2026-01-01T00:05:00Z"},
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {
                        "name": "workers",
                        "count": 3,
                        "flavors": {"nvidia.com/gpu": "west"},
                        "topologyAssignment": {
                            "levels": ["block", "rack"],
                            "domains": [
                                {"values": ["b1", "r1"], "count": 2},
                                {"values": ["b1", "r2"], "count": 1},
                            ],
                        },
                    }
                ],
            },
            "conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted", "message": "ok"}],
        },
    }
    new = queueing.workload_from(wl)
    assert new["apiVersion"] == V2
    assert new["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "batch",
    }
    assert "priorityClassSource" not in new["spec"] and "priorityClassName" not in new["spec"]
    assert new["status"]["accumulatedPastExecutionTimeSeconds"] == 42
    assert "accumulatedPastExexcutionTimeSeconds" not in new["status"]
    (psa,) = new["status"]["admission"]["podSetAssignments"]
    assert psa["flavors"] == {"nvidia.com/gpu": "west"} and psa["count"] == 3
    assert psa["topologyAssignment"] == {
        "levels": ["block", "rack"],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"individual": {"roots": ["b1", "b1"]}},
                    {"individual": {"roots": ["r1", "r2"]}},
                ],
                "podCounts": {"individual": [2, 1]},
            }
        ],
    }
    assert new["status"]["requeueState"] == wl["status"]["requeueState"]
    assert wl["apiVersion"] == V1 and "priorityClassSource" in wl["spec"]  # the input is left alone
    # what Holmes decides on reads the same from either version
    assert (
        queueing.admission(new)
        == queueing.admission(wl)
        == (queueing.ADMITTED, "admitted by ClusterQueue cq")
    )
    flavors = {"west": {"spec": {"nodeLabels": {"holmes.dev/cluster": "west"}}}}
    # admitted by topology: the domains Kueue picked, each with the flavor's labels
    assert queueing.flavor_node_labels(new, flavors) == (
        (
            {"holmes.dev/cluster": "west", "block": "b1", "rack": "r1"},
            {"holmes.dev/cluster": "west", "block": "b1", "rack": "r2"},
        ),
        [],
    )
    # "" (no source) names no class, as Kueue converts it
    wl["spec"]["priorityClassSource"] = ""
    assert "priorityClassRef" not in queueing.workload_from(wl)["spec"]
    assert queueing.workload_from(new) == new


def test_a_workload_backing_off_after_an_eviction_says_when_kueue_requeues_it():
    wl = {
        "apiVersion": V2,
        "status": {
            "requeueState": {"count": 2, "requeueAt": "2026-01-01T00:05:00Z"},
            "conditions": [
                {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "waiting"},
                {"type": "Evicted", "status": "False", "reason": "QuotaReserved", "message": "x"},
                {"type": "Requeued", "status": "False", "reason": "Backoff", "message": "backing off"},
            ],
        },
    }
    assert queueing.admission(wl) == (
        queueing.PENDING,
        "waiting (requeued at 2026-01-01T00:05:00Z, eviction 2)",
    )
    wl["status"]["conditions"][2]["status"] = "True"  # requeued: it just waits for quota
    assert queueing.admission(wl) == (queueing.PENDING, "waiting")


def test_the_discovery_interval_comes_from_the_environment_or_says_what_is_wrong():
    assert kueue_version.discovery_seconds({}) == kueue_version.DISCOVERY_SECONDS
    assert kueue_version.discovery_seconds({kueue_version.ENV_DISCOVERY: "0.5"}) == 0.5
    for bad in ("soon", "0", "-3"):
        with pytest.raises(
            ValueError, match="HOLMES_KUEUE_DISCOVERY_SECONDS=.*give a number of seconds above 0"
        ):
            kueue_version.discovery_seconds({kueue_version.ENV_DISCOVERY: bad})


class Informer:
    """What the link needs of an informer: ``synced`` and ``stop``."""

    def __init__(self, version):
        self.version, self.synced, self.stopped = version, threading.Event(), False
        self.synced.set()

    def stop(self):
        self.stopped = True


def kueue_info() -> dict[str, float]:
    """holmes_kueue_api_info's series: version label -> value."""
    return {
        s.labels["version"]: s.value
        for family in REGISTRY.collect()
        if family.name == "holmes_kueue_api_info"
        for s in family.samples
    }


def test_the_link_follows_kueue_installed_upgraded_failing_and_removed():
    script = [(), ("v1beta1",), ("v1beta1",), ("v1beta2", "v1beta1"), OSError("connection refused"), ()]
    started, chosen = [], []
    done = threading.Event()

    def discover():
        step = script.pop(0) if script else ()
        if not script:
            done.set()
        if isinstance(step, Exception):
            raise step
        return step

    def start(version):
        started.append(Informer(version))
        return [started[-1]]

    caches = Caches()
    caches.workloads.put({"metadata": {"name": "w", "namespace": "ns", "uid": "u"}})
    exported = []  # holmes_kueue_api_info when each version was taken into use

    def on_version(version):
        exported.append(kueue_info())
        chosen.append(version)

    link = kueue_version.KueueLink(discover, start, caches, on_version, interval=0.01).start()
    try:
        assert link.synced.wait(5) and done.wait(5)
        deadline = time.monotonic() + 5
        while chosen[-1:] != [None] or len(chosen) < 4:
            assert time.monotonic() < deadline, chosen
            time.sleep(0.01)
    finally:
        link.stop()
    # not served, then Kueue < 0.15 installed, then upgraded; a failed discovery changes nothing
    assert chosen == [None, "v1beta1", "v1beta2", None]
    assert [i.version for i in started] == ["v1beta1", "v1beta2"]
    assert all(i.stopped for i in started)  # the old version's informers end on each switch
    assert link.version is None and len(caches.workloads) == 0  # removed: nothing cached
    # one series at a time: the fact is its label
    assert exported == [{"none": 1.0}, {"v1beta1": 1.0}, {"v1beta2": 1.0}, {"none": 1.0}]
