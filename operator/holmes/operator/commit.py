"""Optimistic placement: jobs decide (and plan) concurrently, each on a snapshot of the caches,
and take the placement locks only to check that snapshot is still current and claim.

A decision claims capacity when it creates pods or a layout ConfigMap (``claims``). Every
claim bumps ``PlacementLock.version`` and is logged with the nodes its pods are pinned to; a
claiming decision made on an older version is thrown away and decided again on fresh caches
when a claim since then took one of the nodes it chose (or named none), since that job may now
hold them. Claims on other nodes leave it valid: a claim only takes capacity, so it cannot make
room the decision missed, and under many launches at once (threads share one GIL, so deciding
together only makes each decision longer) checking the version alone threw most away.
After ``OPTIMISTIC_TRIES`` lost races the job decides holding the claim turn, so no other job
claims meanwhile (it cannot starve); one decision is still bounded by the planning budget
(holmes.plan.budget). Decisions that claim nothing (tracking a running job, waiting, deleting
pods) are written as decided: they only free capacity or say why a job waits.

The writes themselves (hundreds of pods for a large job) happen outside the locks: until they
are done, the claim's pods are ``in_flight`` and every other decision counts them as held
(pipeline.Pipeline.workloads), and the claiming job is not in anyone's queue. So neither a
slow plan nor a large launch holds the other jobs' launches.

Two locks, always taken in this order (docs/concurrency.md):
- ``_turn``: whose claim it is. Held for a version check and a claim, or for a whole decision
  by a job that lost every race. Nothing a decision calls takes it.
- ``_state``: the version and the claims in flight. Held for a few statements, never around a
  call out; ``decide`` reads it (``in_flight``), which is why the last try, deciding under
  ``_turn``, must not hold ``_state`` (one lock for both deadlocked: issue 46).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from . import metrics
from .core.child_names import ANN_NODE
from .core.state import Decision

OPTIMISTIC_TRIES = 3  # decisions thrown away before one is made holding the claim turn
CLAIMS_KEPT = 1024  # claims remembered with their nodes; a decision older than them is redone

S = TypeVar("S")  # what a decision was made on (written with it)
T = TypeVar("T")  # what the write returns


def claims(d: Decision) -> bool:
    """Whether writing ``d`` takes capacity other jobs plan around."""
    return bool(d.create_pods) or d.configmap is not None


def claimed_nodes(d: Decision) -> frozenset[str] | None:
    """The nodes ``d``'s pods are pinned to; None when it claims without naming them all (a
    layout ConfigMap alone, a pod without its node annotation): such a claim conflicts with any."""
    nodes = set()
    for pod in d.create_pods:
        node = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_NODE)
        if not isinstance(node, str):
            return None
        nodes.add(node)
    return frozenset(nodes) or None


class PlacementLock:
    """The version of what placements claimed, and the claims being written now."""

    def __init__(self) -> None:
        self._turn = threading.Lock()  # taken before _state, never while holding it
        self._state = threading.Lock()
        self._version = 0
        self._in_flight: dict[str, list[dict]] = {}  # job (namespace/name) -> pods it is creating
        # the last claims: (version it made, its nodes or None)
        self._claims: deque[tuple[int, frozenset[str] | None]] = deque(maxlen=CLAIMS_KEPT)

    @property
    def version(self) -> int:
        with self._state:
            return self._version

    def bump(self, nodes: frozenset[str] | None = None) -> None:
        """Count a claim made elsewhere, on ``nodes`` (None: any; tests force lost races with it)."""
        with self._state:
            self._version += 1
            self._claims.append((self._version, nodes))

    def in_flight(self) -> tuple[list[dict], frozenset[str]]:
        """The pods of claims being written, and their jobs."""
        with self._state:
            return [p for ps in self._in_flight.values() for p in ps], frozenset(self._in_flight)

    def decide_and_write(
        self,
        job: str,
        decide: Callable[[], tuple[Decision, S]],
        write: Callable[[Decision, S], T],
        tries: int = OPTIMISTIC_TRIES,
    ) -> tuple[Decision, S, T]:
        """``decide`` (observe the caches and decide: the decision and what it was made on)
        holding no lock; claim if nothing was claimed since, else decide again (the last try
        holding the claim turn); then ``write``, the claim in flight meanwhile."""
        for _ in range(tries):
            seen = self.version
            d, on = decide()
            if not claims(d):
                return d, on, write(d, on)
            with self._turn, self._state:
                won = self._still_valid(seen, d)
                if won:
                    self._claim(job, d)
            if won:
                return d, on, self._write(job, d, on, write)
            metrics.PLACEMENT_RETRIES.inc()
        with self._turn:  # lost every race: decide while no one else can claim
            d, on = decide()
            if claims(d):
                with self._state:
                    self._claim(job, d)
        return d, on, self._write(job, d, on, write)

    def _still_valid(self, seen: int, d: Decision) -> bool:  # holding _state
        """No claim since version ``seen`` took a node ``d`` chose."""
        if self._version == seen:
            return True
        mine = claimed_nodes(d)
        since = [nodes for v, nodes in self._claims if v > seen]
        if mine is None or len(since) != self._version - seen:  # unnamed, or older than the log
            return False
        return all(nodes is not None and not nodes & mine for nodes in since)

    def _claim(self, job: str, d: Decision) -> None:  # holding _state
        self._version += 1
        self._claims.append((self._version, claimed_nodes(d)))
        self._in_flight[job] = list(d.create_pods)

    def _write(self, job: str, d: Decision, on: S, write: Callable[[Decision, S], T]) -> T:
        try:
            return write(d, on)
        finally:
            if claims(d):  # the pods created are in the caches now (read in_flight before them)
                with self._state:
                    self._in_flight.pop(job, None)
