"""Queueing systems a cluster may run, as pure functions (objects in, objects out):

- Kueue (``kueue.x-k8s.io``): a HolmesJob labelled ``kueue.x-k8s.io/queue-name`` gets a
  ``Workload`` with a PodSet per island and pod shape of the pods its plan would create
  (kueue_pod_sets.py). The job stays suspended until the Workload's ``Admitted`` condition is
  True; it plans only on nodes carrying, for one PodSet, the node labels of the ResourceFlavors
  Kueue assigned it (``status.admission.podSetAssignments[].flavors``) and its nodeSelector.
  When the job finishes, the Workload gets ``Finished`` so Kueue releases the quota.
- Eviction (preemption, a stopped queue, node failures): Kueue's eviction only sets
  ``Evicted=True`` (``pkg/workload/evict``, v0.19.2); the quota stays reserved until the job's
  integration has stopped the job. Holmes does what Kueue's job framework does for the kinds it
  integrates (``pkg/controller/jobframework/reconciler.go``, step "handle eviction"): delete the
  pods (the job is Suspended, reason Requeued), and once none is left (terminating pods still
  hold their GPUs while they save the checkpoint), in one status patch:
  ``Requeued`` (True when evicted by preemption or node failures, else False), ``QuotaReserved``
  False (reason Pending) with ``status.admission`` cleared, and ``Admitted`` False (reason
  NoReservation) (``workload.SetRequeuedCondition``, ``UnsetQuotaReservationWithCondition``,
  ``SyncAdmittedCondition``). Only then can the preempting workload's quota fit. ``Evicted``
  stays True until Kueue reserves quota again (``SetQuotaReservation`` resets it), when the job
  resumes from its newest checkpoint in a new attempt.
  Two versions of Kueue's API are spoken (``KUEUE_VERSIONS``): ``v1beta2`` (Kueue 0.15 on) and
  ``v1beta1`` (Kueue 0.6 to 0.14; deprecated since 0.16). Decisions read and build ``v1beta2``
  objects only; ``workload_as`` / ``workload_from`` translate at the API boundary (the fields
  Holmes uses that v1beta2 renamed or moved).
- MultiKueue: a job on a worker cluster uses the Workload MultiKueue made for it (prebuilt.py).
- Volcano (``scheduling.volcano.sh/v1beta1``): a job whose template sets
  ``schedulerName: volcano`` gets a ``PodGroup`` with ``minMember`` = the gang; its pods carry
  the annotation ``scheduling.k8s.io/group-name`` and are created once Volcano admitted the
  group (phase ``Inqueue``: ``podgroup_wait``), as Volcano's own job controller does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from holmes.contract.names import (
    LABEL_KUEUE_PREBUILT_WORKLOAD,
    LABEL_KUEUE_PRIORITY_CLASS,
    LABEL_KUEUE_QUEUE,
)

from . import child_names, island_topology
from .capacity import CPU, MEMORY, PodShape
from .kueue_pod_sets import ANN_POD_SETS, one_pod_set, quantity_text
from .prebuilt import job_workload_name, prebuilt_workload, workload_name

KUEUE_GROUP = "kueue.x-k8s.io"
V1BETA2, V1BETA1 = "v1beta2", "v1beta1"
KUEUE_VERSIONS = (V1BETA2, V1BETA1)  # newest first: the first one the API server serves is used
WORKLOADS, FLAVORS = "workloads", "resourceflavors"
LOCAL_QUEUES, CLUSTER_QUEUES = "localqueues", "clusterqueues"
PRIORITY_CLASSES = "workloadpriorityclasses"

VOLCANO_GROUP, VOLCANO_VERSION = "scheduling.volcano.sh", "v1beta1"
VOLCANO_API = f"{VOLCANO_GROUP}/{VOLCANO_VERSION}"
PODGROUPS = "podgroups"
VOLCANO_SCHEDULER = "volcano"
ANN_GROUP = "scheduling.k8s.io/group-name"
ANN_VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"

ADMITTED, EVICTED, PENDING = "admitted", "evicted", "pending"


# ---- Kueue ------------------------------------------------------------------------------------


def queue_name(job: Mapping) -> str | None:
    return ((job.get("metadata") or {}).get("labels") or {}).get(LABEL_KUEUE_QUEUE) or None


def workload_priority_class(job: Mapping) -> str | None:
    """The WorkloadPriorityClass the job's label kueue.x-k8s.io/priority-class names."""
    return ((job.get("metadata") or {}).get("labels") or {}).get(LABEL_KUEUE_PRIORITY_CLASS) or None


def choose_version(served: Iterable[str]) -> str | None:
    """The Kueue version to speak: the newest Holmes knows among those served (None: none)."""
    served = set(served)
    return next((v for v in KUEUE_VERSIONS if v in served), None)


def build_workload(
    job: str,
    namespace: str,
    queue: str,
    pod_sets: list[dict],
    priority: int,
    priority_class: str | None = None,
    workload_priority_class: str | None = None,
    built_from: str | None = None,
) -> dict:
    """The job's Workload (v1beta2) asking for ``pod_sets`` (``built_from``: their inputs'
    digest, ANN_POD_SETS). ``priority_class``: the job's PriorityClass, named in
    ``spec.priorityClassRef`` as Kueue's own integrations do (``priority`` is its value);
    ``workload_priority_class``: Kueue's WorkloadPriorityClass of the job's label
    kueue.x-k8s.io/priority-class, which wins over the PriorityClass as in Kueue's
    ``jobframework.ExtractPriority`` (``priority`` is then its value)."""
    spec: dict[str, Any] = {"queueName": queue, "priority": priority}
    if workload_priority_class:
        spec["priorityClassRef"] = {
            "group": KUEUE_GROUP,
            "kind": "WorkloadPriorityClass",
            "name": workload_priority_class,
        }
    elif priority_class:
        spec["priorityClassRef"] = {
            "group": "scheduling.k8s.io",
            "kind": "PriorityClass",
            "name": priority_class,
        }
    spec["podSets"] = pod_sets
    meta: dict[str, Any] = {
        "name": workload_name(job),
        "namespace": namespace,
        "labels": {
            child_names.LABEL_JOB: job,
            child_names.LABEL_MANAGED_BY: child_names.MANAGED_BY,
            LABEL_KUEUE_QUEUE: queue,
        },
    }
    if built_from:
        meta["annotations"] = {ANN_POD_SETS: built_from}
    return {"apiVersion": f"{KUEUE_GROUP}/{V1BETA2}", "kind": "Workload", "metadata": meta, "spec": spec}


def same_pod_sets(a: Any, b: Any) -> bool:
    """Whether two pod set lists ask for the same thing (as the API server may have defaulted them)."""

    def key(ps: Any) -> list:
        out = []
        for p in ps or []:
            spec = ((p or {}).get("template") or {}).get("spec") or {}
            reqs = [
                {k: str(v) for k, v in ((c.get("resources") or {}).get("requests") or {}).items()}
                for c in spec.get("containers") or []
            ]
            tas = (p.get("topologyRequest") or {}).get("required")
            out.append(
                (p.get("name"), p.get("count"), reqs, spec.get("nodeSelector"), spec.get("tolerations"), tas)
            )
        return out

    return key(a) == key(b)


def _condition(obj: Mapping, type_: str) -> Mapping:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == type_), {})


def holds_quota(workload: Mapping) -> bool:
    """Kueue's ``HasQuotaReservation``: its QuotaReserved condition is True."""
    return _condition(workload, "QuotaReserved").get("status") == "True"


def admission(workload: Mapping) -> tuple[str, str]:
    """(ADMITTED | EVICTED | PENDING, what Kueue says). EVICTED while the evicted Workload
    still holds its quota (the job must stop and release it); once released it is PENDING, as
    Kueue keeps Evicted True until it reserves quota for it again."""
    ev = _condition(workload, "Evicted")
    evicted = f"{ev.get('reason') or 'Evicted'}: {ev.get('message') or 'no message'}"
    if ev.get("status") == "True" and holds_quota(workload):
        return EVICTED, evicted
    adm = _condition(workload, "Admitted")
    if adm.get("status") == "True":
        cq = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")
        return ADMITTED, f"admitted by ClusterQueue {cq}" if cq else "admitted"
    qr = _condition(workload, "QuotaReserved")
    msg = qr.get("message") or adm.get("message") or "not admitted yet"
    if ev.get("status") == "True":
        msg = f"quota released after the eviction ({evicted}); waiting for Kueue to admit it again"
    requeue = (workload.get("status") or {}).get("requeueState") or {}
    if _condition(workload, "Requeued").get("status") == "False" and requeue.get("requeueAt"):
        # evicted and backing off: Kueue queues it again at requeueAt
        n = requeue.get("count")
        msg += f" (requeued at {requeue['requeueAt']}" + (f", eviction {n})" if n else ")")
    return PENDING, msg


def flavor_choices(
    workload: Mapping, flavors: Mapping[str, Mapping]
) -> tuple[tuple[tuple[dict, tuple[dict, ...]], ...], list[str]]:
    """Where Kueue's admission lets the job's pods go: per PodSet, the node labels of the
    flavors Kueue assigned it (all must hold) with the PodSet's own nodeSelector (its island),
    and the flavors' ``tolerations``, as Kueue's job framework merges them into its pods
    (pkg/podset FromAssignment: node labels into the nodeSelector, tolerations appended); a pod
    may go where one choice's labels hold and its taints are tolerated with that choice's
    tolerations. And the flavors not found."""
    choices: list[tuple[dict, tuple[dict, ...]]] = []
    missing: list[str] = []
    adm = (workload.get("status") or {}).get("admission") or {}
    selectors = {
        p.get("name"): (((p.get("template") or {}).get("spec") or {}).get("nodeSelector") or {})
        for p in (workload.get("spec") or {}).get("podSets") or []
    }
    for psa in adm.get("podSetAssignments") or []:
        labels = dict(selectors.get(psa.get("name")) or {})
        tolerations: list[dict] = []
        for flavor in sorted(set((psa.get("flavors") or {}).values())):
            if flavor not in flavors:
                missing.append(flavor)
                continue
            fspec = flavors[flavor].get("spec") or {}
            labels.update(fspec.get("nodeLabels") or {})
            tolerations += [dict(t) for t in fspec.get("tolerations") or [] if t not in tolerations]
        # admitted by topology (TAS): only the domains Kueue picked (with a Topology down to
        # kubernetes.io/hostname, its nodes), their labels in the pods' node selectors as
        # Kueue's topology ungater writes them
        domains = island_topology.domains(psa.get("topologyAssignment"))
        for want in [{**labels, **d} for d, _ in domains] if domains else [labels]:
            if (want, tuple(tolerations)) not in choices:
                choices.append((want, tuple(tolerations)))
    if ({}, ()) in choices and not any(tol for _, tol in choices):  # a pod set may go anywhere
        choices = [({}, ())]
    return tuple(choices), missing


def flavor_node_labels(
    workload: Mapping, flavors: Mapping[str, Mapping]
) -> tuple[tuple[dict, ...], list[str]]:
    """flavor_choices' node labels only."""
    choices, missing = flavor_choices(workload, flavors)
    return tuple(labels for labels, _ in choices), missing


def flavor_of(node_labels: Mapping[str, str], choices: Iterable[Mapping[str, str]]) -> dict:
    """The first of ``choices`` (flavor_node_labels) a node of ``node_labels`` carries ({}: none)."""
    return dict(next((c for c in choices if all(node_labels.get(k) == v for k, v in c.items())), {}))


# Kueue's pod webhook marks the pods it manages as workloads of their own (its pod integration):
# pods of a HolmesJob it does not know as an external framework, whose queue name they inherit
# or that a LocalQueue named "default" in their namespace defaults.
LABEL_KUEUE_MANAGED = "kueue.x-k8s.io/managed"
HOLMESJOB_FRAMEWORK = "HolmesJob.v1alpha1.holmes.dev"  # for integrations.externalFrameworks


def taken_by_kueue(pods: Iterable[Mapping]) -> list[str]:
    """The job's pods Kueue's pod integration manages as workloads of their own."""
    return sorted(
        p["metadata"]["name"]
        for p in pods
        if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_KUEUE_MANAGED) == "true"
    )


def taken_message(names: list[str]) -> str:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"Kueue's pod integration took pod(s) {shown} for workloads of their own (label "
        f"{LABEL_KUEUE_MANAGED}=true, gated until Kueue admits each): the job's quota would be "
        f"counted twice and its pods wait for it. Add {HOLMESJOB_FRAMEWORK} to Kueue's "
        "configuration, integrations.externalFrameworks (Kueue then leaves a queued HolmesJob's "
        "pods to it), restart Kueue's manager, then delete this job's pods"
    )


# Evictions after which Kueue's job framework sets Requeued=True (the Workload queues again at
# once); after the others (a stopped queue, a deactivated Workload...) Requeued is False.
REQUEUED_AT_ONCE = ("Preempted", "NodeFailures")


def set_condition(conditions: Iterable[Mapping], new: Mapping, now: str) -> list[dict]:
    """``conditions`` with ``new`` set as apimachinery's SetStatusCondition does: the
    lastTransitionTime moves only when the status changes."""
    out, found = [], False
    for c in conditions:
        if c.get("type") != new["type"]:
            out.append(dict(c))
            continue
        found = True
        moved = c.get("status") != new["status"]
        out.append({**c, **new, "lastTransitionTime": now if moved else c.get("lastTransitionTime", now)})
    if not found:
        out.append({**new, "lastTransitionTime": now})
    return out


def release_after_eviction(workload: Mapping, now: str) -> dict | None:
    """The Workload's status patch that gives back an evicted Workload's quota, as Kueue's job
    framework writes it once the job is no longer active (None: nothing to release)."""
    ev = _condition(workload, "Evicted")
    if ev.get("status") != "True" or not holds_quota(workload):
        return None
    reason, message = ev.get("reason") or "Evicted", ev.get("message") or ""
    conds = (workload.get("status") or {}).get("conditions") or []
    requeued = "True" if reason in REQUEUED_AT_ONCE else "False"
    conds = set_condition(
        conds, {"type": "Requeued", "status": requeued, "reason": reason, "message": message}, now
    )
    conds = set_condition(
        conds, {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message}, now
    )
    if _condition(workload, "Admitted").get("status") == "True":  # SyncAdmittedCondition
        no = {"type": "Admitted", "status": "False", "reason": "NoReservation"}
        conds = set_condition(conds, {**no, "message": "The workload has no reservation"}, now)
    if _condition(workload, "PodsReady"):  # not admitted: generatePodsReadyCondition's WaitForStart
        ready = {"type": "PodsReady", "status": "False", "reason": "WaitForStart"}
        conds = set_condition(conds, {**ready, "message": PODS_READY_MESSAGES["WaitForStart"]}, now)
    return {"conditions": conds, "admission": None}


# Kueue's waitForPodsReady: the integration says on the Workload whether its pods are ready
# (jobframework's generatePodsReadyCondition, v0.17.1); Kueue evicts a Workload admitted for
# longer than waitForPodsReady.timeout without PodsReady=True (and, with a recoveryTimeout, one
# that has stayed WaitForRecovery that long).
PODS_READY_MESSAGES = {
    "WaitForStart": "Not all pods are ready or succeeded",
    "WaitForRecovery": "At least one pod has failed, waiting for recovery",
    "Started": "All pods reached readiness and the workload is running",
    "Recovered": "All pods reached readiness and the workload is running",
}


def pods_ready_patch(workload: Mapping, ready: bool, now: str) -> dict | None:
    """The admitted Workload's status patch setting PodsReady as Kueue's job framework does
    (None: it already says so). ``ready``: every pod of the job is ready or succeeded."""
    cur = _condition(workload, "PodsReady")
    if ready:
        recovering = cur.get("reason") in ("WaitForRecovery", "Recovered")
        status, reason = "True", "Recovered" if recovering else "Started"
    elif cur.get("status") == "True" or cur.get("reason") == "WaitForRecovery":
        status, reason = "False", "WaitForRecovery"
    else:
        status, reason = "False", "WaitForStart"
    if (cur.get("status"), cur.get("reason")) == (status, reason):
        return None
    new = {"type": "PodsReady", "status": status, "reason": reason, "message": PODS_READY_MESSAGES[reason]}
    return {"conditions": set_condition((workload.get("status") or {}).get("conditions") or [], new, now)}


def finished_conditions(workload: Mapping, ok: bool, message: str, now: str) -> list[dict] | None:
    """The Workload's conditions with Finished=True (None when it already says so)."""
    if _condition(workload, "Finished").get("status") == "True":
        return None
    conds = [c for c in (workload.get("status") or {}).get("conditions") or [] if c.get("type") != "Finished"]
    conds.append(
        {
            "type": "Finished",
            "status": "True",
            "reason": "Succeeded" if ok else "Failed",
            "message": message[:1000] or ("the job succeeded" if ok else "the job failed"),
            "lastTransitionTime": now,
        }
    )
    return conds


# ---- Kueue: v1beta1 <-> v1beta2 ------------------------------------------------------------------
# What v1beta2 renamed or moved among the fields Holmes reads or writes (the rest, pod sets,
# counts, admission, flavors, conditions, requeueState and ResourceFlavor.spec.nodeLabels, is
# the same in both): spec.priorityClassSource + priorityClassName became spec.priorityClassRef;
# status.accumulatedPastExexcutionTimeSeconds lost its typo; a pod set assignment's
# topologyAssignment lists slices instead of domains.
PRIORITY_SOURCES = {  # v1beta1 priorityClassSource -> v1beta2 priorityClassRef {group, kind}
    "scheduling.k8s.io/priorityclass": ("scheduling.k8s.io", "PriorityClass"),
    "kueue.x-k8s.io/workloadpriorityclass": ("kueue.x-k8s.io", "WorkloadPriorityClass"),
}


def workload_as(version: str, workload: Mapping) -> dict:
    """A Workload built by Holmes (v1beta2) in ``version``, to write it there."""
    if version == V1BETA2:
        return dict(workload)
    if version != V1BETA1:
        raise ValueError(f"Kueue version {version!r}: Holmes speaks {', '.join(KUEUE_VERSIONS)}")
    out = {**workload, "apiVersion": f"{KUEUE_GROUP}/{V1BETA1}"}
    spec = dict(workload.get("spec") or {})
    ref = spec.pop("priorityClassRef", None)
    source = next(
        (k for k, gk in PRIORITY_SOURCES.items() if ref and gk == (ref["group"], ref["kind"])), None
    )
    if source:
        spec["priorityClassSource"], spec["priorityClassName"] = source, ref["name"]
    out["spec"] = spec
    return out


def workload_from(workload: Mapping) -> dict:
    """A Workload as the API server returned it (in the version it was asked in), as v1beta2."""
    if workload.get("apiVersion") != f"{KUEUE_GROUP}/{V1BETA1}":
        return dict(workload)
    out = {**workload, "apiVersion": f"{KUEUE_GROUP}/{V1BETA2}"}
    spec = dict(workload.get("spec") or {})
    source, name = spec.pop("priorityClassSource", None), spec.pop("priorityClassName", None)
    if source in PRIORITY_SOURCES and name:
        group, kind = PRIORITY_SOURCES[source]
        spec["priorityClassRef"] = {"group": group, "kind": kind, "name": name}
    out["spec"] = spec
    status = dict(workload.get("status") or {})
    if "accumulatedPastExexcutionTimeSeconds" in status:
        status["accumulatedPastExecutionTimeSeconds"] = status.pop("accumulatedPastExexcutionTimeSeconds")
    adm = status.get("admission")
    if adm:
        psas = [dict(p) for p in adm.get("podSetAssignments") or []]
        for p in psas:
            if p.get("topologyAssignment"):
                p["topologyAssignment"] = _topology_v1beta2(p["topologyAssignment"])
        status["admission"] = {**adm, "podSetAssignments": psas}
    if "status" in workload:
        out["status"] = status
    return out


def _topology_v1beta2(ta: Mapping) -> dict:
    """v1beta1 ``{levels, domains: [{values, count}]}`` as v1beta2 ``{levels, slices}``: one
    slice of every domain, each level's values listed one per domain."""
    levels, domains = list(ta.get("levels") or []), list(ta.get("domains") or [])
    if not domains:
        return {"levels": levels, "slices": []}
    values = [{"individual": {"roots": [d["values"][i] for d in domains]}} for i in range(len(levels))]
    counts = {"individual": [d["count"] for d in domains]}
    return {
        "levels": levels,
        "slices": [{"domainCount": len(domains), "valuesPerLevel": values, "podCounts": counts}],
    }


# ---- Volcano -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gate:
    """Kueue's word on a job this reconcile: go on (planning only on the nodes of one of
    ``flavor_labels``, flavor_node_labels), or hold it suspended (``hold``: reason, message, a
    Warning?), or stall it (``stall``: reason, message); with the Workload to create or delete."""

    flavor_labels: tuple[dict, ...] = ()
    flavor_tolerations: tuple[tuple[dict, ...], ...] = ()  # each choice's (flavor_choices)
    hold: tuple[str, str, bool] | None = None
    stall: tuple[str, str] | None = None
    create: dict | None = None
    delete: str | None = None
    # the Workload's status patch: giving back an evicted one's quota, or its PodsReady condition
    release: dict | None = None


def gate(
    job: Mapping,
    queue: str,
    count: int,
    shape: PodShape,
    template: Mapping | None,
    planned: Callable[[], list[dict]],
    built_from: str,
    priority: int,
    priority_class: str | None,
    workload: Mapping | None,
    flavors: Mapping[str, Mapping] | None,
    requeued: bool,
    active: bool = False,
    now: str = "",
    workload_priority_classes: Mapping[str, int] | None = None,
    pods_ready: bool | None = None,
    taken: list[str] | None = None,
) -> Gate:
    """A job labelled kueue.x-k8s.io/queue-name runs only while Kueue admits its Workload.
    ``planned``: its pod sets (pod_sets of the pods its plan would create), asked for only when
    a Workload is made or the inputs they are built from changed (``built_from``, their digest:
    planning is not done on every reconcile); ``count``, ``shape``, ``template``: what a
    Workload written before the pod sets per group asked for (one_pod_set). ``workload``: the
    job's own (a same-named job's leftover is None); ``flavors``: None when the Kueue API is not
    served; ``requeued``: the job is held after an eviction;
    ``priority_class``: the PriorityClass the priority is the value of, named in the Workload;
    ``active``: the job has pods that have not ended, terminating ones included (an evicted
    Workload's quota is released only once it has none); ``now``: the time conditions carry;
    ``workload_priority_classes``: Kueue's WorkloadPriorityClass values by name (the job's
    label kueue.x-k8s.io/priority-class names one: the Workload's priority is its value);
    ``pods_ready``: whether every pod of the admitted job is ready or succeeded, for the
    Workload's PodsReady condition (None: leave it); ``taken``: the job's pods Kueue's pod
    integration manages as its own (taken_by_kueue). A job with a prebuilt Workload
    (prebuilt_workload: MultiKueue's, on a worker cluster) waits for it, and neither creates
    nor re-creates one: its PodSets are the manager's."""
    if flavors is None:
        return Gate(
            stall=(
                "KueueNotInstalled",
                f"label {LABEL_KUEUE_QUEUE}={queue} asks Kueue to admit this job, but the API "
                f"{KUEUE_GROUP} (Workload, {' or '.join(KUEUE_VERSIONS)}) is not served: "
                "install Kueue, or remove the label",
            )
        )
    meta = job.get("metadata") or {}
    wpc = workload_priority_class(job)
    if wpc:
        value = (workload_priority_classes or {}).get(wpc)
        if value is None and workload is None:
            msg = (
                f"label {LABEL_KUEUE_PRIORITY_CLASS}={wpc} names a WorkloadPriorityClass "
                f"({KUEUE_GROUP}) that does not exist: create it, or remove the label (Kueue "
                "does not admit a job whose priority class is missing either)"
            )
            return Gate(hold=("WaitingForAdmission", msg, True))
        priority = priority if value is None else value

    def want(pod_sets: list[dict]) -> dict:
        return build_workload(
            meta.get("name", ""),
            meta.get("namespace", "default"),
            queue,
            pod_sets,
            priority,
            priority_class,
            wpc,
            built_from,
        )

    name = job_workload_name(job)
    prebuilt = prebuilt_workload(job) is not None
    if workload is None and prebuilt:
        why = (
            f"Workload {name} (label {LABEL_KUEUE_PREBUILT_WORKLOAD}: made by Kueue's MultiKueue) "
            "does not exist yet: waiting for it (this operator creates none for the job)"
        )
        return Gate(hold=("WaitingForAdmission", why, False))
    if workload is None:
        why = f"Workload {name} created in LocalQueue {queue}: waiting for Kueue to admit it"
        return Gate(hold=("WaitingForAdmission", why, False), create=want(planned()))
    have = (workload.get("spec") or {}).get("podSets")
    was = ((workload.get("metadata") or {}).get("annotations") or {}).get(ANN_POD_SETS)
    changed = was != built_from and not (
        was is None and same_pod_sets(have, one_pod_set(count, shape, template))
    )
    # a prebuilt Workload keeps the manager's PodSets: MultiKueue deletes a copy whose spec drifted
    if changed and not prebuilt and not same_pod_sets(have, planned()):  # immutable: a new Workload
        why = f"the job's pods changed (count, requests, islands): re-creating Workload {name} for Kueue"
        return Gate(hold=("WaitingForAdmission", why, False), delete=name)
    state, why = admission(workload)
    if state == EVICTED:
        msg = f"Workload {name} was evicted by Kueue ({why}): pods deleted; waiting to be admitted again"
        release = None if active else release_after_eviction(workload, now)
        return Gate(hold=("Requeued", msg, True), release=release)
    if state == PENDING:
        reason = "Requeued" if requeued else "WaitingForAdmission"
        return Gate(hold=(reason, f"Workload {name} in LocalQueue {queue} is not admitted: {why}", False))
    choices, missing = flavor_choices(workload, flavors)
    if missing:
        msg = (
            f"Workload {name} is admitted with ResourceFlavor(s) {', '.join(missing)}, which do not "
            "exist (yet): their node labels say where the job may run"
        )
        return Gate(hold=("WaitingForAdmission", msg, False))
    if taken:
        return Gate(stall=("KueueManagesPods", taken_message(taken)))
    ready = None if pods_ready is None else pods_ready_patch(workload, pods_ready, now)
    return Gate(
        flavor_labels=tuple(labels for labels, _ in choices),
        flavor_tolerations=tuple(tol for _, tol in choices),
        release=ready,
    )


# PodGroup phases (scheduling.volcano.sh/v1beta1), as Volcano's scheduler sets them at the end
# of each session (pkg/scheduler/framework/session.go, jobStatus): Pending until the enqueue
# action admits the group to its queue (Inqueue); Running once minMember pods are allocated or
# done; Unknown while some run and the rest cannot be scheduled; Completed once every allocated
# pod Succeeded *or Failed*; a group that falls below minMember (pods evicted by preemption or
# reclaim) and is not Inqueue goes back to Pending and must be enqueued again.
PG_PENDING, PG_INQUEUE, PG_RUNNING, PG_UNKNOWN, PG_COMPLETED = (
    "Pending",
    "Inqueue",
    "Running",
    "Unknown",
    "Completed",
)


def podgroup_wait(podgroup: Mapping | None, want: Mapping, started: bool) -> str | None:
    """Why the gang's pods are not created yet (None: create them). Volcano's own job controller
    creates a job's pods only once its PodGroup is admitted (its phase neither empty nor
    Pending): a group's pods created earlier sit unbound while holding their nodes in every
    other placement. So the first pod of an attempt waits for ``Inqueue``; once the attempt has
    pods (``started``) the rest follow whatever the phase (the group was admitted for them).
    Running, Unknown or Completed with no pod of this attempt are the last attempt's, read
    before Volcano's next session sets the group back to Pending."""
    if started:
        return None
    name = want["metadata"]["name"]
    queue = (want.get("spec") or {}).get("queue") or "default"
    phase = ((podgroup or {}).get("status") or {}).get("phase") or ""
    if podgroup is not None and phase == PG_INQUEUE:
        return None
    if podgroup is None:
        state = "created"
    elif phase in (PG_RUNNING, PG_UNKNOWN, PG_COMPLETED):
        state = f"still {phase} from the last attempt (Volcano sets it Pending at its next session)"
    else:
        state = f"{phase or 'with no phase yet'}"
    return (
        f"PodGroup {name} is {state}: waiting for Volcano to admit it to queue {queue} (phase "
        f"Inqueue) before creating its {want['spec']['minMember']} pods, as Volcano's job "
        "controller does; a Pending group stays so while its queue cannot hold spec.minResources"
    )


def volcano_group(template: Mapping | None) -> bool:
    spec = (template or {}).get("spec")
    return isinstance(spec, Mapping) and spec.get("schedulerName") == VOLCANO_SCHEDULER


def podgroup_name(job: str) -> str:
    return job


def build_podgroup(
    job: str,
    namespace: str,
    min_member: int,
    shape: PodShape,
    template: Mapping | None,
    claimed: int = 0,
) -> dict:
    """The gang's PodGroup. ``claimed``: its pods whose GPUs come with a DRA claim, not as the
    shape's GPU resource; Volcano's queue would hold a group that asks it for GPUs their nodes
    do not advertise as that resource, so minResources counts the others' GPUs only."""
    ann = ((template or {}).get("metadata") or {}).get("annotations") or {}
    members = {shape.gpu_resource: min_member - claimed, CPU: min_member, MEMORY: min_member}
    spec: dict[str, Any] = {
        "minMember": min_member,
        "minResources": {
            k: quantity_text(k, v * members[k])
            for k, v in sorted(shape.requests.items())
            if v and members.get(k)
        },
    }
    if isinstance(ann, Mapping) and ann.get(ANN_VOLCANO_QUEUE):
        spec["queue"] = ann[ANN_VOLCANO_QUEUE]
    return {
        "apiVersion": VOLCANO_API,
        "kind": "PodGroup",
        "metadata": {
            "name": podgroup_name(job),
            "namespace": namespace,
            "labels": {child_names.LABEL_JOB: job, child_names.LABEL_MANAGED_BY: child_names.MANAGED_BY},
        },
        "spec": spec,
    }


def in_group(pod: dict, group: str) -> dict:
    pod["metadata"].setdefault("annotations", {})[ANN_GROUP] = group
    return pod
