"""Replicas on forked gloo ranks: R worlds of W ranks each (one rendezvous per replica, as one per
island), plus the outer group's store; and a worker that trains one rank of one replica."""

from __future__ import annotations

import io
import json
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

from holmes.trainer.engine import Trainer
from holmes.trainer.outer import ReplicaPlace
from holmes.trainer.reporting import MetricsSink


def _worker(replica: int, replicas: int, rank: int, world: int, ports: list[int], fn, args, q) -> None:
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            rank=rank,
            world_size=world,
            init_method=f"tcp://127.0.0.1:{ports[replica]}",
            timeout=timedelta(seconds=30),
        )
        place = ReplicaPlace(replica, replicas, "127.0.0.1", ports[-1])
        out = fn(rank, place, *args)
        buf = io.BytesIO()
        torch.save(out, buf)
        q.put(((replica, rank), "ok", buf.getvalue()))
        dist.destroy_process_group()
    except BaseException as e:
        q.put(((replica, rank), "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        q.close()
        q.join_thread()
        os._exit(1)


def run_replica_ranks(replicas: int, world: int, fn: Callable, *args: Any, timeout: float = 180.0) -> dict:
    """fn(rank, place, *args) on every rank of every replica: {(replica, rank): result}."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ports = [free_port() for _ in range(replicas + 1)]
    procs = [
        ctx.Process(target=_worker, args=(r, replicas, w, world, ports, fn, args, q))
        for r in range(replicas)
        for w in range(world)
    ]
    for p in procs:
        p.start()
    results: dict = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < len(procs) and time.monotonic() < deadline:
            try:
                key, status, out = q.get(timeout=0.2)
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and q.empty():
                    break
                continue
            results[key] = (
                status,
                torch.load(io.BytesIO(out), weights_only=False) if status == "ok" else out,
            )
    finally:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
    bad = {k: v for k, v in results.items() if v[0] != "ok"}
    assert not bad and len(results) == len(procs), f"ranks failed or missing: {bad or sorted(results)}"
    return {k: v[1] for k, v in results.items()}


def train_replica(rank: int, place: ReplicaPlace, cfg, layout, on_iteration=None) -> dict:
    """Train one rank of one replica; its losses, outer records and (DP index 0) parameters."""
    out = io.StringIO()
    sink = MetricsSink(enabled=rank == 0, stream=out)
    trainer = Trainer(
        cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo", replica=place, sink=sink
    )
    history = trainer.train(on_iteration)
    lines = [json.loads(x) for x in out.getvalue().splitlines() if x.startswith("{")]
    params = {}
    if trainer.info.dp_index == 0:
        params = {k: v.detach().clone() for k, v in trainer.module.state_dict().items()}
    return {
        "losses": [h["loss"] for h in history],
        "outer": [h.get("outer") for h in history],
        "outerStep": [h.get("outerStep") for h in history],  # what status.progress.outerStep reads
        "done": next((x for x in lines if x["holmes"] == "done"), None),  # read once the pod ended
        "params": params,
        "iteration": trainer.iteration,
    }


def replica_params(results: dict, replica: int) -> dict[str, torch.Tensor]:
    params: dict[str, torch.Tensor] = {}
    for (r, _), out in sorted(results.items()):
        if r == replica:
            params.update(out["params"])
    return params
