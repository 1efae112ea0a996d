"""Status conditions in the shape kstatus, Argo CD and Flux read (type/status/reason/message/
lastTransitionTime/observedGeneration). Pure functions over lists of dicts."""

from __future__ import annotations

from collections.abc import Iterable

READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
MEMBERS = "MembersReachable"  # jobs across member clusters only (members.py)
REPLANNED = "Replanned"  # jobs with parallelism.replan only (replan.py)
RELAUNCHED = "Relaunched"  # jobs relaunched for a spec edit only: the fields (spec_change.py)
ALL = (READY, RECONCILING, STALLED, SUCCEEDED, FAILED, SUSPENDED, MEMBERS, REPLANNED, RELAUNCHED)


def get(conditions: Iterable[dict] | None, type_: str) -> dict | None:
    for c in conditions or ():
        if c.get("type") == type_:
            return c
    return None


def set_condition(
    conditions: list[dict] | None,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
) -> list[dict]:
    """A new list with ``type_`` set; lastTransitionTime moves only when the status flips."""
    value = "True" if status else "False"
    out = [dict(c) for c in conditions or () if c.get("type") != type_]
    old = get(conditions, type_)
    since = (
        old.get("lastTransitionTime")
        if old and old.get("status") == value and old.get("lastTransitionTime")
        else now
    )
    cond = {"type": type_, "status": value, "reason": reason, "lastTransitionTime": since}
    if message:  # an empty string would reach a 1.20 API server as null through a merge patch
        cond["message"] = message
    if generation is not None:
        cond["observedGeneration"] = generation
    out.append(cond)
    order = {t: i for i, t in enumerate(ALL)}
    out.sort(key=lambda c: order.get(str(c.get("type")), len(order)))
    return out


def set_many(
    conditions: list[dict] | None, values: dict[str, tuple[bool, str, str]], now: str, generation: int | None
) -> list[dict]:
    """Set several conditions at once: ``{type: (status, reason, message)}``."""
    out = list(conditions or ())
    for type_, (status, reason, message) in values.items():
        out = set_condition(out, type_, status, reason, message, now, generation)
    return out


def for_phase(
    phase: str, reason: str, message: str, stalled: tuple[str, str] | None = None
) -> dict[str, tuple[bool, str, str]]:
    """The kstatus conditions that go with a job phase (``set_many``'s values): Ready while
    Running or Succeeded, Reconciling while Pending or Restarting and not stalled, Stalled with
    its own reason when the user must act, and one condition per end state."""
    active = phase in ("Pending", "Restarting")
    ready = phase in ("Running", "Succeeded")

    def only(p: str, otherwise: str) -> tuple[bool, str, str]:
        return (phase == p, reason if phase == p else otherwise, message if phase == p else "")

    return {
        READY: (ready, reason if not ready or phase != "Running" else "AllPodsRunning", message),
        RECONCILING: (active and stalled is None, reason if active else phase, message if active else ""),
        STALLED: (stalled is not None, stalled[0] if stalled else "Healthy", stalled[1] if stalled else ""),
        SUCCEEDED: only("Succeeded", "NotSucceeded"),
        FAILED: only("Failed", "NotFailed"),
        SUSPENDED: only("Suspended", "NotSuspended"),
    }
