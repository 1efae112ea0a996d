"""Activation recomputation in the engine on forked gloo ranks: the same numbers as without, under
pipeline and data parallelism (in one process: tests/unit/trainer/test_trainer_recompute.py)."""

from dataclasses import replace

import pytest
import torch

from holmes.contract import ModelCost
from holmes.trainer.engine import Trainer
from tests.helpers.trainer.trainer_harness import TINY, make_layout, run_ranks, tiny_config


def train_capturing(rank, cfg, layout):
    """Train; record each iteration's reduced gradient shards and how often each block ran forward."""
    trainer = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    calls = {"n": 0}
    for block in trainer.module.layers.values():
        block.register_forward_pre_hook(lambda mod, args: calls.__setitem__("n", calls["n"] + 1))
    grads = []
    step = trainer.opt.step

    def capturing_step(lr, coef=1.0):
        grads.append([b.grad_shard.clone() for b in trainer.opt.buckets])
        step(lr, coef)

    trainer.opt.step = capturing_step
    history = trainer.train()
    return {
        "losses": [h["loss"] for h in history],
        "norms": [h["gradNorm"] for h in history],
        "records": history,
        "grads": grads,
        "block_calls": calls["n"],
        "layers": len(trainer.module.layers),
        "world": layout.world_size,
        "params": {k: v.detach().clone() for k, v in trainer.module.state_dict().items()},
    }


@pytest.mark.parametrize(
    "pipeline, data, split, micro_batches, tied",
    [
        (1, 1, [4], 8, False),  # one process: the engine's plain micro-batch loop
        (2, 2, [1, 3], 4, False),  # PP=2 x DP=2, 1F1B, overlapped reduce-scatter / all-gather
        (2, 2, [2, 2], 4, True),  # ... with the tied embedding's extra all-reduce
    ],
)
def test_engine_recompute_matches_no_recompute(pipeline, data, split, micro_batches, tied):
    lay = make_layout(pipeline, data, split, 2, micro_batches, embedding=tied)
    model = replace(TINY, tied_embeddings=tied)
    world = pipeline * data
    cfg = tiny_config(model=model, overlap=True)
    off = run_ranks(world, train_capturing, cfg.with_(activation_recompute=False), lay)
    on = run_ranks(world, train_capturing, cfg.with_(activation_recompute=True), lay)
    iterations = cfg.iterations
    for r in range(world):
        a, b = off[r][1], on[r][1]
        assert b["losses"] == pytest.approx(a["losses"], abs=1e-6)
        assert b["norms"] == pytest.approx(a["norms"], abs=1e-6)
        assert len(a["grads"]) == len(b["grads"]) == iterations
        for it_a, it_b in zip(a["grads"], b["grads"]):  # reduced gradient shards, every bucket
            for ga, gb in zip(it_a, it_b):
                assert torch.allclose(ga, gb, atol=1e-6, rtol=0), (ga - gb).abs().max()
        for k, v in a["params"].items():
            assert torch.allclose(b["params"][k], v, atol=1e-6, rtol=0), k
        # recomputation really ran: each block's forward twice per micro-batch
        assert a["block_calls"] == a["layers"] * micro_batches * iterations
        assert b["block_calls"] == 2 * a["block_calls"]
    assert on[0][1]["losses"][-1] < on[0][1]["losses"][0]
    # TFLOPS/GPU with the formula that matches what ran
    for res, rec in ((off, False), (on, True)):
        for h in res[0][1]["records"]:
            want = ModelCost.of(model).flops_per_iteration(cfg.global_batch_size, recompute=rec) / (
                h["iterationSeconds"] * world * 1e12
            )
            assert h["tflopsPerGpu"] == pytest.approx(want, rel=1e-9)
