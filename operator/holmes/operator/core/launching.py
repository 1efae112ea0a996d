"""Launching an attempt: wait for the last attempt's pods to stop, place the job
(placement.py), render its ConfigMap, Service and pods, and say why it waits when it cannot
launch. Part of the reconcile state machine (reconcile.py); pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from holmes.contract import JobSpec, Layout
from holmes.plan import InsufficientNodes, PlanError

from . import (
    capacity,
    child_names,
    framework_launch,
    members,
    placement,
    queueing,
    render,
    replicas,
    validation,
)
from . import conditions as cond
from .render import HOSTNAME_LABEL, build_configmap, build_pod, build_service
from .routes import RouteError, claim_templates, job_routes
from .state import (
    PENDING,
    RESTARTING,
    WAIT_INTERVAL,
    Decision,
    JobState,
)
from .summary import (
    iso,
    layout_status,
    parse_time,
    pod_attempt,
    pod_counts,
    pod_node_rank,
)


class Launching(JobState):
    """The launch half of the state machine (reconcile._Reconciler builds on it)."""

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
        if queueing.volcano_group(spec.template) and not self.obs.volcano:
            return self.stall(
                "VolcanoNotInstalled",
                f"template.spec.schedulerName: {queueing.VOLCANO_SCHEDULER} asks Volcano to gang-schedule "
                f"this job, but the API {queueing.VOLCANO_API} (PodGroup) is not served: install "
                "Volcano (then restart the operator), or remove schedulerName",
            )
        same_spec = self.cm_annotation(child_names.ANN_SPEC_HASH) == child_names.spec_hash(
            self.job.get("spec") or {}
        )
        if self.runs_as_replicas(spec, same_spec):
            return self.launch_replicas(spec, same_spec)
        layout = None  # resume a launch cut short: its layout, if the spec is the same
        if same_spec:
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

        mismatch = framework_launch.plan_conflicts(spec, layout)  # spec.framework: the user's arguments
        if mismatch:
            return self.stall("InvalidSpec", "; ".join(mismatch))
        nets = {n: self.facts.network(by_name[n]) for n in layout.nodes}
        try:  # every node's route first: a node the network settings cannot serve gets nothing
            pod_routes = job_routes(spec, layout, nets)
        except RouteError as e:
            return self.stall("InvalidSpec", f"{e}{validation.FIX}")
        if queueing.volcano_group(spec.template):  # the gang as a Volcano PodGroup, admitted first
            why = self.podgroup_first(spec, pod_routes)
            if why is not None:
                return self.wait_for_podgroup(why)
        ref = self.job_ref()
        claimed = [n for n, r in pod_routes.items() if r.claim is not None]
        if claimed and self.obs.members is not None:
            return self.stall(
                "InvalidSpec",
                f"node(s) {', '.join(claimed[:3])} offer their devices through DRA (ResourceSlices), "
                "which Holmes requests only for jobs on the hub's own nodes, not across member clusters"
                f"{validation.FIX}",
            )
        self.d.claim_templates = claim_templates(
            ref.name, ref.namespace, pod_routes.values(), render.child_labels(ref)
        )
        self.d.configmap = build_configmap(ref, layout, spec, framework_launch.config_files(spec, layout))
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
                # spec.framework other than holmes: the user's command under Holmes' launcher
                launch=framework_launch.launch(spec, layout, rank, self.settings.image),
            )
            self.d.create_pods.append(pod)
        if self.d.podgroup is not None:
            for pod in self.d.create_pods:
                queueing.in_group(pod, self.d.podgroup["metadata"]["name"])
        nic_of = {n: net.nic for n, net in nets.items()}
        self.status["layout"] = layout_status(layout, nic_of, child_names.layout_configmap_name(self.name))
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

    # ---- acrossIslands replicas: one torch world per cluster (replicas.py) -------------------
    def launched_replicas(self) -> replicas.ReplicaPlan | None:
        """The current attempt's replicas, from its ConfigMap (None: not known, or a pipeline)."""
        if self.cm_annotation(child_names.ANN_ATTEMPT) != str(self.attempt):
            return None
        try:
            return replicas.read_plan((self.obs.configmap or {}).get("data") or {})
        except (KeyError, TypeError, ValueError):
            return None

    def runs_as_replicas(self, spec: JobSpec, same_spec: bool) -> bool:
        """mode replicas, or auto where the planner picks replicas on the usable nodes (a launch
        cut short keeps what it launched)."""
        mode = spec.training.across_islands.mode
        if mode == "pipeline" or (
            mode == "auto" and (spec.framework != "holmes" or self.obs.members is not None)
        ):
            return False  # auto: replicas only where validation.py would let mode replicas run
        if same_spec and self.launched_replicas() is not None:
            return True
        return replicas.choose(spec, self.replica_nodes(spec), self.facts.cost_model) == replicas.REPLICAS

    def replica_nodes(self, spec: JobSpec) -> list[dict]:
        """The nodes the job's pods could use (GPUs, taints, Ready). Replicas are planned on
        them as they are, not behind the jobs ahead in a queue (capacity.py plans pipelines)."""
        shape = capacity.pod_shape(spec, self.settings.gpu_resource)
        view, _ = capacity.free_view(self.obs.nodes, shape, capacity.Ledger(), self.settings.gpu_resource)
        return [n for n in view if not self.facts.unusable(n)]

    def launch_replicas(self, spec: JobSpec, same_spec: bool) -> Decision:
        """One torch world per cluster (validation.py refused member clusters and frameworks
        other than holmes)."""
        by_name = self.nodes
        plan = self.launched_replicas() if same_spec else None
        if plan is None:
            try:
                plan = replicas.plan_replicas(spec, self.replica_nodes(spec), self.facts.cost_model)
            except InsufficientNodes as e:
                return self.wait_for_nodes(str(e), getattr(e, "reason", "WaitingForNodes"))
            except PlanError as e:
                return self.stall("PlanFailed", f"cannot plan this job's replicas: {e}")
            self.d.placed = True
            self.event(
                "Normal",
                "Planned",
                f"{len(plan.layouts)} replicas, one per cluster ("
                + "; ".join(f"{c}: {plan_message(lay)}" for c, lay in zip(plan.clusters, plan.layouts))
                + ")",
            )
        elif any(n not in by_name for n in plan.nodes):
            self.teardown()  # a planned node vanished: plan again
            return self.launch(spec)
        nets = {n: self.facts.network(by_name[n]) for n in plan.nodes}
        pod_routes = {}
        try:  # each replica's routes inside its own island(s)
            for lay in plan.layouts:
                pod_routes.update(job_routes(spec, lay, {n: nets[n] for n in lay.nodes}))
        except RouteError as e:
            return self.stall("InvalidSpec", f"{e}{validation.FIX}")
        if queueing.volcano_group(spec.template):  # every replica's pods: one gang, admitted first
            why = self.podgroup_first(spec, pod_routes)
            if why is not None:
                return self.wait_for_podgroup(why)
        ref = self.job_ref()
        self.d.claim_templates = claim_templates(
            ref.name, ref.namespace, pod_routes.values(), render.child_labels(ref)
        )
        self.d.configmap = replicas.build_configmap(ref, plan, spec)
        if self.obs.service is None:
            self.d.service = build_service(ref, self.settings)
        existing = {pod_node_rank(p) for p in self.current_pods()}
        self.d.create_pods = replicas.build_pods(
            ref,
            plan,
            routes=pod_routes,
            template=spec.template,
            settings=self.settings,
            hostname_labels={
                n: (by_name[n]["metadata"].get("labels") or {}).get(HOSTNAME_LABEL) for n in plan.nodes
            },
            skip={r for r in existing if r is not None},
        )
        total = len(plan.nodes)
        if self.d.podgroup is not None:
            for pod in self.d.create_pods:
                queueing.in_group(pod, self.d.podgroup["metadata"]["name"])
        nic_of = {n: net.nic for n, net in nets.items()}
        layout_st = layout_status(plan.layouts[0], nic_of, child_names.layout_configmap_name(self.name))
        layout_st["nodes"] = total  # the gang: every replica's pods (replica 0's shape above)
        self.status["layout"] = layout_st
        self.status["replicas"] = replicas.replica_status(plan, {})
        self.status.pop("waitingSince", None)
        self.status["launched"] = True
        self.status["size"] = self.size(total)
        self.status["pods"] = pod_counts(self.current_pods() + self.d.create_pods)
        if self.d.create_pods:
            self.event(
                "Normal",
                "Launched",
                f"attempt {self.attempt}: created {len(self.d.create_pods)} pods for {len(plan.layouts)} "
                f"replicas of layout {layout_st['shape']} (pipeline x data x tensor)",
            )
        self.set_phase(PENDING, "PodsStarting", f"attempt {self.attempt}: waiting for {total} pods to run")
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

    def podgroup_first(self, spec: JobSpec, pod_routes: Mapping[str, Any]) -> str | None:
        """The gang's Volcano PodGroup (``self.d.podgroup``), and why its pods wait for it (None:
        create them)."""
        shape = capacity.pod_shape(spec, self.settings.gpu_resource)
        claimed = sum(1 for r in pod_routes.values() if r.claim is not None and r.claim.gpus)
        self.d.podgroup = queueing.build_podgroup(
            self.name, self.ns, len(pod_routes), shape, spec.template, claimed
        )
        started = any(pod_attempt(p) == self.attempt for p in self.pods)
        return queueing.podgroup_wait(self.obs.podgroup, self.d.podgroup, started)

    def wait_for_podgroup(self, why: str) -> Decision:
        """Volcano's queue has not admitted the gang's PodGroup: its pods wait uncreated (as
        Volcano's job controller does), holding nothing."""
        self.status["launched"] = False
        self.status["pods"] = pod_counts(self.current_pods())
        self.status["size"] = self.size(None)
        self.set_phase(PENDING, "WaitingForPodGroup", why, announce=False)
        self.d.requeue_after = self.until_deadline(WAIT_INTERVAL)
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
            if node not in by_name or "not Ready" in self.facts.unusable(by_name[node]):
                continue
            out.append(p["metadata"]["name"])
        return out

    def placement(self) -> placement.Placement:
        """This job's placement question (core/placement.py); the decision then counts as one
        that placed (its time is the operator's planning-duration metric)."""
        self.d.placed = True
        return placement.Placement(
            self.facts,
            self.obs.nodes,
            self.job,
            across_members=self.obs.members is not None,
            node_labels=self.node_labels,
            priority_classes=self.obs.priority_classes or {},
            gpu_resource=self.settings.gpu_resource,
        )

    def plan_size(self, spec: JobSpec) -> Layout:
        """The layout to launch (placement.place); InsufficientNodes: wait for nodes."""
        sized = placement.place(
            spec,
            self.placement(),
            self.old.get("adaptation"),
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
