"""spec.framework: parsing, the own-image/own-command rule and the arguments that contradict the spec."""

from holmes.contract.frameworks import FRAMEWORKS, conflicts, flag_values
from holmes.contract.jobspec import JobSpec
from tests.helpers.contract.spec_helpers import minimal_spec, problems_of


def template(command, image="registry.example/megatron:24.09", args=None):
    c = {"name": "trainer", "image": image, "command": command}
    if args is not None:
        c["args"] = args
    return {"spec": {"containers": [{"name": "sidecar", "image": "s", "command": ["s"]}, c]}}


def test_default_is_holmes_and_round_trips():
    job = JobSpec.from_spec(minimal_spec())
    assert job.framework == "holmes"
    assert JobSpec.from_spec(job.to_spec()) == job
    for fw in FRAMEWORKS[1:]:
        job = JobSpec.from_spec(minimal_spec(framework=fw, template=template(["python", "train.py"])))
        assert job.framework == fw and JobSpec.from_spec(job.to_spec()) == job


def test_unknown_framework_names_the_choices():
    (p,) = problems_of(minimal_spec(framework="nemo"))
    assert p.startswith("spec.framework") and "megatron" in p and "torchrun" in p


def test_external_framework_needs_the_users_image_and_command():
    (p,) = problems_of(minimal_spec(framework="megatron"))
    assert "containers" in p and "'trainer'" in p
    ps = problems_of(minimal_spec(framework="torchtitan", template=template([], image="")))
    assert any(".image:" in p for p in ps) and any(".command:" in p for p in ps)
    (p,) = problems_of(
        minimal_spec(framework="megatron", template=template(["torchrun", "--nnodes=2", "x.py"]))
    )
    assert "starts a launcher of its own" in p and "torchrun" in p
    (p,) = problems_of(
        minimal_spec(framework="deepspeed", template=template(["/usr/bin/deepspeed", "train.py"]))
    )
    assert "launcher" in p


def test_arguments_contradicting_the_spec_name_both_values():
    cmd = ["python", "pretrain_gpt.py"]
    args = ["--num-layers", "24", "--micro-batch-size=2", "--global-batch-size", "64", "--hidden-size=256"]
    ps = problems_of(minimal_spec(framework="megatron", template=template(cmd, args=args)))
    assert len(ps) == 2, ps  # micro batch and hidden size agree with the spec
    assert any("--num-layers 24" in p and "spec.model.layers is 8" in p for p in ps)
    assert any("--global-batch-size 64" in p and "spec.training.globalBatchSize is 16" in p for p in ps)
    fixed = minimal_spec(
        framework="megatron", template=template(cmd, args=["--tensor-model-parallel-size", "2"])
    )
    fixed["parallelism"] = {"tensor": 4}
    (p,) = problems_of(fixed)
    assert "--tensor-model-parallel-size 2" in p and "is 4" in p


def test_flags_holmes_writes_are_refused():
    cmd = ["python", "pretrain_gpt.py", "--pipeline-model-parallel-layout", "Et|tL", "--use-tp-pp-dp-mapping"]
    ps = problems_of(minimal_spec(framework="megatron", template=template(cmd)))
    assert len(ps) == 2 and all("Holmes controls" in p for p in ps)
    tt = ["python", "-m", "torchtitan.train", "--parallelism.data_parallel_shard_degree", "4"]
    (p,) = problems_of(minimal_spec(framework="torchtitan", template=template(tt)))
    assert "--parallelism.data_parallel_shard_degree" in p


def test_holmes_framework_ignores_megatron_looking_args():
    spec = minimal_spec(template=template(["python", "x.py", "--num-layers", "99"]))
    assert JobSpec.from_spec(spec).framework == "holmes"


def test_flag_values_forms():
    argv = ["--a", "1", "--b=2", "--c", "--a=3"]
    assert flag_values(argv, "--a") == ["1", "3"]
    assert flag_values(argv, "--b") == ["2"] and flag_values(argv, "--c") == [""]
    assert conflicts("megatron", ["--tensor-model-parallel-size", "2"], {"tensor": 2}) == []
    assert conflicts("torchrun", ["--num-layers", "5"], {"layers": 8}) == []
