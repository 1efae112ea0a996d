"""The chart's ClusterTrainingRuntime holmes-torchrun (trainjob.runtime.*, docs/trainjob.md):
rendered only when enabled, carrying what a TrainJob's JobSet and pods need for Holmes' plan.
(On the real Kubeflow Trainer: tests/e2e/operator/test_trainjob_cluster.py.)"""

from __future__ import annotations

from tests.helpers.packaging.packaging_helpers import by_kind, render

ON = {"trainjob.runtime.enabled": "true"}


def runtime(values: dict[str, str]) -> dict:
    (rt,) = by_kind(render(values), "ClusterTrainingRuntime")
    return rt


def test_off_by_default():
    assert by_kind(render(), "ClusterTrainingRuntime") == []


def test_the_runtime_carries_the_label_the_gate_and_the_launcher():
    rt = runtime(
        {**ON, "trainer.image.repository": "reg.example.com/holmes-trainer", "trainer.image.tag": "v9"}
    )
    assert rt["metadata"]["name"] == "holmes-torchrun"
    spec = rt["spec"]
    assert spec["mlPolicy"] == {"numNodes": 1, "torch": {}}
    assert spec["template"]["metadata"]["labels"] == {"holmes.dev/plan": "enabled"}
    (rjob,) = spec["template"]["spec"]["replicatedJobs"]
    # the replicatedJob Trainer fills from spec.trainer (numNodes, image, args, PET_* env)
    assert rjob["name"] == "node"
    assert rjob["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"
    }
    pod = rjob["template"]["spec"]["template"]
    assert pod["metadata"]["annotations"]["holmes.dev/gated-by"].startswith("Holmes operator")
    ps = pod["spec"]
    assert ps["schedulingGates"] == [{"name": "holmes.dev/placement"}]
    (init,) = ps["initContainers"]
    assert init["name"] == "holmes-launch" and init["image"] == "reg.example.com/holmes-trainer:v9"
    assert init["command"] == ["python", "-m", "holmes.launch.install", "/holmes-launch"]
    (node,) = ps["containers"]
    assert node["name"] == "node" and node["image"] == "reg.example.com/holmes-trainer:v9"
    assert node["command"] == ["python", "/holmes-launch/launch.py", "--"] and "args" not in node
    assert {"name": "HOLMES_PLAN", "value": "/etc/holmes/plan.json"} in node["env"]
    assert ps["volumes"][0] == {"name": "holmes-launch", "emptyDir": {}}
    # the plan: the pod's own annotations the operator writes as it ungates it (a runtime
    # cannot name each JobSet's ConfigMap)
    assert {"name": "holmes-plan", "mountPath": "/etc/holmes", "readOnly": True} in node["volumeMounts"]
    items = ps["volumes"][1]["downwardAPI"]["items"]
    assert {i["path"]: i["fieldRef"]["fieldPath"] for i in items} == {
        "plan.json": "metadata.annotations['holmes.dev/plan']",
        "layout.json": "metadata.annotations['holmes.dev/layout']",
    }


def test_the_name_is_a_value():
    assert runtime({**ON, "trainjob.runtime.name": "holmes-gpt"})["metadata"]["name"] == "holmes-gpt"
