"""Checkpoints are layout-independent: saved under one layout, resumed under another (pipeline
degree and split, data degree, tensor degree, micro-batches), training continues as if it had
never stopped: the same losses (1e-4 relative) on the same global batches, with AdamW's moments,
its step count, gradient clipping and the learning-rate schedule carried across."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

import pytest
import torch

from holmes.trainer import checkpoint
from holmes.trainer.config import CheckpointConfig, OptimizerConfig
from holmes.trainer.engine import Trainer
from holmes.trainer.tensor_parallel import TensorParallel
from tests.helpers.trainer.trainer_harness import TINY, make_layout, run_ranks, tiny_config, train_on_layout

SIX = replace(TINY, layers=6)
# eps above fp32 summation-order noise (see test_tensor_parallel.py); clipping at 0.5 is active
ADAMW = OptimizerConfig(
    kind="adamw", learning_rate=3e-3, warmup_iterations=2, weight_decay=0.1, eps=1e-6, grad_clip=0.5
)


def _layout(pipeline: int, data: int, split: list[int], tensor: int = 1, embedding: bool = False):
    mb = 16 // (data * 2)  # global batch 16, micro-batch 2
    return make_layout(pipeline, data, split, 2, mb, tensor=tensor, embedding=embedding)


def _copy_checkpoint(root: str, iteration: int, dest) -> str:
    """A fresh checkpoint root holding only ``root``'s checkpoint at ``iteration``."""
    name = os.path.basename(checkpoint.iteration_dir(root, iteration))
    shutil.copytree(checkpoint.iteration_dir(root, iteration), os.path.join(dest, name))
    return str(dest)


def _resume_with_zeroed_moments(rank: int, cfg, layout) -> dict:
    """Resume, then forget Adam's moments: what a checkpoint without them would give."""
    trainer = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    trainer.maybe_resume()
    for b in trainer.opt.buckets:
        b.exp_avg.zero_()
        b.exp_avg_sq.zero_()
    return {"losses": [h["loss"] for h in trainer.train()]}


def _rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def test_resume_under_other_pipeline_and_data_degrees_continues_exactly(tmp_path):
    saver = _layout(2, 2, [4, 2])
    cfg = tiny_config(model=SIX, optimizer=ADAMW, iterations=6)
    root = str(tmp_path / "ckpt")
    full = run_ranks(4, train_on_layout, cfg.with_(checkpoint=CheckpointConfig(root, 3)), saver)
    want = full[0][1]["losses"]
    assert checkpoint.newest_complete(root) == 6
    meta = checkpoint.check_model(checkpoint.iteration_dir(root, 3), SIX.shape())
    assert meta["format"] == 2 and meta["consumedSamples"] == 48 and meta["globalBatchSize"] == 16
    sizes = checkpoint.saved_sizes(checkpoint.iteration_dir(root, 3))
    assert not any(".bucket" in k or ".stage" in k for k in sizes), sorted(sizes)[:5]
    assert sizes["optim.layers.5.attn.qkv.weight.exp_avg"] == torch.Size([3, 32, 32])  # whole, global

    for pipeline, data, split in ((3, 1, [1, 3, 2]), (1, 4, [6])):
        ckpt = CheckpointConfig(_copy_checkpoint(root, 3, tmp_path / f"pp{pipeline}dp{data}"), 3)
        res = run_ranks(
            pipeline * data, train_on_layout, cfg.with_(checkpoint=ckpt), _layout(pipeline, data, split)
        )
        got = res[0][1]["records"]
        assert [r["iteration"] for r in got] == [4, 5, 6]
        assert _rel([r["loss"] for r in got], want[3:]) < 1e-4, (
            pipeline,
            data,
            [r["loss"] for r in got],
            want,
        )
        assert [r["learningRate"] for r in got] == [r["learningRate"] for r in full[0][1]["records"][3:]]
        assert checkpoint.newest_complete(ckpt.path) == 6  # and it saves again, under its layout

    # the tolerance sees the moments: the same resume without them misses it
    ckpt = CheckpointConfig(_copy_checkpoint(root, 3, tmp_path / "zeroed"), 3)
    res = run_ranks(3, _resume_with_zeroed_moments, cfg.with_(checkpoint=ckpt), _layout(3, 1, [1, 3, 2]))
    assert _rel(res[0][1]["losses"], want[3:]) > 1e-3


@pytest.mark.parametrize("architecture", ["gpt", "llama"])
def test_resume_across_tensor_degrees_and_tied_embeddings(tmp_path, architecture):
    """TP=2 x PP=2 (GPT's fused QKV and the row-parallel projections split; the embedding tied
    across stages, its last-stage copy not written) -> TP=1 x DP=2 one stage, and back."""
    model = replace(SIX, tied_embeddings=True)
    if architecture == "llama":
        model = replace(model, architecture="llama", kv_heads=2, ffn_hidden_size=64, rope_theta=10000.0)
    cfg = tiny_config(model=model, optimizer=ADAMW, iterations=5)
    tp2 = _layout(2, 1, [2, 4], tensor=2, embedding=True)
    root = str(tmp_path / "ckpt")
    full = run_ranks(4, train_on_layout, cfg.with_(checkpoint=CheckpointConfig(root, 2)), tp2)
    want = full[0][1]["losses"]
    sizes = checkpoint.saved_sizes(checkpoint.iteration_dir(root, 2))
    assert not any("tied" in k for k in sizes)

    ckpt = CheckpointConfig(_copy_checkpoint(root, 2, tmp_path / "tp1"), 4)
    res = run_ranks(2, train_on_layout, cfg.with_(checkpoint=ckpt), _layout(1, 2, [6]))
    assert _rel(res[0][1]["losses"], want[2:]) < 1e-4
    # saved at 4 under TP=1 x DP=2, resumed under TP=2 x PP=2 again
    shutil.rmtree(checkpoint.iteration_dir(ckpt.path, 5))
    res = run_ranks(4, train_on_layout, cfg.with_(checkpoint=ckpt), tp2)
    assert [r["iteration"] for r in res[0][1]["records"]] == [5]
    assert _rel(res[0][1]["losses"], want[4:]) < 1e-4


def test_another_global_batch_or_optimizer_is_refused_naming_it(tmp_path):
    root = str(tmp_path / "ckpt")
    cfg = tiny_config(iterations=2, checkpoint=CheckpointConfig(root, 2))
    run_ranks(2, train_on_layout, cfg, _layout(2, 1, [3, 1]))
    lay = make_layout(1, 2, [4], 2, 8)
    res = run_ranks(2, train_on_layout, cfg.with_(iterations=4, global_batch_size=32), lay, allow_exit=True)
    assert res[0][0] == "error" and "spec.training.globalBatchSize is 32 here, 16 there" in res[0][1]
    res = run_ranks(
        2,
        train_on_layout,
        cfg.with_(iterations=4, optimizer=ADAMW),
        make_layout(1, 2, [4], 2, 4),
        allow_exit=True,
    )
    assert res[0][0] == "error" and "optimizer (HOLMES_OPTIMIZER) is 'adamw' here, 'sgd' there" in res[0][1]


def test_flat_ranges_become_chunks_of_the_global_tensor():
    # rows 4 x cols 6 on one rank: elements [3, 17) = row 0 cols 3..6, row 1-1, row 2 cols 0..5
    got = checkpoint.flat_chunks("layers.0.mlp.proj.weight", (4, 6), TensorParallel(), 3, 17)
    assert got == [(0, (0, 3), (1, 3)), (3, (1, 0), (1, 6)), (9, (2, 0), (1, 5))]
    # tp rank 1 of 2 holds columns 6..12 of the row-parallel projection
    tp = TensorParallel(2, 1, None)
    assert checkpoint.flat_chunks("layers.0.mlp.proj.weight", (4, 6), tp, 6, 18) == [(0, (1, 6), (2, 6))]
    # GPT's fused QKV [3*4, 2] (tp-local [3*2, 2] on rank 1): whole rows cut where blocks meet
    assert checkpoint.flat_chunks("layers.0.attn.qkv.weight", (6, 2), tp, 2, 10) == [
        (0, (0, 3, 0), (1, 1, 2)),
        (2, (1, 2, 0), (1, 2, 2)),
        (6, (2, 2, 0), (1, 1, 2)),
    ]
    assert checkpoint.stored_global_shape("layers.0.attn.qkv.weight", (6, 2), tp) == (3, 4, 2)
    # 1-D: a bias split by rows, a replicated norm as is
    assert checkpoint.flat_chunks("layers.0.mlp.fc.bias", (8,), tp, 1, 5) == [(0, (9,), (4,))]
    assert checkpoint.flat_chunks("layers.0.ln1.weight", (8,), tp, 1, 5) == [(0, (1,), (4,))]


def test_resume_under_a_v_shaped_schedule_continues_exactly_and_saves_again(tmp_path):
    """A checkpoint holds tensors under global names: chunks of two virtual stages per GPU load
    them as any stage does, and their own checkpoint resumes a one-chunk layout again."""
    from tests.helpers.trainer.trainer_harness import make_layout

    cfg = tiny_config(model=SIX, optimizer=ADAMW, iterations=6)
    root = str(tmp_path / "ckpt")
    full = run_ranks(
        2, train_on_layout, cfg.with_(checkpoint=CheckpointConfig(root, 3)), _layout(2, 1, [3, 3])
    )
    want = full[0][1]["losses"]
    zbv = make_layout(2, 1, [2, 1, 1, 2], 2, 8, schedule="ZBVZeroBubble")
    ckpt = CheckpointConfig(_copy_checkpoint(root, 3, tmp_path / "zbv"), 3)
    got = run_ranks(2, train_on_layout, cfg.with_(checkpoint=ckpt), zbv)[0][1]["records"]
    assert [r["iteration"] for r in got] == [4, 5, 6]
    assert _rel([r["loss"] for r in got], want[3:]) < 1e-4
    meta = checkpoint.check_model(checkpoint.iteration_dir(ckpt.path, 6), SIX.shape())
    assert meta["layout"]["pipelineSchedule"] == "ZBVZeroBubble" and meta["layout"]["chunks"][0] == [
        [0, 2],
        [4, 6],
    ]
