"""Failing loudly, in-process (a dying rank among forked ones:
tests/integration/trainer/test_trainer_failures.py)."""

import pytest
import torch
from torch import nn

from holmes.trainer.config import OptimizerConfig
from holmes.trainer.dist_optimizer import DistributedOptimizer


class _Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.forgotten = nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


def test_a_parameter_without_gradient_fails_loudly_by_name():
    m = _Unused()
    opt = DistributedOptimizer(
        m,
        OptimizerConfig(kind="sgd", learning_rate=0.1),
        dp_group=None,
        dp_size=1,
        dp_rank=0,
        micro_batches=2,
    )
    for _ in range(2):
        m(torch.randn(3, 4)).sum().backward()
    with pytest.raises(RuntimeError, match=r"forgotten\.weight \(0/2\)"):
        opt.finish_grad_sync()


def test_buckets_are_padded_to_the_dp_size_and_params_are_views():
    m = nn.Sequential(nn.Linear(5, 3), nn.Linear(3, 7))
    before = [p.detach().clone() for p in m.parameters()]
    opt = DistributedOptimizer(
        m,
        OptimizerConfig(kind="sgd", learning_rate=0.1, weight_decay=0.0),
        dp_group=None,
        dp_size=1,
        dp_rank=0,
        micro_batches=1,
        bucket_elements=20,
    )
    assert len(opt.buckets) >= 2
    for p, b in zip(m.parameters(), before):
        assert torch.equal(p, b)
        assert p.untyped_storage().data_ptr() == opt.param_buffer.untyped_storage().data_ptr()
    # a grad applied by hand and stepped equals plain SGD
    m(torch.ones(2, 5)).sum().backward()
    opt.finish_grad_sync()
    grads = [g.clone() for g in opt.main_grads]
    opt.step(lr=0.1)
    for p, b in zip(m.parameters(), before):
        j = next(i for i, q in enumerate(opt.params) if q is p)
        assert torch.allclose(p, b - 0.1 * grads[j])
