"""status.progress's percentage and estimated remaining time (core/eta.py), and their way
through the state machine into the status."""

from __future__ import annotations

from datetime import timedelta

import pytest

from holmes.operator.core import eta
from tests.helpers.operator.opfixtures import T0, FakeWorld, manifest


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def test_first_report_uses_the_trainers_iteration_time_then_the_measured_rate():
    first = eta.with_eta({"iteration": 10, "iterationSeconds": 0.5}, {}, 1, 100, at(0))
    assert first["percentComplete"] == 10 and first["iterations"] == 100
    assert first["iterationsPerSecond"] == 2.0 and first["estimatedRemainingSeconds"] == 45
    assert first["rateFrom"]["iteration"] == 10 and first["rateFrom"]["attempt"] == 1
    # 30 iterations in 20 s: 1.5/s measured (the trainer's 0.5 s leaves out checkpoints)
    later = eta.with_eta({"iteration": 40, "iterationSeconds": 0.5}, first, 1, 100, at(20))
    assert later["iterationsPerSecond"] == 1.5
    assert later["estimatedRemainingSeconds"] == 40 and later["estimatedRemaining"] == "40s"
    assert later["percentComplete"] == 40 and later["rateFrom"] == first["rateFrom"]


def test_a_new_attempt_measures_from_its_own_first_report():
    """A restart that spent 10 minutes down and resumed at iteration 30 (behind the 50 the last
    attempt reached) must not count the downtime nor the iterations lost."""
    a1 = eta.with_eta({"iteration": 10}, {}, 1, 100, at(0))
    a1 = eta.with_eta({"iteration": 50}, a1, 1, 100, at(40))
    assert a1["iterationsPerSecond"] == 1.0
    resumed = eta.with_eta({"iteration": 31, "iterationSeconds": 0.25}, a1, 2, 100, at(640))
    assert resumed["rateFrom"] == {"attempt": 2, "iteration": 31, "time": resumed["rateFrom"]["time"]}
    assert resumed["iterationsPerSecond"] == 4.0  # the trainer's own time until a second report
    again = eta.with_eta({"iteration": 51}, resumed, 2, 100, at(650))
    assert again["iterationsPerSecond"] == 2.0 and again["estimatedRemainingSeconds"] == 24  # 49 at 2/s


def test_an_iteration_behind_the_basis_in_the_same_attempt_starts_a_new_basis():
    a = eta.with_eta({"iteration": 50}, {}, 3, 100, at(0))
    back = eta.with_eta({"iteration": 20, "iterationSeconds": 1.0}, a, 3, 100, at(5))
    assert back["rateFrom"]["iteration"] == 20 and back["iterationsPerSecond"] == 1.0


def test_done_is_100_percent_and_nothing_left():
    done = eta.with_eta({"iteration": 100}, {}, 1, 100, at(0))
    assert done["percentComplete"] == 100 and done["estimatedRemainingSeconds"] == 0
    assert done["estimatedRemaining"] == "0s" and "iterationsPerSecond" not in done


def test_no_rate_known_gives_a_percentage_without_an_eta():
    only = eta.with_eta({"iteration": 3}, {}, 1, 7, at(0))
    assert only["percentComplete"] == 42
    assert "estimatedRemainingSeconds" not in only and "estimatedRemaining" not in only


def test_a_basis_younger_than_the_clock_resolution_is_not_a_rate():
    a = eta.with_eta({"iteration": 1, "iterationSeconds": 2.0}, {}, 1, 10, at(0))
    b = eta.with_eta({"iteration": 2, "iterationSeconds": 2.0}, a, 1, 10, at(0.2))
    assert b["iterationsPerSecond"] == 0.5  # not 1 / 0.2 s


@pytest.mark.parametrize(
    "seconds,text",
    [(0, "0s"), (59.4, "59s"), (61, "1m01s"), (3600 + 300, "1h05m"), (2 * 86400 + 3 * 3600, "2d03h")],
)
def test_human_durations(seconds, text):
    assert eta.human(seconds) == text


def running_world(iterations: int) -> FakeWorld:
    w = FakeWorld(manifest(training={**manifest()["spec"]["training"], "iterations": iterations}))
    w.step()
    w.set_phase("Running")
    w.step()
    assert w.status["phase"] == "Running"
    return w


def test_the_state_machine_writes_percentage_and_eta_and_restarts_measure_anew():
    w = running_world(200)
    w.step(1, progress={"iteration": 20, "iterationSeconds": 0.1})
    p = w.status["progress"]
    assert p["percentComplete"] == 10 and p["estimatedRemainingSeconds"] == 18  # 180 at 10/s
    w.step(10, progress={"iteration": 40, "iterationSeconds": 0.1})
    p = w.status["progress"]
    assert p["iterationsPerSecond"] == 2.0 and p["estimatedRemainingSeconds"] == 80
    w.set_phase("Failed", next(iter(w.pods)))  # a gang restart: attempt 2
    w.step(1)
    w.step(1)
    w.set_phase("Running")
    w.step(300)
    assert w.status["attempt"] == 2 and w.status["phase"] == "Running"
    w.step(1, progress={"iteration": 41, "iterationSeconds": 0.5})
    p = w.status["progress"]
    assert p["rateFrom"]["attempt"] == 2 and p["iterationsPerSecond"] == 2.0  # not 1 / 300 s
    w.step(5, progress={"iteration": 51, "iterationSeconds": 0.5})
    assert w.status["progress"]["iterationsPerSecond"] == 2.0
    assert w.status["progress"]["estimatedRemaining"] == "1m14s"  # 149 left at 2/s: 74.5 s, half to even
