"""The I/O around a labelled JobSet's plan (jobset_watch.py) against a recording API: the ConfigMap
written before any pod is ungated, a second pass (a restarted operator) keeping the plan and
patching nothing twice, a refusal posted once as an Event."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kubernetes.client.rest import ApiException

from holmes.operator import jobset_watch
from holmes.operator.core import jobset_plan as jp
from holmes.operator.core import jobset_status
from holmes.operator.kube import Caches
from holmes.operator.placement_facts import builtin_cost_model
from tests.helpers.operator.jobset_plans import NODES, jobset, pods


class FakeCore:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.configmaps: dict[str, dict] = {}
        self.api_client = SimpleNamespace(sanitize_for_serialization=lambda o: o)
        self.workloads: list[dict] | None = None

    def read_namespaced_config_map(self, name, ns, _preload_content=True):
        if name not in self.configmaps:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps(self.configmaps[name]))

    def create_namespaced_config_map(self, ns, body):
        self.calls.append(("create-cm", body["metadata"]["name"]))
        self.configmaps[body["metadata"]["name"]] = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": "1"},
        }

    def replace_namespaced_config_map(self, name, ns, body):
        self.calls.append(("replace-cm", name))
        self.configmaps[name] = body

    def patch_namespaced_pod(self, name, ns, patch):
        self.calls.append(("patch", name))
        return {"metadata": {"name": name, "namespace": ns}}

    def create_namespaced_event(self, ns, event):
        self.calls.append(("event", event["reason"]))

    # CustomObjectsApi: the JobSet's plan status, Kueue's Workloads
    def patch_namespaced_custom_object(self, group, version, ns, plural, name, patch):
        value = json.loads(patch["metadata"]["annotations"][jobset_status.ANN_STATUS])
        self.calls.append(("annotate", value["reason"]))
        return None

    def list_namespaced_custom_object(self, group, version, ns, plural, label_selector=""):
        if self.workloads is None:
            raise ApiException(status=404, reason="Not Found")
        return {"items": self.workloads}


@pytest.fixture
def core(monkeypatch):
    fake = FakeCore()
    monkeypatch.setattr(jobset_watch.client, "CoreV1Api", lambda *a: fake)
    monkeypatch.setattr(jobset_watch.client, "CustomObjectsApi", lambda *a: fake)
    return fake


def planner() -> jobset_watch.JobSetPlans:
    return jobset_watch.JobSetPlans(object(), Caches(), SimpleNamespace(), builtin_cost_model())  # type: ignore[arg-type]


def test_the_configmap_is_written_before_the_pods_are_ungated(core):
    js = jobset(**{jp.ANN_DATA: "2"})
    planner().plan_one(js, pods(), NODES)
    kinds = [k for k, _ in core.calls]
    assert kinds == ["create-cm", "annotate", "event", "patch", "patch", "patch", "patch"], kinds
    assert core.calls[1:3] == [("annotate", jp.PLANNED), ("event", jp.PLANNED)]


def test_a_restarted_operator_keeps_the_plan_and_ungates_only_the_gated_pods(core):
    js = jobset(**{jp.ANN_DATA: "2"})
    planner().plan_one(js, pods(), NODES)
    core.calls.clear()
    ps = pods()
    for p in ps[:3]:
        p["spec"]["schedulingGates"] = []
    planner().plan_one(js, ps, NODES)  # a new operator: nothing remembered but the ConfigMap
    assert core.calls == [("patch", ps[3]["metadata"]["name"])]


def test_a_refusal_is_posted_once(core):
    js = jobset(**{jp.ANN_PIPELINE: "3", jp.ANN_DATA: "2"})
    p = planner()
    p.plan_one(js, pods(), NODES)
    p.plan_one(js, pods(), NODES)
    assert [c for c in core.calls if c[0] == "event"] == [("event", jp.INVALID)]
    assert ("annotate", jp.INVALID) in core.calls


def test_a_plan_whose_node_went_away_is_not_remade_under_running_pods(core):
    js = jobset(**{jp.ANN_DATA: "2"})
    planner().plan_one(js, pods(), NODES)
    core.calls.clear()
    ps = pods()
    ps[0]["spec"]["schedulingGates"] = []
    gone = jp.read_plan(core.configmaps["js-holmes-plan"])["pods"]["js-w-1-1"]["node"]
    planner().plan_one(js, ps, [n for n in NODES if n["metadata"]["name"] != gone])
    assert core.calls == []


def test_discovery_refused_counts_as_not_served_yet(monkeypatch):
    def forbidden(api):
        raise ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(jobset_watch, "serves_jobsets", forbidden)
    assert planner().served() is False
    monkeypatch.setattr(jobset_watch, "serves_jobsets", lambda api: True)
    assert planner().served() is True


def test_a_suspended_queued_jobset_waits_for_kueue_and_says_so(core):
    js = jobset(**{jp.ANN_DATA: "2"})
    js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "user-queue"
    js["spec"]["suspend"] = True
    p = planner()
    p.jobsets.put(js)
    core.workloads = []
    p.pass_once()
    assert core.calls == [("annotate", "WaitingForAdmission"), ("event", "WaitingForAdmission")]


def test_gated_pods_of_a_queued_jobset_are_not_ungated_before_its_admission(core):
    js = jobset(**{jp.ANN_DATA: "2"})
    js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "user-queue"
    core.workloads = [
        {"metadata": {"name": "jobset-js", "labels": {"kueue.x-k8s.io/job-uid": "u-1"}}, "status": {}}
    ]
    planner().plan_one(js, pods(), NODES)
    assert [k for k, _ in core.calls] == ["annotate", "event"] and "configmap" not in str(core.calls)


def test_an_admitted_queued_jobset_is_planned_on_its_flavors_nodes(core):
    js = jobset(replicas=1)
    js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "user-queue"
    psa = {"name": "w", "count": 2, "flavors": {"cpu": "west"}}
    core.workloads = [
        {
            "metadata": {"name": "jobset-js", "labels": {"kueue.x-k8s.io/job-uid": "u-1"}},
            "spec": {"podSets": [{"name": "w", "count": 2, "template": {"spec": {}}}]},
            "status": {
                "conditions": [
                    {"type": "QuotaReserved", "status": "True"},
                    {"type": "Admitted", "status": "True"},
                ],
                "admission": {"clusterQueue": "cq", "podSetAssignments": [psa]},
            },
        }
    ]
    p = planner()
    p.caches.flavors.put({"metadata": {"name": "west"}, "spec": {"nodeLabels": {"holmes.dev/cluster": "b"}}})
    ps = pods(1, 2)
    for x in ps:
        x["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] = "w"
    p.plan_one(js, ps, NODES)
    doc = jp.read_plan(core.configmaps["js-holmes-plan"])
    assert {e["node"] for e in doc["pods"].values()} == {"b-0", "b-1"}  # not east's IB island
