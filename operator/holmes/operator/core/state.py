"""The reconcile's data and the job status it writes: what was observed (``Observed``), what to
do (``Decision``), one pass's state (``JobState``), and the functions over that state every step
of the state machine (reconcile.py) writes the status with: phase and conditions, stalls,
attempts and teardowns, restarts by reason, the current attempt's launched plan. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from holmes.contract import JobSpec, Layout, LayoutError

from . import child_names, members, placement, replicas, spec_change
from . import conditions as cond
from .placement import PlacementFacts
from .render import JobRef, RenderSettings
from .summary import iso, parse_time, pod_attempt
from .template import enforced_level

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
    dry_run: bool = False  # refused on the dry run before the gang was created (dry_run.py)

    @classmethod
    def from_status(cls, kind: str, name: str, code: Any, reason: Any, body: Any) -> ChildRefusal:
        """From an API error: its HTTP code and reason, and the API's Status ``body`` (JSON text)."""
        try:
            status = json.loads(body or "{}")
        except (TypeError, ValueError):
            status = {}
        if not isinstance(status, dict):
            status = {}
        message = str(status.get("message") or reason or "no message")[:600]
        return cls(kind, name, int(code or 0), str(status.get("reason") or reason or "Unknown"), message)

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
    # Kueue's WorkloadPriorityClass values by name (None: not known)
    workload_priority_classes: Mapping[str, int] | None = None
    # the Topology a flavor of the job's ClusterQueue names (its LocalQueue's, by the label
    # kueue.x-k8s.io/queue-name): Kueue's TAS admits the job (None: no topology, or not known)
    queue_topology: str | None = None
    # Volcano (queueing.py): the job's PodGroup as Volcano last wrote its status; whether the
    # API server serves PodGroups at all
    podgroup: dict | None = None
    volcano: bool = True
    # whether the API server serves NVIDIA's DRA driver's ComputeDomains
    # (computedomains.resource.nvidia.com, watches.py): then one is made for each of the job's
    # NVLink domains (compute_domains.py; kube.py creates them before the pods) and its pods claim
    # the IMEX channel; else the job is planned without NVLink domains. holmes plan --pods: True
    compute_domains: bool = False
    # the ResourceQuotas of the job's namespace, to create no pod they would refuse (quota.py);
    # None: not read (a job across member clusters: the members' quotas judge its pods)
    quotas: list[dict] | None = None
    # Member clusters (members.py): every registered member's state by name, for a job across
    # members (pods, ConfigMap and Service are then the members' and nodes their union, each
    # tagged with its member); None for a single-cluster job.
    members: Mapping[str, members.MemberState] | None = None
    # the job's namespace's labels (its Pod Security level picks Holmes' defaults: render.py);
    # None: not known (defaults as for an unlabelled namespace)
    namespace_labels: Mapping[str, str] | None = None


@dataclass
class Decision:
    status: dict
    delete_pods: list[str] = field(default_factory=list)
    configmap: dict | None = None  # create or replace
    service: dict | None = None  # create when missing
    claim_templates: list[dict] = field(
        default_factory=list
    )  # DRA ResourceClaimTemplates: create when missing
    compute_domains: list[dict] = field(default_factory=list)  # ComputeDomains: create when missing
    create_pods: list[dict] = field(default_factory=list)
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    workload: dict | None = None  # Kueue Workload to create
    delete_workload: str | None = None  # name of a Workload to delete (its pod sets changed)
    workload_status: dict | None = None  # a merge patch of the Workload's status (null removes)
    # the resourceVersion that patch was computed from: it replaces the conditions list whole, so
    # it must not land on a Workload Kueue changed meanwhile (None: no precondition)
    workload_version: str | None = None
    # a merge patch of the metadata of a prebuilt Workload (MultiKueue's) the job takes ownership of
    adopt_workload: dict | None = None
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


@dataclass
class JobState:
    """One reconcile pass: what it read (``obs``, ``old``: the status as read) and what it writes
    (``status``, inside the Decision ``d``). Every step takes it and returns ``d`` when the pass
    ends there. Built by ``begin``."""

    obs: Observed
    facts: PlacementFacts
    settings: RenderSettings
    backoff: RestartBackoff
    job: dict  # the HolmesJob as read
    name: str
    ns: str
    generation: int | None
    old: dict  # status as read
    status: dict  # status being written (is d.status)
    d: Decision
    stamp: str  # obs.now as the status writes it
    attempt: int  # the attempt this pass works on (teardown moves to the next)
    pods: list[dict]  # the pods this job object owns, any attempt
    nodes: dict[str, dict]  # the node index, by name
    # Kueue's admitted flavors (queueing.flavor_node_labels): placement stays on their nodes
    flavor_labels: tuple[dict[str, str], ...] = ()
    flavor_tolerations: tuple[tuple[dict, ...], ...] = ()  # each flavor_labels' tolerations
    # condition Relaunched (True, SpecChanged, this message), set by reconcile.decide at the end of
    # the pass (set_phase rewrites the conditions from those read): see spec_changed
    relaunched: str = ""


def begin(
    obs: Observed, facts: PlacementFacts, settings: RenderSettings, backoff: RestartBackoff
) -> JobState:
    job = obs.job
    meta = job.get("metadata") or {}
    old = dict(job.get("status") or {})
    status = dict(old)
    return JobState(
        obs=obs,
        facts=facts,
        # GPUs are the resource discovery counts: the cost model's nicMapping.gpuResource (its
        # file can change while the operator runs)
        settings=replace(
            settings,
            gpu_resource=facts.cost_model.nic_mapping.gpu_resource,
            pod_security=enforced_level(obs.namespace_labels),
        ),
        backoff=backoff,
        job=job,
        name=meta.get("name", ""),
        ns=meta.get("namespace", "default"),
        generation=meta.get("generation"),
        old=old,
        status=status,
        d=Decision(status=status),
        stamp=iso(obs.now),
        attempt=int(old.get("attempt") or 0),
        # Only pods this job object owns: a job deleted and recreated under the same name must
        # not adopt the old one's pods, which the garbage collector is removing.
        pods=owned(obs.pods, meta.get("uid")),
        nodes=node_index(obs.nodes),
    )


_INDEX: tuple[Sequence[dict], dict[str, dict]] = ((), {})


def node_index(nodes: Sequence[dict]) -> dict[str, dict]:
    """The nodes by name, kept for the last list indexed (read it, never change it): every
    reconcile reads the same node list until a node changes (informer.Store.snapshot), and at
    2,000 nodes indexing it anew was a tenth of a running job's reconcile."""
    global _INDEX
    kept = _INDEX
    if kept[0] is nodes and len(kept[1]) == len(nodes):
        return kept[1]
    index = {n["metadata"]["name"]: n for n in nodes}
    _INDEX = (nodes, index)
    return index


# ---- status: phase, conditions, events ------------------------------------------------------
def event(st: JobState, type_: str, reason: str, message: str) -> None:
    st.d.events.append(Event(type_, reason, message))


def set_phase(
    st: JobState,
    phase: str,
    reason: str,
    message: str,
    stalled: tuple[str, str] | None = None,
    announce: bool = True,
) -> bool:
    """Phase plus the matching kstatus conditions; an Event when the phase changes (True then)."""
    previous = st.old.get("phase")
    st.status["phase"] = phase
    values = cond.for_phase(phase, reason, message, stalled)
    st.status["conditions"] = cond.set_many(st.old.get("conditions"), values, st.stamp, st.generation)
    if phase != previous and announce:
        kind = "Warning" if phase in (FAILED, RESTARTING) else "Normal"
        event(st, kind, reason, f"{previous or 'New'} -> {phase}: {message}")
        return True
    return False


def stall(st: JobState, reason: str, message: str) -> Decision:
    """Bad input: say what to fix (condition + one Warning Event per distinct message)."""
    old = cond.get(st.old.get("conditions"), cond.STALLED)
    phase = st.old.get("phase") or PENDING
    keep_reason = (cond.get(st.old.get("conditions"), cond.READY) or {}).get("reason", reason)
    set_phase(st, phase, keep_reason, message, stalled=(reason, message), announce=False)
    if not (old and old.get("status") == "True" and old.get("message") == message):
        event(st, "Warning", reason, message)
    st.status["observedGeneration"] = st.generation
    return st.d


def fail(st: JobState, reason: str, message: str) -> Decision:
    st.d.delete_pods = live_pods(st)
    st.status.pop("nextAttemptTime", None)
    st.status["completionTime"] = st.stamp
    set_phase(st, FAILED, reason, message, stalled=(reason, message))
    return st.d


def until_deadline(st: JobState, spec: JobSpec, seconds: float) -> float:
    """``seconds``, or less so the job wakes up in time to fail on runPolicy.activeDeadlineSeconds."""
    deadline = spec.run_policy.active_deadline_seconds
    started = parse_time(st.status.get("startTime"))
    if deadline and started:
        seconds = min(seconds, (started + timedelta(seconds=deadline) - st.obs.now).total_seconds())
    return max(seconds, 0.0)


def size(spec: JobSpec, current: int | None) -> dict[str, int]:
    """status.size: nodes.count, nodes.minCount and (when known) the current attempt's nodes."""
    out = {"desired": spec.nodes.count, "minimum": spec.nodes.minimum}
    if current is not None:
        out["current"] = current
    return out


def restarts_by_reason(st: JobState) -> dict[str, int]:
    """status.restartsByReason (a status written before it existed: all were failures)."""
    by = st.old.get("restartsByReason")
    if isinstance(by, Mapping):
        return {k: int(v) for k, v in by.items() if isinstance(v, int)}
    return {FAILURE: int(st.old.get("restarts") or 0)} if st.old.get("restarts") else {}


# ---- pods and attempts ------------------------------------------------------------------------
def live_pods(st: JobState) -> list[str]:
    """Names of pods still running or starting (any attempt) and not already being deleted."""
    return [
        p["metadata"]["name"]
        for p in st.pods
        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not p["metadata"].get("deletionTimestamp")
    ]


def current_pods(st: JobState) -> list[dict]:
    return [p for p in st.pods if pod_attempt(p) == st.attempt]


def delete_stale(st: JobState) -> None:
    """Delete the pods of every other attempt."""
    for p in st.pods:
        if (
            pod_attempt(p) != st.attempt
            and not p["metadata"].get("deletionTimestamp")
            and p["metadata"]["name"] not in st.d.delete_pods
        ):
            st.d.delete_pods.append(p["metadata"]["name"])


def teardown(st: JobState, *, restart: str | None = None) -> None:
    """Delete the current attempt's pods by moving to a new attempt; ``restart`` counts it
    as a gang restart of that kind (FAILURE, DISRUPTION, IGNORED, SCALE_UP)."""
    st.attempt += 1
    st.status["attempt"] = st.attempt
    st.status["launched"] = False
    st.status.pop("scaleUpAfter", None)
    if restart:
        st.status["restarts"] = int(st.old.get("restarts") or 0) + 1
        by = restarts_by_reason(st)
        by[restart] = by.get(restart, 0) + 1
        st.status["restartsByReason"] = by
    delete_stale(st)


def past_leftovers(st: JobState) -> None:
    """Start counting attempts past those of a same-named job's leftover pods (deleted by
    the garbage collector: a pod name must not be taken twice)."""
    foreign = [p for p in st.obs.pods if not any(p is q for q in st.pods)]
    st.attempt = max((pod_attempt(p) or 0 for p in foreign), default=0)


# ---- the current attempt's children -------------------------------------------------------------
def job_ref(st: JobState, parsed: JobSpec | None = None) -> JobRef:
    """The job as rendering sees it; ``parsed`` (its spec): a launch, which records that spec."""
    spec = st.job.get("spec") or {}
    record = spec_change.launch_record(parsed) if parsed is not None else ""
    return JobRef(
        st.name, st.ns, st.attempt, child_names.spec_hash(spec), child_names.model_hash(spec), record
    )


def cm_annotation(st: JobState, key: str) -> str | None:
    return ((st.obs.configmap or {}).get("metadata", {}).get("annotations") or {}).get(key)


def spec_changed(st: JobState, fields: list[str], doing: str) -> None:
    """The spec was edited since the launch (``fields``, spec_change.changes): the Event
    SpecChanged and the condition Relaunched name them; ``doing``: what the operator does now."""
    what = f"{spec_change.describe(fields)} changed"
    event(st, "Normal", "SpecChanged", f"{what}: {doing} (not counted as a restart)")
    st.relaunched = f"attempt {st.attempt}: {what}"


def spec_changes(st: JobState, spec: JobSpec, metadata: bool = False) -> list[str]:
    """The fields the plan or the pods depend on that differ from those the job's ConfigMap was
    launched with (the user edited them since; [] also without a ConfigMap): spec_change.py.
    ``metadata``: template.metadata too (an attempt with no pods to keep)."""
    return spec_change.changes(st.obs.configmap, st.job.get("spec") or {}, spec, metadata)


def launched_layout(st: JobState) -> Layout | None:
    """The Layout of the current attempt, from its ConfigMap (None: not known)."""
    if cm_annotation(st, child_names.ANN_ATTEMPT) != str(st.attempt):
        return None
    try:
        return Layout.from_json((st.obs.configmap or {})["data"][child_names.LAYOUT_FILE])
    except (KeyError, TypeError, LayoutError):
        return None


def launched_replicas(st: JobState) -> replicas.ReplicaPlan | None:
    """The current attempt's acrossIslands replicas, from its ConfigMap (None: not known, or a
    pipeline)."""
    if cm_annotation(st, child_names.ANN_ATTEMPT) != str(st.attempt):
        return None
    try:
        return replicas.read_plan((st.obs.configmap or {}).get("data") or {})
    except (KeyError, TypeError, ValueError):
        return None


UNSCHEDULABLE_NODES = "unschedulableNodes"  # status: planned nodes the scheduler refused


def refused_nodes(st: JobState) -> dict[str, dict]:
    """The planned nodes the scheduler refused a pod of this job on (tracking.py), while
    planning still leaves them out (until their ``until``); the expired ones leave the status."""
    kept = {}
    for node, v in (st.status.get(UNSCHEDULABLE_NODES) or {}).items():
        try:
            until = parse_time((v or {}).get("until"))
        except ValueError:
            until = None
        if until is not None and until > st.obs.now:
            kept[node] = dict(v)
    if kept:
        st.status[UNSCHEDULABLE_NODES] = kept
    else:
        st.status.pop(UNSCHEDULABLE_NODES, None)
    return kept


def planning_nodes(st: JobState) -> list[dict]:
    """The nodes this job plans on: all it observes but those the scheduler refused it."""
    out = refused_nodes(st)
    return [n for n in st.obs.nodes if n["metadata"]["name"] not in out] if out else st.obs.nodes


def placement_of(st: JobState) -> placement.Placement:
    """This job's placement question (core/placement.py); the decision then counts as one
    that placed (its time is the operator's planning-duration metric)."""
    st.d.placed = True
    return placement.Placement(
        st.facts,
        planning_nodes(st),
        st.job,
        across_members=st.obs.members is not None,
        flavor_labels=st.flavor_labels,
        flavor_tolerations=st.flavor_tolerations,
        priority_classes=st.obs.priority_classes or {},
        gpu_resource=st.settings.gpu_resource,
        raw_priority_namespaces=st.settings.raw_priority_namespaces,
        nvlink_channels=nvlink_channels(st),
    )


def nvlink_channels(st: JobState) -> bool:
    """Whether the job's pods can get IMEX channels: the API server serves ComputeDomains and the
    job runs in this cluster (compute_domains.py)."""
    return st.obs.compute_domains and st.obs.members is None
