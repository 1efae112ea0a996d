"""Gang restarts (a step of the state machine, reconcile.py): a failed or disrupted attempt
counted against its runPolicy limit and torn down, children the API server refused, the back-off
before the next attempt, and the planned restarts (scale up, re-plan). Pure."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from holmes.contract import JobSpec

from . import conditions as cond
from . import dry_run
from .state import (
    CHILD_REJECTED_RETRY,
    DISRUPTION,
    FAILURE,
    PENDING,
    RESTARTING,
    ChildRefusal,
    Decision,
    JobState,
    delete_stale,
    event,
    fail,
    restarts_by_reason,
    set_phase,
    spec_changed,
    spec_changes,
    stall,
    teardown,
    until_deadline,
)
from .summary import iso, parse_time, pod_counts

_NEXT_ATTEMPT = re.compile(r"next attempt at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")


def gang_failure(
    st: JobState, spec: JobSpec, why: str, kind: str = FAILURE, reason: str = "PodFailed"
) -> Decision:
    """The attempt fails as a gang: a restart of ``kind`` (failed once its runPolicy limit is
    used up), after a back-off for failures."""
    by = restarts_by_reason(st)
    rp = spec.run_policy
    used, limit, field_ = {
        FAILURE: (by.get(FAILURE, 0), rp.backoff_limit, "backoffLimit"),
        DISRUPTION: (by.get(DISRUPTION, 0), rp.disruption_limit, "disruptionLimit"),
    }.get(kind, (0, None, ""))
    if limit is not None and used >= limit:
        return fail(
            st,
            "BackoffLimitExceeded" if kind == FAILURE else "DisruptionLimitExceeded",
            f"{why}; {used} {kind} restart(s) used of runPolicy.{field_}={limit}",
        )
    teardown(st, restart=kind)
    event(st, "Warning", reason, why)
    # a disruption is nobody's bug: relaunch at once; failures back off as Jobs do
    delay = st.backoff.delay(used + 1) if kind == FAILURE else 0.0
    when = ""
    if delay > 0:
        st.status["nextAttemptTime"] = iso(st.obs.now + timedelta(seconds=delay))
        when = f" after a {delay:g}s back-off: next attempt at {st.status['nextAttemptTime']}"
    of = f" of {limit}" if limit is not None else ""
    set_phase(
        st,
        RESTARTING,
        "GangRestart",
        f"{why}; {kind} restart {used + 1}{of}: deleting the attempt's pods and planning again{when}",
    )
    st.d.requeue_after = until_deadline(st, spec, delay) if delay > 0 else 0.5
    return st.d


def relaunch(st: JobState, restart: str, reason: str, message: str) -> Decision:
    """A planned gang restart of kind ``restart`` (scale up, re-plan): tear down, say why, and
    plan again at once."""
    teardown(st, restart=restart)
    set_phase(st, RESTARTING, reason, message)
    st.d.requeue_after = 0.5
    return st.d


def children_refused(st: JobState, spec: JobSpec, refused: list[ChildRefusal]) -> Decision:
    """The API server refused some of this attempt's children: delete the partial gang (no
    pod holds GPUs for a gang that cannot start), say why, and try again later: after a
    back-off when time can fix it (a full quota), else as Stalled until the spec changes
    (or every CHILD_REJECTED_RETRY seconds, since an admin may change the policy)."""
    teardown(st)
    first = refused[0]
    why = first.describe()
    if len(refused) > 1:
        why += f" (and {len(refused) - 1} more)"
    failures = int(st.old.get("createFailures") or 0) + 1
    st.status["createFailures"] = failures
    if first.retryable:
        delay = max(st.backoff.delay(failures), 1.0)
        due = st.obs.now + timedelta(seconds=delay)
        st.status["nextAttemptTime"] = iso(due)
        set_phase(
            st,
            PENDING,
            "ChildCreateFailed",
            f"{why}; the partial gang was deleted; next attempt at {iso(due)}",
            announce=False,
        )
        if failures == 1:
            event(st, "Warning", "ChildCreateFailed", why)
        st.d.requeue_after = until_deadline(st, spec, delay)
        return st.d
    due = st.obs.now + timedelta(seconds=CHILD_REJECTED_RETRY)
    st.status["nextAttemptTime"] = iso(due)
    st.status["pods"] = pod_counts([])
    if first.dry_run:  # the API server's own check of the rendered pod: nothing was created
        reason, what = (
            "TemplateRejected",
            (
                f"{dry_run.message(first)} -- fix spec.template (a Pod Security level is the "
                "namespace's: pod-security.kubernetes.io/enforce, set by the cluster admin); no pod "
                "was created"
            ),
        )
    else:
        reason = "ChildRejected"
        what = f"{why} -- fix spec.template (or ask the cluster admin); the partial gang was deleted"
    stall(st, reason, f"{what}; tried again when the spec changes or at {iso(due)}")
    st.d.requeue_after = until_deadline(st, spec, CHILD_REJECTED_RETRY)
    return st.d


def wait_out_backoff(st: JobState, spec: JobSpec) -> Decision | None:
    """Wait out the back-off after a gang restart or refused children (None: launch now)."""
    due = _next_attempt_time(st)
    if due is None:
        return None
    st.status["nextAttemptTime"] = iso(due)
    changed = spec_changes(st, spec, metadata=True)  # no pods to keep: any edit may be the fix
    if changed:
        st.status.pop("nextAttemptTime", None)  # the user changed the job: try it at once
        spec_changed(st, changed, "launching now, during the restart back-off")
        return None
    if st.obs.now >= due:
        st.status.pop("nextAttemptTime", None)
        return None
    delete_stale(st)  # the failed attempt's pods, if still there
    if st.old.get("createFailures"):  # children were refused: the status already says so
        st.d.requeue_after = until_deadline(st, spec, (due - st.obs.now).total_seconds())
        return st.d
    st.status["pods"] = pod_counts([])
    left = (due - st.obs.now).total_seconds()
    restarts = int(st.status.get("restarts") or 0)
    set_phase(
        st,
        RESTARTING,
        "RestartBackoff",
        f"restart {restarts}: next attempt at "
        f"{st.status['nextAttemptTime']} (back-off {st.backoff.delay(restarts):g}s after "
        f"{restarts} restart(s), so a job failing at start-up does not relaunch in a tight loop)",
    )
    st.d.requeue_after = until_deadline(st, spec, left)
    return st.d


def _next_attempt_time(st: JobState) -> datetime | None:
    """When the back-off after the last gang restart ends (None: no back-off pending). Read
    from ``status.nextAttemptTime``, else from the Reconciling message that repeats it (an
    API server whose CRD schema lacks the field prunes it from the status)."""
    if st.old.get("phase") != RESTARTING and not st.old.get("createFailures"):
        return None
    if st.status.get("nextAttemptTime"):
        return parse_time(st.status["nextAttemptTime"])
    msg = (cond.get(st.old.get("conditions"), cond.RECONCILING) or {}).get("message") or ""
    m = _NEXT_ATTEMPT.search(msg)
    return parse_time(m.group(1)) if m else None
