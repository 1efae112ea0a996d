"""Tracking a launched attempt: pods running, finished, failed, disrupted or deleted; gang
restarts and their limits; growing back to nodes.count; re-planning from measured stage speeds
(replan.py). Part of the reconcile state machine (reconcile.py); pure."""

from __future__ import annotations

from datetime import timedelta

from holmes.contract import JobSpec

from . import child_names, elastic, eta, failures, placement, replan, replicas
from . import conditions as cond
from .launching import Launching
from .render import build_service
from .replicas import REPLICAS_READ
from .state import (
    DISRUPTION,
    FAILURE,
    IGNORED,
    PENDING,
    RESTARTING,
    RUNNING,
    SCALE_UP,
    SUCCEEDED,
    Decision,
)
from .summary import (
    failure_of,
    iso,
    merged_progress,
    pod_counts,
    waiting_reason,
)


class Tracking(Launching):
    """The tracking half of the state machine (reconcile._Reconciler builds on it)."""

    # ---- tracking a launched attempt ------------------------------------------------------
    def track(self, spec: JobSpec) -> Decision:
        self.status.pop("createFailures", None)  # this attempt's children were all accepted
        self.delete_stale()
        launched_hash = self.cm_annotation(child_names.ANN_SPEC_HASH)
        if (
            self.cm_annotation(child_names.ANN_ATTEMPT) == str(self.attempt)
            and launched_hash
            and launched_hash != child_names.spec_hash(self.job.get("spec") or {})
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
        self.merge_progress(spec)

        # Disruptions first: when a node dies or a pod is evicted, its peers fail too (their
        # collectives break), and those failures are not the job's fault.
        lost = failures.deleted_node(pods, self.nodes) or self.stuck_on_lost_node(pods)
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
            if self.adapt(spec):
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
        layout = self.launched_layout()
        if layout is None:
            return ""  # the plan of this attempt is not known
        plan = self.launched_replicas()  # acrossIslands replicas: every replica's nodes
        nodes = list(plan.nodes if plan is not None else layout.nodes)
        return failures.stuck_on_lost_node(pods, nodes, self.nodes, self.facts.unusable)

    def pod_failed(self, spec: JobSpec, failed: list[dict]) -> Decision:
        """A failed pod: a disruption (failures.disruption), else what runPolicy.failurePolicy
        says of its exit codes (no rule: a counted failure)."""
        why = failure_of(failed[0])
        disrupted = failures.disruption(failed, self.current_pods(), self.nodes, self.facts.unusable)
        if disrupted:
            return self.gang_failure(spec, f"{why} ({disrupted})", DISRUPTION, "PodDisrupted")
        policy = spec.run_policy.failure_policy
        rule = policy.action_for(failures.exits(failed)) if policy else None
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

    def scale_up(self, spec: JobSpec, current: int) -> bool:
        """An elastic job below count whose nodes are back (elastic.scale_up; True: torn down now)."""
        ckpt = int((self.status.get("progress") or {}).get("checkpointIteration") or 0)
        after = self.old.get("scaleUpAfter")
        up = elastic.scale_up(
            spec,
            current,
            ckpt,
            None if after is None else int(after),
            lambda least: placement.at_least(spec, self.placement(), least),
        )
        if up.clear:
            self.status.pop("scaleUpAfter", None)
        if up.pending_at is not None:
            self.status["scaleUpAfter"] = up.pending_at
            self.event(
                "Normal",
                "ScaleUpPending",
                f"{up.bigger} nodes can run the job again (now {current} of {spec.nodes.count}): "
                "relaunching after the next checkpoint",
            )
        if not up.now:
            return False
        when = (
            f"checkpoint at iteration {ckpt} written"
            if after is not None
            else "the pods save a checkpoint as they stop (training.checkpoint.onPreemption)"
        )
        return self.relaunch(
            SCALE_UP,
            "ScaleUp",
            f"{up.bigger} nodes can run the job again; {when}: relaunching on more than {current} nodes "
            f"(nodes.count={spec.nodes.count})",
        )

    # ---- re-planning from measured stage speeds (core/replan.py) -------------------------------
    def adapt(self, spec: JobSpec) -> bool:
        """A running job: judge its measured layout (replan.step); True: torn down to re-plan."""
        layout = self.launched_layout()
        if layout is None or not spec.parallelism.replan.enabled:
            return False
        if self.launched_replicas() is not None:  # replan.step re-plans one pipeline world
            return False
        step = replan.step(
            spec,
            self.old.get("adaptation") or {},
            layout,
            self.status.get("progress") or {},
            self.obs.nodes,
            lambda nodes, job: placement.on_free_capacity(nodes, job, self.placement()),
            lambda *measured: placement.calibrated(self.placement(), *measured),
        )
        if step.adaptation is not None:
            self.status["adaptation"] = step.adaptation
        if step.event:
            self.event("Normal", "Replanned", step.event)
        torn_down = self.relaunch_replanned(step.relaunch) if step.relaunch else False
        if step.condition is not None:  # after set_phase, which rewrites the conditions
            self.status["conditions"] = cond.set_condition(
                self.status.get("conditions"), cond.REPLANNED, *step.condition, self.now, self.generation
            )
        return torn_down

    def relaunch_replanned(self, when: str) -> bool:
        progress = dict(self.status.get("progress") or {})
        progress.pop("stages", None)  # measured in the layout being left
        self.status["progress"] = progress
        last = (self.status.get("adaptation") or {}).get("last") or {}
        return self.relaunch(  # its own kind of restart: never against backoffLimit
            replan.RESTART,
            "Replanned",
            f"re-planned from measured stage speeds: layers {last.get('from')} -> {last.get('to')}; {when}: "
            "relaunching in the new layout, resuming from that checkpoint",
        )

    def merge_progress(self, spec: JobSpec) -> None:
        before = self.old.get("progress") or {}
        read = dict(self.obs.progress or {})
        per_replica = read.pop(REPLICAS_READ, None)
        if per_replica is not None and (plan := self.launched_replicas()) is not None:
            self.status["replicas"] = replicas.merged_status(plan, self.old.get("replicas"), per_replica)
        merged, warning = merged_progress(before, read or None, self.now)
        if merged is not None and merged.get("stages") and (layout := self.launched_layout()) is not None:
            merged["stages"] = replan.with_planned(merged["stages"], layout)  # measured next to planned
        if merged is not None:
            total = spec.training.iterations
            self.status["progress"] = eta.with_eta(merged, before, self.attempt, total, self.obs.now)
        if warning:
            self.event("Warning", "FabricMismatch", warning)
