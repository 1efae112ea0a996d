"""holmes.plan.across: pipeline across a link against replicas that meet over it."""

from dataclasses import replace

import pytest

from holmes.plan import across
from holmes.plan.across import AcrossWork, Link, choose, crossover_gbps, exchange_s, pipeline_iteration_s

WORK = AcrossWork(
    compute_s=0.2,
    micro_batches=8,
    activation_bytes=2 * 64 * 128 * 4,
    model_bytes=3.4e6,
    tokens_per_iteration=16 * 64,
)


def test_a_fast_link_leaves_the_pipeline_its_compute_and_its_fill():
    # no link cost: 2 stages of half the model on the whole batch, M + P - 1 micro-batch slots
    t = pipeline_iteration_s(WORK, Link(1e6))
    assert t == pytest.approx(0.2 * (8 + 1) / 8, rel=1e-3)


# The pipeline below: P = 2 stages, M = 8 micro-batches, c = 0.2 x 2 / 2 / 8 = 25 ms per stage and
# micro-batch (F c/3, B 2c/3); a crossing of 64 KiB at 0.02 Gbit/s takes S = 26.2 ms on the line.
C, S = 0.025, 2 * 64 * 128 * 4 * 8 / 0.02e9


def test_on_a_line_1f1b_pays_two_latencies_per_micro_batch():
    # torch posts a receive when its action is next and gloo sends the bytes once the receiver's
    # notice has crossed: after backward m the last stage asks for activation m + 1 (a latency)
    # and waits for it (another), so each micro-batch costs c + 2 latencies there (while the
    # latency stays below a forward, c/3, the first stage's work hides behind it)
    for latency in (0.002, 0.008):
        assert pipeline_iteration_s(WORK, Link(1e6, latency)) == pytest.approx(9 * C + 16 * latency)


def test_gpipe_asks_for_one_micro_batch_at_a_time_both_ways():
    # latency L = 20 ms >= c/3, no bandwidth cost. Forwards: the last stage asks for each
    # activation once its previous forward is done, 2L + c/3 each, 8 of them. Backwards: the last
    # stage's backward 0 (2c/3), gradient 0 crosses (L, asked for long before), the first stage's
    # backward 0 (2c/3), then it asks for each of the 7 other gradients in turn (2L + 2c/3 each)
    L = 0.02
    gp = replace(WORK, schedule="GPipe")
    expected = 8 * (2 * L + C / 3) + 2 * C / 3 + L + 2 * C / 3 + 7 * (2 * L + 2 * C / 3)
    assert pipeline_iteration_s(gp, Link(1e6, L)) == pytest.approx(expected)


def test_a_shaped_link_with_a_deep_bucket_runs_at_its_rate_and_hides_the_latency():
    # at 3 Mbit/s (the bench's slow link) a crossing takes 175 ms, longer than 1F1B's loop
    # without it (two latencies + c): a tbf-like bucket refills while the loop leaves the link
    # idle, so iteration after iteration the link sends at its rate, M crossings each way in M S3
    s3 = S * 0.02 / 0.003
    shaped = Link(0.003, 0.02, burst_bytes=1e6)
    assert pipeline_iteration_s(WORK, shaped) == pytest.approx(8 * s3, rel=1e-6)
    # on a line the notice asking for activation m + 1 queues behind gradient m on the way back:
    # the two directions take turns, each micro-batch about 2 S3 + 2 latencies + c (the fill
    # adds a little; bench/across_sites.py --link-check measured such a line)
    line = pipeline_iteration_s(WORK, Link(0.003, 0.02))
    assert line == pytest.approx(8 * (2 * s3 + 2 * 0.02 + C), rel=0.02)
    # the closed form this replaced, max(M c, M x) + (P - 1)(c + 2x) with x = latency + S3, is
    # over 1.4x the shaped link's
    x = 0.02 + s3
    assert (8 * x + C + 2 * x) / pipeline_iteration_s(WORK, shaped) > 1.4


def test_a_schedule_without_a_torch_free_order_is_refused_by_name():
    with pytest.raises(ValueError, match="AcrossWork.schedule 'Interleaved1F1B'.*1F1B and GPipe"):
        pipeline_iteration_s(replace(WORK, schedule="Interleaved1F1B"), Link(1.0))
    with pytest.raises(ValueError, match="AcrossWork.stages 1 must be >= 2"):
        pipeline_iteration_s(replace(WORK, stages=1), Link(1.0))


def test_the_exchange_sends_the_model_once_per_replica_pair_and_pays_latency_per_fragment():
    assert exchange_s(WORK, Link(1.0)) == pytest.approx(3.4e6 * 8 / 1e9)
    assert exchange_s(WORK, Link(1.0, 0.01), fragments=4) == pytest.approx(3.4e6 * 8 / 1e9 + 2 * 4 * 0.01)


def test_the_pick_turns_with_the_link_and_the_convergence_assumption():
    slow, fast = Link(0.002), Link(5.0)
    assert choose(WORK, slow, inner_steps=20, tokens_ratio=1.2).pick == "replicas"
    assert choose(WORK, fast, inner_steps=20, tokens_ratio=1.2).pick == "pipeline"
    # replicas that converged as well as synchronous training would win even on the fast link
    assert choose(WORK, fast, inner_steps=20, tokens_ratio=1.0).pick == "replicas"
    why = choose(WORK, slow, inner_steps=20, tokens_ratio=1.2).why
    assert "1.20x the tokens" in why and "(measured)" in why


def test_the_crossover_lies_between_the_links_and_splits_the_picks():
    g = crossover_gbps(WORK, 0.0, inner_steps=20, tokens_ratio=1.2)
    assert g is not None and 0.002 < g < 5.0
    assert choose(WORK, Link(g * 0.9), 20, 1.2).pick == "replicas"
    assert choose(WORK, Link(g * 1.1), 20, 1.2).pick == "pipeline"
    assert crossover_gbps(WORK, 0.0, inner_steps=20, tokens_ratio=0.9) is None  # replicas everywhere


def test_impossible_assumptions_are_refused_by_name():
    with pytest.raises(ValueError, match="tokens_ratio 0"):
        choose(WORK, Link(1.0), 20, 0.0)


def test_the_assumption_is_the_measured_ratio_with_no_floor(monkeypatch):
    # whatever the bench measured is what the planner assumes, below 1 too (no silent floor)
    monkeypatch.setattr(across, "MEASURED_TOKENS_RATIO", ((5, 0.8), (20, 1.3)))
    assert across.assumed_tokens_ratio(5)[0] == 0.8
    ratio, text = across.assumed_tokens_ratio(50)
    assert ratio == 1.3 and "0.8" not in text and "H=20" in text and "beyond what was measured" in text


def test_the_measured_assumption_keeps_the_pipeline_on_a_fast_link_and_not_on_a_slow_one():
    ratio, text = across.assumed_tokens_ratio(20)
    assert "best learning rate" in text
    assert choose(WORK, Link(5.0), 20, ratio).pick == "pipeline"
    assert choose(WORK, Link(0.003), 20, ratio).pick == "replicas"


def test_a_shaped_links_bucket_moves_the_crossover_down():
    # the bucket lets 1F1B's pipeline run at the link's rate where a line makes each micro-batch
    # wait its crossing, a latency and a stage: the pipeline wins on a slower shaped link
    line = crossover_gbps(WORK, 0.0, inner_steps=20, tokens_ratio=1.2)
    shaped = crossover_gbps(WORK, 0.0, inner_steps=20, tokens_ratio=1.2, burst_bytes=256 * 1024)
    assert line is not None and shaped is not None and shaped < line
    assert choose(WORK, Link(shaped * 1.1, 0.0, 256 * 1024), 20, 1.2).pick == "pipeline"
    assert choose(WORK, Link(shaped * 1.1), 20, 1.2).pick == "replicas"
