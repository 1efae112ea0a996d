"""``spec.framework``: which program trains a HolmesJob's layout, and the checks of its command
that need no cluster (pure Python, standard library only).

``holmes`` (the default) runs Holmes' own engine. The others run the user's own image and
command under Holmes' launcher (``holmes.launch``), which hands the plan to the program as the
framework's own command-line arguments:

- ``megatron``: Megatron-LM (or NeMo/Megatron-DeepSpeed scripts that take its arguments);
- ``torchtitan``: torchtitan's trainer (``--module ... --config ...``);
- ``deepspeed``: a DeepSpeed pipeline program (stage sizes through the launcher's hook);
- ``torchrun``: any other torchrun program (it reads the Layout JSON itself if it wants it).

The flags each framework reads for a value the plan fixes live here, so that the spec check
(model and batch, known before planning) and the plan check (tensor and pipeline sizes, known
after) name the same flags. A user argument that contradicts the plan is an error naming both
values; the flags Holmes writes itself (the stage layout, the communicator file) may not be given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

HOLMES = "holmes"
FRAMEWORKS = (HOLMES, "megatron", "torchtitan", "deepspeed", "torchrun")
DEFAULT_FRAMEWORK = HOLMES
TRAINER_CONTAINER = "trainer"

# concept -> (the flag carrying it, the spec field it must equal). Concepts: the model's shape
# and the batch (checked against the spec), the parallel degrees (checked against the Layout).
PLAN_FLAGS: dict[str, dict[str, str]] = {
    "megatron": {
        "layers": "--num-layers",
        "hiddenSize": "--hidden-size",
        "attentionHeads": "--num-attention-heads",
        "seqLength": "--seq-length",
        "tensor": "--tensor-model-parallel-size",
        "pipeline": "--pipeline-model-parallel-size",
        "microBatchSize": "--micro-batch-size",
        "globalBatchSize": "--global-batch-size",
        "experts": "--num-experts",
        "expertsPerToken": "--moe-router-topk",
        "expertHiddenSize": "--moe-ffn-hidden-size",
        "sharedExpertSize": "--moe-shared-expert-intermediate-size",
        "expert": "--expert-model-parallel-size",
    },
    "torchtitan": {
        "seqLength": "--training.seq_len",
        "tensor": "--parallelism.tensor_parallel_degree",
        "pipeline": "--parallelism.pipeline_parallel_degree",
        "microBatchSize": "--parallelism.pipeline_parallel_microbatch_size",
        "globalBatchSize": "--training.global_batch_size",
    },
    "deepspeed": {},
    "torchrun": {},
}

# Flags Holmes writes from the plan: a user value would fight Holmes' own (or, for Megatron's
# --use-tp-pp-dp-mapping, reorder ranks so that a stage is no longer one block of nodes).
OWNED_FLAGS: dict[str, tuple[str, ...]] = {
    "megatron": (
        "--pipeline-model-parallel-layout",
        "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers",
        "--nccl-communicator-config-path",
        "--use-tp-pp-dp-mapping",
        "--context-parallel-size",
        "--expert-tensor-parallel-size",  # Holmes plans expert tensor parallelism = tensor
    ),
    "torchtitan": (
        "--parallelism.module_fqns_per_model_part",
        "--parallelism.pipeline_parallel_layers_per_stage",
        "--parallelism.data_parallel_replicate_degree",
        "--parallelism.data_parallel_shard_degree",
        "--parallelism.context_parallel_degree",
        "--training.local_batch_size",
        "--parallelism.expert_parallel_degree",  # expert x tensor (its experts borrow the tensor ranks)
    ),
    "deepspeed": (),
    "torchrun": (),
}

SPEC_FIELDS = {
    "layers": "spec.model.layers",
    "hiddenSize": "spec.model.hiddenSize",
    "attentionHeads": "spec.model.attentionHeads",
    "seqLength": "spec.model.seqLength",
    "tensor": "the plan's tensor size (spec.parallelism.tensor)",
    "pipeline": "the plan's pipeline size (spec.parallelism.pipeline)",
    "microBatchSize": "spec.training.microBatchSize",
    "globalBatchSize": "spec.training.globalBatchSize",
    "experts": "spec.model.moe.experts",
    "expertsPerToken": "spec.model.moe.expertsPerToken",
    "expertHiddenSize": "spec.model.moe.expertHiddenSize",
    "sharedExpertSize": "spec.model.moe.sharedExperts x expertHiddenSize",
    "expert": "the plan's expert-parallel size (spec.parallelism.expert)",
}

# A command that starts torchrun itself would start a second rendezvous with its own ranks.
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "deepspeed")


def is_external(framework: str) -> bool:
    return framework != HOLMES


def trainer_container(template: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The template's container named ``trainer``, else its first one; None without any."""
    listed = ((template or {}).get("spec") or {}).get("containers") or []
    containers = [c for c in listed if isinstance(c, Mapping)]
    named = [c for c in containers if c.get("name") == TRAINER_CONTAINER]
    if named:
        return named[0]
    return containers[0] if containers else None


def user_command(template: Mapping[str, Any] | None) -> list[str]:
    """The trainer container's command followed by its args, as the user wrote them."""
    c = trainer_container(template) or {}
    return [str(a) for a in [*(c.get("command") or []), *(c.get("args") or [])]]


def flag_values(argv: Sequence[str], flag: str) -> list[str]:
    """Every value ``argv`` gives ``flag`` (``--flag v`` or ``--flag=v``; a bare ``--flag``
    gives ``""``)."""
    out = []
    for i, a in enumerate(argv):
        if a == flag:
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            out.append("" if nxt.startswith("--") else nxt)
        elif a.startswith(flag + "="):
            out.append(a[len(flag) + 1 :])
    return out


def conflicts(framework: str, argv: Sequence[str], values: Mapping[str, int]) -> list[str]:
    """User arguments that contradict ``values`` (concept -> the plan's or spec's value), or that
    set a flag Holmes writes; one message per problem naming both values and the fix."""
    out = []
    for concept, want in values.items():
        flag = PLAN_FLAGS.get(framework, {}).get(concept)
        if flag is None:
            continue
        for got in flag_values(argv, flag):
            if got.strip() != str(want):
                out.append(
                    f"spec.template: the command gives {flag} {got or '(no value)'} but "
                    f"{SPEC_FIELDS[concept]} is {want}; remove {flag} (Holmes appends it from the plan) "
                    "or make the two agree"
                )
    for flag in OWNED_FLAGS.get(framework, ()):
        if flag_values(argv, flag):
            out.append(
                f"spec.template: the command sets {flag}, which Holmes controls for framework "
                f"{framework} (it writes the stages and networks from the plan, in the framework's "
                "default rank order); remove it"
            )
    return out


# Megatron-LM's full recomputation as the planner prices it (training.activationRecompute):
# every layer its own recompute unit, so each keeps only its input (costmodel.memory).
# megatron-core's TransformerConfig refuses granularity full without a unit size.
MEGATRON_RECOMPUTE = {
    "--recompute-granularity": "full",
    "--recompute-method": "uniform",
    "--recompute-num-layers": "1",
}
# Megatron-LM's shorthand for selective recomputation (validate_args sets granularity selective)
MEGATRON_SELECTIVE = "--recompute-activations"


def recompute_args(framework: str, recompute: bool) -> list[str]:
    """The recomputation flags that make the engine keep what the plan's memory estimate assumed
    (appended after the user's; none without recomputation: the engine's default keeps all)."""
    if framework != "megatron" or not recompute:
        return []
    return [a for flag, v in MEGATRON_RECOMPUTE.items() for a in (flag, v)]


def recompute_conflicts(framework: str, argv: Sequence[str], recompute: bool) -> list[str]:
    """User recomputation flags the plan's memory estimate contradicts. With recomputation the
    plan keeps one input per layer: any other unit or selective recomputation keeps more.
    Without it, full recomputation would run a forward the plan did not price (selective
    recomputation keeps less than planned and is allowed)."""
    if framework != "megatron":
        return []
    field = "spec.training.activationRecompute"
    out = []
    if recompute:
        for flag, want in MEGATRON_RECOMPUTE.items():
            for got in flag_values(argv, flag):
                if got.strip() != want:
                    out.append(
                        f"spec.template: the command gives {flag} {got or '(no value)'} but {field} is "
                        f"true, which the plan prices as {flag} {want} (one recompute unit per layer); "
                        f"remove {flag} (Holmes appends it) or set activationRecompute: false"
                    )
        if flag_values(argv, MEGATRON_SELECTIVE):
            out.append(
                f"spec.template: the command sets {MEGATRON_SELECTIVE} (selective recomputation) but "
                f"{field} is true (full recomputation, which Holmes appends); remove "
                f"{MEGATRON_SELECTIVE} or set activationRecompute: false"
            )
        return out
    full = [g for g in flag_values(argv, "--recompute-granularity") if g.strip() != "selective"]
    for got in full:
        out.append(
            f"spec.template: the command gives --recompute-granularity {got or '(no value)'} but {field} "
            "is false, so the plan prices no recomputed forward; set activationRecompute: true (Holmes "
            "then appends the recompute flags) or remove --recompute-granularity"
        )
    return out


# Megatron-LM's validate_args (megatron/training/arguments.py, core_v0.16.1 and 2026-08 main)
# asserts CUDA_DEVICE_MAX_CONNECTIONS=1 when tensor or context parallelism is above 1 on GPUs
# before Blackwell, unless FSDP or the MoE all-to-all overlap is on: those assert or want it
# above 1. Blackwell no longer needs it; there it only orders kernel launches.
MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
_MANY_CONNECTIONS = ("--use-torch-fsdp2", "--use-megatron-fsdp", "--overlap-moe-expert-parallel-comm")


def engine_env(framework: str, argv: Sequence[str], tensor: int, context: int = 1) -> dict[str, str]:
    """Environment the engine asserts for the plan's degrees, set in its pods."""
    if framework != "megatron" or (tensor == 1 and context == 1):
        return {}
    if any(flag_values(argv, f) for f in _MANY_CONNECTIONS):
        return {}
    return {MAX_CONNECTIONS: "1"}


def env_conflicts(framework: str, argv: Sequence[str], env: Mapping[str, str], tensor: int) -> list[str]:
    """Template env that contradicts what :func:`engine_env` must set (template env wins)."""
    out = []
    for name, want in engine_env(framework, argv, tensor).items():
        if name in env and env[name] != want:
            out.append(
                f"spec.template: the trainer container sets {name}={env[name]} but {framework} asserts "
                f"{name}={want} with tensor parallelism {tensor} (the plan's); remove it from env "
                "(Holmes sets it)"
            )
    return out


def trainer_env(template: Mapping[str, Any] | None) -> dict[str, str]:
    """The trainer container's literal env values (valueFrom entries are left out)."""
    env = (trainer_container(template) or {}).get("env") or []
    return {str(e["name"]): str(e["value"]) for e in env if isinstance(e, Mapping) and "value" in e}


def spec_values(job: Any) -> dict[str, int]:
    """What the spec alone fixes: the model's shape, the batch, and degrees given as numbers."""
    m, t, p = job.model, job.training, job.parallelism
    values = {
        "layers": m.layers,
        "hiddenSize": m.hidden_size,
        "attentionHeads": m.attention_heads,
        "seqLength": m.seq_length,
        "microBatchSize": t.micro_batch_size,
        "globalBatchSize": t.global_batch_size,
    }
    if m.moe is not None:
        values["experts"] = m.moe.experts
        values["expertsPerToken"] = m.moe.experts_per_token
        values["expertHiddenSize"] = m.moe.expert_hidden_size
        values["sharedExpertSize"] = m.moe.shared_experts * m.moe.expert_hidden_size
    for concept, v in (("tensor", p.tensor), ("pipeline", p.pipeline), ("expert", p.expert)):
        if isinstance(v, int) and (concept != "expert" or m.moe is not None):
            values[concept] = v
    return values


def framework_problems(job: Any) -> list[str]:
    """The spec checks of ``spec.framework``: an external framework runs the user's own image and
    command (Holmes cannot guess them), which must not start a launcher of its own nor contradict
    the spec."""
    fw = job.framework
    if not is_external(fw):
        return []
    c = trainer_container(job.template)
    if c is None:
        return [
            f"spec.template.spec.containers: framework {fw} runs your own image and command; add a "
            f"container named {TRAINER_CONTAINER!r} with image and command"
        ]
    out = []
    where = f"spec.template.spec.containers[{c.get('name')!r}]"
    if not c.get("image"):
        out.append(f"{where}.image: framework {fw} runs your own image; set the image holding your trainer")
    argv = user_command(job.template)
    if not argv:
        out.append(
            f"{where}.command: framework {fw} runs your own command (e.g. [python, pretrain_gpt.py, ...]); "
            "set command (and args)"
        )
    elif any(a.split("/")[-1] in _LAUNCHERS for a in argv[:3]):
        out.append(
            f"{where}.command: {' '.join(argv[:3])} starts a launcher of its own; give the program "
            "torchrun should run (e.g. [python, pretrain_gpt.py, ...]): Holmes starts torchrun with "
            "the Layout's node ranks"
        )
    out += conflicts(fw, argv, spec_values(job))
    sp = flag_values(argv, "--sequence-parallel")
    if fw == "megatron" and sp and not job.parallelism.sequence_parallel:
        out.append(
            "spec.template: the command sets --sequence-parallel but spec.parallelism.sequenceParallel is "
            "false, which the plan's memory estimate assumes; set sequenceParallel: true (Holmes then "
            "appends --sequence-parallel when tensor > 1) or remove the flag"
        )
    return out + recompute_conflicts(fw, argv, job.training.activation_recompute)
