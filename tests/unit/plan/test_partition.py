import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from holmes.plan.partition import PartitionError, adaptive, bottleneck, check_explicit, uniform


def brute_force(costs, layers):
    P = len(costs)
    best = None
    for cut in itertools.combinations(range(1, layers), P - 1):
        bounds = (0,) + cut + (layers,)
        parts = tuple(b - a for a, b in zip(bounds, bounds[1:]))
        v = bottleneck(costs, parts)
        best = v if best is None else min(best, v)
    return best


stage_cost = st.tuples(st.floats(0.1, 5.0), st.floats(0.0, 10.0), st.floats(0.0, 0.5))


@settings(max_examples=150, deadline=None)
@given(st.lists(stage_cost, min_size=1, max_size=4), st.integers(4, 14))
def test_adaptive_equals_brute_force_optimum(params, layers):
    # per-layer time, fixed cost (embedding/head), and a convex communication term
    costs = [lambda n, a=a, b=b, c=c: a * n + b + c * n * n for a, b, c in params]
    if len(costs) > layers:
        return
    parts = adaptive(costs, layers)
    assert sum(parts) == layers and min(parts) >= 1
    assert bottleneck(costs, parts) == pytest.approx(brute_force(costs, layers), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.1, 5.0), min_size=2, max_size=5), st.integers(5, 12))
def test_step_costs_with_infinite_caps(rates, layers):
    # a stage may not take more than 4 layers (memory): inf beyond, still exact
    costs = [lambda n, r=r: r * n if n <= 4 else float("inf") for r in rates]
    if len(costs) > layers:
        return
    want = brute_force(costs, layers)
    got = bottleneck(costs, adaptive(costs, layers))
    assert got == want or got == pytest.approx(want)


def test_faster_stage_gets_more_layers_and_is_deterministic():
    costs = [lambda n: 1.0 * n, lambda n: 1.4 * n]
    assert adaptive(costs, 48) == (28, 20)
    assert adaptive(costs, 48) == adaptive(costs, 48)
    assert adaptive([lambda n: n, lambda n: n], 5) == (3, 2)  # tie goes to the lower stage


def test_uniform_and_explicit():
    assert uniform(2, 36) == (18, 18)
    assert uniform(4, 10) == (3, 3, 2, 2)
    assert check_explicit([26, 22], 2, 48) == (26, 22)
    with pytest.raises(PartitionError, match="sums to 47"):
        check_explicit([26, 21], 2, 48)
    with pytest.raises(PartitionError, match="2 stages but the pipeline has 3"):
        check_explicit([26, 22], 3, 48)
    with pytest.raises(PartitionError, match="positive integer"):
        check_explicit([48, 0], 2, 48)
    with pytest.raises(PartitionError):
        uniform(5, 4)
    with pytest.raises(PartitionError):
        adaptive([lambda n: n] * 5, 4)
