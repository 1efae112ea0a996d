"""holmes.plan.across: pipeline across a link against replicas that meet over it."""

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


def test_a_slow_link_makes_the_pipeline_wait_for_every_micro_batch():
    link = Link(0.02, latency_s=0.02)
    x = link.seconds(WORK.activation_bytes)
    assert pipeline_iteration_s(WORK, link) == pytest.approx(8 * x + (0.2 / 8 + 2 * x))


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
