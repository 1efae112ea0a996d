"""Optimistic placement: jobs decide (and plan) concurrently, each on a snapshot of the caches,
and take the placement lock only to check that snapshot is still current and claim.

A decision claims capacity when it creates pods or a layout ConfigMap (``claims``). Every
claim bumps ``PlacementLock.version``; a claiming decision made on an older version is thrown
away and decided again on fresh caches, since another job may now hold the nodes it chose.
After ``OPTIMISTIC_TRIES`` lost races the job decides under the lock (it cannot starve); one
decision is still bounded by the planning budget (holmes.plan.budget). Decisions that claim
nothing (tracking a running job, waiting, deleting pods) are written as decided: they only free
capacity or say why a job waits.

The writes themselves (hundreds of pods for a large job) happen outside the lock: until they
are done, the claim's pods are ``in_flight`` and every other decision counts them as held
(pipeline.Pipeline.workloads), and the claiming job is not in anyone's queue. So neither a
slow plan nor a large launch holds the other jobs' launches: the lock is held for a version
check.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from . import metrics
from .core.state import Decision

OPTIMISTIC_TRIES = 3  # decisions thrown away before one is made under the lock

S = TypeVar("S")  # what a decision was made on (written with it)
T = TypeVar("T")  # what the write returns


def claims(d: Decision) -> bool:
    """Whether writing ``d`` takes capacity other jobs plan around."""
    return bool(d.create_pods) or d.configmap is not None


class PlacementLock:
    """The version of what placements claimed, and the claims being written now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.version = 0
        self._in_flight: dict[str, list[dict]] = {}  # job (namespace/name) -> pods it is creating

    def in_flight(self) -> tuple[list[dict], frozenset[str]]:
        """The pods of claims being written, and their jobs."""
        with self._lock:
            return [p for ps in self._in_flight.values() for p in ps], frozenset(self._in_flight)

    def decide_and_write(
        self,
        job: str,
        decide: Callable[[], tuple[Decision, S]],
        write: Callable[[Decision, S], T],
        tries: int = OPTIMISTIC_TRIES,
    ) -> tuple[Decision, S, T]:
        """``decide`` (observe the caches and decide: the decision and what it was made on)
        outside the lock; claim under it if nothing was claimed since, else decide again (the
        last try under the lock); then ``write``, the claim in flight meanwhile."""
        for _ in range(tries):
            seen = self.version
            d, on = decide()
            with self._lock:
                if claims(d) and self.version != seen:
                    metrics.PLACEMENT_RETRIES.inc()
                    continue
                self._claim(job, d)
            return d, on, self._write(job, d, on, write)
        with self._lock:  # lost every race: decide where no one else can claim meanwhile
            d, on = decide()
            self._claim(job, d)
        return d, on, self._write(job, d, on, write)

    def _claim(self, job: str, d: Decision) -> None:  # under the lock
        if claims(d):
            self.version += 1
            self._in_flight[job] = list(d.create_pods)

    def _write(self, job: str, d: Decision, on: S, write: Callable[[Decision, S], T]) -> T:
        try:
            return write(d, on)
        finally:
            if claims(d):  # the pods created are in the caches now (read in_flight before them)
                with self._lock:
                    self._in_flight.pop(job, None)
