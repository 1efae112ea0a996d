"""Whether the job may run now (a step of the state machine, reconcile.py): runPolicy.suspend,
its priority class, and Kueue's admission (queueing.gate); a suspended or held job keeps its
status and runs no pods. Pure."""

from __future__ import annotations

from collections.abc import Collection

from holmes.contract import JobSpec
from holmes.contract.names import LABEL_KUEUE_PREBUILT_WORKLOAD, LABEL_KUEUE_PRIORITY_CLASS

from . import capacity, child_names, kueue_pod_sets, placement, prebuilt, queueing
from . import conditions as cond
from . import island_topology as topology_levels
from .state import (
    SUSPENDED,
    WAIT_INTERVAL,
    Decision,
    JobState,
    current_pods,
    delete_stale,
    event,
    owned_by,
    past_leftovers,
    placement_of,
    set_phase,
    stall,
    teardown,
)
from .summary import pod_counts


def admit(st: JobState, spec: JobSpec) -> Decision | None:
    """The Decision when the job may not run now; None: go on (a resumed job plans again, on
    the nodes of the flavors Kueue admitted it to)."""
    if spec.run_policy.suspend:
        return _suspend(st)
    refused = _priority_problem(st, spec)
    if refused is not None:
        return stall(st, *refused)
    held = _kueue_gate(st, spec)
    if held is not None:
        return held
    if st.old.get("phase") == SUSPENDED:  # suspend already moved to a fresh attempt
        st.status["launched"] = False
        st.status["startTime"] = st.stamp  # the deadline counts from the resume
        why = "admitted by Kueue" if queueing.queue_name(st.job) else "runPolicy.suspend is false"
        event(st, "Normal", "Resumed", f"{why}: planning again")
    return None


def _suspend(st: JobState) -> Decision:
    st.status.pop("nextAttemptTime", None)  # resuming is the user's call: no back-off after it
    if st.old.get("phase") != SUSPENDED:
        teardown(st)
    else:
        delete_stale(st)
    st.status["pods"] = pod_counts([])
    set_phase(st, SUSPENDED, "Suspended", "runPolicy.suspend is true: pods deleted, status kept")
    return st.d


def raw_priority_problem(spec: JobSpec, namespace: str, allowed: Collection[str]) -> str | None:
    """Why the job may not set runPolicy.priority, a raw number, in ``namespace`` (None: it does
    not set one, or the operator's --raw-priority-namespaces, ``allowed``, lists the namespace).
    Anyone who may edit a HolmesJob would otherwise jump Holmes' queue and Kueue's and preempt
    other teams: priority comes from objects admins own."""
    if spec.run_policy.priority is None or namespace in allowed:
        return None
    return (
        f"spec.runPolicy.priority: namespace {namespace} may not set a raw priority (the operator "
        "flag --raw-priority-namespaces, chart value rawPriorityNamespaces, lists those that "
        "may): remove it and name a PriorityClass in spec.runPolicy.priorityClassName, or, "
        f"for a job queued in Kueue, a WorkloadPriorityClass in the label {LABEL_KUEUE_PRIORITY_CLASS}"
    )


def _raw_priority(st: JobState) -> bool:
    """The operator's policy lets this job's namespace set runPolicy.priority."""
    return st.ns in st.settings.raw_priority_namespaces


def _priority_problem(st: JobState, spec: JobSpec) -> tuple[str, str] | None:
    """(reason, message) when the job's priority cannot be had: a raw runPolicy.priority its
    namespace may not set, or a PriorityClass that does not exist."""
    refused = raw_priority_problem(spec, st.ns, st.settings.raw_priority_namespaces)
    if refused is not None:
        return "PolicyViolation", refused
    if spec.run_policy.priority is not None:
        return None  # allowed: it wins over the class
    classes = st.obs.priority_classes
    if classes is None:
        return None
    problem = capacity.priority_of(spec, classes)[1]
    return ("InvalidSpec", problem) if problem else None


def _kueue_gate(st: JobState, spec: JobSpec) -> Decision | None:
    """Kueue's word (queueing.gate); None: admitted, go on, planning on the flavors' nodes."""
    queue = queueing.queue_name(st.job)
    if not queue:
        return None
    wl, uid = st.obs.workload, st.job["metadata"].get("uid")
    made = prebuilt.prebuilt_workload(st.job)  # MultiKueue's, on a worker cluster
    if wl is not None and uid and not owned_by(wl, uid):
        if not made:
            wl = None  # a same-named job's leftover: garbage collected
        elif prebuilt.controller_uid(wl) is None:  # MultiKueue's, made for this job: take it
            st.d.adopt_workload = prebuilt.adopt_patch(wl, st.job)
        else:  # Kueue's jobframework ignores such a Workload too
            msg = (
                f"Workload {made} (label {LABEL_KUEUE_PREBUILT_WORKLOAD}) is controlled by "
                "another object: this job cannot use it; delete the job (MultiKueue creates its "
                "copy again with a Workload of its own)"
            )
            return _hold(st, "WaitingForAdmission", msg, warn=True)
    was = (cond.get(st.old.get("conditions"), cond.SUSPENDED) or {}).get("reason")
    priority, unknown = capacity.priority_of(spec, st.obs.priority_classes or {}, _raw_priority(st))
    rp = spec.run_policy  # the class is named when the priority is its value
    from_class = rp.priority_class_name if rp.priority is None and not unknown else None
    shape = capacity.pod_shape(spec, st.settings.gpu_resource)
    tas = st.obs.queue_topology is not None
    g = queueing.gate(
        st.job,
        queue,
        spec.nodes.count,
        shape,
        spec.template,
        lambda: planned_pod_sets(st, spec, shape, topology=tas),
        pod_sets_inputs(st.job) + (f"+{topology_levels.LABEL_ISLAND}" if tas else ""),
        priority,
        from_class,
        wl,
        st.obs.flavors,
        requeued=was == "Requeued",
        # terminating pods too: they hold their GPUs (and save the checkpoint) until they are
        # gone, and a preemptor admitted into the quota meanwhile would run beside them
        active=any((p.get("status") or {}).get("phase") not in ("Succeeded", "Failed") for p in st.pods),
        now=st.stamp,
        workload_priority_classes=st.obs.workload_priority_classes,
        pods_ready=_pods_ready(st, spec) if st.status.get("launched") else None,
        taken=queueing.taken_by_kueue(current_pods(st)),
    )
    st.d.workload, st.d.delete_workload = g.create, g.delete
    st.d.workload_status = g.release
    if g.release is not None and wl is not None:
        st.d.workload_version = (wl.get("metadata") or {}).get("resourceVersion")
    if g.stall is not None:
        return stall(st, *g.stall)
    if g.hold is not None:
        return _hold(st, *g.hold)
    st.flavor_labels, st.flavor_tolerations = g.flavor_labels, g.flavor_tolerations
    return None


def pod_sets_inputs(job: dict) -> str:
    """The digest of what the job's Workload pod sets are built from (the spec but its run
    policy and training loop, whose changes leave its pods as they are): while it holds, the
    Workload is kept without planning again."""
    spec = dict(job.get("spec") or {})
    spec.pop("runPolicy", None)
    training = spec.pop("training", None) or {}
    spec["acrossIslands"] = training.get("acrossIslands") if isinstance(training, dict) else None
    return child_names.digest(spec)


def planned_pod_sets(
    st: JobState, spec: JobSpec, shape: capacity.PodShape, topology: bool = False
) -> list[dict]:
    """The Workload's pod sets: the pods the job's plan on the nodes it could ever use would
    create, grouped (kueue_pod_sets.group_pods); one shape of nodes.count pods when it cannot be
    planned there (it then waits for nodes anyway). ``topology``: the job's ClusterQueue has a
    flavor with a Topology (Kueue's TAS): grouped by Holmes' island level, each PodSet requiring
    one island (kueue_pod_sets.pod_sets)."""
    pods = placement.queued_pods(spec, placement_of(st), topology)
    if not pods:
        return kueue_pod_sets.one_pod_set(spec.nodes.count, shape, spec.template)
    label = topology_levels.LABEL_ISLAND if topology else spec.nodes.cluster_label
    return kueue_pod_sets.pod_sets(kueue_pod_sets.group_pods(pods), spec.template, label, topology)


def _pods_ready(st: JobState, spec: JobSpec) -> bool:
    """Every pod of this attempt ready (its Ready condition True) or succeeded, as Kueue counts
    a Job's (status.ready + status.succeeded >= its pods): the pods it launched (an elastic
    job may run on fewer nodes than nodes.count)."""

    def ok(p: dict) -> bool:
        status = p.get("status") or {}
        if status.get("phase") == "Succeeded":
            return True
        ready: dict = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
        return status.get("phase") == "Running" and ready.get("status") == "True"

    pods = [p for p in current_pods(st) if not p["metadata"].get("deletionTimestamp")]
    launched = (st.old.get("size") or {}).get("current") or spec.nodes.count
    return sum(ok(p) for p in pods) >= launched


def _hold(st: JobState, reason: str, message: str, warn: bool = False) -> Decision:
    """Suspended by the queueing system: no pods (deleted gracefully), status kept."""
    if st.old.get("phase") != SUSPENDED:
        if st.attempt == 0:
            past_leftovers(st)
        teardown(st)
    else:
        delete_stale(st)
    st.status.pop("nextAttemptTime", None)
    st.status.pop("waitingSince", None)
    st.status["pods"] = pod_counts([])
    old = cond.get(st.old.get("conditions"), cond.SUSPENDED) or {}
    set_phase(st, SUSPENDED, reason, message, announce=False)
    if (old.get("reason"), old.get("status")) != (reason, "True"):
        event(st, "Warning" if warn else "Normal", reason, message)
    st.d.requeue_after = WAIT_INTERVAL
    return st.d
