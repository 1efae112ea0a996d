"""Tensor parallelism (and sequence parallelism) against one process: the split model computes
the whole model's logits, loss and gradients, and training under TP x PP x DP layouts matches
the single-process reference (losses 1e-5, grad norms 1e-4 relative, parameters)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from holmes.trainer.config import OptimizerConfig
from holmes.trainer.model import build_full, build_stage, loss_fn
from holmes.trainer.models import sharding
from holmes.trainer.tensor_parallel import TensorParallel
from tests.helpers.trainer.trainer_harness import (
    TINY,
    assert_matches_reference,
    kill_after,
    make_layout,
    run_ranks,
    tiny_config,
    train_on_layout,
)

LLAMA = replace(TINY, architecture="llama", kv_heads=2, ffn_hidden_size=64, rope_theta=10000.0)
MODELS = {"gpt": TINY, "llama": LLAMA}


def _split_vs_whole(rank: int, cfg, sequence_parallel: bool) -> dict:
    tp = TensorParallel(2, rank, dist.new_group([0, 1]), sequence_parallel)
    whole = build_full(cfg, 3)
    part = build_stage(cfg, 0, cfg.layers, True, True, 3, tp=tp)
    ids = torch.randint(
        0, cfg.vocab_size, (2, cfg.seq_length + 1), generator=torch.Generator().manual_seed(0)
    )
    x, y = ids[:, :-1], ids[:, 1:]
    want = whole(x)
    loss_fn(want, y).backward()
    got = part(x)
    loss = loss_fn(got, y, tp=tp)
    loss.backward()
    width = cfg.vocab_size // 2
    out = {"logits": (got - want[..., rank * width : (rank + 1) * width]).abs().max().item()}
    out["loss"] = abs(loss.item() - loss_fn(want, y).item())
    whole_params = dict(whole.named_parameters())
    grad_err = 0.0
    for name, p in part.named_parameters():
        assert torch.equal(p.detach(), sharding.take(whole_params[name].detach(), name, 2, rank)), name
        g = p.grad.clone()
        if sequence_parallel and sharding.split_of(name) is None:
            dist.all_reduce(g, group=tp.group)  # partial over the sequence: the optimizer sums these
        grad_err = max(
            grad_err, (g - sharding.take(whole_params[name].grad, name, 2, rank)).abs().max().item()
        )
    out["grad"] = grad_err
    return out


@pytest.mark.parametrize("arch", ["gpt", "llama"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_split_model_computes_the_whole_models_logits_loss_and_gradients(arch, tied, sp):
    cfg = replace(MODELS[arch], tied_embeddings=tied)
    for _, (_, r) in run_ranks(2, _split_vs_whole, cfg, sp).items():
        assert r["logits"] < 1e-6 and r["loss"] < 1e-6 and r["grad"] < 1e-6, r


# eps above fp32 noise: Adam's first step moves an element by lr * g / (|g| + eps), so on the few
# elements whose gradient is itself ~1e-8 (summation-order noise, different for split matmuls)
# eps=1e-8 turns that noise into a visible fraction of lr; the maths under test is the same
ADAMW = OptimizerConfig(kind="adamw", learning_rate=3e-3, warmup_iterations=1, weight_decay=0.1, eps=1e-6)


@pytest.mark.parametrize(
    "arch,pipeline,data,sp,extra",
    [
        ("gpt", 1, 1, False, {}),
        ("llama", 1, 1, True, {}),
        ("gpt", 2, 1, True, {"activation_recompute": True}),
        ("llama", 2, 1, False, {"tied": True}),
        ("gpt", 1, 2, True, {"optimizer": ADAMW}),
        ("llama", 1, 2, False, {"optimizer": ADAMW}),
    ],
    ids=[
        "gpt-tp2",
        "llama-tp2-sp",
        "gpt-tp2xpp2-sp-recompute",
        "llama-tp2xpp2-tied",
        "gpt-tp2xdp2-sp-adamw",
        "llama-tp2xdp2-adamw",
    ],
)
def test_training_under_tensor_parallel_layouts_matches_one_process(arch, pipeline, data, sp, extra):
    extra = dict(extra)
    model = replace(MODELS[arch], tied_embeddings=extra.pop("tied", False))
    cfg = tiny_config(model=model, sequence_parallel=sp, overlap=True, **extra)
    split = [2, 2] if pipeline == 2 else [4]
    mb = cfg.global_batch_size // (data * cfg.micro_batch_size)
    layout = make_layout(
        pipeline,
        data,
        split,
        cfg.micro_batch_size,
        mb,
        tensor=2,
        embedding=model.tied_embeddings and pipeline > 1,
    )
    assert_matches_reference(cfg, layout, param_atol=1e-5 if cfg.optimizer.kind == "adamw" else 2e-6)


def test_resume_under_tensor_parallelism_continues_exactly(tmp_path):
    """Checkpoint under TP=2 x DP=2 with sequence parallelism (model slices as DTensor shards of
    whole tensors, optimizer state as chunks of whole tensors), kill, resume: the same losses."""
    from holmes.trainer import checkpoint
    from holmes.trainer.config import CheckpointConfig

    lay = make_layout(1, 2, [4], 2, 4, tensor=2)
    cfg = tiny_config(model=LLAMA, optimizer=ADAMW, iterations=5, sequence_parallel=True)
    want = run_ranks(4, train_on_layout, cfg, lay)[0][1]["losses"]
    cfg = cfg.with_(checkpoint=CheckpointConfig(path=str(tmp_path / "ckpt"), interval_iterations=2))
    run_ranks(4, train_on_layout, cfg, lay, kill_after(3), allow_exit=True)
    assert checkpoint.newest_complete(cfg.checkpoint.path) == 2
    sizes = checkpoint.saved_sizes(checkpoint.iteration_dir(cfg.checkpoint.path, 2))
    assert sizes["model.embedding.tok.weight"] == torch.Size([LLAMA.vocab_size, LLAMA.hidden_size])  # whole
    got = run_ranks(4, train_on_layout, cfg, lay)[0][1]["records"]
    assert [r["iteration"] for r in got] == [3, 4, 5]
    assert [r["loss"] for r in got] == pytest.approx(want[2:], abs=1e-6)


def test_a_planned_tensor_parallel_layout_trains_like_one_process():
    """The small twin of examples/jobs/llama3-70b.yaml's plan (tensor > 1, sequence parallelism,
    GQA, stages on two NIC islands): the Layout the planner writes, run by the trainer."""
    from holmes.contract import JobSpec
    from holmes.plan import plan
    from tests.helpers.plan.plan_helpers import node

    job = JobSpec.from_spec(
        {
            "model": LLAMA.to_spec(),
            "training": {"globalBatchSize": 16, "microBatchSize": 2, "iterations": 4, "learningRate": 0.5},
            "parallelism": {"tensor": 2, "pipeline": 2, "sequenceParallel": True},
            "nodes": {"count": 2, "gpusPerNode": 2},
        }
    )
    layout = plan([node("ib-0", "infiniband", "east", gpus=2), node("roce-0", "roce", "west", gpus=2)], job)
    assert (layout.tensor, layout.pipeline, layout.data) == (2, 2, 1)
    assert {g.kind for g in layout.groups} >= {"tp", "dp", "p2p", "pp"}
    cfg = tiny_config(model=LLAMA, sequence_parallel=True, micro_batch_size=2, global_batch_size=16)
    assert_matches_reference(cfg, layout)


def test_a_planned_layout_with_tensor_groups_over_nodes_of_an_nvlink_domain_trains_like_one_process():
    """The small twin of examples/jobs/llama3-70b-gb200.yaml's plan: one-GPU nodes of one NVLink
    domain (GFD's clique label), tensor 2, so each tensor group spans two nodes: the version-4
    Layout the planner writes, whose groups the trainer forms, trains as one process does."""
    from holmes.contract import JobSpec
    from holmes.contract.layout import NVLINK_VERSION
    from holmes.plan import plan
    from tests.helpers.plan.plan_helpers import node

    job = JobSpec.from_spec(
        {
            "model": LLAMA.to_spec(),
            "training": {"globalBatchSize": 16, "microBatchSize": 2, "iterations": 4, "learningRate": 0.5},
            "parallelism": {"tensor": 2, "pipeline": 2, "sequenceParallel": True},
            "nodes": {"count": 4, "gpusPerNode": 1},
        }
    )
    clique = {"nvidia.com/gpu.clique": "6f0d1c2e-8a41-4b7e-9c55-2d1e0a7b3f10.1"}
    nodes = [node(f"gb-{i}", "infiniband", "east", gpus=1, labels=clique) for i in range(4)]
    layout = plan(nodes, job)
    assert (layout.tensor, layout.pipeline, layout.data, layout.version) == (2, 2, 1, NVLINK_VERSION)
    assert [len({r // 1 for r in g.ranks}) for g in layout.process_groups("tp")] == [2, 2]
    cfg = tiny_config(model=LLAMA, sequence_parallel=True, micro_batch_size=2, global_batch_size=16)
    assert_matches_reference(cfg, layout)
