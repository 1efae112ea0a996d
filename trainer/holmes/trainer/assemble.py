"""This rank's part of the model under a Layout, for training (engine.py) and evaluation
(evaluate.py): its stage, its tensor-parallel slice, and the weights it starts from."""

from __future__ import annotations

from typing import Any

import torch

from holmes.contract import Layout

from . import checkpoint, hf
from .config import TrainConfig
from .groups import RankGroups, tensor_parallel
from .model import StageModule, build_stage


def stage_model(
    cfg: TrainConfig,
    layout: Layout,
    rank: int,
    device: torch.device,
    groups: RankGroups,
    *,
    recompute: bool = False,
) -> StageModule:
    """``rank``'s stage of the Layout (its slice of it under tensor parallelism, ``.tp``) on
    ``device`` in ``cfg.dtype``, with the seed's weights."""
    info = layout.rank_info(rank)
    stage = layout.stages[info.stage]
    ranges = stage.ranges  # one per virtual stage: the embedding where layer 0 is, the head at the end
    return build_stage(
        cfg.model,
        stage.layers[0],
        stage.layers[1],
        any(a == 0 for a, _ in ranges),
        any(b == layout.num_layers for _, b in ranges),
        cfg.seed,
        device,
        recompute=recompute,
        dtype=cfg.dtype,
        tp=tensor_parallel(layout, rank, groups, cfg.sequence_parallel),
        ranges=ranges,
    )


def load_start_weights(module: StageModule, cfg: TrainConfig, checkpoint_arg: str | None, group: Any) -> None:
    """The weights a fresh stage starts from: ``checkpoint_arg``'s (training.checkpoint.path or
    one checkpoint in it, written under any layout; collective over ``group``), else
    spec.model.init's Hugging Face weights, else the seed's (left as built)."""
    if checkpoint_arg:
        path = checkpoint.resolve(checkpoint_arg)
        checkpoint.check_model(path, cfg.model.shape())
        checkpoint.load_model(path, module, group=group)
    elif cfg.model.init is not None:
        hf.load_stage(module, cfg.model, cfg.model.init.huggingface.path)
