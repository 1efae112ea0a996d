"""Start-up shared by the tools that run a model under a Layout outside training (evaluate):
torchrun's environment, the job and Layout, the device, the world and the Layout's groups, and
one stage's weights from a checkpoint written under any layout, from Hugging Face, or the seed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from holmes.contract import Layout

from . import checkpoint, hf
from .config import TrainConfig
from .groups import RankGroups, build_groups, init_world, tensor_parallel
from .model import build_stage

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class LaunchError(ValueError):
    """Cannot start: the message says what to fix."""


@dataclass
class Run:
    cfg: TrainConfig
    layout: Layout
    rank: int
    device: torch.device
    groups: RankGroups


def torchrun_rank() -> tuple[int, int]:
    """(RANK, LOCAL_RANK) from torchrun's environment."""
    missing = [k for k in TORCHRUN_ENV if k not in os.environ]
    if missing:
        raise LaunchError(
            f"{', '.join(missing)} not set: start it with torchrun "
            "(torchrun --nnodes N --nproc-per-node G ... -m holmes.trainer...)"
        )
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])


def device_for(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def start(job: Any, layout_path: str, dtype: str | None = None, backend: str | None = None) -> Run:
    """Parse and check the job against the Layout, then join the world and build its groups."""
    rank, local_rank = torchrun_rank()
    cuda = torch.cuda.is_available()
    try:
        cfg = TrainConfig.from_job(job, dtype=dtype or ("bfloat16" if cuda else "float32"))
        with open(layout_path) as f:
            layout = Layout.from_json(f.read())
        cfg.check_model_layout(layout)
    except (OSError, ValueError) as e:
        raise LaunchError(str(e)) from None
    world = int(os.environ["WORLD_SIZE"])
    if world != layout.world_size:
        raise LaunchError(
            f"torchrun started {world} processes but the layout needs {layout.world_size} "
            "(nnodes x nproc-per-node must equal the layout's worldSize)"
        )
    device = device_for(local_rank)
    backend = backend or ("nccl" if cuda else "gloo")
    init_world(layout, backend, cfg.timeout_seconds)
    groups = build_groups(layout, rank, backend, cfg.timeout_seconds)
    return Run(cfg, layout, rank, device, groups)


def build_model_for_layout(run: Run, checkpoint_arg: str | None) -> torch.nn.Module:
    """This rank's stage (its tensor-parallel slice) with weights from ``checkpoint_arg`` (any
    layout's), else from spec.model.init, else the seed. Collective over the world group when
    reading a checkpoint."""
    cfg, info = run.cfg, run.layout.rank_info(run.rank)
    stage = run.layout.stages[info.stage]
    module = build_stage(
        cfg.model,
        stage.layers[0],
        stage.layers[1],
        info.stage == 0,
        info.stage == run.layout.pipeline - 1,
        cfg.seed,
        run.device,
        dtype=cfg.dtype,
        tp=tensor_parallel(run.layout, run.rank, run.groups, cfg.sequence_parallel),
    )
    if checkpoint_arg:
        path = checkpoint.resolve(checkpoint_arg)
        checkpoint.check_model(path, cfg.model.shape())
        checkpoint.load_model(path, module, group=run.groups.world)
    elif cfg.model.init is not None:
        hf.load_stage(module, cfg.model, cfg.model.init.huggingface.path)
    return module
