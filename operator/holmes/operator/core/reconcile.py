"""The reconcile decision: observed state in, desired status + actions out. Pure (no I/O, no
clock of its own), so every transition is unit-tested as data; ``kube.py`` applies the result.
This module is the state machine's entry (spec, suspend, deadline, back-off, Kueue); launching an
attempt is launching.py's, tracking a launched one tracking.py's, the layout placement.py's.

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

import re
from datetime import datetime, timedelta

from holmes.contract import JobSpec, SpecError, load_job

from . import capacity, child_names, members, placement, queueing, validation
from . import conditions as cond
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
    owned,
    owned_by,
)
from .summary import iso, parse_time, pod_counts
from .tracking import Tracking

_NEXT_ATTEMPT = re.compile(r"next attempt at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")


def decide(
    obs: Observed,
    facts: placement.PlacementFacts,
    settings: RenderSettings,
    backoff: RestartBackoff = RestartBackoff(),
) -> Decision:
    return _Reconciler(obs, facts, settings, backoff).run()


class _Reconciler(Tracking):
    """The state machine: one pass from the observed job to its Decision."""

    # ---- the state machine ----------------------------------------------------------------
    def run(self) -> Decision:
        if (self.job.get("metadata") or {}).get("deletionTimestamp"):
            return self.d  # owner references clean up (across members: the finalizer, members.cleanup)
        d = self.transition()
        if self.obs.members is not None and self.old.get("phase") not in FINISHED:
            st, events, value = members.job_status(
                self.obs.members,
                self.obs.nodes,
                self.current_pods() + self.d.create_pods,
                self.old.get("members") or {},
            )
            self.status["members"] = st
            self.d.events += [Event(*e) for e in events]
            self.status["conditions"] = cond.set_condition(
                self.status.get("conditions"), cond.MEMBERS, *value, self.now, self.generation
            )
        return d

    def transition(self) -> Decision:
        phase = self.old.get("phase")
        try:
            spec, invalid = load_job(self.job), None
        except SpecError as e:
            spec, invalid = None, e
        if phase in FINISHED:
            return self.finished(phase, spec)

        problem = child_names.job_name_problem(self.name)
        if problem:
            return self.stall("InvalidName", problem)
        if spec is None:
            return self.stall("InvalidSpec", f"{invalid}{validation.FIX}")
        self.spec = spec
        refused = validation.refusal(
            self.job,
            spec,
            self.settings.policy,
            self.obs.members is not None,
            self.cm_annotation(child_names.ANN_MODEL_HASH),
        )
        if refused is not None:
            return self.stall(*refused)
        self.status["observedGeneration"] = self.generation
        self.status.setdefault("restarts", 0)
        self.status.setdefault("attempt", self.attempt)
        rp = spec.run_policy

        if rp.suspend:
            return self.suspend()
        problem = self.priority_problem(spec)
        if problem:
            return self.stall("InvalidSpec", problem)
        held = self.kueue_gate(spec)
        if held is not None:
            return held
        if phase == SUSPENDED:  # suspend already moved to a fresh attempt
            self.status["launched"] = False
            self.status["startTime"] = self.now  # the deadline counts from the resume
            why = "admitted by Kueue" if queueing.queue_name(self.job) else "runPolicy.suspend is false"
            self.event("Normal", "Resumed", f"{why}: planning again")

        if not self.status.get("startTime"):
            self.status["startTime"] = self.now
        deadline = rp.active_deadline_seconds
        started = parse_time(self.status.get("startTime"))
        if deadline and started and self.obs.now >= started + timedelta(seconds=deadline):
            return self.fail(
                "DeadlineExceeded",
                f"the job was active longer than runPolicy.activeDeadlineSeconds={deadline}",
            )

        if self.attempt == 0:  # first launch
            self.past_leftovers()
            self.teardown()
        lost = members.lost_with_unreachable(self.obs.members, self.current_pods(), self.attempt)
        if lost:
            return self.gang_failure(spec, lost, DISRUPTION, "MemberUnreachable")
        if self.obs.refused and self.status.get("launched"):
            return self.children_refused(self.obs.refused)
        if self.status.get("launched"):
            return self.track(spec)
        due = self.next_attempt_time()
        if due is not None:
            waiting = self.restart_backoff(due)
            if waiting is not None:
                return waiting
        return self.launch(spec)

    def next_attempt_time(self) -> datetime | None:
        """When the back-off after the last gang restart ends (None: no back-off pending). Read
        from ``status.nextAttemptTime``, else from the Reconciling message that repeats it (an
        API server whose CRD schema lacks the field prunes it from the status)."""
        if self.old.get("phase") != RESTARTING and not self.old.get("createFailures"):
            return None
        if self.status.get("nextAttemptTime"):
            return parse_time(self.status["nextAttemptTime"])
        msg = (cond.get(self.old.get("conditions"), cond.RECONCILING) or {}).get("message") or ""
        m = _NEXT_ATTEMPT.search(msg)
        return parse_time(m.group(1)) if m else None

    def restart_backoff(self, due: datetime) -> Decision | None:
        """Wait out the back-off after a gang restart (None: go on and launch now)."""
        self.status["nextAttemptTime"] = iso(due)
        last_hash = self.cm_annotation(child_names.ANN_SPEC_HASH)
        if last_hash and last_hash != child_names.spec_hash(self.job.get("spec") or {}):
            self.status.pop("nextAttemptTime", None)  # the user changed the job: try it at once
            self.event(
                "Normal",
                "SpecChanged",
                "the spec changed during the restart back-off: launching now (not counted as a restart)",
            )
            return None
        if self.obs.now >= due:
            self.status.pop("nextAttemptTime", None)
            return None
        self.delete_stale()  # the failed attempt's pods, if still there
        if self.old.get("createFailures"):  # children were refused: the status already says so
            self.d.requeue_after = self.until_deadline((due - self.obs.now).total_seconds())
            return self.d
        self.status["pods"] = pod_counts([])
        left = (due - self.obs.now).total_seconds()
        restarts = int(self.status.get("restarts") or 0)
        self.set_phase(
            RESTARTING,
            "RestartBackoff",
            f"restart {restarts}: next attempt at "
            f"{self.status['nextAttemptTime']} (back-off {self.backoff.delay(restarts):g}s after "
            f"{restarts} restart(s), so a job failing at start-up does not relaunch in a tight loop)",
        )
        self.d.requeue_after = self.until_deadline(left)
        return self.d

    def finished(self, phase: str, spec: JobSpec | None) -> Decision:
        """Edits to a finished job have no effect, but runPolicy.ttlSecondsAfterFinished (of a
        spec that is still valid) deletes it."""
        self.status["observedGeneration"] = self.generation
        if phase == FAILED:  # a failed gang leaves nothing running
            self.d.delete_pods = self.live_pods()
        if self.obs.workload is not None and queueing.queue_name(self.job):  # Kueue frees the quota
            msg = (cond.get(self.old.get("conditions"), cond.READY) or {}).get("message") or ""
            conds = queueing.finished_conditions(self.obs.workload, phase == SUCCEEDED, msg, self.now)
            self.d.workload_status = None if conds is None else {"conditions": conds}
        ttl = spec.run_policy.ttl_seconds_after_finished if spec else None
        done = parse_time(self.old.get("completionTime"))
        if ttl is not None and done:
            left = (done + timedelta(seconds=ttl) - self.obs.now).total_seconds()
            if left <= 0:
                self.d.delete_job = True
                self.event(
                    "Normal", "TTLExpired", f"deleting the {phase.lower()} job {ttl}s after it finished"
                )
            else:
                self.d.requeue_after = left
        return self.d

    def suspend(self) -> Decision:
        self.status.pop("nextAttemptTime", None)  # resuming is the user's call: no back-off after it
        if self.old.get("phase") != SUSPENDED:
            self.teardown()
        else:
            self.delete_stale()
        self.status["pods"] = pod_counts([])
        self.set_phase(SUSPENDED, "Suspended", "runPolicy.suspend is true: pods deleted, status kept")
        return self.d

    def children_refused(self, refused: list[ChildRefusal]) -> Decision:
        """The API server refused some of this attempt's children: delete the partial gang (no
        pod holds GPUs for a gang that cannot start), say why, and try again later: after a
        back-off when time can fix it (a full quota), else as Stalled until the spec changes
        (or every CHILD_REJECTED_RETRY seconds, since an admin may change the policy)."""
        self.teardown()
        first = refused[0]
        why = first.describe()
        if len(refused) > 1:
            why += f" (and {len(refused) - 1} more)"
        failures = int(self.old.get("createFailures") or 0) + 1
        self.status["createFailures"] = failures
        if first.retryable:
            delay = max(self.backoff.delay(failures), 1.0)
            due = self.obs.now + timedelta(seconds=delay)
            self.status["nextAttemptTime"] = iso(due)
            self.set_phase(
                PENDING,
                "ChildCreateFailed",
                f"{why}; the partial gang was deleted; next attempt at {iso(due)}",
                announce=False,
            )
            if failures == 1:
                self.event("Warning", "ChildCreateFailed", why)
            self.d.requeue_after = self.until_deadline(delay)
            return self.d
        due = self.obs.now + timedelta(seconds=CHILD_REJECTED_RETRY)
        self.status["nextAttemptTime"] = iso(due)
        self.status["pods"] = pod_counts([])
        self.stall(
            "ChildRejected",
            f"{why} -- fix spec.template (or ask the cluster admin); the partial gang was deleted; "
            f"tried again when the spec changes or at {iso(due)}",
        )
        self.d.requeue_after = self.until_deadline(CHILD_REJECTED_RETRY)
        return self.d

    # ---- shared clusters: priority, Kueue admission -------------------------------------------
    def priority_problem(self, spec: JobSpec) -> str:
        classes = self.obs.priority_classes
        if classes is None or spec.run_policy.priority is not None:
            return ""
        return capacity.priority_of(spec, classes)[1]

    def kueue_gate(self, spec: JobSpec) -> Decision | None:
        """Kueue's word (queueing.gate); None: admitted, go on, planning on the flavors' nodes."""
        queue = queueing.queue_name(self.job)
        if not queue:
            return None
        wl, uid = self.obs.workload, self.job["metadata"].get("uid")
        if wl is not None and uid and not owned_by(wl, uid):
            wl = None  # a same-named job's leftover: garbage collected
        was = (cond.get(self.old.get("conditions"), cond.SUSPENDED) or {}).get("reason")
        priority, unknown = capacity.priority_of(spec, self.obs.priority_classes or {})
        rp = spec.run_policy  # the class is named when the priority is its value
        from_class = rp.priority_class_name if rp.priority is None and not unknown else None
        g = queueing.gate(
            self.job,
            queue,
            spec.nodes.count,
            capacity.pod_shape(spec, self.settings.gpu_resource),
            spec.template,
            priority,
            from_class,
            wl,
            self.obs.flavors,
            requeued=was == "Requeued",
            active=bool(self.live_pods()),
            now=self.now,
        )
        self.d.workload, self.d.delete_workload = g.create, g.delete
        self.d.workload_status = g.release
        if g.stall is not None:
            return self.stall(*g.stall)
        if g.hold is not None:
            return self.hold(*g.hold)
        self.node_labels = {**self.node_labels, **(g.node_labels or {})}
        return None
