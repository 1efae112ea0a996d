"""What Megatron-LM itself checks of the command and environment Holmes gives it: megatron-core's
TransformerConfig (the real package) built from the example's pods, CUDA_DEVICE_MAX_CONNECTIONS
for tensor parallelism (Megatron-LM's validate_args), recomputation from the plan."""

import json

import pytest

from holmes.contract import JobSpec, Layout
from holmes.contract.frameworks import engine_env, recompute_conflicts
from tests.helpers.frameworks.framework_helpers import (
    MEGATRON,
    REPO,
    job,
    launched,
    plan_pods,
    pod_argv,
    pod_env,
    small_config,
)
from tests.helpers.frameworks.megatron_config import transformer_config


def test_the_megatron_example_builds_megatron_cores_transformer_config_as_written(capsys):
    code, out = plan_pods(capsys, REPO / "examples/jobs/megatron-gpt-7b.yaml")
    assert code == 0, out.err
    items = json.loads(out.out)["items"]
    layout = Layout.from_json(items[0]["data"]["layout.json"])
    for pod in items[2:]:
        cfg = transformer_config(pod_argv(pod))
        recompute = (cfg.recompute_granularity, cfg.recompute_method, cfg.recompute_num_layers)
        assert recompute == ("full", "uniform", 1)
        assert cfg.num_layers == layout.num_layers and cfg.pipeline_model_parallel_size == layout.pipeline
        # Megatron-LM's validate_args: tensor 1 here, so no CUDA_DEVICE_MAX_CONNECTIONS needed
        assert layout.tensor == 1 and "CUDA_DEVICE_MAX_CONNECTIONS" not in pod_env(pod)


def test_megatron_with_tensor_parallelism_gets_one_device_connection():
    _, d = launched(job())  # tensor 2
    assert d.create_pods
    for pod in d.create_pods:
        assert pod_env(pod)["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
        small_config(pod)
    one = job()
    one["spec"]["parallelism"]["tensor"] = 1
    _, d = launched(one)
    assert d.create_pods and all("CUDA_DEVICE_MAX_CONNECTIONS" not in pod_env(p) for p in d.create_pods)


def test_max_connections_rule():
    assert engine_env("megatron", [], tensor=2) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert engine_env("megatron", [], tensor=1, context=2) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert engine_env("megatron", [], tensor=1) == {}
    assert engine_env("torchtitan", [], tensor=2) == {}
    # Megatron-LM asserts the opposite under FSDP, and only warns with the MoE all-to-all overlap
    for flag in ("--use-torch-fsdp2", "--use-megatron-fsdp", "--overlap-moe-expert-parallel-comm"):
        assert engine_env("megatron", ["python", "x.py", flag], tensor=2) == {}


def test_a_template_env_contradicting_megatrons_assertion_stalls_the_job():
    w, d = launched(job(env=[{"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "8"}]))
    assert not d.create_pods
    stalled = w.condition("Stalled")
    msg = stalled["message"]
    assert stalled["reason"] == "InvalidSpec" and "CUDA_DEVICE_MAX_CONNECTIONS=8" in msg
    assert "tensor parallelism 2" in msg


def spec_problems(args, recompute=True):
    m = job(command=[*MEGATRON, *args])
    m["spec"]["training"]["activationRecompute"] = recompute
    try:
        JobSpec.from_manifest(m)
    except ValueError as e:
        return e.problems
    return []


def test_recompute_flags_that_contradict_the_plan_are_refused():
    assert spec_problems(["--recompute-granularity=full", "--recompute-method", "uniform"]) == []
    (p,) = spec_problems(["--recompute-num-layers=2"])
    assert "--recompute-num-layers 2" in p and "activationRecompute is true" in p
    (p,) = spec_problems(["--recompute-method=block"])
    assert "--recompute-method block" in p
    (p,) = spec_problems(["--recompute-activations"])
    assert "selective" in p
    (p,) = spec_problems(["--recompute-granularity", "full"], recompute=False)
    assert "activationRecompute is false" in p
    # selective recomputation keeps less than a plan without recomputation assumed
    assert spec_problems(["--recompute-granularity=selective"], recompute=False) == []
    assert recompute_conflicts("torchtitan", ["--recompute-num-layers=2"], True) == []


def test_sequence_parallel_is_appended_from_the_spec_and_refused_against_it():
    m = job()
    m["spec"]["parallelism"]["sequenceParallel"] = True
    _, d = launched(m)
    assert d.create_pods and all("--sequence-parallel" in pod_argv(p) for p in d.create_pods)
    cfg = small_config(d.create_pods[0])
    assert cfg.sequence_parallel
    (p,) = spec_problems(["--sequence-parallel"])
    assert "sequenceParallel is" in p and "false" in p


@pytest.mark.parametrize("recompute", [True, False])
def test_appended_recompute_follows_the_spec(recompute):
    m = job()
    m["spec"]["training"]["activationRecompute"] = recompute
    _, d = launched(m)
    argv = pod_argv(d.create_pods[0])
    assert ("--recompute-num-layers" in argv) == recompute
    cfg = small_config(d.create_pods[0])
    assert cfg.recompute_granularity == ("full" if recompute else None)
