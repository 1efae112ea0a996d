"""The planner's choice of pipeline schedule and virtual stages (plan/schedule_choice.py): priced
by bubble, p2p crossings and memory, explained, and written into the Layout it returns."""

from dataclasses import replace

import pytest

from holmes.contract.layout import Layout
from holmes.plan import CostModelConfig, plan
from holmes.plan.errors import PlanError
from holmes.plan.schedule_choice import chunk_split
from tests.helpers.plan.plan_helpers import job_spec, node, paper_nodes

# three islands, one stage each: a few micro-batches, so 1F1B idles most in fill and drain
THREE_ISLANDS = (
    [node(f"a{i}", "infiniband", "east") for i in range(2)]
    + [node(f"b{i}", "infiniband", "west") for i in range(2)]
    + [node(f"c{i}", "infiniband", "south") for i in range(2)]
)


def three_island_job(hidden=4096, B=48, **training):
    """M = B / 16: 3 micro-batches by default (M = P)."""
    spec = job_spec(layers=24, hidden=hidden, heads=16, B=B, mb=1, count=6, pipeline=3, data=16)
    spec["training"].update(training)
    return spec


# links between the islands as fast as inside them (400 Gbit/s): the bubble is what is left
_base = CostModelConfig()
FAT_LINKS = replace(_base, fabric=replace(_base.fabric, socket_gbps=400, cross_cluster_gbps=400))


def test_few_micro_batches_over_three_islands_pick_a_zero_bubble_schedule_and_say_why():
    lay = plan(THREE_ISLANDS, three_island_job(B=96), FAT_LINKS)  # M = 6 >= 2P - 1
    assert lay.schedule == "ZBVZeroBubble" and lay.virtual_stages == 2 and lay.version == 3
    one = plan(THREE_ISLANDS, three_island_job(B=96, pipelineSchedule="1F1B"), FAT_LINKS)
    assert one.version == 2 and one.schedule == "1F1B" and one.virtual_stages == 1
    # the same placement and layers per GPU; the estimate follows the schedule
    assert lay.nodes == one.nodes and [s.num_layers for s in lay.stages] == [s.num_layers for s in one.stages]
    assert lay.estimate["iterationSeconds"] < one.estimate["iterationSeconds"]
    assert lay.estimate["pipelineSchedule"] == "ZBVZeroBubble" and lay.estimate["bubbleSeconds"] > 0
    why = [line for line in lay.explanation if line.startswith("schedule:")]
    assert why and "x 1F1B: bubble" in why[0] and "p2p" in why[0] and "memory" in why[0], why
    assert any(line.strip().startswith("1F1B:") for line in lay.explanation)
    # V-shaped: the head sits with the embedding on the first stage, chunks on their own GPUs
    assert lay.virtual_layers()[-1][1] == 24 and lay.stages[0].chunks[1][1] == 24
    assert Layout.from_json(lay.to_json()) == lay


def test_at_m_equal_p_torchs_zbv_keeps_twice_the_bubble_and_interleaved_zero_bubble_wins():
    """M = P = 3: torch's ZB-V order plans its warm-up for 2P-1 micro-batches and drops the ones
    past M, keeping 1/3 of 1F1B's bubble (the papers' figure, 1/6, holds from M = 2P-1), as the
    simulation of its order says; InterleavedZeroBubble's v=2 order keeps 1/6 even there."""
    lay = plan(THREE_ISLANDS, three_island_job(), FAT_LINKS)
    assert lay.schedule == "InterleavedZeroBubble" and lay.virtual_stages == 2
    assert "  its bubble: 0.333 micro-batch steps idle (1F1B: 2) at M=3, simulated on torch's" in "\n".join(
        lay.explanation
    )
    zbv = next(line for line in lay.explanation if line.strip().startswith("ZBVZeroBubble v=2:"))
    assert f"bubble {2 * lay.estimate['bubbleSeconds']:.3g} s" in zbv, zbv


@pytest.mark.parametrize(
    "nodes, spec", [(paper_nodes(), job_spec()), (THREE_ISLANDS, three_island_job(2048))]
)
def test_slow_links_between_islands_keep_1f1b_because_every_chunk_crosses_them(nodes, spec):
    """25 Gbit/s sockets between the islands: two chunks per GPU send each activation over each
    boundary twice, which costs more than the bubble they save."""
    lay = plan(nodes, spec)
    assert lay.schedule == "1F1B" and lay.version == 2
    fat = plan(nodes, spec, FAT_LINKS)
    looped = next(line for line in lay.explanation if line.strip().startswith("Interleaved1F1B v=2"))
    assert "p2p" in looped
    assert fat.estimate["iterationSeconds"] < lay.estimate["iterationSeconds"]


def test_a_split_backward_under_recompute_is_priced_with_whole_activations():
    """Between a micro-batch's input- and weight-gradient passes its recomputed blocks stay alive:
    gpt-7b on the paper's testbed under ZBV peaked at 179-188 GiB per GPU in the dry run, where
    the plain recompute estimate said 36."""
    spec = job_spec()
    spec["training"]["pipelineSchedule"] = "ZBVZeroBubble"
    with pytest.raises(PlanError, match="ZBVZeroBubble cannot run here: needs 1[5-9][0-9].[0-9] GiB"):
        plan(paper_nodes(), spec)
    spec["training"]["pipelineSchedule"] = "Interleaved1F1B"  # no split: recompute keeps inputs only
    assert plan(paper_nodes(), spec).estimate["memoryPerGpuGiB"] < 45


def test_a_named_schedule_and_virtual_stages_are_honoured_or_refused_with_the_reason():
    lay = plan(
        THREE_ISLANDS, three_island_job(pipelineSchedule="Interleaved1F1B", virtualStages=2), FAT_LINKS
    )
    assert lay.schedule == "Interleaved1F1B" and lay.virtual_stages == 2
    wrap = [g for g in lay.groups if g.kind == "p2p" and g.stage == 2]
    assert wrap, "a looped schedule needs the link from the last stage back to the first"
    with pytest.raises(PlanError, match="DualPipeV cannot run here: DualPipeV needs microBatches"):
        plan(THREE_ISLANDS, three_island_job(pipelineSchedule="DualPipeV"), FAT_LINKS)


def test_an_external_framework_runs_one_stage_per_gpu():
    spec = three_island_job()
    spec["framework"] = "megatron"
    spec["template"] = {
        "spec": {"containers": [{"name": "trainer", "image": "x", "command": ["python", "t.py"]}]}
    }
    assert plan(THREE_ISLANDS, spec, FAT_LINKS).schedule == "1F1B"


def test_chunks_split_each_stage_evenly_with_the_remainder_away_from_the_head():
    split = chunk_split([5, 4, 3], "ZBVZeroBubble", 2)
    assert split == ((3, 2), (2, 2), (2, 1))  # stage 0's chunk 1 ends with the head: the smaller
    looped = chunk_split([5, 4, 3], "Interleaved1F1B", 2)
    assert looped == ((3, 2), (2, 2), (2, 1))  # the last stage's chunk 1 holds the head
    assert chunk_split([1, 4, 3], "Interleaved1F1B", 2) is None


def test_a_fixed_cost_per_p2p_message_charges_schedules_by_the_messages_they_wait_for():
    """p2p_message_seconds: per micro-batch a middle GPU waits for 2 messages under 1F1B, 4
    under ZB-V (two chunks, each with remote neighbours) and 7-8 with four looped chunks."""
    from holmes.plan.schedule_choice import _waits

    assert _waits("1F1B", 3, 1) == [1, 2, 1]
    assert _waits("ZBVZeroBubble", 3, 2) == [2, 4, 2]  # the turn on the last GPU waits for nothing
    assert _waits("Interleaved1F1B", 3, 4) == [7, 8, 7]
    slow = replace(FAT_LINKS, p2p_message_seconds=0.01)
    M = 3  # 48 sequences over 16 data-parallel pipelines of micro-batch 1
    for schedule, waits in (("1F1B", 2), ("ZBVZeroBubble", 4)):
        job = three_island_job(pipelineSchedule=schedule)
        before = plan(THREE_ISLANDS, job, FAT_LINKS).estimate["iterationSeconds"]
        after = plan(THREE_ISLANDS, job, slow).estimate["iterationSeconds"]
        assert 0 < after - before <= M * waits * 0.01 + 1e-9, (schedule, before, after)
    with pytest.raises(ValueError, match="p2p_message_seconds must be >= 0"):
        replace(FAT_LINKS, p2p_message_seconds=-1.0)


def test_a_fixed_cost_per_action_charges_schedules_by_the_actions_they_run():
    """pipeline_action_seconds: per micro-batch a GPU runs 2 actions under 1F1B, 2v with v looped
    chunks, 3 per chunk under a split backward; the fill and drain run 1F1B's steps. Enough of it
    turns the pick from four chunks per GPU to fewer."""
    from holmes.plan.pipeline_cost import actions

    assert [actions("1F1B", 1), actions("Interleaved1F1B", 4), actions("ZBVZeroBubble", 2)] == [2, 8, 6]
    assert actions("InterleavedZeroBubble", 4) == 12
    M, P, a = 3, 3, 0.01
    costly = replace(FAT_LINKS, pipeline_action_seconds=a)
    for schedule, virtual, n in (("1F1B", 1, 2), ("ZBVZeroBubble", 2, 6), ("InterleavedZeroBubble", 4, 12)):
        job = three_island_job(pipelineSchedule=schedule, virtualStages=virtual)
        before = plan(THREE_ISLANDS, job, FAT_LINKS)
        after = plan(THREE_ISLANDS, job, costly)
        assert after.virtual_stages == virtual
        grown = after.estimate["iterationSeconds"] - before.estimate["iterationSeconds"]
        steady, fill = M * n * a, (P - 1) * 2 * a  # the fill's share shrinks with the bubble
        assert steady < grown <= steady + fill + 1e-9, (schedule, grown)
    # h=2048: a step of ~40 ms per micro-batch, where 4 more actions at 10 ms outweigh the bubble
    free, dear = (plan(THREE_ISLANDS, three_island_job(2048), cfg) for cfg in (FAT_LINKS, costly))
    assert (free.schedule, free.virtual_stages) == ("InterleavedZeroBubble", 2) and dear.schedule == "1F1B"
    assert any("overhead" in line for line in dear.explanation if line.startswith("schedule:"))
    assert not any("overhead" in line for line in free.explanation)  # not priced: not shown
    with pytest.raises(ValueError, match="pipeline_action_seconds must be >= 0"):
        replace(FAT_LINKS, pipeline_action_seconds=-0.1)


def test_a_split_backward_dearer_than_a_full_one_hands_the_pick_to_a_schedule_without_it():
    """split_backward_ratio: the zero-bubble schedules pay (ratio - 1) x the backward per
    micro-batch; 1F1B and Interleaved1F1B do not split, so they do not."""
    assert sched_is_split(plan(THREE_ISLANDS, three_island_job(), FAT_LINKS).schedule)
    dear = replace(FAT_LINKS, split_backward_ratio=1.5)
    for schedule in ("1F1B", "Interleaved1F1B"):
        job = three_island_job(pipelineSchedule=schedule)
        same = plan(THREE_ISLANDS, job, dear).estimate["iterationSeconds"]
        assert same == plan(THREE_ISLANDS, job, FAT_LINKS).estimate["iterationSeconds"], schedule
    zbv = three_island_job(pipelineSchedule="ZBVZeroBubble")
    lay = plan(THREE_ISLANDS, zbv, FAT_LINKS)
    grown = plan(THREE_ISLANDS, zbv, dear).estimate["iterationSeconds"] - lay.estimate["iterationSeconds"]
    assert grown > 0
    assert not sched_is_split(plan(THREE_ISLANDS, three_island_job(), dear).schedule)
    with pytest.raises(ValueError, match="split_backward_ratio must be > 0"):
        replace(FAT_LINKS, split_backward_ratio=0.0)


def sched_is_split(name: str) -> bool:
    from holmes.contract.pipeline_schedules import kind

    return kind(name).split_backward


def test_dualpipev_says_torch_overlaps_only_with_a_registered_function_and_holmes_has_none():
    """Before: nothing said that torch 2.13 runs DualPipeV's OVERLAP_F_B actions as forward then
    backward unless a function is registered for them, which Holmes does not do."""
    from pathlib import Path

    lay = plan(THREE_ISLANDS, three_island_job(B=96, pipelineSchedule="DualPipeV"), FAT_LINKS)
    assert lay.schedule == "DualPipeV"
    note = next(line for line in lay.explanation if line.strip().startswith("DualPipeV: torch 2.13"))
    assert "OVERLAP_F_B" in note and "register_custom_function" in note and "Holmes registers none" in note
    auto = plan(THREE_ISLANDS, three_island_job(B=96), FAT_LINKS)
    assert auto.schedule != "DualPipeV" and not any("OVERLAP_F_B" in line for line in auto.explanation)
    docs = (Path(__file__).parents[3] / "docs" / "trainer.md").read_text()
    assert "register_custom_function(OVERLAP_F_B" in docs and "Holmes registers none" in docs
