"""The reconcile decision: observed state in, desired status + actions out. Pure (no I/O, no
clock of its own), so every transition is unit-tested as data; ``kube.py`` applies the result.

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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol

from holmes.contract import JobSpec, Layout, LayoutError, SpecError, load_job
from holmes.contract.names import EXIT_PREEMPTED
from holmes.plan import InsufficientNodes, PlanError

from . import capacity, frameworks, members, names, queueing
from . import conditions as cond
from .render import JobRef, RenderSettings, build_configmap, build_pod, build_service
from .summary import (
    container_exits,
    disruption_of,
    failure_of,
    iso,
    layout_status,
    parse_time,
    pod_attempt,
    pod_counts,
    pod_node_rank,
    waiting_reason,
)
from .template import policy_violations, shape_problems

PENDING, RUNNING, RESTARTING = "Pending", "Running", "Restarting"
SUCCEEDED, FAILED, SUSPENDED = "Succeeded", "Failed", "Suspended"
FINISHED = (SUCCEEDED, FAILED)

# how a gang restart is counted (status.restartsByReason)
FAILURE, DISRUPTION, IGNORED, SCALE_UP = "failure", "disruption", "ignored", "scaleUp"
_NEXT_ATTEMPT = re.compile(r"next attempt at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")
WAIT_INTERVAL = 30.0  # re-plan a job waiting for nodes at least this often


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class ChildRefusal:
    """A create the API server refused: its HTTP code, reason (Forbidden, Invalid, ...) and message."""

    kind: str
    name: str
    code: int
    reason: str
    message: str

    @property
    def retryable(self) -> bool:
        """Whether time alone can fix it: a full ResourceQuota, throttling, a busy API server. A
        Pod Security or webhook denial (403), an invalid object (422) wait for someone to act."""
        if self.code == 403:
            return "exceeded quota" in self.message
        return self.code == 429 or self.code >= 500 or self.code == 0

    def describe(self) -> str:
        return f"creating {self.kind} {self.name} was refused: {self.code} {self.reason}: {self.message}"


CHILD_REJECTED_RETRY = 300.0  # a child refused for good is tried again this often (policy may change)


@dataclass
class Observed:
    job: dict  # the HolmesJob as just read
    pods: list[dict]  # pods labelled with the job's name, any attempt
    configmap: dict | None  # <job>-layout, or None
    service: dict | None  # the headless Service, or None
    nodes: list[dict]  # node objects known to the operator
    now: datetime
    progress: dict | None = None  # numbers just read from the rank-0 trainer
    # children the API server refused in the apply just before this pass (see ChildRefusal)
    refused: list[ChildRefusal] = field(default_factory=list)
    # Shared clusters (queueing.py): the job's Kueue Workload; Kueue's ResourceFlavors by name
    # (None: the Kueue API is not served); PriorityClass values by name (None: not known)
    workload: dict | None = None
    flavors: Mapping[str, dict] | None = None
    priority_classes: Mapping[str, int] | None = None
    # Member clusters (members.py): every registered member's state by name, for a job across
    # members (pods, ConfigMap and Service are then the members' and nodes their union, each
    # tagged with its member); None for a single-cluster job.
    members: Mapping[str, members.MemberState] | None = None


@dataclass
class Decision:
    status: dict
    delete_pods: list[str] = field(default_factory=list)
    configmap: dict | None = None  # create or replace
    service: dict | None = None  # create when missing
    create_pods: list[dict] = field(default_factory=list)
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    workload: dict | None = None  # Kueue Workload to create
    delete_workload: str | None = None  # name of a Workload to delete (its pod sets changed)
    workload_conditions: list[dict] | None = None  # the Workload's new status.conditions
    podgroup: dict | None = None  # Volcano PodGroup to create or update


class Planner(Protocol):
    """What the reconciler asks of the planner (``planning.ClusterPlanner``; tests give their own)."""

    def plan(self, nodes: list, job: JobSpec) -> Layout:
        """Raises InsufficientNodes (wait for nodes) or PlanError (the job cannot be planned)."""

    def network(self, node: Mapping) -> NodeNetwork:
        """The node's NIC kind, RDMA resource and NCCL environment."""

    def unusable(self, node: Mapping) -> str:
        """Why the node cannot run pods ("" if it can)."""


@dataclass(frozen=True)
class NodeNetwork:
    nic: str  # infiniband | roce | ethernet
    rdma_resource: str | None
    env: Mapping[str, str]


@dataclass(frozen=True)
class RestartBackoff:
    """Delay before the attempt after gang restart k: ``base * 2^(k-1)`` seconds, at most ``cap``
    (operator flags --restart-backoff-seconds / --restart-backoff-max-seconds; base 0 disables)."""

    base: float = 10.0
    cap: float = 300.0

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0:
            raise ValueError(f"restart back-off must not be negative (base={self.base}, cap={self.cap})")

    def delay(self, restarts: int) -> float:
        if self.base <= 0 or restarts < 1:
            return 0.0
        return min(self.base * 2.0 ** min(restarts - 1, 62), self.cap)


def decide(
    obs: Observed, planner: Planner, settings: RenderSettings, backoff: RestartBackoff = RestartBackoff()
) -> Decision:
    return _Reconciler(obs, planner, settings, backoff).run()


class _Reconciler:
    def __init__(self, obs: Observed, planner: Planner, settings: RenderSettings, backoff: RestartBackoff):
        self.obs, self.planner, self.settings, self.backoff = obs, planner, settings, backoff
        self.job = obs.job
        meta = self.job.get("metadata") or {}
        self.name, self.ns = meta.get("name", ""), meta.get("namespace", "default")
        self.generation = meta.get("generation")
        self.old = dict(self.job.get("status") or {})
        self.status = dict(self.old)
        self.now = iso(obs.now)
        self.d = Decision(status=self.status)
        self.attempt = int(self.old.get("attempt") or 0)
        # Only pods this job object owns: a job deleted and recreated under the same name must
        # not adopt the old one's pods, which the garbage collector is removing.
        uid = meta.get("uid")
        self.pods = owned(obs.pods, uid)
        self.spec: JobSpec | None = None  # set once the spec parsed

    # ---- helpers -------------------------------------------------------------------------
    def event(self, type_: str, reason: str, message: str) -> None:
        self.d.events.append(Event(type_, reason, message))

    def set_phase(
        self,
        phase: str,
        reason: str,
        message: str,
        stalled: tuple[str, str] | None = None,
        announce: bool = True,
    ) -> bool:
        """Phase plus the matching kstatus conditions; an Event when the phase changes (True then)."""
        previous = self.old.get("phase")
        self.status["phase"] = phase
        active = phase in (PENDING, RESTARTING)
        ready = phase in (RUNNING, SUCCEEDED)
        values = {
            cond.READY: (ready, reason if not ready or phase != RUNNING else "AllPodsRunning", message),
            cond.RECONCILING: (
                active and stalled is None,
                reason if active else phase,
                message if active else "",
            ),
            cond.STALLED: (
                stalled is not None,
                stalled[0] if stalled else "Healthy",
                stalled[1] if stalled else "",
            ),
            cond.SUCCEEDED: (
                phase == SUCCEEDED,
                reason if phase == SUCCEEDED else "NotSucceeded",
                message if phase == SUCCEEDED else "",
            ),
            cond.FAILED: (
                phase == FAILED,
                reason if phase == FAILED else "NotFailed",
                message if phase == FAILED else "",
            ),
            cond.SUSPENDED: (
                phase == SUSPENDED,
                reason if phase == SUSPENDED else "NotSuspended",
                message if phase == SUSPENDED else "",
            ),
        }
        self.status["conditions"] = cond.set_many(
            self.old.get("conditions"), values, self.now, self.generation
        )
        if phase != previous and announce:
            kind = "Warning" if phase in (FAILED, RESTARTING) else "Normal"
            self.event(kind, reason, f"{previous or 'New'} -> {phase}: {message}")
            return True
        return False

    def stall(self, reason: str, message: str) -> Decision:
        """Bad input: say what to fix (condition + one Warning Event per distinct message)."""
        old = cond.get(self.old.get("conditions"), cond.STALLED)
        phase = self.old.get("phase") or PENDING
        keep_reason = (cond.get(self.old.get("conditions"), cond.READY) or {}).get("reason", reason)
        self.set_phase(phase, keep_reason, message, stalled=(reason, message), announce=False)
        if not (old and old.get("status") == "True" and old.get("message") == message):
            self.event("Warning", reason, message)
        self.status["observedGeneration"] = self.generation
        return self.d

    def live_pods(self) -> list[str]:
        """Names of pods still running or starting (any attempt) and not already being deleted."""
        return [
            p["metadata"]["name"]
            for p in self.pods
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and not p["metadata"].get("deletionTimestamp")
        ]

    def current_pods(self) -> list[dict]:
        return [p for p in self.pods if pod_attempt(p) == self.attempt]

    def delete_stale(self) -> None:
        for p in self.pods:
            if (
                pod_attempt(p) != self.attempt
                and not p["metadata"].get("deletionTimestamp")
                and p["metadata"]["name"] not in self.d.delete_pods
            ):
                self.d.delete_pods.append(p["metadata"]["name"])

    def teardown(self, *, restart: str | None = None) -> None:
        """Delete the current attempt's pods by moving to a new attempt; ``restart`` counts it
        as a gang restart of that kind (FAILURE, DISRUPTION, IGNORED, SCALE_UP)."""
        self.attempt += 1
        self.status["attempt"] = self.attempt
        self.status["launched"] = False
        self.status.pop("scaleUpAfter", None)
        if restart:
            self.status["restarts"] = int(self.old.get("restarts") or 0) + 1
            by = self.restarts_by_reason()
            by[restart] = by.get(restart, 0) + 1
            self.status["restartsByReason"] = by
        self.delete_stale()

    def restarts_by_reason(self) -> dict[str, int]:
        """status.restartsByReason (a status written before it existed: all were failures)."""
        by = self.old.get("restartsByReason")
        if isinstance(by, Mapping):
            return {k: int(v) for k, v in by.items() if isinstance(v, int)}
        return {FAILURE: int(self.old.get("restarts") or 0)} if self.old.get("restarts") else {}

    def job_ref(self, attempt: int | None = None) -> JobRef:
        spec = self.job.get("spec") or {}
        return JobRef(
            self.name,
            self.ns,
            self.attempt if attempt is None else attempt,
            names.spec_hash(spec),
            names.model_hash(spec),
        )

    def cm_annotation(self, key: str) -> str | None:
        return ((self.obs.configmap or {}).get("metadata", {}).get("annotations") or {}).get(key)

    # ---- the state machine ----------------------------------------------------------------
    def run(self) -> Decision:
        if (self.job.get("metadata") or {}).get("deletionTimestamp"):
            return self.d  # owner references clean up (across members: the finalizer, members.cleanup)
        d = self.transition()
        if self.obs.members is not None and self.old.get("phase") not in FINISHED:
            self.member_status()
        return d

    def transition(self) -> Decision:
        phase = self.old.get("phase")
        try:
            spec, invalid = load_job(self.job), None
        except SpecError as e:
            spec, invalid = None, e
        if phase in FINISHED:
            return self.finished(phase, spec)

        problem = names.job_name_problem(self.name)
        if problem:
            return self.stall("InvalidName", problem)
        if spec is None:
            return self.stall("InvalidSpec", f"{invalid} -- fix the spec with kubectl edit or apply")
        self.spec = spec
        shape = shape_problems(spec.template)
        if shape:
            return self.stall("InvalidSpec", "; ".join(shape) + " -- fix the spec with kubectl edit or apply")
        denied = policy_violations(spec.template, self.settings.policy)
        if spec.network == "hostNetwork" and not self.settings.policy.allow_host_namespaces:
            denied.append(
                "spec.network: hostNetwork is not allowed by the operator's job policy (allowed by the "
                "operator flag --allow-host-namespaces, chart value jobPolicy.allowHostNamespaces: true)"
            )
        if denied:
            return self.stall("PolicyViolation", "; ".join(denied))
        if self.obs.members is not None and queueing.volcano_group(spec.template):
            return self.stall(
                "InvalidSpec",
                "schedulerName: volcano (a Volcano PodGroup) is not supported for a job across member "
                "clusters yet: remove spec.template.spec.schedulerName",
            )
        started_model = self.cm_annotation(names.ANN_MODEL_HASH)
        if started_model and started_model != names.model_hash(self.job.get("spec")):
            return self.stall(
                "ImmutableField",
                "spec.model cannot change once the job has started (its "
                "checkpoints hold this model); revert spec.model or create a new HolmesJob",
            )
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

        if self.attempt == 0:  # first launch, past the attempts of any same-named job's leftovers
            foreign = [p for p in self.obs.pods if not any(p is q for q in self.pods)]
            self.attempt = max((pod_attempt(p) or 0 for p in foreign), default=0)
            self.teardown()
        lost = self.on_unreachable_member()
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

    def until_deadline(self, seconds: float) -> float:
        """``seconds``, or less so the job wakes up in time to fail on runPolicy.activeDeadlineSeconds."""
        deadline = self.spec.run_policy.active_deadline_seconds
        started = parse_time(self.status.get("startTime"))
        if deadline and started:
            seconds = min(seconds, (started + timedelta(seconds=deadline) - self.obs.now).total_seconds())
        return max(seconds, 0.0)

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
        last_hash = self.cm_annotation(names.ANN_SPEC_HASH)
        if last_hash and last_hash != names.spec_hash(self.job.get("spec")):
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
            self.d.workload_conditions = queueing.finished_conditions(
                self.obs.workload, phase == SUCCEEDED, msg, self.now
            )
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

    def fail(self, reason: str, message: str) -> Decision:
        self.d.delete_pods = self.live_pods()
        self.status.pop("nextAttemptTime", None)
        self.status["completionTime"] = self.now
        self.set_phase(FAILED, reason, message, stalled=(reason, message))
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
        """A job labelled kueue.x-k8s.io/queue-name runs only while Kueue admits its Workload
        (None: admitted, go on; the planner is then restricted to the flavors' nodes)."""
        queue = queueing.queue_name(self.job)
        if not queue:
            return None
        if self.obs.flavors is None:
            return self.stall(
                "KueueNotInstalled",
                f"label {queueing.LABEL_QUEUE}={queue} asks Kueue to admit this job, but the API "
                f"{queueing.KUEUE_API} (Workload) is not served: install Kueue, or remove the label",
            )
        shape = capacity.pod_shape(spec, self.settings.gpu_resource)
        priority = capacity.priority_of(spec, self.obs.priority_classes or {})[0]
        want = queueing.build_workload(
            self.name, self.ns, queue, spec.nodes.count, shape, spec.template, priority
        )
        wl = self.obs.workload
        if wl is not None and (
            self.job["metadata"].get("uid") and not owned_by(wl, self.job["metadata"]["uid"])
        ):
            wl = None  # a same-named job's leftover: garbage collected
        name = want["metadata"]["name"]
        if wl is None:
            self.d.workload = want
            return self.hold(
                "WaitingForAdmission",
                f"Workload {name} created in LocalQueue {queue}: waiting for Kueue to admit it",
            )
        if not queueing.same_pod_sets(wl.get("spec", {}).get("podSets"), want["spec"]["podSets"]):
            self.d.delete_workload = name
            return self.hold(
                "WaitingForAdmission",
                f"the job's pods changed (count or requests): re-creating Workload {name} for Kueue",
            )
        state, why = queueing.admission(wl)
        if state == queueing.EVICTED:
            return self.hold(
                "Requeued",
                f"Workload {name} was evicted by Kueue ({why}): pods deleted; waiting to be admitted again",
                warn=True,
            )
        if state == queueing.PENDING:
            was = (cond.get(self.old.get("conditions"), cond.SUSPENDED) or {}).get("reason")
            reason = "Requeued" if was == "Requeued" else "WaitingForAdmission"
            return self.hold(reason, f"Workload {name} in LocalQueue {queue} is not admitted: {why}")
        labels, missing = queueing.flavor_node_labels(wl, self.obs.flavors)
        if missing:
            return self.hold(
                "WaitingForAdmission",
                f"Workload {name} is admitted with ResourceFlavor(s) {', '.join(missing)}, which do not "
                "exist (yet): their node labels say where the job may run",
            )
        self.planner = capacity.restricted(self.planner, labels)
        return None

    def hold(self, reason: str, message: str, warn: bool = False) -> Decision:
        """Suspended by the queueing system: no pods (deleted gracefully), status kept."""
        if self.old.get("phase") != SUSPENDED:
            if self.attempt == 0:  # past the attempts of any same-named job's leftovers
                foreign = [p for p in self.obs.pods if not any(p is q for q in self.pods)]
                self.attempt = max((pod_attempt(p) or 0 for p in foreign), default=0)
            self.teardown()
        else:
            self.delete_stale()
        self.status.pop("nextAttemptTime", None)
        self.status.pop("waitingSince", None)
        self.status["pods"] = pod_counts([])
        old = cond.get(self.old.get("conditions"), cond.SUSPENDED) or {}
        self.set_phase(SUSPENDED, reason, message, announce=False)
        if (old.get("reason"), old.get("status")) != (reason, "True"):
            self.event("Warning" if warn else "Normal", reason, message)
        self.d.requeue_after = WAIT_INTERVAL
        return self.d

    # ---- launching --------------------------------------------------------------------------
    def launch(self, spec: JobSpec) -> Decision:
        self.delete_stale()
        stopping = self.terminating_pods()
        if stopping:  # a graceful stop may be writing the checkpoint the next attempt resumes from
            self.status["pods"] = pod_counts([])
            self.set_phase(
                RESTARTING if self.old.get("phase") == RESTARTING else PENDING,
                "WaitingForPodsToStop",
                f"attempt {self.attempt}: waiting for {len(stopping)} pod(s) of the previous attempt to stop "
                f"({', '.join(stopping[:3])}{' ...' if len(stopping) > 3 else ''}) within their grace period",
                announce=False,
            )
            self.d.requeue_after = self.until_deadline(1.0)
            return self.d
        layout = None
        if self.cm_annotation(names.ANN_ATTEMPT) == str(self.attempt) and self.cm_annotation(
            names.ANN_SPEC_HASH
        ) == names.spec_hash(self.job.get("spec")):
            try:  # resume a launch cut short
                layout = Layout.from_json(self.obs.configmap["data"][names.LAYOUT_FILE])
            except (KeyError, TypeError, LayoutError):
                layout = None
        by_name = {n["metadata"]["name"]: n for n in self.obs.nodes}
        if layout is None:
            try:
                layout = self.plan_size(spec)
            except InsufficientNodes as e:
                return self.wait_for_nodes(str(e), getattr(e, "reason", "WaitingForNodes"))
            except PlanError as e:
                return self.stall("PlanFailed", f"cannot plan this job: {e}")
            missing = [n for n in layout.nodes if n not in by_name]
            if missing:
                return self.stall("PlanFailed", f"the planner chose unknown nodes {missing}")
            self.event("Normal", "Planned", plan_message(layout))
        elif any(n not in by_name for n in layout.nodes):
            self.teardown()  # a planned node vanished: plan again
            return self.launch(spec)

        mismatch = frameworks.plan_conflicts(spec, layout)  # spec.framework: the user's arguments
        if mismatch:
            return self.stall("InvalidSpec", "; ".join(mismatch))
        ref = self.job_ref()
        self.d.configmap = frameworks.with_framework_files(build_configmap(ref, layout, spec), spec, layout)
        if self.obs.service is None:
            self.d.service = build_service(ref, self.settings)
        existing = {pod_node_rank(p) for p in self.current_pods()}
        nets = {n: self.planner.network(by_name[n]) for n in layout.nodes}
        ranks, master = self.rendezvous(len(layout.nodes))
        for rank, node_name in enumerate(layout.nodes):
            if rank in existing or rank not in ranks:
                continue
            net = nets[node_name]
            pod = build_pod(
                ref,
                layout,
                rank,
                nic=net.nic,
                rdma_resource=net.rdma_resource,
                nccl_env=net.env,
                template=spec.template,
                settings=self.settings,
                hostname_label=(by_name[node_name]["metadata"].get("labels") or {}).get(
                    "kubernetes.io/hostname"
                ),
                master=master if rank else None,
                host_network=spec.network == "hostNetwork",
            )
            # spec.framework other than holmes: the user's command under Holmes' launcher
            self.d.create_pods.append(frameworks.launched_pod(pod, spec, layout, rank, self.settings.image))
        if queueing.volcano_group(spec.template):  # the gang as a Volcano PodGroup
            shape = capacity.pod_shape(spec, self.settings.gpu_resource)
            self.d.podgroup = queueing.build_podgroup(
                self.name, self.ns, len(layout.nodes), shape, spec.template
            )
            for pod in self.d.create_pods:
                queueing.in_group(pod, self.d.podgroup["metadata"]["name"])
        nic_of = {n: net.nic for n, net in nets.items()}
        self.status["layout"] = layout_status(layout, nic_of, names.layout_configmap_name(self.name))
        self.status.pop("waitingSince", None)
        if len(existing) + len(self.d.create_pods) < len(layout.nodes):  # across members: rank 0 first
            return self.wait_for_rendezvous(layout)
        self.status["launched"] = True
        self.status["size"] = self.size(len(layout.nodes))
        self.status["pods"] = pod_counts(self.current_pods() + self.d.create_pods)
        if self.d.create_pods:
            self.event(
                "Normal",
                "Launched",
                f"attempt {self.attempt}: created {len(self.d.create_pods)} pods "
                f"for layout {self.status['layout']['shape']} (pipeline x data x tensor)",
            )
        self.set_phase(
            PENDING, "PodsStarting", f"attempt {self.attempt}: waiting for {len(layout.nodes)} pods to run"
        )
        self.d.requeue_after = self.settings.progress_interval
        return self.d

    # ---- member clusters (members.py) -------------------------------------------------------
    def rendezvous(self, nodes: int) -> tuple[range | tuple[int, ...], str | None]:
        """The ranks to create now and the rendezvous address they get. One cluster: all ranks,
        rank 0's DNS name. Across members (no shared DNS): rank 0 first, the others once rank 0's
        pod has an IP, which they get as MASTER_ADDR."""
        if self.obs.members is None:
            return range(nodes), None
        rank0 = next((p for p in self.current_pods() if pod_node_rank(p) == 0), None)
        if rank0 is None:
            return (0,), None
        ip = members.pod_ip(rank0)
        return (range(nodes), ip) if ip else ((), None)

    def wait_for_rendezvous(self, layout: Layout) -> Decision:
        self.status["launched"] = False
        self.status["size"] = self.size(len(layout.nodes))
        self.status["pods"] = pod_counts(self.current_pods() + self.d.create_pods)
        self.set_phase(
            PENDING,
            "WaitingForRendezvous",
            f"attempt {self.attempt}: rank 0 is created first; the other {len(layout.nodes) - 1} pod(s) "
            "follow once it has an IP, their rendezvous address across member clusters",
            announce=False,
        )
        self.d.requeue_after = self.until_deadline(1.0)
        return self.d

    def on_unreachable_member(self) -> str:
        """Why pods of the current attempt are lost with an unreachable member ('' if none are)."""
        if self.obs.members is None:
            return ""
        down = {m: st for m, st in self.obs.members.items() if not st.reachable}
        lost: dict[str, int] = {}
        for p in self.current_pods():
            m = members.member_of(p)
            if m in down or (m is not None and m not in self.obs.members):
                lost[m] = lost.get(m, 0) + 1
        if not lost:
            return ""
        parts = []
        for m, k in sorted(lost.items()):
            why = down[m].message if m in down else "no longer registered"
            parts.append(
                f"member cluster {m} is unreachable ({why or 'no answer'}): {k} pod(s) of attempt "
                f"{self.attempt} there are lost"
            )
        return "; ".join(parts) + "; planning again on the members left"

    def member_status(self) -> None:
        """status.members and the MembersReachable condition; an Event when a member the job
        uses becomes unreachable or comes back."""
        states = self.obs.members or {}
        by_node = {n["metadata"]["name"]: members.member_of(n) for n in self.obs.nodes}
        pods = []
        for p in self.current_pods() + self.d.create_pods:
            m = members.member_of(p) or by_node.get(
                ((p.get("metadata") or {}).get("annotations") or {}).get(names.ANN_NODE) or ""
            )
            pods.append(members.tag(p, m) if m else p)
        st = members.members_status(states, pods)
        self.status["members"] = st
        before = self.old.get("members") or {}
        for m, entry in st.items():
            was = (before.get(m) or {}).get("reachable")
            if was is not False and not entry["reachable"] and (was is True or entry["nodes"]):
                self.event(
                    "Warning",
                    "MemberUnreachable",
                    f"member cluster {m} is unreachable: {entry.get('message') or 'no answer'}",
                )
            elif was is False and entry["reachable"]:
                self.event("Normal", "MemberReachable", f"member cluster {m} is reachable again")
        down = [m for m, e in st.items() if not e["reachable"]]
        if down:
            msg = "; ".join(f"{m}: {st[m].get('message') or 'no answer'}" for m in down)
            value = (False, "MemberUnreachable", f"unreachable member cluster(s): {msg}")
        elif st:
            value = (True, "AllMembersReachable", f"{len(st)} member cluster(s): {', '.join(st)}")
        else:
            value = (False, "NoMembers", "no member cluster is registered")
        self.status["conditions"] = cond.set_condition(
            self.status.get("conditions"), cond.MEMBERS, *value, self.now, self.generation
        )

    def size(self, current: int | None) -> dict[str, int]:
        n = self.spec.nodes
        out = {"desired": n.count, "minimum": n.minimum}
        if current is not None:
            out["current"] = current
        return out

    def terminating_pods(self) -> list[str]:
        """Pods of earlier attempts still stopping on a node that can still stop them (a pod on a
        lost node never reports back: it is not waited for)."""
        by_name = {n["metadata"]["name"]: n for n in self.obs.nodes}
        out = []
        for p in self.pods:
            if pod_attempt(p) == self.attempt or (p.get("status") or {}).get("phase") in (
                "Succeeded",
                "Failed",
            ):
                continue
            node = (p.get("spec") or {}).get("nodeName")
            if not node:
                continue  # never scheduled: nothing runs
            if node not in by_name or "not Ready" in self.planner.unusable(by_name[node]):
                continue
            out.append(p["metadata"]["name"])
        return out

    def plan_size(self, spec: JobSpec) -> Layout:
        """The layout at spec.nodes.count, or for an elastic job (minCount < count) the largest
        size down to minCount that plans, when it may run smaller now: at once after a restart
        (the job was running: waiting costs the whole gang), else after waitForNodesSeconds."""
        try:
            return self.planner.plan(self.obs.nodes, spec)
        except InsufficientNodes as e:
            n = spec.nodes
            if not n.elastic:
                raise
            restarted = bool(self.old.get("restarts"))
            since = parse_time(self.old.get("waitingSince")) or self.obs.now
            waited = (self.obs.now - since).total_seconds()
            wait = spec.run_policy.wait_for_nodes_seconds
            if not restarted and waited < wait:
                self.status["waitingSince"] = iso(since)
                raise type(e)(
                    f"{e}; nodes.minCount={n.minimum}: runs on fewer after waiting "
                    f"{wait - waited:.0f}s more (runPolicy.waitForNodesSeconds={wait})"
                ) from None
            for count in range(n.count - 1, n.minimum - 1, -1):
                try:
                    layout = self.planner.plan(self.obs.nodes, spec.replace(nodes=replace(n, count=count)))
                except PlanError:
                    continue
                self.event(
                    "Warning",
                    "ScaledDown",
                    f"running on {count} of {n.count} nodes (nodes.minCount={n.minimum}) with the same "
                    f"global batch; {e}",
                )
                return layout
            raise type(e)(f"{e}; not even nodes.minCount={n.minimum} nodes can run it") from None

    def wait_for_nodes(self, why: str, reason: str = "WaitingForNodes") -> Decision:
        self.status["pods"] = pod_counts([])
        self.status["size"] = self.size(None)
        old = cond.get(self.old.get("conditions"), cond.RECONCILING)
        announced = self.set_phase(PENDING, reason, why)
        if not announced and not (old and old.get("reason") == reason and old.get("message") == why):
            self.event("Normal", reason, why)
        self.d.requeue_after = WAIT_INTERVAL
        return self.d

    # ---- tracking a launched attempt ------------------------------------------------------
    def track(self, spec: JobSpec) -> Decision:
        self.status.pop("createFailures", None)  # this attempt's children were all accepted
        self.delete_stale()
        launched_hash = self.cm_annotation(names.ANN_SPEC_HASH)
        if (
            self.cm_annotation(names.ANN_ATTEMPT) == str(self.attempt)
            and launched_hash
            and launched_hash != names.spec_hash(self.job.get("spec"))
        ):
            self.teardown()
            self.event(
                "Normal",
                "SpecChanged",
                "the spec changed: relaunching all pods with a new plan (not counted as a restart)",
            )
            return self.launch(spec)

        if self.obs.service is None:  # rendezvous needs it: put it back
            self.d.service = build_service(self.job_ref(), self.settings)
        pods = self.current_pods()
        counts = pod_counts(pods)
        self.status["pods"] = counts
        expected = int((self.status.get("layout") or {}).get("nodes") or spec.nodes.count)
        self.merge_progress()

        # Disruptions first: when a node dies or a pod is evicted, its peers fail too (their
        # collectives break), and those failures are not the job's fault.
        lost = self.on_deleted_node(pods) or self.stuck_on_lost_node(pods)
        if lost:
            return self.gang_failure(spec, lost, DISRUPTION, "NodeLost")
        failed = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
        deleting = [p for p in pods if p["metadata"].get("deletionTimestamp") and p not in failed]
        gone = expected - len(pods)
        if deleting or gone > 0:  # the operator deletes only other attempts' pods: someone else did
            what = (
                f"pod {deleting[0]['metadata']['name']} is being deleted"
                if deleting
                else f"{gone} pod(s) of attempt {self.attempt} were deleted"
            )
            return self.gang_failure(spec, f"{what} (not by Holmes)", DISRUPTION, "PodDeleted")
        if failed:
            return self.pod_failed(spec, failed)
        if counts["succeeded"] == expected:
            self.status["completionTime"] = self.now
            self.set_phase(SUCCEEDED, "AllPodsSucceeded", f"all {expected} pods finished training")
            return self.d
        if counts["running"] + counts["succeeded"] == expected:
            self.set_phase(RUNNING, "AllPodsRunning", f"attempt {self.attempt}: {expected} pods running")
            if expected < spec.nodes.count and self.scale_up(spec, expected):
                return self.d
        else:
            why = waiting_reason(pods)
            self.set_phase(
                PENDING,
                "PodsStarting",
                f"attempt {self.attempt}: {counts['running']}/{expected} "
                f"pods running" + (f"; {why}" if why else ""),
            )
        self.d.requeue_after = self.settings.progress_interval
        return self.d

    def stuck_on_lost_node(self, pods: list[dict]) -> str:
        """Why a Pending pod of this attempt can never start on its planned node ("" if none is
        stuck). Only Pending pods: running ones on a failing node are Kubernetes' to evict."""
        if self.cm_annotation(names.ANN_ATTEMPT) != str(self.attempt):
            return ""  # the plan of this attempt is not known
        try:
            planned = Layout.from_json(self.obs.configmap["data"][names.LAYOUT_FILE]).nodes
        except (KeyError, TypeError, LayoutError):
            return ""
        by_name = {n["metadata"]["name"]: n for n in self.obs.nodes}
        for p in pods:
            if (p.get("status") or {}).get("phase", "Pending") != "Pending" or p["metadata"].get(
                "deletionTimestamp"
            ):
                continue
            rank = pod_node_rank(p)
            if rank is None or not 0 <= rank < len(planned):
                continue
            node = planned[rank]
            why = "was deleted" if node not in by_name else self.planner.unusable(by_name[node])
            if why:
                why = why if node not in by_name else f"is {why}"
                return (
                    f"pod {p['metadata']['name']} is Pending on its planned node {node}, which {why}; "
                    "it cannot start there"
                )
        return ""

    def pod_failed(self, spec: JobSpec, failed: list[dict]) -> Decision:
        """A failed pod: a disruption (evicted, preempted, the trainer's preempted exit), else
        what runPolicy.failurePolicy says of its exit codes (no rule: a counted failure)."""
        why = failure_of(failed[0])
        disrupted = next((d for p in failed if (d := disruption_of(p, EXIT_PREEMPTED))), "")
        if not disrupted:  # a pod that died with its node (NotReady) did not fail on its own
            by_name = {n["metadata"]["name"]: n for n in self.obs.nodes}
            for p in self.current_pods():
                node = by_name.get((p.get("spec") or {}).get("nodeName") or "")
                if node is not None and "not Ready" in self.planner.unusable(node):
                    disrupted = f"node {node['metadata']['name']} is not Ready"
                    break
        if disrupted:
            return self.gang_failure(spec, f"{why} ({disrupted})", DISRUPTION, "PodDisrupted")
        policy = spec.run_policy.failure_policy
        rule = policy.action_for([x for p in failed for x in container_exits(p)]) if policy else None
        if rule is not None:
            codes = ",".join(str(v) for v in rule.on_exit_codes.values)
            matched = f"failurePolicy rule {rule.action} (exit code {rule.on_exit_codes.operator} [{codes}])"
            if rule.action == "FailJob":
                return self.fail("PodFailurePolicy", f"{why}; {matched}")
            if rule.action == "Ignore":
                return self.gang_failure(spec, f"{why}; {matched}: not counted", IGNORED, "PodFailed")
        return self.gang_failure(spec, why, FAILURE, "PodFailed")

    def gang_failure(
        self, spec: JobSpec, why: str, kind: str = FAILURE, reason: str = "PodFailed"
    ) -> Decision:
        by = self.restarts_by_reason()
        rp = spec.run_policy
        used, limit, field_ = {
            FAILURE: (by.get(FAILURE, 0), rp.backoff_limit, "backoffLimit"),
            DISRUPTION: (by.get(DISRUPTION, 0), rp.disruption_limit, "disruptionLimit"),
        }.get(kind, (0, None, ""))
        if limit is not None and used >= limit:
            return self.fail(
                "BackoffLimitExceeded" if kind == FAILURE else "DisruptionLimitExceeded",
                f"{why}; {used} {kind} restart(s) used of runPolicy.{field_}={limit}",
            )
        self.teardown(restart=kind)
        self.event("Warning", reason, why)
        # a disruption is nobody's bug: relaunch at once; failures back off as Jobs do
        delay = self.backoff.delay(used + 1) if kind == FAILURE else 0.0
        when = ""
        if delay > 0:
            self.status["nextAttemptTime"] = iso(self.obs.now + timedelta(seconds=delay))
            when = f" after a {delay:g}s back-off: next attempt at {self.status['nextAttemptTime']}"
        of = f" of {limit}" if limit is not None else ""
        self.set_phase(
            RESTARTING,
            "GangRestart",
            f"{why}; {kind} restart {used + 1}{of}: deleting the attempt's pods and planning again{when}",
        )
        self.d.requeue_after = self.until_deadline(delay) if delay > 0 else 0.5
        return self.d

    def on_deleted_node(self, pods: list[dict]) -> str:
        """Why a pod of this attempt lost its node (its Node object was deleted), or ''."""
        known = {n["metadata"]["name"] for n in self.obs.nodes}
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if node and node not in known:
                return f"pod {p['metadata']['name']} ran on node {node}, which was deleted"
        return ""

    def scale_up(self, spec: JobSpec, current: int) -> bool:
        """An elastic job below count whose nodes are back: relaunch larger at a checkpoint (True:
        torn down now). With training.checkpoint.onPreemption the stop itself writes it (the
        trainer saves on SIGTERM), so the relaunch is at once; else right after the trainer
        reports its next periodic checkpoint."""
        ckpt_spec = spec.training.checkpoint
        if spec.nodes.scale_up != "atCheckpoint" or not ckpt_spec:
            return False
        ckpt = int((self.status.get("progress") or {}).get("checkpointIteration") or 0)
        after = self.old.get("scaleUpAfter")
        if after is not None and ckpt <= int(after):
            return False  # nodes are back: waiting for the next checkpoint
        try:  # (again at the checkpoint: the nodes may have gone meanwhile)
            bigger = len(self.plan_size_at_least(spec, current + 1).nodes)
        except PlanError:
            self.status.pop("scaleUpAfter", None)
            return False
        if after is None and not ckpt_spec.on_preemption:
            self.status["scaleUpAfter"] = ckpt
            self.event(
                "Normal",
                "ScaleUpPending",
                f"{bigger} nodes can run the job again (now {current} of {spec.nodes.count}): "
                "relaunching after the next checkpoint",
            )
            return False
        self.teardown(restart=SCALE_UP)
        when = (
            f"checkpoint at iteration {ckpt} written"
            if after is not None
            else "the pods save a checkpoint as they stop (training.checkpoint.onPreemption)"
        )
        self.set_phase(
            RESTARTING,
            "ScaleUp",
            f"{bigger} nodes can run the job again; {when}: relaunching on more than {current} nodes "
            f"(nodes.count={spec.nodes.count})",
        )
        self.d.requeue_after = 0.5
        return True

    def plan_size_at_least(self, spec: JobSpec, least: int) -> Layout:
        n = spec.nodes
        for count in range(n.count, least - 1, -1):
            try:
                return self.planner.plan(self.obs.nodes, spec.replace(nodes=replace(n, count=count)))
            except PlanError:
                continue
        raise InsufficientNodes(f"no layout of {least} or more nodes plans now")

    def merge_progress(self) -> None:
        p = self.obs.progress
        if p:
            before = dict(self.old.get("progress") or {})
            merged = dict(before)
            merged.update({k: v for k, v in p.items() if v is not None})
            merged.pop("updateTime", None)
            if {k: v for k, v in before.items() if k != "updateTime"} != merged:  # else no patch
                merged["updateTime"] = self.now
                self.status["progress"] = merged
            fabric = p.get("fabricWarnings") or []
            if fabric and fabric != before.get("fabricWarnings"):  # once per distinct set
                n = len(fabric) - 3
                more = f" (and {n} more in status.progress.fabricWarnings)" if n > 0 else ""
                self.event("Warning", "FabricMismatch", "; ".join(fabric[:3]) + more)


# ---- pure helpers -----------------------------------------------------------------------------


def owned_by(obj: Mapping, uid: str) -> bool:
    """Owned by the job ``uid``: an ownerReference, or across member clusters (where no
    ownerReference can point at the hub's job) the holmes.dev/job-uid annotation."""
    meta = obj.get("metadata") or {}
    if (meta.get("annotations") or {}).get(members.ANN_JOB_UID) == uid:
        return True
    return any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or [])


def owned(objs: list[dict], uid: str | None) -> list[dict]:
    """The objects whose ownerReference carries ``uid`` (all of them when the job has no uid)."""
    return [o for o in objs if not uid or owned_by(o, uid)]


def plan_message(layout: Layout) -> str:
    stages = "; ".join(
        f"stage {s.index}: {s.island} {s.nic} layers {s.layers[0]}-{s.layers[1] - 1} "
        f"on {len(s.nodes or layout.stage_nodes(s.index))} node(s), DP over {s.dp_net}"
        for s in layout.stages
    )
    est = layout.estimate or {}
    tail = (
        f"; estimate {est['tflopsPerGpu']:.1f} TFLOPS/GPU"
        if isinstance(est.get("tflopsPerGpu"), (int, float))
        else ""
    )
    return f"layout {layout.pipeline}x{layout.data}x{layout.tensor} (PxDxT): {stages}{tail}"
