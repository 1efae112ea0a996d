"""Optimistic placement (operator/holmes/operator/commit.py): decisions run outside the placement
lock, a claim made on a stale snapshot is decided again, claims being written are visible to
every other decision, and a job ahead in the queue costs the jobs behind it a bounded search."""

from __future__ import annotations

import threading
import time

from holmes.contract import load_job
from holmes.operator import placement_facts
from holmes.operator.commit import OPTIMISTIC_TRIES, PlacementLock
from holmes.operator.core import capacity, placement
from holmes.operator.core.capacity import WaitingForCapacity, Workloads
from holmes.operator.core.state import Decision
from tests.helpers.operator.pipeline_world import claiming, fake_nodes, pool_job, waiting_job


def test_a_slow_decision_does_not_hold_another_jobs_claim_and_is_decided_again_after_it():
    lock = PlacementLock()
    slow_started, release = threading.Event(), threading.Event()
    slow_decisions = []

    def slow_decide():
        slow_decisions.append(lock.version)
        if len(slow_decisions) == 1:  # the first plan is a long search
            slow_started.set()
            release.wait(10)
        return claiming("slow"), "snapshot"

    out = {}
    t = threading.Thread(
        target=lambda: out.update(slow=lock.decide_and_write("ns/slow", slow_decide, lambda d, on: on))
    )
    t.start()
    assert slow_started.wait(5)
    started = time.monotonic()
    d, on, written = lock.decide_and_write(
        "ns/fast", lambda: (claiming("fast"), "s"), lambda d, on: "written"
    )
    assert written == "written" and time.monotonic() - started < 1.0  # not behind the slow search
    release.set()
    t.join(10)
    # the slow one planned before the fast one's claim: thrown away and decided again on fresh caches
    assert slow_decisions == [0, 1] and out["slow"][2] == "snapshot" and lock.version == 2


def test_a_decision_that_claims_nothing_is_written_as_decided():
    lock = PlacementLock()
    calls = []

    def decide():
        calls.append(1)
        lock.bump()  # someone claims meanwhile: a status-only decision does not care
        return Decision(status={"phase": "Running"}), None

    lock.decide_and_write("ns/a", decide, lambda d, on: None)
    assert len(calls) == 1


def test_after_losing_every_race_a_job_decides_under_the_lock():
    lock = PlacementLock()
    held = []

    def decide():
        held.append(lock._turn.locked())
        if len(held) <= OPTIMISTIC_TRIES:
            lock.bump()  # another claim lands during every optimistic try
        return claiming("a"), None

    lock.decide_and_write("ns/a", decide, lambda d, on: None)
    assert held == [False] * OPTIMISTIC_TRIES + [True]


def test_a_claim_being_written_is_seen_by_every_other_decision_until_its_pods_are_cached():
    lock = PlacementLock()
    writing, done = threading.Event(), threading.Event()

    def write(d, on):
        writing.set()
        done.wait(10)

    t = threading.Thread(target=lambda: lock.decide_and_write("ns/a", lambda: (claiming("a"), None), write))
    t.start()
    assert writing.wait(5)
    pods, jobs = lock.in_flight()
    assert [p["metadata"]["name"] for p in pods] == ["a-1-0"] and jobs == {"ns/a"}
    assert not lock._turn.locked() and not lock._state.locked()  # the writes happen outside the locks
    done.set()
    t.join(10)
    assert lock.in_flight() == ([], frozenset())


def test_a_launching_job_is_in_no_queue_and_its_namespace_has_taken_a_turn():
    a = waiting_job("a", 0)
    b = waiting_job("b", 1)
    b["metadata"]["namespace"] = "other"
    me = waiting_job("me", 2)
    seen = Workloads(jobs=[a, b, me], launching=frozenset({"ns/a"}))
    state = capacity.shared_state(me, seen, {})
    assert [w.job for w in state.ahead] == ["other/b"]  # ns took its turn with a: other's b goes first


def test_a_huge_job_ahead_costs_the_job_behind_a_bounded_search_and_keeps_its_own_nodes():
    nodes = fake_nodes(128, "a", 0) + fake_nodes(2, "b", 128)
    huge = pool_job("huge", 128, 0, "a", 1024)  # its own search: far more than AHEAD_UNITS
    small = pool_job("small", 2, 1, "b", 4)
    facts = placement_facts.gather(placement_facts.builtin_cost_model(), Workloads(jobs=[huge, small]))
    started = time.monotonic()
    layout = placement.on_free_capacity(nodes, load_job(small), placement.Placement(facts, nodes, small))
    assert time.monotonic() - started < 2.0  # ~0.3 s of weighing the huge job, not its whole search
    assert sorted(layout.nodes) == ["fake-0128", "fake-0129"]
    # a small job in the huge one's pool waits: the huge job keeps the nodes it could use
    also_a = pool_job("also-a", 2, 2, "a", 4)
    facts = placement_facts.gather(placement_facts.builtin_cost_model(), Workloads(jobs=[huge, also_a]))
    try:
        placement.on_free_capacity(nodes, load_job(also_a), placement.Placement(facts, nodes, also_a))
        raise AssertionError("the small job took nodes the huge job ahead of it waits for")
    except WaitingForCapacity as e:
        assert "kept for ns/huge ahead in the queue" in str(e)
