"""Run a function on forked gloo ranks on this machine: the trainer tests' and the trainer
benchmarks' one harness."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from holmes_dev.ports import free_port


def _worker(
    rank: int, world: int, port: int, fn: Callable, args: tuple, q: Any, timeout: float, threads: int
) -> None:
    torch.set_num_threads(threads)
    try:
        dist.init_process_group(
            "gloo",
            rank=rank,
            world_size=world,
            init_method=f"tcp://127.0.0.1:{port}",
            timeout=timedelta(seconds=timeout),
        )
        out = fn(rank, *args)
        buf = io.BytesIO()  # by value: torch's queue pickler would share fds that die with us
        torch.save(out, buf)
        q.put((rank, "ok", buf.getvalue()))
        dist.destroy_process_group()
    except BaseException as e:  # report, then leave without waiting for peers
        q.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        q.close()
        q.join_thread()  # flush the queue before skipping interpreter shutdown
        os._exit(1)


def _load(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def run_ranks(
    world: int,
    fn: Callable,
    *args: Any,
    timeout: float = 120.0,
    pg_timeout: float = 30.0,
    allow_exit: bool = False,
    threads: int = 1,
) -> dict[int, tuple[str, Any]]:
    """Run fn(rank, *args) on ``world`` forked gloo ranks of ``threads`` torch threads each;
    {rank: ("ok", result) | ("error", text) | ("exit", code)}. Unless ``allow_exit``, any rank
    that did not return fails with an AssertionError that carries every rank's error."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, world, port, fn, args, q, pg_timeout, threads))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world and time.monotonic() < deadline:
            try:
                rank, status, out = q.get(timeout=0.2)
                results[rank] = (status, _load(out) if status == "ok" else out)
            except queue.Empty:
                if all(not p.is_alive() for p in procs):
                    while True:  # drain what was put just before exiting
                        try:
                            rank, status, out = q.get(timeout=0.5)
                            results[rank] = (status, _load(out) if status == "ok" else out)
                        except queue.Empty:
                            break
                    break
    finally:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    for r, p in enumerate(procs):
        if r not in results:
            results[r] = ("exit", p.exitcode)
    if not allow_exit:
        bad = {r: v for r, v in results.items() if v[0] != "ok"}
        assert not bad, f"ranks failed: {bad}"
    return results
