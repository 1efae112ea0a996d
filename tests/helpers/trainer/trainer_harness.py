"""Helpers for the trainer tests: tiny configs, hand-built Layouts, a reference loop, launched
trainer processes; forked gloo ranks and free ports come from hack/holmes_dev (re-exported here)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from holmes_dev.gloo import run_ranks  # noqa: F401 (the trainer tests import it from here)
from holmes_dev.jobs import holmes_job
from holmes_dev.ports import free_port

from holmes.contract import ModelSpec
from holmes.contract import pipeline_schedules as sched
from holmes.contract.layout import LAYOUT_VERSION, NVLINK_VERSION, VIRTUAL_VERSION, GroupFamily, Layout, Stage
from holmes.trainer.config import OptimizerConfig, TrainConfig
from holmes.trainer.data import BatchLoader, Sharding, make_source
from holmes.trainer.engine import Trainer, learning_rate
from holmes.trainer.model import build_full, global_name, loss_fn
from holmes.trainer.models import sharding

TINY = ModelSpec(layers=4, hidden_size=32, attention_heads=4, seq_length=16, vocab_size=64)

# The HolmesJob of the entry-point tests (TINY on 2 nodes x 2 GPUs: pipeline 2 x data 2).
TINY_JOB = holmes_job(
    "tiny",
    {
        "model": {"layers": 4, "hiddenSize": 32, "attentionHeads": 4, "seqLength": 16, "vocabSize": 64},
        "training": {
            "globalBatchSize": 16,
            "microBatchSize": 2,
            "iterations": 3,
            "learningRate": 1e-3,
            "seed": 5,
        },
        "parallelism": {"pipeline": 2, "data": 2},
        "nodes": {"count": 2, "gpusPerNode": 2},
    },
)


def tiny_config(**kw: Any) -> TrainConfig:
    args = dict(
        model=TINY,
        global_batch_size=16,
        micro_batch_size=2,
        iterations=4,
        seed=7,
        optimizer=OptimizerConfig(kind="sgd", learning_rate=0.5, weight_decay=0.0, grad_clip=1.0),
        bucket_elements=3000,
        timeout_seconds=30.0,
    )
    args.update(kw)
    return TrainConfig(**args)


def make_layout(
    pipeline: int,
    data: int,
    split: list[int],
    micro_batch_size: int,
    micro_batches: int,
    gpus_per_node: int | None = None,
    embedding: bool = False,
    tensor: int = 1,
    schedule: str = "1F1B",
) -> Layout:
    """``split``: layers per stage, or with virtual stages (a looped or V-shaped ``schedule``)
    layers per virtual stage in pipeline order (pipeline x v numbers). ``tensor`` above
    ``gpus_per_node``: every node in one NVLink domain, each tensor group over several nodes."""
    world = pipeline * data * tensor
    g = gpus_per_node or world
    bounds = [0]
    for n in split:
        bounds.append(bounds[-1] + n)
    v = len(split) // pipeline
    chunks: list[list[tuple[int, int]]] = [[(0, 0)] * v for _ in range(pipeline)]
    for k in range(pipeline * v):
        st, c = sched.owner(schedule, pipeline, k)
        chunks[st][c] = (bounds[k], bounds[k + 1])
    stages = tuple(
        Stage(
            i,
            (min(a for a, _ in chunks[i]), max(b for _, b in chunks[i])),
            f"isl{i}/infiniband",
            "infiniband",
            "IB",
            chunks=tuple(chunks[i]) if v > 1 else (),
        )
        for i in range(pipeline)
    )
    groups = tuple(GroupFamily("dp", "IB", s) for s in range(pipeline)) + (GroupFamily("pp", "Socket"),)
    if tensor > 1:
        groups += tuple(GroupFamily("tp", "IB", s) for s in range(pipeline))
    wrap = sched.needs_wrap_link(schedule, pipeline, v)
    groups += tuple(GroupFamily("p2p", "Socket", b) for b in range(pipeline if wrap else pipeline - 1))
    if embedding:
        groups += (GroupFamily("embedding", "Socket"),)
    nodes = tuple(f"node-{i}" for i in range(world // g))
    spans = tensor > g
    return Layout(
        tensor=tensor,
        pipeline=pipeline,
        data=data,
        gpus_per_node=g,
        nodes=nodes,
        stages=stages,
        groups=groups,
        micro_batch_size=micro_batch_size,
        micro_batches=micro_batches,
        schedule=schedule,
        version=NVLINK_VERSION if spans else VIRTUAL_VERSION if v > 1 else LAYOUT_VERSION,
        nvlink_domains=(("rack-uuid.1", nodes),) if spans else (),
    )


def start_nodes(
    tmp_path, nnodes: int, nproc: int, env: dict, launcher: str = "torch.distributed.run", args=()
) -> list:
    """``nnodes`` "pods" of ``nproc`` trainer processes each, launched with ``python -m launcher``
    (torchrun or holmes.trainer.run) on tmp_path's job.yaml and layout.json, metrics to
    tmp_path/metrics.jsonl; the Popen objects, in node order."""
    import subprocess
    import sys

    port = free_port()
    procs = []
    for node in range(nnodes):
        cmd = [
            sys.executable,
            "-m",
            launcher,
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc}",
            f"--node-rank={node}",
            "--rdzv-backend=static",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "-m",
            "holmes.trainer",
            "--job",
            str(tmp_path / "job.yaml"),
            "--layout",
            str(tmp_path / "layout.json"),
            "--metrics-file",
            str(tmp_path / "metrics.jsonl"),
            *args,
        ]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return procs


def finish_nodes(procs: list, timeout: float) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each process of start_nodes; all are killed if one hangs."""
    import subprocess

    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out, err))
    return outs


def train_on_layout(
    rank: int, cfg: TrainConfig, layout: Layout, on_iteration: Callable | None = None
) -> dict:
    """Worker body: train, return losses and this rank's parameters (only DP index 0 reports
    params; a tensor-parallel slice under ``name@tp<t>``, see merged)."""
    trainer = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    history = trainer.train(on_iteration)
    params = {}
    if trainer.info.dp_index == 0:
        tag = f"@tp{trainer.info.tp_index}" if layout.tensor > 1 else ""
        params = {k + tag: v.detach().clone() for k, v in trainer.module.state_dict().items()}
    return {
        "losses": [h["loss"] for h in history],
        "grad_norms": [h["gradNorm"] for h in history],
        "params": params,
        "records": history,
    }


def merged(results: dict[int, tuple[str, Any]]) -> tuple[list[float], dict[str, torch.Tensor]]:
    params: dict[str, torch.Tensor] = {}
    for _, (_, out) in sorted(results.items()):
        params.update(out["params"])
    slices: dict[str, dict[int, torch.Tensor]] = {}
    for key in [k for k in params if "@tp" in k]:
        name, t = key.split("@tp")
        slices.setdefault(name, {})[int(t)] = params.pop(key)
    for name, parts in slices.items():  # tensor parallelism: the whole tensor from its slices
        params[name] = sharding.assemble([parts[t] for t in sorted(parts)], global_name(name))
    losses = results[0][1]["losses"]
    for _, (_, out) in results.items():
        assert out["losses"] == losses, "every rank must report the same global loss"
    return losses, params


def reference(cfg: TrainConfig) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    """A plain single-process PyTorch loop: same model init, data, loss scaling, clipping, schedule."""
    model = build_full(cfg.model, cfg.seed)
    o = cfg.optimizer
    if o.kind == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=o.learning_rate)
    else:
        decay = [p for p in model.parameters() if p.ndim >= 2]
        rest = [p for p in model.parameters() if p.ndim < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o.weight_decay}, {"params": rest, "weight_decay": 0.0}],
            lr=o.learning_rate,
            betas=o.betas,
            eps=o.eps,
        )
    loader = BatchLoader(
        make_source(cfg.data.path, cfg.model.vocab_size, cfg.model.seq_length, cfg.seed),
        Sharding(cfg.global_batch_size, 1, 0),
    )
    n_mb = cfg.global_batch_size // cfg.micro_batch_size
    losses, norms = [], []
    for i in range(cfg.iterations):
        for g in opt.param_groups:
            g["lr"] = learning_rate(o, i, cfg.iterations)
        x, y = loader.batch(i)
        total = 0.0
        for xm, ym in zip(x.chunk(n_mb), y.chunk(n_mb)):
            loss = loss_fn(model(xm), ym) / n_mb
            loss.backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip if o.grad_clip > 0 else 1e30)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
        norms.append(float(norm))
    return losses, norms, {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_params_close(got: dict, want: dict, atol: float = 2e-6) -> None:
    """Every parameter of ``want`` is in ``got`` and equal to within ``atol``."""
    assert want and set(want) <= set(got), f"parameters missing: {set(want) - set(got)}"
    for k, v in want.items():
        if k in got:
            assert torch.allclose(got[k], v, atol=atol, rtol=0), f"{k}: max diff {(got[k] - v).abs().max()}"


def trained(cfg: TrainConfig, layout: Layout) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The losses and merged parameters of ``cfg`` trained under ``layout`` on forked ranks."""
    return merged(run_ranks(layout.world_size, train_on_layout, cfg, layout))


def assert_matches_reference(cfg: TrainConfig, layout: Layout, param_atol: float = 2e-6) -> dict:
    """Train ``cfg`` under ``layout`` on forked ranks and compare with the single-process
    reference: losses within 1e-5, grad norms within 1e-4 relative, parameters within
    ``param_atol``, and the loss fell. Returns the merged parameters."""
    import pytest

    ref_losses, ref_norms, ref_params = reference(cfg)
    res = run_ranks(layout.world_size, train_on_layout, cfg, layout)
    losses, params = merged(res)
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    assert res[0][1]["grad_norms"] == pytest.approx(ref_norms, rel=1e-4)
    assert_params_close(params, ref_params, atol=param_atol)
    assert losses[-1] < losses[0]
    return params


def kill_after(n):
    """A train_on_layout hook that ends the process at iteration ``n``, as a lost node would."""

    def on_iteration(trainer, record):
        if trainer.iteration == n:
            trainer.wait_for_checkpoint()  # an asynchronous save in flight would be lost
            os._exit(17)  # no cleanup, like a node going away

    return on_iteration
