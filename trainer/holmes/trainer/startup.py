"""Start-up of a process that runs a rank of a Layout: training (``python -m holmes.trainer``),
evaluation (``holmes.trainer.evaluate``) and, without torchrun, the dry run.

:func:`configure` reads the job and the Layout and checks them against each other (and against
the world torchrun started); :func:`start` adds torchrun's environment, this rank's device and
its backend. Joining the world and building the groups stay with the caller: training builds
its groups after the fabric preflight (engine.py), evaluation right away. Errors say what to fix.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from holmes.contract import Layout

from .config import TrainConfig

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class StartupError(ValueError):
    """Cannot start (the caller exits 2): the message says what to fix; ``rank`` when known."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


@dataclass(frozen=True)
class Started:
    """What start-up settled for this process."""

    cfg: TrainConfig
    layout: Layout
    rank: int
    device: torch.device
    backend: str


def torchrun_ranks(env: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """(RANK, LOCAL_RANK) from torchrun's environment."""
    missing = [k for k in TORCHRUN_ENV if k not in env]
    if missing:
        raise StartupError(
            f"{', '.join(missing)} not set: start it with torchrun "
            "(torchrun --nnodes N --nproc-per-node G ... -m holmes.trainer ...)"
        )
    return int(env["RANK"]), int(env["LOCAL_RANK"])


def configure(
    job: Any,
    layout_path: str,
    *,
    training: bool,
    world: int | None = None,
    checkpoint_dir: str | None = None,
    **overrides: Any,
) -> tuple[TrainConfig, Layout]:
    """The job's TrainConfig (``overrides``: TrainConfig fields the job does not carry) and the
    Layout, checked together: for ``training`` the whole job (batch sizes, embedding group,
    micro-batches), else only that the model fits the Layout (evaluation takes any layout of
    the model). ``world``: the processes started, which must be the Layout's world size."""
    try:
        cfg = TrainConfig.from_job(job, **overrides)
        with open(layout_path) as f:
            layout = Layout.from_json(f.read())
        if checkpoint_dir:
            cfg = replace(cfg, checkpoint=replace(cfg.checkpoint, path=checkpoint_dir))
        if training:
            cfg.check_against_layout(layout)
        else:
            cfg.check_model_layout(layout)
    except (OSError, ValueError) as e:  # SpecError, TrainerConfigError, LayoutError, a file
        raise StartupError(str(e)) from None
    if world is not None and world != layout.world_size:
        raise StartupError(
            f"torchrun started {world} processes but the layout needs {layout.world_size} "
            "(nnodes x nproc-per-node must equal the layout's worldSize)"
        )
    return cfg, layout


def start(
    job: Any,
    layout_path: str,
    *,
    training: bool,
    dtype: str | None = None,
    backend: str | None = None,
    checkpoint_dir: str | None = None,
    **overrides: Any,
) -> Started:
    """:func:`configure` for this torchrun rank, then its device (``cuda:LOCAL_RANK`` when there
    is CUDA) and backend (nccl on CUDA, else gloo, unless ``backend``). ``dtype``: bfloat16 on
    CUDA, float32 on CPU unless given."""
    rank, local_rank = torchrun_ranks()
    cuda = torch.cuda.is_available()
    try:
        cfg, layout = configure(
            job,
            layout_path,
            training=training,
            world=int(os.environ["WORLD_SIZE"]),
            checkpoint_dir=checkpoint_dir,
            dtype=dtype or ("bfloat16" if cuda else "float32"),
            **overrides,
        )
    except StartupError as e:
        raise StartupError(str(e), rank) from None
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return Started(cfg, layout, rank, device, backend or ("nccl" if cuda else "gloo"))


def report(prog: str, error: StartupError) -> None:
    """Say on stderr why this rank cannot start."""
    where = f"rank {error.rank}: " if error.rank is not None else ""
    print(f"{prog}: {where}{error}", file=sys.stderr, flush=True)
