"""The reconcile decision: observed state in, desired status + actions out. Pure (no I/O, no
clock of its own), so every transition is unit-tested as data; ``kube.py`` applies the result.

``decide`` is the whole state machine, read top to bottom: each step is a plain function over
one pass's state (state.JobState) in a module named for it, and returns the Decision when the
pass ends there (None: go on). validating.py (name, spec, the operator's job policy) ->
admitting.py (suspend, priority, Kueue) -> finishing.py (the deadline; a finished job's TTL) ->
restarting.py (gang restarts, refused children, the back-off) -> launching.py (place, render,
wait) -> tracking.py (pods running, failing, growing back, re-planning). The primitives every
step writes the status with are state.py's; the policies they consult have modules of their own
(validation, queueing, capacity, elastic, failures, members, replan, placement).

State kept in the HolmesJob status (the only memory the operator needs; a restarted operator
reads it back):
- ``attempt``: launches so far; pods are named ``<job>-<attempt>-<rank>``, so pods of any other
  attempt are stale and deleted. Every teardown (gang restart, suspend, spec change) bumps it.
- ``launched``: all pods of ``attempt`` were created. Until then missing pods are (re)created
  from the ConfigMap of the same attempt (crash-safe: names are deterministic, creation of an
  existing pod is a no-op); afterwards a missing or failed pod fails the attempt.
- ``restarts``: gang restarts of every reason; ``restartsByReason`` splits them: ``failure``
  (compared with runPolicy.backoffLimit), ``disruption`` (evicted, preempted, deleted, node lost;
  compared with runPolicy.disruptionLimit), ``ignored`` (a failurePolicy Ignore rule), ``scaleUp``.
- ``size``: nodes of the current attempt, desired (count) and minimum (minCount); an elastic job
  runs below count when nodes are missing and grows back after its next checkpoint.
- ``waitingSince``: when the job started waiting for nodes (runPolicy.waitForNodesSeconds).
- ``scaleUpAfter``: the trainer's checkpoint iteration when nodes for a larger size were seen;
  the job relaunches larger once a newer checkpoint exists.
- ``nextAttemptTime``: after a gang restart, the next attempt starts no earlier than this
  (back-off ``base * 2^(restarts-1)``, capped, like Kubernetes Jobs), so a job that crashes at
  start-up does not relaunch in a tight loop. Phase Restarting meanwhile; suspend, deletion and
  the deadline act at once, and a spec edit (other than runPolicy) ends the wait.

What each situation leads to (gang restart, lost nodes, back-off, suspend, spec edits, TTL,
deadline) is the reconcile-rule table of docs/api.md, kept in one place.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import admitting, finishing, launching, members, restarting, tracking, validating
from . import conditions as cond
from .placement import PlacementFacts
from .render import RenderSettings
from .state import (  # noqa: F401 (the reconcile's data types, imported from here by the I/O side)
    CHILD_REJECTED_RETRY,
    DISRUPTION,
    FAILED,
    FAILURE,
    FINISHED,
    IGNORED,
    PENDING,
    RESTARTING,
    RUNNING,
    SCALE_UP,
    SUCCEEDED,
    SUSPENDED,
    WAIT_INTERVAL,
    ChildRefusal,
    Decision,
    Event,
    JobState,
    Observed,
    RestartBackoff,
    begin,
    current_pods,
    owned,
    owned_by,
    past_leftovers,
    teardown,
)


def decide(
    obs: Observed,
    facts: PlacementFacts,
    settings: RenderSettings,
    backoff: RestartBackoff = RestartBackoff(),
) -> Decision:
    """One pass from the observed job to its Decision."""
    st = begin(obs, facts, settings, backoff)
    if (st.job.get("metadata") or {}).get("deletionTimestamp"):
        return st.d  # owner references clean up (across members: the finalizer, members.cleanup)
    _transition(st)
    if st.relaunched:  # after every set_phase of the pass (each rewrites the conditions read)
        st.status["conditions"] = cond.set_condition(
            st.status.get("conditions"),
            cond.RELAUNCHED,
            True,
            "SpecChanged",
            st.relaunched,
            st.stamp,
            st.generation,
        )
    if obs.members is not None and st.old.get("phase") not in FINISHED:
        _report_members(st, obs.members)
    return st.d


def _transition(st: JobState) -> Decision:
    spec, invalid = validating.parse(st.job)
    if st.old.get("phase") in FINISHED:
        return finishing.finished(st, spec)  # edits have no effect; TTL, Kueue's quota
    stop = validating.validate(st, spec, invalid)
    if stop is not None:
        return stop
    assert spec is not None  # validate stalls a spec that did not parse
    st.status["observedGeneration"] = st.generation  # accepted: this generation is acted on
    st.status.setdefault("restarts", 0)
    st.status.setdefault("attempt", st.attempt)

    stop = admitting.admit(st, spec)  # suspended, or held by Kueue; a resumed job plans again
    if stop is not None:
        return stop
    if not st.status.get("startTime"):
        st.status["startTime"] = st.stamp
    stop = finishing.past_deadline(st, spec)
    if stop is not None:
        return stop

    if st.attempt == 0:  # first launch
        past_leftovers(st)
        teardown(st)
    lost = members.lost_with_unreachable(st.obs.members, current_pods(st), st.attempt)
    if lost:
        return restarting.gang_failure(st, spec, lost, DISRUPTION, "MemberUnreachable")
    if st.status.get("launched"):
        if st.obs.refused:
            return restarting.children_refused(st, spec, st.obs.refused)
        return tracking.track(st, spec)
    stop = restarting.wait_out_backoff(st, spec)
    if stop is not None:
        return stop
    return launching.launch(st, spec)


def _report_members(st: JobState, states: Mapping[str, members.MemberState]) -> None:
    """A job across member clusters: each member's part of it (members.job_status)."""
    status, events, value = members.job_status(
        states,
        st.obs.nodes,
        current_pods(st) + st.d.create_pods,
        st.old.get("members") or {},
    )
    st.status["members"] = status
    st.d.events += [Event(*e) for e in events]
    st.status["conditions"] = cond.set_condition(
        st.status.get("conditions"), cond.MEMBERS, *value, st.stamp, st.generation
    )
