"""Interleaved and zero-bubble schedules with virtual stages: the same losses, grad norms and
parameters as the single-process reference, and each gradient bucket's reduce-scatter started
as soon as its last weight gradient is final, whatever the schedule (recorded calls)."""

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from holmes.trainer.engine import Trainer
from tests.helpers.trainer.trainer_harness import (
    TINY,
    assert_matches_reference,
    make_layout,
    run_ranks,
    tiny_config,
)

EIGHT_LAYERS = replace(TINY, layers=8)


@pytest.mark.parametrize(
    "schedule, pipeline, data, split, micro_batches",
    [
        # uneven virtual stages, a middle rank-stage, and the wrap-around link P-1 -> 0
        ("Interleaved1F1B", 3, 1, [1, 2, 1, 1, 2, 1], 6),
        ("InterleavedZeroBubble", 2, 2, [3, 1, 2, 2], 4),
        ("ZBVZeroBubble", 3, 1, [2, 1, 1, 1, 1, 2], 6),
        ("DualPipeV", 2, 2, [1, 2, 3, 2], 4),
    ],
)
def test_every_schedule_matches_the_single_process_reference(schedule, pipeline, data, split, micro_batches):
    cfg = tiny_config(model=EIGHT_LAYERS, global_batch_size=2 * micro_batches * data)
    assert_matches_reference(cfg, make_layout(pipeline, data, split, 2, micro_batches, schedule=schedule))


@pytest.mark.parametrize("schedule", ["ZBVZeroBubble", "InterleavedZeroBubble"])
def test_a_split_backward_under_activation_recompute_matches_the_reference(schedule):
    """The job's default: each block rebuilt in backward, here once for the input gradient's pass
    and read again by the weight gradient's."""
    cfg = tiny_config(model=EIGHT_LAYERS, activation_recompute=True)
    assert_matches_reference(cfg, make_layout(2, 1, [2, 2, 2, 2], 2, 8, schedule=schedule))


@pytest.mark.parametrize("schedule", ["ZBVZeroBubble", "Interleaved1F1B"])
def test_tied_embeddings_match_the_reference_on_one_rank_or_across_the_pipeline(schedule):
    """V-shaped: the first rank holds the embedding and the head, so the tied matrix gets a
    gradient from two chunks per micro-batch (no embedding group). Looped: the head is on the
    last rank, summed over the embedding group as with 1F1B."""
    cfg = tiny_config(model=replace(TINY, tied_embeddings=True))
    probe = make_layout(2, 1, [1, 1, 1, 1], 2, 8, schedule=schedule)
    layout = make_layout(2, 1, [1, 1, 1, 1], 2, 8, schedule=schedule, embedding=probe.embedding_split)
    assert probe.embedding_split == (schedule == "Interleaved1F1B")
    assert_matches_reference(cfg, layout)


def _record_reduce_starts(rank, cfg, layout):
    """One iteration with every landed weight gradient and every reduce-scatter recorded in
    order, and where the schedule ended."""
    trainer = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    opt, events = trainer.opt, []
    land, reduce_scatter = opt._land, dist.reduce_scatter_single

    def landing(i, p):
        events.append(("grad", opt.bucket_of[i], opt.seen[i] + 1 == opt.expected[i]))  # the last one?
        land(i, p)

    def recorded(out, src, group=None, async_op=False):
        bucket = next(b.index for b in opt.buckets if b.grad_shard is out or b.reduce_out is out)
        events.append(("reduce", bucket, async_op))
        return reduce_scatter(out, src, group=group, async_op=async_op)

    opt._land = landing
    dist.reduce_scatter_single = recorded
    run = trainer.runner.run
    trainer.runner.run = lambda *a: (run(*a), events.append(("schedule done", None, None)))[0]
    trainer.train_step()
    return {"events": events, "buckets": len(opt.buckets), "pending": [len(b.params) for b in opt.buckets]}


@pytest.mark.parametrize(
    "schedule, split",
    [
        ("1F1B", [2, 2]),
        ("Interleaved1F1B", [1, 1, 1, 1]),
        ("InterleavedZeroBubble", [1, 1, 1, 1]),
        ("ZBVZeroBubble", [1, 1, 1, 1]),
        ("DualPipeV", [1, 1, 1, 1]),
    ],
)
def test_each_bucket_reduce_scatter_starts_when_its_last_weight_gradient_lands(schedule, split):
    """Before: a split backward's weight step assigns .grad itself, no post-accumulate-grad hook
    fired, and finish_grad_sync found every parameter without its gradients."""
    cfg = tiny_config(iterations=1, bucket_elements=3000, global_batch_size=32)
    layout = make_layout(2, 2, split, 2, 8, schedule=schedule)
    for rank, (_, out) in run_ranks(4, _record_reduce_starts, cfg, layout).items():
        events = out["events"]
        done = events.index(("schedule done", None, None))
        reduces = [(i, e) for i, e in enumerate(events) if e[0] == "reduce"]
        assert sorted(b for _, (_, b, _) in reduces) == list(range(out["buckets"])), (rank, events)
        for i, (_, bucket, async_op) in reduces:
            # started asynchronously inside the schedule, right after the bucket's last gradient
            assert async_op and i < done, (rank, schedule, events)
            assert events[i - 1] == ("grad", bucket, True), (rank, schedule, events[i - 3 : i + 1])
            later = [e for e in events[i + 1 :] if e[:2] == ("grad", bucket)]
            assert not later, f"rank {rank}: a gradient of bucket {bucket} after its reduce-scatter"


def test_evaluation_with_virtual_stages_is_refused_with_the_fix():
    from holmes.contract.spec_sections import EvalSpec
    from holmes.trainer.config import TrainerConfigError

    looped = make_layout(2, 1, [1, 1, 1, 1], 2, 8, schedule="Interleaved1F1B")
    cfg = tiny_config(eval=EvalSpec(path="/eval.bin", interval_iterations=1))
    with pytest.raises(TrainerConfigError, match="set training.pipelineSchedule to 1F1B"):
        cfg.check_against_layout(looped)


@pytest.mark.parametrize("schedule, sequence_parallel", [("ZBVZeroBubble", True), ("Interleaved1F1B", False)])
def test_tensor_parallel_chunks_match_the_reference(schedule, sequence_parallel):
    cfg = tiny_config(sequence_parallel=sequence_parallel)
    layout = make_layout(2, 1, [1, 1, 1, 1], 2, 8, schedule=schedule, tensor=2)
    assert_matches_reference(cfg, layout, param_atol=1e-5)
