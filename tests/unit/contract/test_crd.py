"""The CRD file itself: generated from the declarations, structural, documented, with the printer
columns users see."""

from __future__ import annotations

from pathlib import Path

import yaml

CRD = Path(__file__).resolve().parents[3] / "crds" / "holmesjob.yaml"


def schema():
    doc = yaml.safe_load(CRD.read_text())
    assert doc["apiVersion"] == "apiextensions.k8s.io/v1"
    v = next(v for v in doc["spec"]["versions"] if v["storage"])
    return doc, v


def walk(node, path):
    yield path, node
    for k, sub in (node.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{k}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")


def test_names_scope_and_subresources():
    doc, v = schema()
    assert doc["spec"]["names"]["shortNames"] == ["hj"] and doc["spec"]["scope"] == "Namespaced"
    assert v["name"] == "v1alpha1" and v["subresources"] == {"status": {}}
    cols = {c["name"]: c["jsonPath"] for c in v["additionalPrinterColumns"]}
    assert cols["Phase"] == ".status.phase" and cols["Nodes"] == ".spec.nodes.count"
    assert cols["PxDxT"] == ".status.layout.shape" and cols["TFLOPS/GPU"] == ".status.progress.tflopsPerGpu"
    assert "Age" in cols


def test_not_in_the_all_category():
    """`kubectl delete all --all` deletes every resource in the category "all": a namespace's
    workloads, which a training job and its checkpoints are not to be swept away with."""
    doc, _ = schema()
    assert doc["spec"]["names"]["categories"] == ["holmes"]  # `kubectl get holmes` lists them


def test_every_spec_and_status_field_has_a_description():
    _, v = schema()
    root = v["schema"]["openAPIV3Schema"]
    missing = [
        p
        for p, node in walk(root, "")
        if p.startswith((".spec", ".status")) and not p.endswith("[]") and not node.get("description")
    ]
    assert not missing, f"fields without a description: {missing}"


def test_structural_every_field_has_a_type_or_an_escape():
    _, v = schema()
    for p, node in walk(v["schema"]["openAPIV3Schema"], ""):
        assert (
            node.get("type")
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ), p


def test_spec_fields_match_what_the_operator_parses():
    """Every field the schema offers is one JobSpec accepts (it rejects unknown fields)."""
    from holmes.contract.jobspec import JobSpec

    _, v = schema()
    spec = v["schema"]["openAPIV3Schema"]["properties"]["spec"]
    full = {
        "model": {
            "layers": 2,
            "hiddenSize": 8,
            "attentionHeads": 2,
            "seqLength": 4,
            "vocabSize": 16,
            "ffnHiddenSize": 32,
            "tiedEmbeddings": True,
            "architecture": "llama",
            "kvHeads": 1,
            "ropeTheta": 500000.0,
            "normEps": 1.0e-6,
            "init": {"huggingface": {"path": "/models/llama"}},
            "moe": {"experts": 4, "expertsPerToken": 2, "expertHiddenSize": 16, "sharedExperts": 1},
        },
        "training": {
            "globalBatchSize": 4,
            "microBatchSize": 1,
            "iterations": 1,
            "learningRate": 0.1,
            "seed": 1,
            "weightDecay": 0.0,
            "gradClip": 1.0,
            "warmupIterations": 0,
            "decay": "linear",
            "minLearningRate": 0.01,
            "betas": [0.9, 0.99],
            "eval": {"data": {"path": "/v.bin"}, "intervalIterations": 1, "windows": 8},
            "activationRecompute": False,
            "gradReduceDtype": "bfloat16",
            "fabricCheck": "fail",
            "pipelineSchedule": "1F1B",
            "virtualStages": 1,
            "data": {"synthetic": {}},
            "checkpoint": {"path": "/c", "intervalIterations": 1, "onPreemption": False},
            "acrossIslands": {
                "mode": "replicas",
                "innerSteps": 20,
                "outerLearningRate": 0.7,
                "outerMomentum": 0.9,
                "fragments": 2,
                "exchangeDtype": "bfloat16",
            },
        },
        "parallelism": {
            "tensor": 1,
            "pipeline": "auto",
            "data": "auto",
            "expert": "auto",
            "partition": "adaptive",
            "nicSelection": "auto",
            "sequenceParallel": False,
            "replan": {"enabled": True, "threshold": 0.2, "maxReplans": 1},
        },
        "nodes": {
            "count": 1,
            "gpusPerNode": 4,
            "selector": {"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "k", "operator": "Exists"}]},
            "clusterLabel": "c",
            "minCount": 1,
            "scaleUp": "never",
        },
        "template": {"spec": {"containers": [{"name": "trainer", "image": "i", "command": ["python", "x"]}]}},
        "runPolicy": {
            "backoffLimit": 1,
            "suspend": False,
            "ttlSecondsAfterFinished": 5,
            "activeDeadlineSeconds": 9,
            "waitForNodesSeconds": 0,
            "schedulingTimeoutSeconds": 30,
            "disruptionLimit": 2,
            "priority": 10,
            "priorityClassName": "high",
            "failurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": "t", "operator": "In", "values": [3]},
                    }
                ]
            },
        },
        "network": "podNetwork",
        "islands": [
            {
                "cluster": "east",
                "nic": "roce",
                "rdmaDevices": "perRail",
                "trafficClass": 106,
                "serviceLevel": 3,
                "ipcLock": True,
            },
            {
                "cluster": "west",
                "sriov": {"networks": ["gpu/rail-0", "rail-1"], "resource": "nvidia.com/rail"},
            },
            {"nic": "ethernet", "netPlugin": "AWS Libfabric"},
        ],
        "framework": "megatron",  # a mixture of experts runs on an external engine
    }
    for section, fields in full.items():
        if isinstance(fields, dict) and section != "template":
            assert set(fields) == set(spec["properties"][section]["properties"]), section
    island = spec["properties"]["islands"]["items"]["properties"]
    assert {k for entry in full["islands"] for k in entry} == set(island)
    assert set(full["islands"][1]["sriov"]) == set(island["sriov"]["properties"])
    assert set(full) == set(spec["properties"])
    JobSpec.from_spec(full)


def test_committed_crd_is_generated_from_the_declarations():
    """crds/holmesjob.yaml is made from the contract's field declarations (hack/crdgen),
    so the API server's defaults and bounds are the parser's; a hand edit, or a field declared
    without `make crd`, makes the two differ."""
    from crdgen.render import render

    assert CRD.read_text() == render(), "crds/holmesjob.yaml is stale: run `make crd` and commit the result"


def test_v1beta1_is_served_beside_the_storage_version_with_the_same_schema():
    """No conversion webhook while the schemas are equal: strategy None rewrites apiVersion only;
    v1alpha1 stays the storage version (docs/api.md#api-versions)."""
    doc, stored = schema()
    versions = {v["name"]: v for v in doc["spec"]["versions"]}
    assert list(versions) == ["v1alpha1", "v1beta1"] and stored["name"] == "v1alpha1"
    assert all(v["served"] for v in versions.values())
    assert [v["name"] for v in versions.values() if v["storage"]] == ["v1alpha1"]
    assert doc["spec"]["conversion"] == {"strategy": "None"}
    for key in ("schema", "subresources", "additionalPrinterColumns"):
        assert versions["v1beta1"][key] == versions["v1alpha1"][key], key


def test_the_name_limit_is_a_rule_at_admission():
    """The 50 characters a pod hostname <name>-<attempt>-<rank> leaves: a CEL rule on
    metadata.name at the root (the only place a rule may read it), not a stalled job."""
    _, v = schema()
    rules = v["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    assert {r["rule"] for r in rules} == {
        "oldSelf.hasValue() || self.metadata.name.size() <= 50",
        "oldSelf.hasValue() || self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
    }
    # on create only: a root rule runs on every update (the status' too), and the name is immutable
    assert all(r["optionalOldSelf"] for r in rules)
    assert all("metadata.name" in r["message"] for r in rules)
