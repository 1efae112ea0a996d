"""The distributed optimizer's own paths: padded buckets with DP > 1, AdamW parameter parity,
fp32 master weights under bf16, and the pipeline schedules a layout accepts or refuses."""

import pytest
import torch

from holmes.trainer.config import OptimizerConfig, TrainerConfigError
from holmes.trainer.engine import Trainer
from tests.helpers.trainer.trainer_harness import (
    assert_matches_reference,
    make_layout,
    run_ranks,
    tiny_config,
)

ADAMW = OptimizerConfig(kind="adamw", learning_rate=2e-3, weight_decay=0.1, warmup_iterations=1)


def _bucket_sizes(rank, cfg, layout):
    trainer = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    opt = trainer.opt
    raw = [sum(opt.params[i].numel() for i in b.params) for b in opt.buckets]
    return {"raw": raw, "padded": [b.size for b in opt.buckets]}


def test_buckets_padded_for_three_dp_ranks_still_match_the_reference():
    cfg = tiny_config(global_batch_size=12, optimizer=ADAMW, iterations=3)
    layout = make_layout(1, 3, [4], 2, 2)
    sizes = run_ranks(3, _bucket_sizes, cfg, layout)[0][1]
    padding = [p - r for r, p in zip(sizes["raw"], sizes["padded"])]
    assert all(p % 3 == 0 for p in sizes["padded"]) and any(padding), sizes  # some bucket is padded
    assert_matches_reference(cfg, layout, param_atol=1e-5)


@pytest.mark.parametrize(
    "pipeline, data, split, schedule",
    [
        (3, 2, [1, 2, 1], "1F1B"),  # a middle stage: receives activations and sends gradients back
        (2, 2, [3, 1], "GPipe"),
    ],
)
def test_adamw_parameters_match_the_reference(pipeline, data, split, schedule):
    cfg = tiny_config(optimizer=ADAMW, iterations=3, pipeline_schedule=schedule)
    # every stage reports its parameters, the middle one too
    assert_matches_reference(cfg, make_layout(pipeline, data, split, 2, 4), param_atol=1e-5)


def _master_weights(rank, cfg, layout):
    trainer = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    trainer.train()
    opt = trainer.opt
    opt.wait_param_gathers()
    out = []
    for b in opt.buckets:
        live = opt.param_buffer[b.shard]
        out.append(
            {
                "master": b.master.dtype,
                "param": live.dtype,
                "rounded_from_master": torch.equal(b.master.to(live.dtype), live),
                "finer_than_param": bool((b.master != live.float()).any()),
            }
        )
    return out


def test_master_weights_are_fp32_and_the_bf16_parameters_are_rounded_from_them():
    cfg = tiny_config(
        dtype="bfloat16",
        optimizer=OptimizerConfig(kind="sgd", learning_rate=1e-3, weight_decay=0.0),
        iterations=2,
    )
    res = run_ranks(2, _master_weights, cfg, make_layout(1, 2, [4], 2, 4))
    for _, (_, buckets) in res.items():
        for b in buckets:
            assert b["master"] == torch.float32 and b["param"] == torch.bfloat16
            assert b["rounded_from_master"]
        # updates smaller than bf16's resolution live on in the fp32 master
        assert any(b["finer_than_param"] for b in buckets)


def test_unknown_schedules_and_schedules_the_layout_was_not_planned_for_are_refused():
    with pytest.raises(TrainerConfigError, match="not one of auto, 1F1B, GPipe, Interleaved1F1B"):
        tiny_config(pipeline_schedule="1f1b")
    # a one-chunk layout cannot run a V-shaped schedule: it needs two chunks per rank
    with pytest.raises(TrainerConfigError, match="re-plan with training.pipelineSchedule ZBVZeroBubble"):
        tiny_config(pipeline_schedule="ZBVZeroBubble").check_against_layout(make_layout(2, 1, [2, 2], 2, 8))
    looped = make_layout(2, 1, [1, 1, 1, 1], 2, 8, schedule="Interleaved1F1B")
    with pytest.raises(TrainerConfigError, match="planned for Interleaved1F1B with 2"):
        tiny_config(pipeline_schedule="1F1B").check_against_layout(looped)
    # the same placement with a split backward runs on it
    zero_bubble = tiny_config(pipeline_schedule="InterleavedZeroBubble")
    assert zero_bubble.schedule_for(looped) == "InterleavedZeroBubble"
    assert tiny_config().schedule_for(looped) == "Interleaved1F1B"  # auto: the layout's


@pytest.mark.parametrize("dp_size", [3, 5, 6])
def test_every_parameter_bucket_and_shard_starts_256_byte_aligned(dp_size):
    """With D = 3, 5, 6 the old padding (a multiple of D) put parameter views and shards at odd
    offsets: cuBLAS and NCCL then get unaligned pointers. Built on the meta device: no memory."""
    from holmes.trainer.dist_optimizer import DistributedOptimizer
    from holmes.trainer.model import meta_stage

    cfg = tiny_config()
    module = meta_stage(cfg.model, 0, cfg.model.layers, True, True, dtype="bfloat16")
    for r in range(dp_size):
        opt = DistributedOptimizer(
            module, ADAMW, dp_group=None, dp_size=dp_size, dp_rank=r, micro_batches=2, bucket_elements=3000
        )
        starts = list(opt.offsets) + [b.start for b in opt.buckets] + [b.shard.start for b in opt.buckets]
        assert all(s * 2 % 256 == 0 for s in starts), [s for s in starts if s * 2 % 256]
        assert all(b.size % dp_size == 0 for b in opt.buckets)
