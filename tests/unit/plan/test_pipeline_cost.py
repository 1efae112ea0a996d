"""What each pipeline schedule costs the planner (holmes.plan.pipeline_cost): its bubble, the
micro-batches in flight, the boundaries a micro-batch crosses; and the bubble table read from its
runs, a broken one refused with the fix."""

import json

import pytest

from holmes.contract import pipeline_schedules as sched
from holmes.plan import pipeline_cost as cost


def test_a_v_crosses_each_boundary_twice_and_a_loop_v_times_plus_the_wrap_around():
    # a V never leaves its neighbours: each boundary twice, the turn on one rank, no wrap-around
    assert cost.crossings("ZBVZeroBubble", 3, 2) == {0: 2, 1: 2}
    assert sched.link("ZBVZeroBubble", 3, 2) is None
    # a loop crosses each boundary v times and the link from the last rank to the first v-1 times
    assert cost.crossings("Interleaved1F1B", 3, 3) == {0: 3, 1: 3, 2: 2}


def test_bubble_and_in_flight_micro_batches_per_schedule():
    P, M = 4, 8
    one = cost.bubble_fraction("1F1B", P, 1, M)
    assert one == pytest.approx(3 / 11)
    assert cost.bubble_fraction("Interleaved1F1B", P, 2, M) == pytest.approx(1.5 / 9.5)
    assert cost.bubble_fraction("ZBVZeroBubble", P, 2, M) < cost.bubble_fraction("Interleaved1F1B", P, 2, M)
    assert cost.in_flight("GPipe", P, 1, M) == M
    assert cost.in_flight("1F1B", P, 1, M) == P and cost.in_flight("1F1B", P, 1, M, stage=3) == 1
    assert cost.in_flight("DualPipeV", P, 2, M) > cost.in_flight("ZBVZeroBubble", P, 2, M)
    assert cost.actions("1F1B", 1) == 2 and cost.actions("InterleavedZeroBubble", 2) == 6


def test_a_run_covers_only_the_micro_batches_torch_accepts():
    """Interleaved1F1B at P = 3 refuses M = 7 and 10 (M a multiple of M // P): a run from 6 to 10
    holds 6, 8 and 9."""
    runs = [["Interleaved1F1B", 3, 2, 6, 10, 1.0], ["DualPipeV", 2, 2, 4, 5, 0.5]]
    assert cost.expand_runs(runs) == {
        ("Interleaved1F1B", 3, 2, 6): 1.0,
        ("Interleaved1F1B", 3, 2, 8): 1.0,
        ("Interleaved1F1B", 3, 2, 9): 1.0,
        ("DualPipeV", 2, 2, 4): 0.5,
        ("DualPipeV", 2, 2, 5): 0.5,
    }


def test_a_broken_table_is_refused_with_the_fix():
    good = {"max_pipeline": 8, "max_micro_batches": 32, "columns": list(cost.RUN_COLUMNS), "runs": []}
    assert cost.read_table(json.dumps(good)).idle_units == {}
    broken = [{**good, "columns": ["schedule"]}, {k: v for k, v in good.items() if k != "max_pipeline"}]
    for text in ["{", *map(json.dumps, broken)]:
        with pytest.raises(ValueError, match=r"^x.json: .*regenerate it with `make bubble-table`"):
            cost.read_table(text, "x.json")
