"""spec.model.moe and spec.parallelism.expert: declared once, read with defaults, checked against
the degrees and the engine."""

import pytest

from holmes.contract.jobspec import JobSpec, SpecError
from tests.helpers.plan.plan_helpers import job_spec

TRAINER = {"name": "trainer", "image": "i", "command": ["python", "pretrain_gpt.py"]}
TEMPLATE = {"spec": {"containers": [TRAINER]}}


def moe_spec(moe=None, framework="megatron", **parallelism):
    spec = {**minimal_spec(), "framework": framework, "template": TEMPLATE, "parallelism": parallelism}
    spec["model"]["moe"] = {"experts": 8, **(moe or {})}
    return spec


def minimal_spec(**sections):
    spec = job_spec(layers=8, hidden=256, heads=8, seq=128, vocab=1000, B=16, mb=2, count=2, gpus=4)
    return {**spec, **sections}


def problems(spec):
    with pytest.raises(SpecError) as e:
        JobSpec.from_spec(spec)
    return e.value.problems


def test_moe_defaults_and_round_trip():
    job = JobSpec.from_spec(moe_spec())
    moe = job.model.moe
    assert (moe.experts, moe.experts_per_token, moe.shared_experts) == (8, 2, 0)
    assert moe.expert_hidden_size == job.model.ffn_hidden_size == 4 * 256
    assert job.parallelism.expert == "auto"
    assert JobSpec.from_spec(job.to_spec()) == job
    assert job.to_spec()["model"]["moe"]["expertHiddenSize"] == 1024
    dense = JobSpec.from_spec(minimal_spec())
    assert dense.model.moe is None and "moe" not in dense.to_spec()["model"]


def test_moe_problems_name_the_field_and_the_fix():
    (p,) = problems(moe_spec({"expertsPerToken": 9}))
    assert p.startswith("spec.model.moe.expertsPerToken: 9 exceeds experts 8")
    (p,) = problems(moe_spec(expert=3))
    assert p.startswith("spec.parallelism.expert: 3 must divide model.moe.experts 8")
    (p,) = problems(moe_spec(expert=4, data=2, pipeline=4))
    assert "must divide parallelism.data 2" in p
    (p,) = problems(moe_spec(tensor=2))
    assert p.startswith("spec.parallelism.sequenceParallel") and "tensor: 1" in p
    JobSpec.from_spec(moe_spec(tensor=2, sequenceParallel=True))
    (p,) = problems(moe_spec({"experts": 1}))
    assert p.startswith("spec.model.moe.experts")


def test_holmes_engine_refuses_a_mixture_of_experts():
    spec = moe_spec(framework="holmes")
    del spec["template"]
    (p,) = problems(spec)
    assert p.startswith("spec.model.moe:") and "dense models only" in p and "megatron" in p


def test_an_expert_degree_needs_experts():
    (p,) = problems(minimal_spec(parallelism={"expert": 2}))
    assert p.startswith("spec.parallelism.expert: 2") and "model.moe" in p
    assert JobSpec.from_spec(minimal_spec(parallelism={"expert": 1})).parallelism.expert == 1
