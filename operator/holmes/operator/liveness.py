"""Whether reconciles make progress: the liveness probe's verdict (issue 46).

A wedged operator (a deadlock, a write that never returns) used to keep answering its liveness
probe and renewing its Lease, so Kubernetes never restarted it and the standby never took over.
Each job loop reports here when its reconcile is due and when it runs; the operator is
unhealthy when

- a reconcile has run longer than ``bound`` seconds, or
- a reconcile has been due (woken, waiting for a worker thread) longer than ``bound`` while no
  reconcile finished: the workers are all taken by reconciles that do not end.

A job waiting for capacity reconciles and finishes each time, so a full cluster is healthy.
The probe (handlers.py), the Lease renewals (leader.py) and the gauge of the oldest reconcile
in progress (metrics.OLDEST_RECONCILE) read this one record.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# The longest one reconcile may run: a plan is bounded by its budget (holmes.plan.budget, 60 s
# at most), the writes by the client's timeouts; a large launch's pods are created 16 at a time.
DEFAULT_BOUND = 300.0


class Progress:
    """Reconciles due and running, and when one last finished. Thread-safe: the event loop
    marks a reconcile due, a worker thread runs it."""

    def __init__(self, bound: float = DEFAULT_BOUND, clock: Callable[[], float] = time.monotonic):
        if not bound > 0:
            raise ValueError(f"the reconcile bound must be > 0 seconds, got {bound!r}")
        self.bound, self._clock = bound, clock
        self._lock = threading.Lock()  # a leaf: nothing is called while it is held
        self._ids = itertools.count()
        self._due: dict[int, tuple[str, float]] = {}  # token -> (job, since)
        self._running: dict[int, tuple[str, float]] = {}
        self._finished = clock()

    def due(self, job: str) -> int:
        """A reconcile of ``job`` is waiting for a worker; the token to run it with."""
        with self._lock:
            token = next(self._ids)
            self._due[token] = (job, self._clock())
            return token

    def dropped(self, token: int) -> None:
        """The loop stopped waiting (cancelled): the reconcile is no longer due."""
        with self._lock:
            self._due.pop(token, None)

    @contextmanager
    def running(self, token: int) -> Iterator[None]:
        """Around one reconcile, in its worker thread."""
        with self._lock:
            job, _ = self._due.pop(token, ("?", 0.0))
            self._running[token] = (job, self._clock())
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(token, None)
                self._finished = self._clock()

    def oldest_running(self) -> float:
        """Seconds the oldest reconcile in progress has run (0 when none runs)."""
        now = self._clock()
        with self._lock:
            return max((now - since for _, since in self._running.values()), default=0.0)

    def verdict(self) -> str:
        """Why reconciles are stuck; '' while they make progress."""
        now = self._clock()
        with self._lock:
            running = sorted(self._running.values(), key=lambda r: r[1])
            due = sorted(self._due.values(), key=lambda r: r[1])
            finished = self._finished
        if running and now - running[0][1] > self.bound:
            job, since = running[0]
            return (
                f"the reconcile of {job} has run {now - since:.0f}s, over the {self.bound:.0f}s bound "
                f"({len(running)} running): a reconcile that does not end (restart the operator; "
                "report its stack dump)"
            )
        if due and now - due[0][1] > self.bound and now - finished > self.bound:
            job, since = due[0]
            return (
                f"{len(due)} reconciles wait for a worker, the oldest ({job}) for {now - since:.0f}s, "
                f"and none finished in {now - finished:.0f}s: every worker is taken"
            )
        return ""
