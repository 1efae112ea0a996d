"""How a ``spec.framework`` other than holmes is launched on the plan, pure: the plan as the
framework's own arguments, the files they point at, and what the pods need to run the user's
command under Holmes' launcher (``holmes.launch``), returned as data that render.py renders the
pods with. (Which frameworks there are and the checks of their commands that need no plan:
``holmes.contract.frameworks``.)

What a pod of an external framework gets on top of Holmes' own (render.py: ranks, the
rendezvous, per-node NCCL env without NCCL_NET, the RDMA resource and the Layout at /etc/holmes):

- an init container from the Holmes image copying the launcher and the network hook into an
  emptyDir (``/holmes-launch``): the user's image needs only its own Python and torch;
- the trainer container's command: ``<its python> /holmes-launch/launch.py -- <the user's
  command and args> <the plan's arguments>``;
- ``HOLMES_FRAMEWORK`` and ``HOLMES_FABRIC_CHECK`` for the launcher and the hook.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from holmes.contract import JobSpec, Layout
from holmes.contract.frameworks import (
    conflicts,
    engine_env,
    env_conflicts,
    is_external,
    recompute_args,
    trainer_env,
    user_command,
)

from . import child_names

LAUNCH_VOLUME = "holmes-launch"
LAUNCH_DIR = "/holmes-launch"
INIT_CONTAINER = "holmes-launch"
DEFAULT_PYTHON = "python3"


# ---- the plan as arguments ---------------------------------------------------------------------


def stage_layers(layout: Layout) -> list[int]:
    return [s.num_layers for s in layout.stages]


def global_batch(layout: Layout) -> int:
    return layout.micro_batch_size * layout.micro_batches * layout.data


def megatron_layout(layout: Layout) -> str:
    """``--pipeline-model-parallel-layout``: E (embedding) on the first stage, t (a transformer
    layer) times each stage's count, L (loss) on the last: ``Et*3|t*3|t*2L``."""
    stages = [f"t*{n}" if n > 1 else "t" for n in stage_layers(layout)]
    stages[0] = "E" + stages[0]
    stages[-1] += "L"
    return "|".join(stages)


def megatron_nccl_file(stage: int) -> str:
    return f"megatron-nccl-stage-{stage}.yaml"


def megatron_nccl_config(layout: Layout, stage: int) -> dict[str, dict[str, str]]:
    """Megatron-core's communicator YAML (``net_name`` per group *type*) for the pods of one
    stage: right for this stage's groups, which is all a type-keyed file can say. The launcher's
    hook sets the same nets per group and is what counts where both apply."""
    net = {(g.kind, g.stage): g.net for g in layout.groups}
    dp, tp = net[("dp", stage)], net[("tp", stage)]
    pp = net.get(("pp", None), layout.world_net)
    emb = net.get(("embedding", None), pp)
    cfg = {"dp": dp, "dp_cp": dp, "tp": tp, "tp_cp": tp, "tp_dp": dp, "tp_dp_cp": dp, "pp": pp, "mp": pp}
    cfg["embd"] = emb
    # megatron-core's expert groups (parallel_state.initialize_model_parallel makes them even
    # with expert parallelism 1): inside the stage, so on its island, but tp_ep_pp and the
    # distributed optimizer's instance group span the stages like pp
    cfg.update({k: dp for k in ("ep", "ep_dp", "intra_ep_dp", "inter_ep_dp", "tp_ep_mp")})
    cfg.update({"ep_tp": tp, "tp_ep_pp": pp, "intra_dist_opt_instance": pp})
    return {kind: {"net_name": v} for kind, v in cfg.items()}


def megatron_args(spec: JobSpec, layout: Layout, node_rank: int) -> list[str]:
    """Megatron-LM's arguments for the plan: degrees, batch, stage layout, this stage's
    communicator file, and what the plan's memory estimate assumed (sequence parallelism,
    full recomputation of every layer)."""
    stage = layout.rank_info(node_rank * layout.gpus_per_node).stage
    args = [
        "--tensor-model-parallel-size",
        str(layout.tensor),
        "--pipeline-model-parallel-size",
        str(layout.pipeline),
        "--num-layers",
        str(layout.num_layers),
        "--micro-batch-size",
        str(layout.micro_batch_size),
        "--global-batch-size",
        str(global_batch(layout)),
        "--nccl-communicator-config-path",
        f"{child_names.LAYOUT_MOUNT}/{megatron_nccl_file(stage)}",
    ]
    if layout.pipeline > 1:
        args += ["--pipeline-model-parallel-layout", megatron_layout(layout)]
    if spec.parallelism.sequence_parallel and layout.tensor > 1:
        args.append("--sequence-parallel")
    moe = spec.model.moe
    if moe is not None:
        args += ["--num-experts", str(moe.experts), "--moe-router-topk", str(moe.experts_per_token)]
        args += ["--moe-ffn-hidden-size", str(moe.expert_hidden_size)]
        args += ["--expert-model-parallel-size", str(layout.expert)]
        if moe.shared_experts:
            shared = moe.shared_experts * moe.expert_hidden_size
            args += ["--moe-shared-expert-intermediate-size", str(shared)]
    return args + recompute_args(spec.framework, spec.training.activation_recompute)


def torchtitan_parts(layout: Layout) -> list[str]:
    """``module_fqns_per_model_part`` in torchtitan's CLI form (one ``a,b,c`` per stage):
    ``tok_embeddings`` first, ``norm`` and ``output`` last, each stage its layers."""
    parts = []
    for s in layout.stages:
        fqns = [f"layers.{i}" for i in range(*s.layers)]
        if s.index == 0:
            fqns.insert(0, "tok_embeddings")
        if s.index == layout.pipeline - 1:
            fqns += ["norm", "output"]
        parts.append(",".join(fqns))
    return parts


def torchtitan_args(layout: Layout) -> list[str]:
    """torchtitan's arguments. Its expert parallelism borrows the tensor ranks (its experts are
    not tensor-split): Holmes' E expert groups of E x T ranks are its expert degree E x T."""
    local = layout.micro_batch_size * layout.micro_batches
    args = [
        "--parallelism.tensor_parallel_degree",
        str(layout.tensor),
        "--parallelism.pipeline_parallel_degree",
        str(layout.pipeline),
        "--parallelism.data_parallel_replicate_degree",
        "1",
        "--parallelism.data_parallel_shard_degree",
        str(layout.data),
        "--parallelism.context_parallel_degree",
        "1",
        "--training.local_batch_size",
        str(local),
        "--training.global_batch_size",
        str(global_batch(layout)),
    ]
    if layout.expert > 1:
        args += ["--parallelism.expert_parallel_degree", str(layout.expert * layout.tensor)]
    if layout.pipeline > 1:
        args += [
            "--parallelism.pipeline_parallel_microbatch_size",
            str(layout.micro_batch_size),
            "--parallelism.module_fqns_per_model_part",
            *torchtitan_parts(layout),
        ]
    return args


def plan_args(spec: JobSpec, layout: Layout, node_rank: int) -> list[str]:
    """The arguments appended to the user's for the pod of ``node_rank``. DeepSpeed takes the
    stage sizes through the launcher's hook (holmes.launch.stages); torchrun programs read the
    Layout themselves."""
    if spec.framework == "megatron":
        return megatron_args(spec, layout, node_rank)
    if spec.framework == "torchtitan":
        return torchtitan_args(layout)
    return []


def plan_conflicts(spec: JobSpec, layout: Layout) -> list[str]:
    """The user's arguments against what only the plan knows (tensor and pipeline sizes, and
    the layer count again), and the template's env against what the engine asserts for them."""
    values = {"tensor": layout.tensor, "pipeline": layout.pipeline, "layers": layout.num_layers}
    if spec.model.moe is not None:
        values["expert"] = layout.expert
    argv = user_command(spec.template)
    env = trainer_env(spec.template)
    return conflicts(spec.framework, argv, values) + env_conflicts(spec.framework, argv, env, layout.tensor)


# ---- the ConfigMap's files and the pod's parts ----------------------------------------------------


def config_files(spec: JobSpec, layout: Layout) -> dict[str, str]:
    """The files the framework's arguments name, added to the job's ConfigMap (mounted at
    /etc/holmes): Megatron's communicator file per stage."""
    if spec.framework != "megatron":
        return {}
    return {
        megatron_nccl_file(s): yaml.safe_dump(megatron_nccl_config(layout, s), sort_keys=True)
        for s in range(layout.pipeline)
    }


@dataclass(frozen=True)
class Launch:
    """What the launcher adds to the pod of one node rank (render.build_pod renders it in): the
    trainer container's whole command (its args folded in), variables ahead of Holmes' own
    (Holmes' and the user's win on a clash), and an emptyDir that an init container, first of
    the pod's, fills with the launcher."""

    command: tuple[str, ...]
    env: Mapping[str, str]
    volume: Mapping[str, Any]
    mount: Mapping[str, Any]
    init_container: Mapping[str, Any]


def launch(spec: JobSpec, layout: Layout, node_rank: int, image: str) -> Launch | None:
    """The launcher's part of the pod of ``node_rank``; None for Holmes' own trainer.
    ``image``: the Holmes image the init container copies the launcher from."""
    if not is_external(spec.framework):
        return None
    argv = user_command(spec.template)
    command = (launcher_python(argv), f"{LAUNCH_DIR}/launch.py", "--", *argv)
    return Launch(
        command=(*command, *plan_args(spec, layout, node_rank)),
        env={
            "HOLMES_FRAMEWORK": spec.framework,
            "HOLMES_FABRIC_CHECK": spec.training.fabric_check,
            **engine_env(spec.framework, argv, layout.tensor),
        },
        volume={"name": LAUNCH_VOLUME, "emptyDir": {}},
        mount={"name": LAUNCH_VOLUME, "mountPath": LAUNCH_DIR, "readOnly": True},
        init_container=launcher_init_container(image),
    )


def launcher_python(argv: list[str]) -> str:
    """The user's own interpreter when the command starts with one, so torchrun and the workers
    run where the user's packages are."""
    head = os.path.basename(argv[0]) if argv else ""
    return argv[0] if head in ("python", "python3") or head.startswith("python3.") else DEFAULT_PYTHON


def launcher_init_container(image: str) -> dict:
    """Copies the launcher from the Holmes image; within Pod Security's restricted level."""
    return {
        "name": INIT_CONTAINER,
        "image": image,
        "command": ["python", "-m", "holmes.launch.install", LAUNCH_DIR],
        "volumeMounts": [{"name": LAUNCH_VOLUME, "mountPath": LAUNCH_DIR}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
