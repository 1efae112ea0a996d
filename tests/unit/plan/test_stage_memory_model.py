"""The planner's memory per GPU counts what the trainer's dry run finds (holmes.trainer.dryrun):
torch's per-micro-batch pipeline buffers, the optimizer shard's extra state, communicators."""

from dataclasses import replace

import pytest

from holmes.contract import JobSpec, ModelCost
from holmes.plan import CostModelConfig
from holmes.plan.costmodel import NCCL_COMMUNICATOR_BYTES, Shape, StageCost, StagePlace
from tests.helpers.plan.plan_helpers import job_spec

MODEL = ModelCost.of(
    JobSpec.from_spec(job_spec(layers=36, hidden=4096, heads=32, seq=2048, vocab=50257, B=64, mb=1)).model
)


def cost(micro_batches: int, s: int = 1, P: int = 4, D: int = 4, T: int = 1) -> StageCost:
    shape = Shape(tensor=T, data=D, pipeline=P, micro_batch=1, micro_batches=micro_batches)
    place = StagePlace(s, s == 0, s == P - 1, None, 0.0, 0.0, inflight=P - s)
    return StageCost(MODEL, shape, place, CostModelConfig())


def test_receive_buffers_grow_with_the_micro_batches_of_an_iteration():
    """torch allocates one activation and one gradient receive buffer per micro-batch and keeps
    them: before, the estimate did not depend on M at all (the in-flight count is min(P-s, M))."""
    one = 1 * 2048 * 4096 * 2  # [mb, s, h] bf16
    middle = cost(256).memory(9) - cost(8).memory(9)
    assert middle == pytest.approx(248 * 2 * one)
    first = cost(256, s=0).memory(9) - cost(8, s=0).memory(9)
    assert first == pytest.approx(248 * one)  # the first stage receives no activations


def test_communicators_and_shard_state_are_counted():
    c = cost(8)
    # world, dp, and two for each p2p group before and after a middle stage: the group's own
    # and the pair's torch 2.13's _batch_p2p sends lone ops on (before: one per p2p group)
    assert c.communicators() == 6
    assert cost(8, s=0, D=1).communicators() == 3
    p = c.params(9)
    shard = cost(8, D=2).memory(9) - c.memory(9)  # half as many data ranks: twice the shard
    assert shard == pytest.approx(p * (12 + 5 + 2) / 4)
    assert NCCL_COMMUNICATOR_BYTES > 0


def test_a_replica_counts_its_outer_optimizer_and_group():
    """acrossIslands.mode replicas (trainer outer.py): fp32 anchor and momentum per shard
    parameter, the exchange in flight with overlapSteps (one fragment on the exchange dtype), the
    outer group's communicator. Before, a replica's estimate was the synchronous job's: 2.1 GiB
    under the dry run's peak on examples/jobs/gpt-7b-replicas.yaml (P=1 x D=32)."""
    from holmes.contract.spec_sections import AcrossIslandsSpec
    from holmes.plan.costmodel import outer_bytes

    assert outer_bytes(AcrossIslandsSpec()) == 0  # the pipeline: no outer optimizer
    sync = AcrossIslandsSpec(mode="replicas", outer_momentum=0.9)
    assert outer_bytes(sync) == 8
    assert outer_bytes(AcrossIslandsSpec(mode="replicas", outer_momentum=0.0)) == 4
    streaming = AcrossIslandsSpec(mode="replicas", fragments=2, overlap_steps=1, exchange_dtype="bfloat16")
    assert outer_bytes(streaming) == 8 + 2 / 2
    plain, D = cost(8), 4
    shape = Shape(tensor=1, data=D, pipeline=4, micro_batch=1, micro_batches=8)
    replica = StageCost(
        MODEL, replace(shape, outer_shard_bytes=9, outer_communicators=1), plain.place, plain.cfg
    )
    assert replica.communicators() == plain.communicators() + 1
    extra = replica.memory(9) - plain.memory(9)
    assert extra == pytest.approx(plain.params(9) * 9 / D + NCCL_COMMUNICATOR_BYTES)
