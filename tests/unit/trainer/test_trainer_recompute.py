"""Activation recomputation: same numbers as without, real (blocks run twice, fewer saved tensors),
preserves RNG, flows from the job (the engine on forked ranks, with the overlapped distributed
optimizer's hooks: tests/integration/trainer/test_trainer_recompute.py)."""

import torch
import torch.nn.functional as F

import holmes.trainer.model as model_mod
from holmes.contract.jobspec import JobSpec
from holmes.trainer.config import TrainConfig
from holmes.trainer.models import gpt
from tests.helpers.trainer.trainer_harness import TINY

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
