"""Shared pieces of the trainer benchmarks: forked gloo workers and hand-built Layouts."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from holmes.contract import ModelSpec
from holmes.contract.layout import GroupFamily, Layout, Stage

SMOKE_HELP = "the small mode tests/bench runs: a toy-width model, the fewest steps (its numbers mean nothing)"


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


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, fn, args, q, threads):
    torch.set_num_threads(threads)
    try:
        dist.init_process_group(
            "gloo",
            rank=rank,
            world_size=world,
            init_method=f"tcp://127.0.0.1:{port}",
            timeout=timedelta(seconds=120),
        )
        out = fn(rank, *args)
        buf = io.BytesIO()
        torch.save(out, buf)
        q.put((rank, buf.getvalue()))
        dist.destroy_process_group()
    except BaseException:
        q.put((rank, traceback.format_exc().encode()))
        q.close()
        q.join_thread()
        os._exit(1)


def run_ranks(world: int, fn: Callable, *args: Any, threads: int = 1) -> dict[int, Any]:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, q, threads)) for r in range(world)]
    for p in procs:
        p.start()
    out = {}
    for _ in range(world):
        rank, data = q.get(timeout=900)
        try:
            out[rank] = torch.load(io.BytesIO(data), weights_only=False)
        except Exception:
            raise RuntimeError(f"rank {rank} failed:\n{data.decode(errors='replace')}") from None
    for p in procs:
        p.join()
    return out


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
