"""The discrete-event simulation of a schedule's per-rank action lists
(holmes.contract.pipeline_simulation): the textbook bubbles, and orders it must refuse."""

import pytest

from holmes.contract.pipeline_simulation import Action, idle_units, makespan


def one_f_one_b(P: int, M: int) -> dict[int, list[Action]]:
    """1F1B as its paper draws it: rank r runs P-1-r warm-up forwards, then one forward and one
    backward in turn, then the remaining backwards."""
    orders = {}
    for r in range(P):
        warm = min(M, P - 1 - r)
        acts = [Action(r, "F", m) for m in range(warm)]
        f = warm
        for b in range(M):
            if f < M:
                acts.append(Action(r, "F", f))
                f += 1
            acts.append(Action(r, "B", b))
        orders[r] = acts
    return orders


@pytest.mark.parametrize("P, M", [(2, 2), (3, 3), (4, 8), (5, 16)])
def test_1f1b_idles_p_minus_1_micro_batch_steps_whatever_m(P, M):
    assert idle_units(one_f_one_b(P, M), 1, M) == pytest.approx(P - 1)


def test_a_split_backward_runs_w_after_its_i_and_fills_the_drain():
    """One rank pair, the last stage's weight pass deferred: W waits on I, never before it."""
    orders = {
        0: [Action(0, "F", 0), Action(0, "I", 0), Action(0, "W", 0)],
        1: [Action(1, "F", 0), Action(1, "I", 0), Action(1, "W", 0)],
    }
    d = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
    # F0 F1 I1 (then W1 on rank 1 while rank 0 runs I0) W0: five steps
    assert makespan(orders, d) == pytest.approx(5.0)


def test_an_order_that_deadlocks_is_refused_with_the_stuck_actions():
    orders = one_f_one_b(2, 2)
    orders[1] = [Action(1, "B", 0), Action(1, "F", 0), Action(1, "F", 1), Action(1, "B", 1)]
    with pytest.raises(ValueError, match="deadlocks.*stage=1, op='B', micro_batch=0"):
        makespan(orders, {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0})


def test_an_order_missing_a_backward_is_refused():
    orders = one_f_one_b(2, 2)
    orders[1] = [a for a in orders[1] if a != Action(1, "B", 1)]
    with pytest.raises(ValueError, match="virtual stage 1 has no backward for micro-batch 1"):
        makespan(orders, {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0})


def test_an_unknown_op_is_refused_by_name():
    with pytest.raises(ValueError, match="op must be one of F, B, I, W"):
        makespan({0: [Action(0, "X", 0)]}, {"F": 1.0})
