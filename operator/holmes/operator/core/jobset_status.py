"""Holmes' word on a labelled JobSet, written on the JobSet itself (issue 53). Pure.

JobSet's status is JobSet's (its controller owns ``status``), so Holmes writes one annotation,
``holmes.dev/plan-status``, a condition-like JSON object: ``state`` (Planned | Waiting |
Invalid), the ``reason`` (the Event's), its ``message`` and ``since`` (when the state last
changed). ``kubectl get jobset NAME -o jsonpath='{.metadata.annotations.holmes\\.dev/plan-status}'``
reads it whether or not the Events have expired.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

ANN_STATUS = "holmes.dev/plan-status"
PLANNED, WAITING, INVALID = "Planned", "Waiting", "Invalid"
# the Event reasons (jobset_plan, jobset_kueue) and the state each one means
STATES = {
    "PlanWritten": PLANNED,
    "WaitingForNodes": WAITING,
    "WaitingForAdmission": WAITING,
    "InvalidPlanRequest": INVALID,
}
MAX_MESSAGE = 1000


def current(jobset: Mapping[str, Any]) -> dict:
    """The JobSet's plan status ({}: none, or not JSON: rewritten)."""
    raw = ((jobset.get("metadata") or {}).get("annotations") or {}).get(ANN_STATUS)
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def status_patch(jobset: Mapping[str, Any], reason: str, message: str, now: str) -> dict | None:
    """The JobSet's merge patch for the status ``reason`` and ``message`` (None: already so).
    ``since`` moves only when the state or reason changes."""
    state = STATES[reason]
    message = message[:MAX_MESSAGE]
    old = current(jobset)
    if (old.get("state"), old.get("reason"), old.get("message")) == (state, reason, message):
        return None
    same = (old.get("state"), old.get("reason")) == (state, reason)
    since = old.get("since") if same and old.get("since") else now
    value = {"state": state, "reason": reason, "message": message, "since": since}
    return {"metadata": {"annotations": {ANN_STATUS: json.dumps(value, sort_keys=True)}}}
