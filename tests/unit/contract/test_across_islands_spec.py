"""spec.training.acrossIslands: read with its defaults, and its one cross-field rule."""

from holmes.contract.jobspec import JobSpec
from tests.helpers.contract.spec_helpers import minimal_spec, problems_of


def training(**across):
    t = {"globalBatchSize": 16, "microBatchSize": 2, "iterations": 10, "learningRate": 1.0e-3}
    if across:
        t["acrossIslands"] = across
    return minimal_spec(training=t)


def test_the_default_stays_the_synchronous_pipeline():
    a = JobSpec.from_spec(training()).training.across_islands
    assert (a.mode, a.inner_steps, a.fragments, a.exchange_dtype) == ("pipeline", 50, 1, "float32")
    assert a.overlap_steps == 0  # the synchronous exchange


def test_replicas_are_read_by_their_camel_case_names():
    a = JobSpec.from_spec(
        training(mode="replicas", innerSteps=8, outerLearningRate=1.0, outerMomentum=0.0, fragments=4)
    ).training.across_islands
    assert (a.mode, a.inner_steps, a.outer_learning_rate, a.outer_momentum, a.fragments) == (
        "replicas",
        8,
        1.0,
        0.0,
        4,
    )


def test_fragments_must_divide_inner_steps():
    (problem,) = problems_of(training(mode="replicas", innerSteps=10, fragments=3))
    assert "acrossIslands.fragments" in problem and "innerSteps 10" in problem


def test_overlap_steps_keep_one_exchange_in_flight():
    ok = training(mode="replicas", innerSteps=8, fragments=2, overlapSteps=4)
    assert JobSpec.from_spec(ok).training.across_islands.overlap_steps == 4
    (problem,) = problems_of(training(mode="replicas", innerSteps=8, fragments=2, overlapSteps=5))
    assert "acrossIslands.overlapSteps: 5" in problem and "at most 4" in problem
    assert any("overlapSteps" in p for p in problems_of(training(mode="replicas", overlapSteps=-1)))


def test_an_unknown_mode_names_the_choices():
    problems = problems_of(training(mode="diloco"))
    assert any("acrossIslands.mode" in p and "replicas" in p for p in problems)
