"""Pure parts of bench/pipeline_schedules.py: the per-action cost it derives from a toy-width 1F1B
run is the one that makes the planner's price of that run come out at what was measured."""

from dataclasses import replace

import pipeline_schedules as ps  # noqa: E402
import pytest
from fabric_emulation import planner_config  # noqa: E402

from holmes.plan import plan


@pytest.mark.parametrize("action, message", [(0.004, 0.0005), (0.0015, 0.0)])
def test_the_per_action_cost_inverts_the_planners_price_of_1f1b_at_negligible_flops(action, message):
    toy = ps.smoke_model(replace(ps.MODEL, hidden_size=16, seq_length=16))
    config = replace(
        planner_config(1e6, 1e4, 1e4), p2p_message_seconds=message, pipeline_action_seconds=action
    )  # a million TFLOP/s and 10 Tbit/s links: what is left is the per-action and -message costs
    layout = plan(ps.nodes(), ps.job(toy, 6, "1F1B", ps.M), config)
    seconds = layout.estimate["iterationSeconds"]
    assert seconds == pytest.approx(2 * (ps.M + ps.P - 1) * action + 2 * ps.M * message, rel=1e-3)
    assert ps.action_seconds(seconds, message, ps.M) == pytest.approx(action, rel=1e-3)
    assert ps.action_seconds(0.0, message, ps.M) == 0.0  # never negative


def test_the_planned_bubble_is_the_schedules_own_or_1f1bs_per_stage():
    toy = ps.smoke_model(replace(ps.MODEL, hidden_size=16, seq_length=16))
    config = planner_config(1.0, 1e4, 1e4)
    zbv = plan(ps.nodes(), ps.job(toy, 6, "ZBVZeroBubble", ps.M), config)
    one = plan(ps.nodes(), ps.job(toy, 6, "1F1B", ps.M), config)
    assert ps.planned_bubble(zbv) == zbv.estimate["bubbleSeconds"] > 0
    stages = sorted(st["bubbleSeconds"] for st in one.estimate["stages"])
    assert ps.planned_bubble(one) == stages[len(stages) // 2] > ps.planned_bubble(zbv)


def test_a_message_link_is_the_small_messages_overhead_and_the_large_ones_extra_as_bandwidth():
    link = ps.message_link(0.001, 0.003, 4e6)
    assert link.overhead_s == 0.001 and link.bytes_per_s == pytest.approx(2e9)
    # a large message no slower than a small one (a quota's noise): no bandwidth term, not negative
    assert ps.message_link(0.002, 0.001, 4e6).bytes_per_s == float("inf")


def test_the_simulated_idle_with_free_messages_is_the_bubble_tables_and_costs_only_add():
    from holmes.plan import pipeline_cost
    from holmes.plan import pipeline_simulation as sim

    compute, m = 2.4, ps.M  # t = 0.8 s per micro-batch on a rank
    for name, v in ps.SIMULATED:
        free = ps.simulated_idle(name, v, m, compute, 0.0, sim.FREE, 1.0)
        bubble = pipeline_cost.bubble_units(name, ps.P, v, m)
        assert free == pytest.approx(bubble * compute / m, abs=1e-6), name
        priced = ps.simulated_idle(name, v, m, compute, 0.003, sim.Link(overhead_s=0.001), 1.0)
        assert priced > free, name
