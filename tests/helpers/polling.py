"""Waiting for a cluster to get somewhere, shared by the cluster tests (operator, labeller,
packaging): poll until true, or fail the test saying what never happened."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    what: str,
    fn: Callable[[], T],
    timeout: float = 60.0,
    every: float = 0.3,
    detail: Callable[[], str] | None = None,
) -> T:
    """``fn()``'s first truthy result; AssertionError with the last result (and ``detail()``,
    e.g. a log tail) when none came within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(
        f"timed out after {timeout:g}s waiting for {what}; "
        f"last: {json.dumps(last, default=str)[:2000]}" + (detail() if detail else "")
    )
