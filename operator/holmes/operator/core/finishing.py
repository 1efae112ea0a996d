"""How a job ends, apart from its pods' own exit (tracking.py): runPolicy.activeDeadlineSeconds,
and what a finished job still does (Kueue's quota released, runPolicy.ttlSecondsAfterFinished).
A step of the state machine (reconcile.py); pure."""

from __future__ import annotations

from datetime import timedelta

from holmes.contract import JobSpec

from . import conditions as cond
from . import queueing
from .state import FAILED, SUCCEEDED, Decision, JobState, event, fail, live_pods
from .summary import parse_time


def past_deadline(st: JobState, spec: JobSpec) -> Decision | None:
    """Failed once the job was active longer than runPolicy.activeDeadlineSeconds (counted from
    status.startTime); None: go on."""
    deadline = spec.run_policy.active_deadline_seconds
    started = parse_time(st.status.get("startTime"))
    if deadline and started and st.obs.now >= started + timedelta(seconds=deadline):
        return fail(
            st,
            "DeadlineExceeded",
            f"the job was active longer than runPolicy.activeDeadlineSeconds={deadline}",
        )
    return None


def finished(st: JobState, spec: JobSpec | None) -> Decision:
    """Edits to a finished job have no effect, but runPolicy.ttlSecondsAfterFinished (of a
    spec that is still valid) deletes it."""
    phase = st.old["phase"]
    st.status["observedGeneration"] = st.generation
    if phase == FAILED:  # a failed gang leaves nothing running
        st.d.delete_pods = live_pods(st)
    if st.obs.workload is not None and queueing.queue_name(st.job):  # Kueue frees the quota
        msg = (cond.get(st.old.get("conditions"), cond.READY) or {}).get("message") or ""
        conds = queueing.finished_conditions(st.obs.workload, phase == SUCCEEDED, msg, st.stamp)
        st.d.workload_status = None if conds is None else {"conditions": conds}
    ttl = spec.run_policy.ttl_seconds_after_finished if spec else None
    done = parse_time(st.old.get("completionTime"))
    if ttl is not None and done:
        left = (done + timedelta(seconds=ttl) - st.obs.now).total_seconds()
        if left <= 0:
            st.d.delete_job = True
            event(st, "Normal", "TTLExpired", f"deleting the {phase.lower()} job {ttl}s after it finished")
        else:
            st.d.requeue_after = left
    return st.d
