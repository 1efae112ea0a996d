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
