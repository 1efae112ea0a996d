"""Shared pieces of the trainer benchmarks: forked gloo workers and hand-built Layouts."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack"))  # holmes_dev: the shared helpers
from holmes_dev import gloo  # noqa: E402
from holmes_dev.ports import free_port  # noqa: E402, F401 (the benches' one port picker)

from holmes.contract import ModelSpec  # noqa: E402
from holmes.contract.layout import GroupFamily, Layout, Stage  # noqa: E402
from holmes.trainer.config import OptimizerConfig, TrainConfig  # noqa: E402

SMOKE_HELP = "the small mode `make test` runs: a toy-width model, the fewest steps (its numbers mean nothing)"


def train_config(
    model: ModelSpec, global_batch: int, micro_batch: int, iterations: int, **kw: Any
) -> TrainConfig:
    """The trainer benchmarks' job: AdamW at 1e-3, the engine's defaults for the rest unless ``kw``."""
    return TrainConfig(
        model=model,
        global_batch_size=global_batch,
        micro_batch_size=micro_batch,
        iterations=iterations,
        optimizer=OptimizerConfig(kind="adamw", learning_rate=1e-3),
        **kw,
    )


def smoke_model(m: ModelSpec) -> ModelSpec:
    """m at toy width (same layers, heads and architecture): every code path in seconds."""
    return replace(
        m,
        hidden_size=16 * m.attention_heads,
        ffn_hidden_size=32 * m.attention_heads,
        seq_length=32,
        vocab_size=256,
    )


def layout(
    pipeline: int, data: int, split: list[int], mb: int, micro_batches: int, tensor: int = 1
) -> Layout:
    bounds = [0]
    for n in split:
        bounds.append(bounds[-1] + n)
    stages = tuple(
        Stage(i, (bounds[i], bounds[i + 1]), "bench/ethernet", "ethernet", "Socket") for i in range(pipeline)
    )
    groups = tuple(GroupFamily("dp", "Socket", s) for s in range(pipeline)) + (GroupFamily("pp", "Socket"),)
    groups += tuple(GroupFamily("p2p", "Socket", b) for b in range(pipeline - 1))
    groups += tuple(GroupFamily("tp", "Socket", s) for s in range(pipeline)) if tensor > 1 else ()
    world = pipeline * data * tensor
    return Layout(
        tensor=tensor,
        pipeline=pipeline,
        data=data,
        gpus_per_node=world,
        nodes=("bench",),
        stages=stages,
        groups=groups,
        micro_batch_size=mb,
        micro_batches=micro_batches,
    )


def run_ranks(world: int, fn: Callable, *args: Any, threads: int = 1) -> dict[int, Any]:
    """fn(rank, *args) on ``world`` forked gloo ranks; {rank: its result} (holmes_dev.gloo, with a
    benchmark's patience: 15 minutes in all, 2 minutes per collective)."""
    out = gloo.run_ranks(world, fn, *args, timeout=900, pg_timeout=120, threads=threads)
    return {rank: result for rank, (_, result) in out.items()}


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
