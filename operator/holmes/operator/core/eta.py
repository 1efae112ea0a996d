"""How far a job is and when it will be done: status.progress's percentComplete and estimated
remaining time, from the iteration rate measured by the operator's own reads (pure).

The rate is the iterations done since the current attempt's first progress report over the
time since that report (``rateFrom``, kept in status.progress). A new attempt (a gang restart, a
resume, a re-plan) or an iteration lower than the basis (a resume from an older checkpoint)
starts a new basis: neither the time the job spent down or restarting nor iterations an earlier
attempt did count, and start-up (imports, rendezvous, loading a checkpoint) is over before the
first report. Until the basis is at least ``MIN_BASIS_SECONDS`` old and an iteration further,
the trainer's last iteration time stands in (it leaves out checkpoint and evaluation time,
which the measured rate includes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

RATE_FROM = "rateFrom"
MIN_BASIS_SECONDS = 1.0  # below this the operator's clock resolution dominates the rate
_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime(_TIME)


def _parse(s: Any) -> datetime | None:
    if not isinstance(s, str):
        return None
    for fmt in (_TIME, "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(s, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


def human(seconds: float) -> str:
    """A duration as kubectl prints ages: 45s, 12m30s, 3h05m, 2d04h."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def basis(before: Mapping[str, Any], attempt: int, iteration: int, now: datetime) -> dict[str, Any]:
    """The rate's starting point: the previous one while it belongs to this attempt and lies
    behind ``iteration``, else this report."""
    old = before.get(RATE_FROM)
    if (
        isinstance(old, Mapping)
        and old.get("attempt") == attempt
        and isinstance(old.get("iteration"), int)
        and old["iteration"] <= iteration
        and _parse(old.get("time")) is not None
    ):
        return dict(old)
    return {"attempt": attempt, "iteration": iteration, "time": _iso(now)}


def rate(since: Mapping[str, Any], iteration: int, now: datetime, iteration_seconds: Any) -> float | None:
    """Iterations per second: measured since ``since``, else 1 / the trainer's last iteration
    time (None: neither is known yet)."""
    start = _parse(since.get("time"))
    done = iteration - int(since.get("iteration") or 0)
    if start is not None and done > 0:
        elapsed = (now - start).total_seconds()
        if elapsed >= MIN_BASIS_SECONDS:
            return done / elapsed
    if isinstance(iteration_seconds, (int, float)) and iteration_seconds > 0:
        return 1.0 / float(iteration_seconds)
    return None


def with_eta(
    progress: Mapping[str, Any], before: Mapping[str, Any], attempt: int, total: int, now: datetime
) -> dict[str, Any]:
    """``progress`` (the numbers just merged) with iterations, percentComplete and, once a rate is
    known, iterationsPerSecond, estimatedRemainingSeconds and estimatedRemaining (for people)."""
    out = dict(progress)
    for k in ("iterationsPerSecond", "estimatedRemainingSeconds", "estimatedRemaining"):
        out.pop(k, None)
    iteration = progress.get("iteration")
    if not isinstance(iteration, int) or total < 1:
        return out
    out["iterations"] = total
    out["percentComplete"] = min(100, math.floor(100 * iteration / total))
    since = basis(before, attempt, iteration, now)
    out[RATE_FROM] = since
    if iteration >= total:
        out["estimatedRemainingSeconds"], out["estimatedRemaining"] = 0, human(0)
        return out
    r = rate(since, iteration, now, progress.get("iterationSeconds"))
    if r is None:
        return out
    left = (total - iteration) / r
    out["iterationsPerSecond"] = round(r, 6)
    out["estimatedRemainingSeconds"] = int(round(left))
    out["estimatedRemaining"] = human(left)
    return out
