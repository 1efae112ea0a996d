import copy
from pathlib import Path

import pytest
import yaml
from holmes_dev.jobs import holmes_job

from holmes.contract.jobspec import JobSpec, SpecError
from holmes.contract.spec_sections import AUTO, LabelSelector, SelectorRequirement
from tests.helpers.contract.spec_helpers import minimal_spec, problems_of

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "jobs" / "gpt-7b.yaml"


def manifest(spec):
    return holmes_job("j", spec)


def test_example_manifest_parses_with_every_field():
    job = JobSpec.from_manifest(yaml.safe_load(EXAMPLE.read_text()))
    assert job.model.layers == 36 and job.model.hidden_size == 4096
    assert job.model.ffn_hidden_size == 4 * 4096 and job.model.tied_embeddings is False
    assert job.training.learning_rate == pytest.approx(3e-4)
    assert job.training.data.synthetic and job.training.data.path is None
    assert job.training.checkpoint.interval_iterations == 100 and job.training.activation_recompute is True
    assert job.parallelism.pipeline == AUTO and job.parallelism.tensor == 1
    assert job.nodes.selector.matches({"pool": "llm", "x": "y"})
    assert not job.nodes.selector.matches({"pool": "web"})
    assert job.template["spec"]["containers"][0]["name"] == "trainer"
    assert job.world_size == 64


def test_documented_defaults_and_round_trip():
    job = JobSpec.from_spec(minimal_spec())
    assert (job.training.seed, job.training.weight_decay, job.training.grad_clip) == (1234, 0.01, 1.0)
    assert job.training.checkpoint is None and job.training.data.synthetic
    p = job.parallelism
    assert (p.tensor, p.pipeline, p.data, p.partition, p.nic_selection) == (
        1,
        "auto",
        "auto",
        "adaptive",
        "auto",
    )
    assert job.nodes.cluster_label == "holmes.dev/cluster" and job.nodes.selector is None
    assert job.run_policy.backoff_limit == 3 and job.run_policy.ttl_seconds_after_finished is None
    spec = job.to_spec()
    assert spec["model"]["ffnHiddenSize"] == 1024 and "runPolicy" in spec
    assert JobSpec.from_spec(spec) == job
    full = JobSpec.from_manifest(yaml.safe_load(EXAMPLE.read_text()))
    assert JobSpec.from_spec(full.to_spec()) == full


def test_round_trip_of_explicit_partition_path_data_and_expressions():
    spec = minimal_spec(
        parallelism={"pipeline": 2, "partition": [5, 3], "nicSelection": "off"},
        nodes={
            "count": 2,
            "gpusPerNode": 4,
            "selector": {
                "matchExpressions": [
                    {"key": "pool", "operator": "In", "values": ["a", "b"]},
                    {"key": "bad", "operator": "DoesNotExist"},
                ]
            },
        },
    )
    spec["training"]["data"] = {"path": "/data/tokens.bin"}
    job = JobSpec.from_spec(spec)
    assert job.parallelism.explicit_partition == (5, 3)
    assert job.training.data.path == "/data/tokens.bin" and not job.training.data.synthetic
    assert job.nodes.selector.matches({"pool": "b"}) and not job.nodes.selector.matches(
        {"pool": "b", "bad": "1"}
    )
    assert JobSpec.from_spec(job.to_spec()) == job


def test_type_errors_name_field_and_value():
    spec = minimal_spec()
    spec["training"]["microBatchSize"] = "four"
    spec["model"]["layers"] = "8"
    spec["training"]["learningRate"] = "3e-4"
    spec["runPolicy"] = {"suspend": "yes"}
    spec["parallelism"] = {"pipeline": 0, "tensor": True}
    msgs = problems_of(spec)
    text = "\n".join(msgs)
    assert "spec.training.microBatchSize: must be a positive integer, got 'four'" in text
    assert "spec.model.layers: must be an integer from 1 to 1024, got '8' (a string: remove the quotes)" in (
        text
    )
    assert "spec.training.learningRate" in text and "write 3.0e-4" in text
    assert "spec.runPolicy.suspend: must be true or false" in text
    assert "spec.parallelism.pipeline" in text and "spec.parallelism.tensor" in text
    assert len(msgs) == 6


def test_integers_beyond_int64_are_refused_by_name():
    """The API server holds an integer field as an int64 and refuses a larger one: so does the
    reader, naming the field (the field's own bound where it is tighter)."""
    spec = minimal_spec(parallelism={"pipeline": 2, "partition": [2**63, 3]})
    spec["training"].update(iterations=10**30, seed=-(2**63) - 1)
    spec["model"]["layers"] = 10**30
    assert problems_of(spec) == [
        "spec.model.layers: must be an integer from 1 to 1024, got 1000000000000000000000000000000",
        "spec.training.iterations: must be a positive integer, got 1000000000000000000000000000000 "
        "(beyond the API server's int64: at most 9223372036854775807)",
        "spec.training.seed: must be an integer >= 0, got -9223372036854775809",
        "spec.parallelism.partition[0]: must be a positive integer (layers of stage 0), "
        "got 9223372036854775808",
    ]
    spec = minimal_spec()
    spec["training"]["iterations"] = 2**63 - 1  # the largest int64 is an integer the server holds
    assert JobSpec.from_spec(spec).training.iterations == 2**63 - 1


def test_unknown_and_missing_fields_are_named():
    spec = minimal_spec()
    spec["model"]["hiden"] = 3
    spec["extra"] = 1
    del spec["training"]["iterations"]
    text = "\n".join(problems_of(spec))
    assert "spec.model: unknown field hiden" in text
    assert "spec: unknown field extra" in text
    assert "spec.training.iterations: required field is missing" in text


def test_all_problems_in_one_message():
    spec = minimal_spec()
    spec["nodes"]["count"] = -1
    spec["training"]["data"] = {"synthetic": {}, "path": "/x"}
    with pytest.raises(SpecError) as e:
        JobSpec.from_spec(spec)
    assert (
        "2 problems" in str(e.value) and "spec.nodes.count" in str(e.value) and "exactly one" in str(e.value)
    )


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            lambda s: s["model"].update(attentionHeads=7),
            "hiddenSize: 256 is not divisible by attentionHeads 7",
        ),
        (
            lambda s: s["training"].update(globalBatchSize=15),
            "globalBatchSize: 15 is not divisible by microBatchSize 2",
        ),
        (lambda s: s.update(parallelism={"tensor": 3}), "tensor: 3 must divide nodes.gpusPerNode 4"),
        (lambda s: s.update(parallelism={"pipeline": 9}), "only 8 layers"),
        (
            lambda s: s.update(parallelism={"pipeline": 2, "partition": [4, 3]}),
            "sum to 7 but model.layers is 8",
        ),
        (
            lambda s: s.update(parallelism={"pipeline": 3, "partition": [4, 4]}),
            "lists 2 stages but pipeline is 3",
        ),
        (
            lambda s: s.update(parallelism={"partition": [4, 0, 4]}),
            "partition[1]: must be a positive integer",
        ),
        (lambda s: s.update(parallelism={"partition": "even"}), "must be adaptive, uniform or a list"),
        (
            lambda s: s.update(parallelism={"tensor": 1, "pipeline": 2, "data": 2}),
            "tensor*pipeline*data = 4 but the job has",
        ),
        (lambda s: s.update(parallelism={"pipeline": 3}), "pipeline = 3 does not divide the job's 8 GPUs"),
        (
            lambda s: (
                s["training"].update(globalBatchSize=8),
                s.update(parallelism={"data": 8, "pipeline": 1}),
            ),
            "not divisible by data*microBatchSize = 8*2",
        ),
        (
            lambda s: s.update(parallelism={"nicSelection": "manual"}),
            "nicSelection: must be one of auto, off",
        ),
        (lambda s: s["training"].update(warmupIterations=11), "warmupIterations: 11 exceeds iterations 10"),
        (
            lambda s: s["model"].update(architecture="llama", kvHeads=3),
            "kvHeads: 3 must divide attentionHeads 8",
        ),
        (lambda s: s["model"].update(kvHeads=2), "architecture gpt has no grouped-query attention"),
        (lambda s: s["model"].update(ropeTheta=1.0e4), "ropeTheta: architecture gpt learns its positions"),
        (
            lambda s: s["model"].update(init={"huggingface": {"path": "/m"}}),
            "only architecture llama loads Hugging Face weights",
        ),
        (lambda s: s["model"].update(architecture="mamba"), "architecture: must be one of gpt, llama"),
        (
            lambda s: s["model"].update(architecture="llama", hiddenSize=24, attentionHeads=8),
            "head size hiddenSize/attentionHeads = 3 must be even",
        ),
        (lambda s: s["model"].update(init={"huggingface": {}}), "init.huggingface.path: required"),
        (
            lambda s: s["training"].update(minLearningRate=1.0),
            "minLearningRate: 1.0 exceeds learningRate",
        ),
        (lambda s: s["training"].update(decay="step"), "decay: must be one of cosine, linear, constant"),
        (lambda s: s["training"].update(betas=[0.9]), "betas: must be two numbers in [0, 1)"),
        (lambda s: s["training"].update(betas=[0.9, 1.0]), "betas: must be two numbers in [0, 1)"),
        (
            lambda s: s["training"].update(data={"blend": [{"path": "/a", "weight": 0}]}),
            "blend[0].weight: must be a positive number",
        ),
        (lambda s: s["training"].update(data={"blend": []}), "blend: must be a non-empty list"),
        (
            lambda s: s["training"].update(data={"path": "/a", "blend": [{"path": "/b", "weight": 1}]}),
            "set exactly one of synthetic",
        ),
        (
            lambda s: s["training"].update(eval={"data": {"synthetic": {}}, "intervalIterations": 2}),
            "eval.data: unknown field synthetic",
        ),
        (lambda s: s["training"].update(eval={"data": {"path": "/v"}}), "eval.intervalIterations: required"),
        (
            lambda s: (
                s.update(parallelism={"tensor": 4}) or s["model"].update(architecture="llama", kvHeads=2)
            ),
            "tensor: 4 must divide model.kvHeads 2",
        ),
        (
            lambda s: s.update(parallelism={"tensor": 4}) or s["model"].update(vocabSize=50257),
            "tensor: 4 must divide model.vocabSize 50257; pad the vocabulary to a multiple of 4 (e.g. 50304)",
        ),
        (
            lambda s: (
                s.update(parallelism={"tensor": 2, "sequenceParallel": True})
                or s["model"].update(seqLength=127)
            ),
            "tensor: 2 must divide model.seqLength (sequenceParallel) 127",
        ),
        (
            lambda s: s.update(parallelism={"sequenceParallel": "yes"}),
            "spec.parallelism.sequenceParallel",
        ),
        (
            lambda s: s["nodes"].update(selector={"matchExpressions": [{"key": "a", "operator": "In"}]}),
            "needs at least one value",
        ),
        (
            lambda s: s["nodes"].update(selector={"matchLabels": {"gpu": True}}),
            "label values must be strings",
        ),
        (
            lambda s: s["training"].update(checkpoint={"path": "/c"}),
            "checkpoint.intervalIterations: required",
        ),
    ],
)
def test_cross_field_and_value_checks(change, expected):
    spec = copy.deepcopy(minimal_spec())
    change(spec)
    assert any(expected in p for p in problems_of(spec)), problems_of(spec)


def test_manifest_header_is_checked():
    m = manifest(minimal_spec())
    m["kind"] = "Job"
    with pytest.raises(SpecError, match="kind: must be HolmesJob"):
        JobSpec.from_manifest(m)
    with pytest.raises(SpecError, match="spec: missing"):
        JobSpec.from_manifest({"apiVersion": "holmes.dev/v1alpha1", "kind": "HolmesJob"})
    with pytest.raises(SpecError, match="must be a mapping"):
        JobSpec.from_manifest(["not", "a", "job"])


def test_selector_semantics():
    sel = LabelSelector(
        match_labels=(("a", "1"),),
        match_expressions=(SelectorRequirement("b", "NotIn", ("x",)), SelectorRequirement("c", "Exists")),
    )
    assert sel.matches({"a": "1", "c": ""})
    assert sel.matches({"a": "1", "b": "y", "c": "z"})
    assert not sel.matches({"a": "1", "b": "x", "c": "z"})
    assert not sel.matches({"a": "1"})
    assert LabelSelector().matches(None)
    assert sel.describe() == "a=1,b notin (x),c"


def test_specs_are_frozen():
    job = JobSpec.from_spec(minimal_spec())
    with pytest.raises(AttributeError):
        job.model.layers = 3


def test_activation_recompute_defaults_on_round_trips_and_is_strict():
    job = JobSpec.from_spec(minimal_spec())
    assert job.training.activation_recompute is True  # the paper's / Megatron-at-scale setting
    assert job.to_spec()["training"]["activationRecompute"] is True
    spec = minimal_spec()
    spec["training"]["activationRecompute"] = False
    off = JobSpec.from_spec(spec)
    assert off.training.activation_recompute is False and off != job
    assert off.to_spec()["training"]["activationRecompute"] is False
    assert JobSpec.from_spec(off.to_spec()) == off
    for bad in ("false", 0, 1, "yes"):  # booleans only, like the API server's schema
        spec["training"]["activationRecompute"] = bad
        assert any(
            p.startswith("spec.training.activationRecompute: must be true or false")
            for p in problems_of(spec)
        )


def test_islands_round_trip_and_their_problems_name_the_field_and_the_fix():
    islands = [
        {"cluster": "east", "nic": "infiniband", "rdmaDevices": "perRail"},
        {
            "cluster": "west",
            "sriov": {"networks": ["llm/rail-0", "rail-1"]},
            "trafficClass": 106,
            "serviceLevel": 3,
        },
        {"nic": "ethernet", "netPlugin": "AWS Libfabric"},
    ]
    job = JobSpec.from_spec(minimal_spec(islands=islands))
    assert [(i.cluster, i.nic) for i in job.islands] == [
        ("east", "infiniband"),
        ("west", None),
        (None, "ethernet"),
    ]
    assert job.islands[1].sriov.networks == ("llm/rail-0", "rail-1") and job.islands[1].traffic_class == 106
    assert JobSpec.from_spec(job.to_spec()) == job
    assert "islands" not in JobSpec.from_spec(minimal_spec()).to_spec()
    bad = [
        {"nic": "ethernet", "trafficClass": 300},
        {"rdmaDevices": "perRail", "sriov": {"networks": ["Bad_Name"]}},
        {"cluster": "east", "nic": "ethernet"},
        {"nic": "roce", "netPlugin": "x", "serviceLevel": 3, "color": "red"},
        {"sriov": {"networks": []}},
    ]
    found = "\n".join(problems_of(minimal_spec(islands=bad)))
    for expected in (
        "spec.islands[0].trafficClass: must be an integer from 0 to 255, got 300",
        "spec.islands[0].trafficClass: applies to NCCL's IB transport (infiniband, roce), not nic ethernet",
        "spec.islands[1].sriov.networks: 'Bad_Name' is not a NetworkAttachmentDefinition name",
        "spec.islands[3]: unknown field color",
        "spec.islands[3].netPlugin: the island's traffic runs on the plugin",
        "spec.islands[4].sriov.networks: must be a non-empty list",
    ):
        assert expected in found, expected
    twice = problems_of(minimal_spec(islands=[{"cluster": "a"}, {"cluster": "a", "trafficClass": 1}]))
    assert any("spec.islands[1]: names the same island as spec.islands[0]" in p for p in twice)
    host = problems_of(minimal_spec(network="hostNetwork", islands=[{"sriov": {"networks": ["a"]}}]))
    assert any("spec.islands[0].sriov: Multus attaches no networks to hostNetwork pods" in p for p in host)
    per_rail_sriov = problems_of(
        minimal_spec(islands=[{"rdmaDevices": "perRail", "sriov": {"networks": ["a"]}}])
    )
    assert any(
        "spec.islands[0].rdmaDevices: applies to the shared RDMA device plugin" in p for p in per_rail_sriov
    )


def test_tensor_may_be_a_multiple_of_gpus_per_node_for_an_nvlink_domain():
    """A tensor group over two 4-GPU nodes (GB200 NVL72) is a spec the reader takes (the planner
    checks the NVLink domain); a degree neither dividing nor a multiple of the node says the fix."""
    assert JobSpec.from_spec(minimal_spec(parallelism={"tensor": 8})).parallelism.tensor == 8
    with pytest.raises(SpecError, match=r"tensor: 3 must divide nodes.gpusPerNode 4 .* multiple such as 8"):
        JobSpec.from_spec(minimal_spec(parallelism={"tensor": 3}))
