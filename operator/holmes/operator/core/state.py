"""The reconcile's data and the job status it writes: what was observed (``Observed``), what to
do (``Decision``), and ``JobState``, the primitives every rule of the state machine
(reconcile.py) writes the status with: phase and conditions, stalls, attempts and teardowns,
restarts by reason. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from holmes.contract import JobSpec, Layout, LayoutError

from . import child_names, members
from . import conditions as cond
from .placement import PlacementFacts
from .render import JobRef, RenderSettings
from .summary import iso, parse_time, pod_attempt, pod_counts

PENDING, RUNNING, RESTARTING = "Pending", "Running", "Restarting"
SUCCEEDED, FAILED, SUSPENDED = "Succeeded", "Failed", "Suspended"
FINISHED = (SUCCEEDED, FAILED)

WAIT_INTERVAL = 30.0  # re-plan a job waiting for nodes (or held by a queue) at least this often

# how a gang restart is counted (status.restartsByReason)
FAILURE, DISRUPTION, IGNORED, SCALE_UP = "failure", "disruption", "ignored", "scaleUp"


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
    # Volcano (queueing.py): the job's PodGroup as Volcano last wrote its status; whether the
    # API server serves PodGroups at all
    podgroup: dict | None = None
    volcano: bool = True
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
    claim_templates: list[dict] = field(
        default_factory=list
    )  # DRA ResourceClaimTemplates: create when missing
    create_pods: list[dict] = field(default_factory=list)
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    workload: dict | None = None  # Kueue Workload to create
    delete_workload: str | None = None  # name of a Workload to delete (its pod sets changed)
    workload_status: dict | None = None  # a merge patch of the Workload's status (null removes)
    podgroup: dict | None = None  # Volcano PodGroup to create or update
    placed: bool = False  # a layout was searched for (placement.py): timed as planning


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


class JobState:
    """One reconcile's view of the job and the status it writes (``self.status``, in
    ``self.d``); the state machine (reconcile._Reconciler) is built on these primitives."""

    def __init__(
        self, obs: Observed, facts: PlacementFacts, settings: RenderSettings, backoff: RestartBackoff
    ):
        self.obs, self.facts, self.backoff = obs, facts, backoff
        # GPUs are the resource discovery counts: the cost model's nicMapping.gpuResource (its
        # file can change while the operator runs)
        self.settings = replace(settings, gpu_resource=facts.cost_model.nic_mapping.gpu_resource)
        self.node_labels: dict[str, str] = {}  # Kueue's admitted flavors: placement stays on them
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
        self.nodes = {n["metadata"]["name"]: n for n in obs.nodes}  # the node index, by name
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
        values = cond.for_phase(phase, reason, message, stalled)
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

    def past_leftovers(self) -> None:
        """Start counting attempts past those of a same-named job's leftover pods (deleted by
        the garbage collector: a pod name must not be taken twice)."""
        foreign = [p for p in self.obs.pods if not any(p is q for q in self.pods)]
        self.attempt = max((pod_attempt(p) or 0 for p in foreign), default=0)

    def hold(self, reason: str, message: str, warn: bool = False) -> Decision:
        """Suspended by the queueing system: no pods (deleted gracefully), status kept."""
        if self.old.get("phase") != SUSPENDED:
            if self.attempt == 0:
                self.past_leftovers()
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

    def fail(self, reason: str, message: str) -> Decision:
        self.d.delete_pods = self.live_pods()
        self.status.pop("nextAttemptTime", None)
        self.status["completionTime"] = self.now
        self.set_phase(FAILED, reason, message, stalled=(reason, message))
        return self.d

    def relaunch(self, restart: str, reason: str, message: str) -> bool:
        """A planned gang restart of kind ``restart`` (scale up, re-plan): tear down, say why, and
        plan again at once (True: the reconcile ends here)."""
        self.teardown(restart=restart)
        self.set_phase(RESTARTING, reason, message)
        self.d.requeue_after = 0.5
        return True

    def launched_layout(self) -> Layout | None:
        """The Layout of the current attempt, from its ConfigMap (None: not known)."""
        if self.cm_annotation(child_names.ANN_ATTEMPT) != str(self.attempt):
            return None
        try:
            return Layout.from_json((self.obs.configmap or {})["data"][child_names.LAYOUT_FILE])
        except (KeyError, TypeError, LayoutError):
            return None

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
            child_names.spec_hash(spec),
            child_names.model_hash(spec),
        )

    def cm_annotation(self, key: str) -> str | None:
        return ((self.obs.configmap or {}).get("metadata", {}).get("annotations") or {}).get(key)

    def until_deadline(self, seconds: float) -> float:
        """``seconds``, or less so the job wakes up in time to fail on runPolicy.activeDeadlineSeconds."""
        assert self.spec is not None  # only after the spec parsed
        deadline = self.spec.run_policy.active_deadline_seconds
        started = parse_time(self.status.get("startTime"))
        if deadline and started:
            seconds = min(seconds, (started + timedelta(seconds=deadline) - self.obs.now).total_seconds())
        return max(seconds, 0.0)

    def size(self, current: int | None) -> dict[str, int]:
        assert self.spec is not None  # only after the spec parsed
        n = self.spec.nodes
        out = {"desired": n.count, "minimum": n.minimum}
        if current is not None:
            out["current"] = current
        return out
