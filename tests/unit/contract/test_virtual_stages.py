"""Virtual stages in the contract: where each schedule puts a rank's chunks, which links they
use, the version-3 Layout that carries them (version 2 unchanged), and the spec's fields."""

import pytest

from holmes.contract import SpecError
from holmes.contract import pipeline_schedules as sched
from holmes.contract.jobspec import JobSpec
from holmes.contract.layout import LAYOUT_VERSION, Layout, LayoutError
from tests.helpers.contract.layout_helpers import virtual_layout


def test_looped_chunks_go_round_the_ranks_and_v_shaped_ones_down_and_back():
    assert [sched.owner("Interleaved1F1B", 3, k) for k in range(6)] == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)
    ]  # fmt: skip
    assert [sched.owner("ZBVZeroBubble", 3, k) for k in range(6)] == [
        (0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)
    ]  # fmt: skip
    for name in ("Interleaved1F1B", "ZBVZeroBubble"):
        for k in range(6):
            assert sched.virtual_stage(name, 3, *sched.owner(name, 3, k)) == k
    # a V never leaves its neighbours: the turn stays on one rank (what each costs: tests/plan)
    assert sched.link("ZBVZeroBubble", 3, 2) is None
    assert sched.link("ZBVZeroBubble", 3, 1) == 1 and sched.link("Interleaved1F1B", 3, 2) == 2


def test_a_v_shaped_layout_round_trips_as_version_3_and_places_the_head_on_rank_0():
    lay = virtual_layout("ZBVZeroBubble", [[(0, 2), (7, 8)], [(2, 4), (6, 7)], [(4, 5), (5, 6)]])
    assert lay.virtual_stages == 2 and lay.num_layers == 8
    assert lay.virtual_layers() == [(0, 2), (2, 4), (4, 5), (5, 6), (6, 7), (7, 8)]
    assert [s.num_layers for s in lay.stages] == [3, 3, 2]
    assert not lay.embedding_split  # the first and last virtual stage share rank 0
    d = lay.to_dict()
    assert d["version"] == 3 and d["pipelineSchedule"] == "ZBVZeroBubble"
    assert d["stages"][0]["chunks"] == [[0, 2], [7, 8]]
    assert Layout.from_dict(d) == Layout.from_dict(Layout.from_dict(d).to_dict())


def test_a_looped_layout_needs_the_wrap_around_link_and_one_chunk_layouts_stay_version_2():
    chunks = [[(0, 1), (2, 3)], [(1, 2), (3, 4)]]
    lay = virtual_layout("Interleaved1F1B", chunks)
    wrap = [g.ranks for g in lay.process_groups("p2p") if g.stage == 1]
    assert wrap == [(1, 0)] and lay.embedding_split
    with pytest.raises(LayoutError, match="boundary 0..1 \\(P-1: the wrap-around link"):
        virtual_layout("Interleaved1F1B", chunks, wrap=False)
    plain = virtual_layout("1F1B", [[(0, 2)], [(2, 4)]], version=LAYOUT_VERSION)
    d = plain.to_dict()
    assert d["version"] == 2 and "pipelineSchedule" not in d and "chunks" not in d["stages"][0]


@pytest.mark.parametrize(
    "schedule, chunks, version, message",
    [
        ("ZBVZeroBubble", [[(0, 1), (3, 4)], [(1, 2), (2, 3)]], 2, "need layout version 3"),
        ("1F1B", [[(0, 2)], [(2, 4)]], 3, "version 3 is only for them"),
        ("ZBVZeroBubble", [[(0, 1), (2, 3)], [(1, 2), (3, 4)]], 3, "virtual stage 2 \\(stage 1 chunk 1\\)"),
        ("ZBVZeroBubble", [[(0, 1), (3, 4), (4, 5)], [(1, 2), (2, 3), (5, 6)]], 3, "runs 2 virtual"),
        ("Bogus", [[(0, 1), (3, 4)], [(1, 2), (2, 3)]], 3, "pipelineSchedule 'Bogus' is not one of"),
    ],
)
def test_broken_virtual_layouts_are_refused_with_the_reason(schedule, chunks, version, message):
    with pytest.raises(LayoutError, match=message):
        virtual_layout(schedule, chunks, version=version, wrap=False)


def _spec(**training):
    return {
        "model": {"layers": 4, "hiddenSize": 32, "attentionHeads": 4, "seqLength": 16, "vocabSize": 64},
        "training": {
            "globalBatchSize": 8,
            "microBatchSize": 1,
            "iterations": 1,
            "learningRate": 1.0e-3,
            **training,
        },
        "nodes": {"count": 2, "gpusPerNode": 1},
    }


def test_the_spec_defaults_to_auto_and_checks_virtual_stages_against_the_schedule():
    job = JobSpec.from_spec(_spec())
    assert job.training.pipeline_schedule == "auto" and job.training.virtual_stages is None
    assert (
        JobSpec.from_spec(_spec(pipelineSchedule="Interleaved1F1B", virtualStages=3)).training.virtual_stages
        == 3
    )
    with pytest.raises(SpecError, match="virtualStages: ZBVZeroBubble runs 2 chunk"):
        JobSpec.from_spec(_spec(pipelineSchedule="ZBVZeroBubble", virtualStages=3))
    with pytest.raises(SpecError, match="pipelineSchedule"):
        JobSpec.from_spec(_spec(pipelineSchedule="ZeroBubble"))
