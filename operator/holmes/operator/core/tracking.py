"""Tracking a launched attempt (a step of the state machine, reconcile.py): pods running,
finished, failed, disrupted or deleted; growing back to nodes.count; re-planning from measured
stage speeds (replan.py). A failed attempt restarts as a gang (restarting.py). Pure."""

from __future__ import annotations

from datetime import timedelta

from holmes.contract import JobSpec

from . import (
    child_names,
    elastic,
    eta,
    failures,
    launching,
    placement,
    queueing,
    replan,
    replicas,
    restarting,
)
from . import conditions as cond
from .render import build_service
from .replicas import REPLICAS_READ
from .state import (
    DISRUPTION,
    FAILURE,
    IGNORED,
    PENDING,
    RUNNING,
    SCALE_UP,
    SUCCEEDED,
    UNSCHEDULABLE_NODES,
    Decision,
    JobState,
    cm_annotation,
    current_pods,
    delete_stale,
    event,
    fail,
    job_ref,
    launched_layout,
    launched_replicas,
    placement_of,
    refused_nodes,
    set_phase,
    spec_changed,
    spec_changes,
    teardown,
)
from .summary import failure_of, iso, merged_progress, pod_counts, waiting_reason


def track(st: JobState, spec: JobSpec) -> Decision:
    st.status.pop("createFailures", None)  # this attempt's children were all accepted
    delete_stale(st)
    changed = spec_changes(st, spec) if cm_annotation(st, child_names.ANN_ATTEMPT) == str(st.attempt) else []
    if changed:
        teardown(st)
        spec_changed(st, changed, "relaunching all pods with a new plan")
        return launching.launch(st, spec)

    if st.obs.service is None:  # rendezvous needs it: put it back
        st.d.service = build_service(job_ref(st), st.settings)
    pods = current_pods(st)
    counts = pod_counts(pods)
    st.status["pods"] = counts
    expected = int((st.status.get("layout") or {}).get("nodes") or spec.nodes.count)
    _merge_progress(st, spec)

    disrupted = _disrupted(st, spec, pods, expected)
    if disrupted is not None:
        return disrupted
    refused, next_in = _unschedulable(st, spec, pods)
    if refused is not None:
        return refused
    failed = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
    if failed:
        return _pod_failed(st, spec, failed)
    if counts["succeeded"] == expected:
        st.status["completionTime"] = st.stamp
        set_phase(st, SUCCEEDED, "AllPodsSucceeded", f"all {expected} pods finished training")
        return st.d
    if counts["running"] + counts["succeeded"] == expected:
        set_phase(st, RUNNING, "AllPodsRunning", f"attempt {st.attempt}: {expected} pods running")
        grown = _scale_up(st, spec, expected) if expected < spec.nodes.count else None
        if grown is not None:
            return grown
        replanned = _adapt(st, spec)
        if replanned is not None:
            return replanned
    else:
        why = waiting_reason(pods)
        set_phase(
            st,
            PENDING,
            "PodsStarting",
            f"attempt {st.attempt}: {counts['running']}/{expected} "
            f"pods running" + (f"; {why}" if why else ""),
        )
    st.d.requeue_after = st.settings.progress_interval
    if next_in is not None:  # wake when a refused pod's timeout is up
        st.d.requeue_after = min(st.d.requeue_after, max(next_in, 0.5))
    return st.d


def _unschedulable(st: JobState, spec: JobSpec, pods: list[dict]) -> tuple[Decision | None, float | None]:
    """A pod the scheduler has refused on its planned node for runPolicy.schedulingTimeoutSeconds:
    give the gang's nodes back and plan again without that node (a disruption, not the job's
    failure), as Kueue's waitForPodsReady does; a job Kueue admits has that deadline from Kueue
    itself. Else (None, seconds until a refused pod's timeout)."""
    kept = refused_nodes(st)
    if queueing.queue_name(st.job) is not None:
        return None, None
    layout = launched_layout(st)
    if layout is None:
        return None, None
    plan = launched_replicas(st)
    timeout = spec.run_policy.scheduling_timeout_seconds
    found = failures.unschedulable(
        pods, list(plan.nodes if plan is not None else layout.nodes), st.obs.now, timeout
    )
    if not found.refused:
        return None, found.next_in
    until = iso(st.obs.now + timedelta(seconds=timeout))
    st.status[UNSCHEDULABLE_NODES] = {
        **kept,
        **{n: {"message": m, "until": until} for n, m in found.refused.items()},
    }
    listed = "; ".join(f"node {n}: {m}" for n, m in sorted(found.refused.items()))
    why = (
        f"the scheduler left a pod unschedulable on its planned node for {timeout}s "
        f"(runPolicy.schedulingTimeoutSeconds): {listed}; planning again without "
        f"{', '.join(sorted(found.refused))} until {until}"
    )
    return restarting.gang_failure(st, spec, why, DISRUPTION, "PodUnschedulable"), None


def _disrupted(st: JobState, spec: JobSpec, pods: list[dict], expected: int) -> Decision | None:
    """Disruptions first: when a node dies or a pod is evicted, its peers fail too (their
    collectives break), and those failures are not the job's fault."""
    lost = failures.deleted_node(pods, st.nodes) or _stuck_on_lost_node(st, pods)
    if lost:
        return restarting.gang_failure(st, spec, lost, DISRUPTION, "NodeLost")
    failed = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
    deleting = [p for p in pods if p["metadata"].get("deletionTimestamp") and p not in failed]
    gone = expected - len(pods)
    if deleting or gone > 0:  # the operator deletes only other attempts' pods: someone else did
        what = (
            f"pod {deleting[0]['metadata']['name']} is being deleted"
            if deleting
            else f"{gone} pod(s) of attempt {st.attempt} were deleted"
        )
        return restarting.gang_failure(st, spec, f"{what} (not by Holmes)", DISRUPTION, "PodDeleted")
    return None


def _stuck_on_lost_node(st: JobState, pods: list[dict]) -> str:
    layout = launched_layout(st)
    if layout is None:
        return ""  # the plan of this attempt is not known
    plan = launched_replicas(st)  # acrossIslands replicas: every replica's nodes
    nodes = list(plan.nodes if plan is not None else layout.nodes)
    return failures.stuck_on_lost_node(pods, nodes, st.nodes, st.facts.unusable)


def _pod_failed(st: JobState, spec: JobSpec, failed: list[dict]) -> Decision:
    """A failed pod: a disruption (failures.disruption), else what runPolicy.failurePolicy
    says of its exit codes (no rule: a counted failure)."""
    why = failure_of(failed[0])
    disrupted = failures.disruption(failed, current_pods(st), st.nodes, st.facts.unusable)
    if disrupted:
        return restarting.gang_failure(st, spec, f"{why} ({disrupted})", DISRUPTION, "PodDisrupted")
    policy = spec.run_policy.failure_policy
    rule = policy.action_for(failures.exits(failed)) if policy else None
    if rule is not None:
        codes = ",".join(str(v) for v in rule.on_exit_codes.values)
        matched = f"failurePolicy rule {rule.action} (exit code {rule.on_exit_codes.operator} [{codes}])"
        if rule.action == "FailJob":
            return fail(st, "PodFailurePolicy", f"{why}; {matched}")
        if rule.action == "Ignore":
            return restarting.gang_failure(st, spec, f"{why}; {matched}: not counted", IGNORED, "PodFailed")
    return restarting.gang_failure(st, spec, why, FAILURE, "PodFailed")


def _scale_up(st: JobState, spec: JobSpec, current: int) -> Decision | None:
    """An elastic job below count whose nodes are back (elastic.scale_up; the Decision: torn
    down to relaunch larger now)."""
    ckpt = int((st.status.get("progress") or {}).get("checkpointIteration") or 0)
    after = st.old.get("scaleUpAfter")
    up = elastic.scale_up(
        spec,
        current,
        ckpt,
        None if after is None else int(after),
        lambda least: placement.at_least(spec, placement_of(st), least),
    )
    if up.clear:
        st.status.pop("scaleUpAfter", None)
    if up.pending_at is not None:
        st.status["scaleUpAfter"] = up.pending_at
        event(
            st,
            "Normal",
            "ScaleUpPending",
            f"{up.bigger} nodes can run the job again (now {current} of {spec.nodes.count}): "
            "relaunching after the next checkpoint",
        )
    if not up.now:
        return None
    when = (
        f"checkpoint at iteration {ckpt} written"
        if after is not None
        else "the pods save a checkpoint as they stop (training.checkpoint.onPreemption)"
    )
    return restarting.relaunch(
        st,
        SCALE_UP,
        "ScaleUp",
        f"{up.bigger} nodes can run the job again; {when}: relaunching on more than {current} nodes "
        f"(nodes.count={spec.nodes.count})",
    )


# ---- re-planning from measured stage speeds (core/replan.py) -------------------------------
def _adapt(st: JobState, spec: JobSpec) -> Decision | None:
    """A running job: judge its measured layout (replan.step); the Decision: torn down to re-plan."""
    layout = launched_layout(st)
    if layout is None or not spec.parallelism.replan.enabled:
        return None
    if launched_replicas(st) is not None:  # replan.step re-plans one pipeline world
        return None
    step = replan.step(
        spec,
        st.old.get("adaptation") or {},
        layout,
        st.status.get("progress") or {},
        st.obs.nodes,
        lambda nodes, job: placement.on_free_capacity(nodes, job, placement_of(st)),
        lambda *measured: placement.calibrated(placement_of(st), *measured),
    )
    if step.adaptation is not None:
        st.status["adaptation"] = step.adaptation
    if step.event:
        event(st, "Normal", "Replanned", step.event)
    torn_down = _relaunch_replanned(st, step.relaunch) if step.relaunch else None
    if step.condition is not None:  # after set_phase, which rewrites the conditions
        st.status["conditions"] = cond.set_condition(
            st.status.get("conditions"), cond.REPLANNED, *step.condition, st.stamp, st.generation
        )
    return torn_down


def _relaunch_replanned(st: JobState, when: str) -> Decision:
    progress = dict(st.status.get("progress") or {})
    progress.pop("stages", None)  # measured in the layout being left
    st.status["progress"] = progress
    last = (st.status.get("adaptation") or {}).get("last") or {}
    return restarting.relaunch(  # its own kind of restart: never against backoffLimit
        st,
        replan.RESTART,
        "Replanned",
        f"re-planned from measured stage speeds: layers {last.get('from')} -> {last.get('to')}; {when}: "
        "relaunching in the new layout, resuming from that checkpoint",
    )


def _merge_progress(st: JobState, spec: JobSpec) -> None:
    before = st.old.get("progress") or {}
    read = dict(st.obs.progress or {})
    per_replica = read.pop(REPLICAS_READ, None)
    if per_replica is not None and (plan := launched_replicas(st)) is not None:
        st.status["replicas"] = replicas.merged_status(plan, st.old.get("replicas"), per_replica)
    merged, warning = merged_progress(before, read or None, st.stamp)
    if merged is not None and merged.get("stages") and (layout := launched_layout(st)) is not None:
        merged["stages"] = replan.with_planned(merged["stages"], layout)  # measured next to planned
    if merged is not None:
        total = spec.training.iterations
        st.status["progress"] = eta.with_eta(merged, before, st.attempt, total, st.obs.now)
    if warning:
        event(st, "Warning", "FabricMismatch", warning)
