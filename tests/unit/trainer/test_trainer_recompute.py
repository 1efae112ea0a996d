"""Activation recomputation: same numbers as without, real (blocks run twice, fewer saved tensors),
composes with the overlapped distributed optimizer's hooks, preserves RNG, flows from the job."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import holmes.trainer.model as model_mod
from holmes.contract import ModelCost
from holmes.contract.jobspec import JobSpec
from holmes.trainer.config import TrainConfig
from holmes.trainer.engine import Trainer
from holmes.trainer.models import gpt
from tests.helpers.trainer.trainer_harness import TINY, make_layout, run_ranks, tiny_config

# ---- one process, the model alone ---------------------------------------------------------------


def forward_backward(recompute, seed=0):
    """Loss, parameter grads, bytes the autograd graph saved outside checkpointed blocks, block calls."""
    torch.manual_seed(seed)
    m = model_mod.build_full(TINY, 7, recompute=recompute)
    x = torch.randint(0, TINY.vocab_size, (4, TINY.seq_length))
    y = torch.randint(0, TINY.vocab_size, (4, TINY.seq_length))
    calls = [0]
    for block in m.layers.values():
        block.register_forward_pre_hook(lambda mod, args: calls.__setitem__(0, calls[0] + 1))
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model_mod.loss_fn(m(x), y)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in m.named_parameters()}, saved[0], calls[0]


def test_single_process_same_loss_and_grads_fewer_saved_activations():
    loss_off, grads_off, saved_off, calls_off = forward_backward(False)
    loss_on, grads_on, saved_on, calls_on = forward_backward(True)
    assert loss_on == loss_off
    for name, g in grads_off.items():
        assert torch.allclose(grads_on[name], g, atol=1e-6, rtol=0), name
    assert calls_off == TINY.layers and calls_on == 2 * TINY.layers  # each block's forward ran again
    assert saved_on < saved_off / 4  # blocks kept only their inputs


def test_recompute_replays_the_rng_so_dropout_draws_the_same_masks(monkeypatch):
    plain = gpt.MLP.forward
    monkeypatch.setattr(gpt.MLP, "forward", lambda self, x: F.dropout(plain(self, x), p=0.3, training=True))
    loss_off, grads_off, _, _ = forward_backward(False, seed=3)
    loss_on, grads_on, _, _ = forward_backward(True, seed=3)
    assert loss_on == loss_off
    for name, g in grads_off.items():
        assert torch.allclose(grads_on[name], g, atol=1e-6, rtol=0), name


def test_no_recompute_without_grad():
    m = model_mod.build_full(TINY, 7, recompute=True)
    with torch.no_grad():
        out = m(torch.zeros(1, TINY.seq_length, dtype=torch.long))
    assert out.shape == (1, TINY.seq_length, TINY.vocab_size)


# ---- the engine: PP x DP with the overlapped optimizer ------------------------------------------


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


# ---- from the job ---------------------------------------------------------------------------------


def test_train_config_takes_recompute_from_the_job():
    spec = {
        "model": {"layers": 4, "hiddenSize": 32, "attentionHeads": 4, "seqLength": 16, "vocabSize": 64},
        "training": {"globalBatchSize": 16, "microBatchSize": 2, "iterations": 3, "learningRate": 1e-3},
        "nodes": {"count": 1, "gpusPerNode": 1},
    }
    assert TrainConfig.from_jobspec(JobSpec.from_spec(spec)).activation_recompute is True  # the job's default
    spec["training"]["activationRecompute"] = False
    assert TrainConfig.from_job(spec).activation_recompute is False
    assert TrainConfig.from_job(spec, activation_recompute=True).activation_recompute is True
