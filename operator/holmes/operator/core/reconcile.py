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
from datetime import datetime, timedelta

from holmes.contract import JobSpec, Layout, SpecError, load_job
from holmes.plan import InsufficientNodes, PlanError

from . import capacity, elastic, failures, frameworks, members, names, queueing, replan, validation
from . import conditions as cond
from .render import HOSTNAME_LABEL, RenderSettings, build_configmap, build_pod, build_service
from .routes import RouteError, job_routes
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
    NodeNetwork,
    Observed,
    Planner,
    RestartBackoff,
    owned,
    owned_by,
)
from .summary import (
    failure_of,
    iso,
    layout_status,
    merged_progress,
    parse_time,
    pod_attempt,
    pod_counts,
    pod_node_rank,
    waiting_reason,
)

_NEXT_ATTEMPT = re.compile(r"next attempt at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")


def decide(
    obs: Observed, planner: Planner, settings: RenderSettings, backoff: RestartBackoff = RestartBackoff()
) -> Decision:
    return _Reconciler(obs, planner, settings, backoff).run()


class _Reconciler(JobState):
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

        problem = names.job_name_problem(self.name)
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
            self.cm_annotation(names.ANN_MODEL_HASH),
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
        last_hash = self.cm_annotation(names.ANN_SPEC_HASH)
        if last_hash and last_hash != names.spec_hash(self.job.get("spec") or {}):
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
        )
        self.d.workload, self.d.delete_workload = g.create, g.delete
        if g.stall is not None:
            return self.stall(*g.stall)
        if g.hold is not None:
            return self.hold(*g.hold)
        self.planner = capacity.restricted(self.planner, g.node_labels or {})
        return None

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
        layout = None  # resume a launch cut short: its layout, if the spec is the same
        if self.cm_annotation(names.ANN_SPEC_HASH) == names.spec_hash(self.job.get("spec") or {}):
            layout = self.launched_layout()
        by_name = self.nodes
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
        nets = {n: self.planner.facts.network(by_name[n]) for n in layout.nodes}
        try:  # every node's route first: a node the network settings cannot serve gets nothing
            pod_routes = job_routes(spec, layout, nets)
        except RouteError as e:
            return self.stall("InvalidSpec", f"{e}{validation.FIX}")
        ref = self.job_ref()
        self.d.configmap = frameworks.with_framework_files(build_configmap(ref, layout, spec), spec, layout)
        if self.obs.service is None:
            self.d.service = build_service(ref, self.settings)
        existing = {pod_node_rank(p) for p in self.current_pods()}
        ranks, master = members.rendezvous(self.obs.members, self.current_pods(), len(layout.nodes))
        for rank, node_name in enumerate(layout.nodes):
            if rank in existing or rank not in ranks:
                continue
            pod = build_pod(
                ref,
                layout,
                rank,
                route=pod_routes[node_name],
                template=spec.template,
                settings=self.settings,
                hostname_label=(by_name[node_name]["metadata"].get("labels") or {}).get(HOSTNAME_LABEL),
                master=master if rank else None,
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

    def terminating_pods(self) -> list[str]:
        """Pods of earlier attempts still stopping on a node that can still stop them (a pod on a
        lost node never reports back: it is not waited for)."""
        by_name = self.nodes
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
            if node not in by_name or "not Ready" in self.planner.facts.unusable(by_name[node]):
                continue
            out.append(p["metadata"]["name"])
        return out

    def plan_size(self, spec: JobSpec) -> Layout:
        """The layout to launch (elastic.plan_size); InsufficientNodes: wait for nodes."""
        sized = elastic.plan_size(
            replan.planning(self.planner.plan, self.old.get("adaptation"), spec),  # measured rates
            self.obs.nodes,
            spec,
            restarted=bool(self.old.get("restarts")),
            since=parse_time(self.old.get("waitingSince")) or self.obs.now,
            now=self.obs.now,
        )
        if sized.since is not None:
            self.status["waitingSince"] = iso(sized.since)
        if sized.scaled_down:
            self.event("Warning", "ScaledDown", sized.scaled_down)
        if sized.waiting is not None:
            raise sized.waiting
        assert sized.layout is not None  # Sized holds a layout or why to wait
        return sized.layout

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
            and launched_hash != names.spec_hash(self.job.get("spec") or {})
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
        return failures.stuck_on_lost_node(pods, list(layout.nodes), self.nodes, self.planner.facts.unusable)

    def pod_failed(self, spec: JobSpec, failed: list[dict]) -> Decision:
        """A failed pod: a disruption (failures.disruption), else what runPolicy.failurePolicy
        says of its exit codes (no rule: a counted failure)."""
        why = failure_of(failed[0])
        disrupted = failures.disruption(failed, self.current_pods(), self.nodes, self.planner.facts.unusable)
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
            lambda least: len(elastic.plan_at_least(self.planner.plan, self.obs.nodes, spec, least).nodes),
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
        step = replan.step(
            spec,
            self.old.get("adaptation") or {},
            layout,
            self.status.get("progress") or {},
            self.obs.nodes,
            self.planner.plan,
            self.planner.calibrated,
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

    def merge_progress(self) -> None:
        merged, warning = merged_progress(self.old.get("progress") or {}, self.obs.progress, self.now)
        if merged is not None and merged.get("stages") and (layout := self.launched_layout()) is not None:
            merged["stages"] = replan.with_planned(merged["stages"], layout)  # measured next to planned
        if merged is not None:
            self.status["progress"] = merged
        if warning:
            self.event("Warning", "FabricMismatch", warning)


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
