"""The bubble table the planner reads (operator/holmes/plan/pipeline_bubble_table.json, through
holmes.plan.pipeline_cost): regenerated here from torch's own schedule orders, so it cannot drift
from the torch installed; the file is exactly what its generator writes; and what it says at the
pipeline-schedules bench's point (P = M = 3)."""

import json
import random

import gen_bubble_table as table  # hack/ (on the tests path), needs torch
import pytest

from holmes.plan import pipeline_cost as cost

IDLE_UNITS = cost.table().idle_units


def test_the_table_covers_exactly_the_grid_torch_accepts():
    assert set(IDLE_UNITS) == set(table.grid())
    assert (cost.table().max_pipeline, cost.table().max_micro_batches) == (
        table.MAX_PIPELINE,
        table.MAX_MICRO_BATCHES,
    )


def test_every_run_and_a_sample_inside_them_regenerated_from_torch_agree():
    """Both ends of every run (where the idle units change), a random sample of the rest and the
    points the bench and the docs quote."""
    runs = json.loads(table.OUT.read_text())["runs"]
    ends = {(n, p, v, m) for n, p, v, first, last, _ in runs for m in (first, last)}
    assert ends <= set(IDLE_UNITS)
    sample = sorted(ends) + random.Random(40).sample(sorted(IDLE_UNITS), 40)
    sample += [
        ("Interleaved1F1B", 3, 4, 3),
        ("InterleavedZeroBubble", 3, 4, 3),
        ("ZBVZeroBubble", 3, 2, 3),
        ("DualPipeV", 8, 2, 32),
        ("InterleavedZeroBubble", 8, 4, 32),
    ]
    for key in sample:
        assert table.torch_idle_units(*key) == pytest.approx(IDLE_UNITS[key], abs=1e-6), key


def test_the_file_is_what_the_generator_writes():
    """Its runs, order and header as hack/gen_bubble_table.py renders them (no hand edit), 72 runs
    for 975 entries; and the runs read back to the same entries."""
    text = table.OUT.read_text()
    assert table.render(dict(IDLE_UNITS), json.loads(text)["torch"]) == text
    assert len(table.runs(dict(IDLE_UNITS))) == 72 and len(IDLE_UNITS) == 975
    assert cost.expand_runs(table.runs(dict(IDLE_UNITS))) == IDLE_UNITS


def test_gpipe_replayed_from_torch_idles_p_minus_1_steps():
    """The simulation on a torch order whose bubble is known: GPipe's (P-1) t."""
    for P, M in [(2, 2), (3, 3), (4, 9)]:
        assert table.torch_idle_units("GPipe", P, 1, M) == pytest.approx(P - 1)


def test_at_the_benchs_m_equal_p_the_zbv_bubble_is_twice_the_papers_figure():
    """P = M = 3 (bench/pipeline_schedules.py): torch's orders keep the papers' 1/4 (interleaved,
    v=4) and 1/12 (zero bubble, v=4) of 1F1B's bubble when F, I and W take equal time; ZB-V keeps
    1/3, not 1/6: its warm-up counts on 2P-1 micro-batches and torch drops the ones past M."""
    P, M = 3, 3
    one = cost.bubble_units("1F1B", P, 1, M)
    assert one == 2
    assert cost.bubble_units("Interleaved1F1B", P, 4, M) / one == pytest.approx(1 / 4, abs=1e-5)
    assert cost.bubble_units("InterleavedZeroBubble", P, 4, M) / one == pytest.approx(1 / 12, abs=1e-5)
    assert cost.bubble_units("ZBVZeroBubble", P, 2, M) / one == pytest.approx(1 / 3, abs=1e-5)
    assert cost.bubble_units("ZBVZeroBubble", P, 2, 2 * P - 1) / one == pytest.approx(1 / 6, abs=1e-5)
    assert cost.bubble_basis("ZBVZeroBubble", P, 2, M) == cost.SIMULATED


def test_outside_the_table_the_papers_figure_is_used_and_said():
    key = ("InterleavedZeroBubble", 16, 2, 64)
    assert key not in IDLE_UNITS
    assert cost.bubble_units(*key) == pytest.approx(15 / 3 / 2)
    assert cost.bubble_basis(*key).startswith(cost.PAPERS) and "P <= 8, M <= 32" in cost.bubble_basis(*key)
