"""The discrete-event simulation of a schedule's per-rank action lists
(holmes.plan.pipeline_simulation): the textbook bubbles, orders it must refuse, and messages
between ranks priced on links (latency overlaps, bandwidth and per-message overhead serialize)."""

import pytest

from holmes.plan.pipeline_simulation import (
    Action,
    Link,
    Messages,
    gpipe,
    idle_units,
    makespan,
    one_f_one_b,
    steady_iteration_s,
)


def paper_one_f_one_b(P: int, M: int) -> dict[int, list[Action]]:
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


@pytest.mark.parametrize("P, M", [(2, 2), (3, 3), (4, 8)])
def test_torchs_1f1b_runtime_order_is_the_papers_and_gpipe_idles_as_much(P, M):
    assert one_f_one_b(P, M) == paper_one_f_one_b(P, M)
    assert idle_units(gpipe(P, M), 1, M) == pytest.approx(P - 1)


@pytest.mark.parametrize("P, M", [(2, 2), (3, 3), (4, 8), (5, 16)])
def test_1f1b_idles_p_minus_1_micro_batch_steps_whatever_m(P, M):
    assert idle_units(paper_one_f_one_b(P, M), 1, M) == pytest.approx(P - 1)


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
    orders = paper_one_f_one_b(2, 2)
    orders[1] = [Action(1, "B", 0), Action(1, "F", 0), Action(1, "F", 1), Action(1, "B", 1)]
    with pytest.raises(ValueError, match="deadlocks.*stage=1, op='B', micro_batch=0"):
        makespan(orders, {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0})


def test_an_order_missing_a_backward_is_refused():
    orders = paper_one_f_one_b(2, 2)
    orders[1] = [a for a in orders[1] if a != Action(1, "B", 1)]
    with pytest.raises(ValueError, match="virtual stage 1 has no backward for micro-batch 1"):
        makespan(orders, {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0})


def test_an_unknown_op_is_refused_by_name():
    with pytest.raises(ValueError, match="op must be one of F, B, I, W"):
        makespan({0: [Action(0, "X", 0)]}, {"F": 1.0})


# ---- messages on links -----------------------------------------------------------------------
# Two ranks, forwards only: rank 0 runs F of stage 0 for micro-batches 0..2 (1 s each), rank 1 F of
# stage 1 for each as its activation arrives. Free messages: 3 s on rank 0, the last 1 s on rank
# 1: 4 s.
FORWARDS = {0: [Action(0, "F", m) for m in range(3)], 1: [Action(1, "F", m) for m in range(3)]}
ONE_S = {"F": 1.0}


def over(link: Link, nbytes: float = 5.0) -> Messages:
    return Messages(nbytes, lambda _src, _dst: link)


def test_free_messages_are_the_default():
    assert makespan(FORWARDS, ONE_S) == makespan(FORWARDS, ONE_S, over(Link())) == pytest.approx(4.0)


def test_latency_is_paid_once_when_messages_are_in_flight_together():
    # sent at 1, 2, 3; arrive at 11, 12, 13; rank 1 ends at 14: 4 + 10, not 4 + 3 x 10
    assert makespan(FORWARDS, ONE_S, over(Link(latency_s=10.0))) == pytest.approx(14.0)


def test_bandwidth_serializes_messages_first_in_first_out():
    # 5 bytes at 1 byte/s: the link carries them 1-6, 6-11, 11-16; rank 1 ends at 17
    assert makespan(FORWARDS, ONE_S, over(Link(bytes_per_s=1.0))) == pytest.approx(17.0)
    # with 10 s of latency on top: the bandwidth's queue, then one latency: 27
    assert makespan(FORWARDS, ONE_S, over(Link(bytes_per_s=1.0, latency_s=10.0))) == pytest.approx(27.0)


def test_a_per_message_overhead_serializes_where_a_latency_of_the_same_size_does_not():
    # 2 s per message on the link: sent at 1, 2, 3, carried 1-3, 3-5, 5-7; rank 1 ends at 8
    assert makespan(FORWARDS, ONE_S, over(Link(overhead_s=2.0))) == pytest.approx(8.0)
    # 2 s of latency: arrive at 3, 4, 5; rank 1 ends at 6
    assert makespan(FORWARDS, ONE_S, over(Link(latency_s=2.0))) == pytest.approx(6.0)


def test_a_token_bucket_lets_what_it_holds_leave_at_once():
    # 10 bytes deep, refilling at 1 byte/s: message 0 leaves at 1 (5 tokens left), message 1 at
    # 2 (6 - 5 = 1 left), message 2 at 3 finds 2 tokens and waits 3 s for the rest: arrives at 6
    assert makespan(FORWARDS, ONE_S, over(Link(bytes_per_s=1.0, burst_bytes=10.0))) == pytest.approx(7.0)


def test_each_direction_is_a_link_of_its_own_and_same_rank_inputs_stay_free():
    # 1F1B, P=2, M=1: F 1 s, B 2 s on each rank; the activation goes 0 -> 1 (10 s), its gradient
    # 1 -> 0 (100 s): 1 + 10 + 1 + 2 + 100 + 2
    latency = {(0, 1): 10.0, (1, 0): 100.0}
    msgs = Messages(1.0, lambda src, dst: Link(latency_s=latency[(src, dst)]))
    d = {"F": 1.0, "B": 2.0}
    assert makespan(one_f_one_b(2, 1), d, msgs) == pytest.approx(116.0)
    # both stages on one rank: the same actions, no message
    one_rank = {0: [Action(0, "F", 0), Action(1, "F", 0), Action(1, "B", 0), Action(0, "B", 0)]}
    assert makespan(one_rank, d, msgs) == pytest.approx(6.0)


def test_steady_iterations_carry_the_buckets_tokens_over():
    # 1F1B, P=2, M=4, 5-byte messages at 1 byte/s: a plain line costs every iteration the same.
    # By hand: activations 0, 1 leave at 0.1, 0.2 and land at 5.1, 10.1; rank 0 then waits for
    # gradient 0 (10.4) before forward 2, so its activation lands at 15.7 and 3's at 20.7; gradient
    # 3 leaves rank 1 at 21.0 and lands at 26.0; rank 0's last backward ends at 26.2 (the 1F1B
    # loop holds 2 micro-batches in flight: the link idles while a gradient comes back);
    # a bucket of all 4 messages starts full (the first iteration runs at compute speed, 1.5 s),
    # then each iteration sends what the bucket refilled, the link's idle time included: 4 x 5 s
    d = {"F": 0.1, "B": 0.2}
    orders = one_f_one_b(2, 4)
    line = over(Link(bytes_per_s=1.0))
    assert makespan(orders, d, line) == pytest.approx(26.2)
    assert steady_iteration_s(orders, d, line) == pytest.approx(26.2)
    shaped = over(Link(bytes_per_s=1.0, burst_bytes=20.0))
    assert makespan(orders, d, shaped) == pytest.approx(5 * 0.3)
    assert steady_iteration_s(orders, d, shaped) == pytest.approx(20.0, abs=0.5)


def test_a_rendezvous_send_waits_for_the_receivers_notice():
    # rank 1 posts each receive when its forward is next: the notice crosses (10 s), the
    # activation comes back (10 s), then 1 s of compute: 3 x 21 = 63, where eager sends made 14
    assert makespan(FORWARDS, ONE_S, Messages(5.0, lambda _s, _d: Link(latency_s=10.0), True)) == 63.0


def test_a_notice_queues_behind_the_data_on_its_direction():
    # 1F1B, P=2, M=2, F = B = 1 s, 5-byte messages at 1 byte/s, no latency. Eager: activations
    # 1-6 and 6-11, gradients 8-13 and 13-18, rank 0's last backward 18-19.
    # Rendezvous: activation 0 leaves at 1 (rank 1 asked at 0) and lands at 6; rank 1's backward
    # ends at 8, gradient 0 goes 8-13, and the notice asking for activation 1, posted at 8, leaves
    # behind it at 13: activation 1 travels 13-18; gradient 1 leaves at 20 (rank 0's notice, posted
    # at 14, waited behind activation 1 until 18) and lands at 25; rank 0 ends at 26
    d = {"F": 1.0, "B": 1.0}
    eager = Messages(5.0, lambda _s, _d: Link(bytes_per_s=1.0))
    rendezvous = Messages(5.0, lambda _s, _d: Link(bytes_per_s=1.0), rendezvous=True)
    assert makespan(one_f_one_b(2, 2), d, eager) == pytest.approx(19.0)
    assert makespan(one_f_one_b(2, 2), d, rendezvous) == pytest.approx(26.0)


def test_links_refuse_impossible_settings_by_name():
    with pytest.raises(ValueError, match="Link.bytes_per_s must be > 0"):
        Link(bytes_per_s=0.0)
    with pytest.raises(ValueError, match="Link.latency_s must be >= 0"):
        Link(latency_s=-1.0)
    with pytest.raises(ValueError, match="iterations must be >= 2"):
        steady_iteration_s(FORWARDS, ONE_S, over(Link()), iterations=1)
