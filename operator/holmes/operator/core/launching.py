"""Launching an attempt (a step of the state machine, reconcile.py): wait for the last attempt's
pods to stop, place the job (placement.py) as one pipeline or as acrossIslands replicas
(replicas.py), render its ConfigMap, Service and pods, and say why it waits when it cannot
launch. Pure."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace

from holmes.contract import JobSpec, Layout
from holmes.plan import InsufficientNodes, PlanError

from . import (
    admitting,
    capacity,
    child_names,
    compute_domains,
    framework_launch,
    island_topology,
    kueue_pod_sets,
    members,
    placement,
    prebuilt,
    queueing,
    quota,
    render,
    replicas,
    tolerations,
    validation,
)
from . import conditions as cond
from .render import HOSTNAME_LABEL, JobRef, build_configmap, build_pod, build_service
from .routes import PodRoute, RouteError, claim_templates, job_routes, with_compute_domains
from .state import (
    PENDING,
    RESTARTING,
    WAIT_INTERVAL,
    Decision,
    JobState,
    cm_annotation,
    current_pods,
    delete_stale,
    event,
    job_ref,
    launched_layout,
    launched_replicas,
    nvlink_channels,
    placement_of,
    planning_nodes,
    refused_nodes,
    set_phase,
    size,
    spec_changes,
    stall,
    teardown,
    until_deadline,
)
from .summary import iso, layout_status, parse_time, pod_attempt, pod_counts, pod_node_rank


def launch(st: JobState, spec: JobSpec) -> Decision:
    delete_stale(st)
    stopping = _terminating_pods(st)
    if stopping:  # a graceful stop may be writing the checkpoint the next attempt resumes from
        st.status["pods"] = pod_counts([])
        set_phase(
            st,
            RESTARTING if st.old.get("phase") == RESTARTING else PENDING,
            "WaitingForPodsToStop",
            f"attempt {st.attempt}: waiting for {len(stopping)} pod(s) of the previous attempt to stop "
            f"({', '.join(stopping[:3])}{' ...' if len(stopping) > 3 else ''}) within their grace period",
            announce=False,
        )
        st.d.requeue_after = until_deadline(st, spec, 1.0)
        return st.d
    if queueing.volcano_group(spec.template) and not st.obs.volcano:
        return stall(
            st,
            "VolcanoNotInstalled",
            f"template.spec.schedulerName: {queueing.VOLCANO_SCHEDULER} asks Volcano to gang-schedule "
            f"this job, but the API {queueing.VOLCANO_API} (PodGroup) is not served: install "
            "Volcano (then restart the operator), or remove schedulerName",
        )
    if not nvlink_channels(st):  # tensor groups over nodes need IMEX channels (compute_domains.py)
        why = compute_domains.refusal(spec, st.obs.members is not None)
        if why and _on_nvlink_domains(st):
            return stall(st, compute_domains.NOT_INSTALLED, why)
    # a launch cut short is resumed with its plan, if the spec is the same
    same_spec = cm_annotation(st, child_names.ANN_SPEC_HASH) is not None and not spec_changes(st, spec)
    if _runs_as_replicas(st, spec, same_spec):
        return _launch_replicas(st, spec, same_spec)
    layout = launched_layout(st) if same_spec else None
    if layout is None:
        try:
            layout = _plan_size(st, spec)
        except InsufficientNodes as e:
            return _wait_for_nodes(st, spec, str(e), getattr(e, "reason", "WaitingForNodes"))
        except PlanError as e:
            return stall(st, "PlanFailed", f"cannot plan this job: {e}")
        missing = [n for n in layout.nodes if n not in st.nodes]
        if missing:
            return stall(st, "PlanFailed", f"the planner chose unknown nodes {missing}")
        note = "" if nvlink_channels(st) else compute_domains.domains_left_out(layout, _domain_of(st, layout))
        event(st, "Normal", "Planned", plan_message(layout) + note)
    elif any(n not in st.nodes for n in layout.nodes):
        teardown(st)  # a planned node vanished: plan again
        return launch(st, spec)
    return _launch_pipeline(st, spec, layout)


def _on_nvlink_domains(st: JobState) -> bool:
    """Whether any node the job plans on is in an NVLink domain (GFD's clique label): elsewhere
    the planner's own refusal of a tensor group over nodes says what to fix."""
    return any(st.facts.network(n).nvlink_domain for n in planning_nodes(st))


def _domain_of(st: JobState, layout: Layout) -> dict[str, str | None]:
    return {n: st.facts.network(st.nodes[n]).nvlink_domain for n in layout.nodes if n in st.nodes}


# ---- one pipeline world -------------------------------------------------------------------------
def _plan_size(st: JobState, spec: JobSpec) -> Layout:
    """The layout to launch (placement.place); InsufficientNodes: wait for nodes."""
    sized = placement.place(
        spec,
        placement_of(st),
        st.old.get("adaptation"),
        restarted=bool(st.old.get("restarts")),
        since=parse_time(st.old.get("waitingSince")) or st.obs.now,
        now=st.obs.now,
    )
    if sized.since is not None:
        st.status["waitingSince"] = iso(sized.since)
    if sized.scaled_down:
        event(st, "Warning", "ScaledDown", sized.scaled_down)
    if sized.waiting is not None:
        raise sized.waiting
    assert sized.layout is not None  # Sized holds a layout or why to wait
    return sized.layout


def _launch_pipeline(st: JobState, spec: JobSpec, layout: Layout) -> Decision:
    mismatch = framework_launch.plan_conflicts(spec, layout)  # spec.framework: the user's arguments
    if mismatch:
        return stall(st, "InvalidSpec", "; ".join(mismatch))
    held = _outside_admission(st, spec, layout.nodes)
    if held is not None:
        return held
    nets = {n: st.facts.network(st.nodes[n]) for n in layout.nodes}
    try:  # every node's route first: a node the network settings cannot serve gets nothing
        pod_routes = job_routes(spec, layout, nets)
    except RouteError as e:
        return stall(st, "InvalidSpec", f"{e}{validation.FIX}")
    if queueing.volcano_group(spec.template):  # the gang as a Volcano PodGroup, admitted first
        why = _podgroup_first(st, spec, pod_routes)
        if why is not None:
            return _wait_for_podgroup(st, spec, why)
    ref = job_ref(st, spec)
    claimed = [n for n, r in pod_routes.items() if r.claim is not None]
    if claimed and st.obs.members is not None:
        return stall(
            st,
            "InvalidSpec",
            f"node(s) {', '.join(claimed[:3])} offer their devices through DRA (ResourceSlices), "
            "which Holmes requests only for jobs on the hub's own nodes, not across member clusters"
            f"{validation.FIX}",
        )
    domains = (  # the IMEX channels of the job's NVLink domains (not across member clusters)
        compute_domains.job_domains(ref.name, layout, {n: nets[n].nvlink_domain for n in layout.nodes})
        if nvlink_channels(st)
        else []
    )
    pod_routes = with_compute_domains(pod_routes, domains, nets)
    existing = {pod_node_rank(p) for p in current_pods(st)}
    configmap = build_configmap(ref, layout, spec, framework_launch.config_files(spec, layout))
    over = _create_children(
        st, ref, pod_routes, configmap, _pipeline_pods(st, spec, ref, layout, pod_routes, existing)
    )
    if over:
        return _wait_for_quota(st, spec, over)
    st.d.compute_domains = compute_domains.objects(domains, ref.namespace, render.child_labels(ref))
    nic_of = {n: net.nic for n, net in nets.items()}
    st.status["layout"] = layout_status(layout, nic_of, child_names.layout_configmap_name(st.name))
    st.status.pop("waitingSince", None)
    if len(existing) + len(st.d.create_pods) < len(layout.nodes):  # across members: rank 0 first
        return _wait_for_rendezvous(st, spec, layout)
    return _launched(st, spec, len(layout.nodes), f"layout {st.status['layout']['shape']}")


def _pipeline_pods(
    st: JobState,
    spec: JobSpec,
    ref: JobRef,
    layout: Layout,
    pod_routes: Mapping[str, PodRoute],
    existing: set[int | None],
) -> list[dict]:
    """The pods still to create (across members: those the rendezvous lets start now)."""
    ranks, master = members.rendezvous(st.obs.members, current_pods(st), len(layout.nodes))
    return [
        build_pod(
            ref,
            layout,
            rank,
            route=pod_routes[node_name],
            template=spec.template,
            settings=st.settings,
            hostname_label=_hostname(st, node_name),
            master=master if rank else None,
            # spec.framework other than holmes: the user's command under Holmes' launcher
            launch=framework_launch.launch(spec, layout, rank, st.settings.image),
        )
        for rank, node_name in enumerate(layout.nodes)
        if rank not in existing and rank in ranks
    ]


# ---- acrossIslands replicas: one torch world per cluster (replicas.py) -------------------------
def _runs_as_replicas(st: JobState, spec: JobSpec, same_spec: bool) -> bool:
    """mode replicas, or auto where the planner picks replicas on the usable nodes (a launch
    cut short keeps what it launched)."""
    mode = spec.training.across_islands.mode
    if mode == "pipeline" or (mode == "auto" and (spec.framework != "holmes" or st.obs.members is not None)):
        return False  # auto: replicas only where validation.py would let mode replicas run
    if same_spec and launched_replicas(st) is not None:
        return True
    return replicas.choose(spec, _replica_nodes(st, spec), _replica_model(st)) == replicas.REPLICAS


def _replica_model(st: JobState):
    """Replicas claim no IMEX channel: they are planned without NVLink domains (compute_domains.py)."""
    return compute_domains.without_domains(st.facts.cost_model)


def _replica_nodes(st: JobState, spec: JobSpec) -> list[Mapping]:
    """The nodes the job's pods could use (GPUs, taints, Ready). Replicas are planned on
    them as they are, not behind the jobs ahead in a queue (capacity.py plans pipelines)."""
    shape = replace(
        capacity.pod_shape(spec, st.settings.gpu_resource),
        flavor_labels=st.flavor_labels,
        flavor_tolerations=st.flavor_tolerations,
    )
    view, _ = capacity.free_view(planning_nodes(st), shape, capacity.Ledger(), st.settings.gpu_resource)
    return [n for n in view if not st.facts.unusable(n)]


def _launch_replicas(st: JobState, spec: JobSpec, same_spec: bool) -> Decision:
    """One torch world per cluster (validation.py refused member clusters and frameworks
    other than holmes)."""
    plan = launched_replicas(st) if same_spec else None
    if plan is None:
        try:
            plan = replicas.plan_replicas(spec, _replica_nodes(st, spec), _replica_model(st))
        except InsufficientNodes as e:
            return _wait_for_nodes(st, spec, str(e), getattr(e, "reason", "WaitingForNodes"))
        except PlanError as e:
            return stall(st, "PlanFailed", f"cannot plan this job's replicas: {e}")
        st.d.placed = True
        event(st, "Normal", "Planned", _replicas_message(plan))
    elif any(n not in st.nodes for n in plan.nodes):
        teardown(st)  # a planned node vanished: plan again
        return launch(st, spec)
    held = _outside_admission(st, spec, plan.nodes)
    if held is not None:
        return held
    nets = {n: st.facts.network(st.nodes[n]) for n in plan.nodes}
    pod_routes = {}
    try:  # each replica's routes inside its own island(s)
        for lay in plan.layouts:
            pod_routes.update(job_routes(spec, lay, {n: nets[n] for n in lay.nodes}))
    except RouteError as e:
        return stall(st, "InvalidSpec", f"{e}{validation.FIX}")
    # replicas claim no IMEX channel: NCCL's multi-node NVLink off on NVLink-domain nodes
    pod_routes = with_compute_domains(pod_routes, [], nets)
    if queueing.volcano_group(spec.template):  # every replica's pods: one gang, admitted first
        why = _podgroup_first(st, spec, pod_routes)
        if why is not None:
            return _wait_for_podgroup(st, spec, why)
    ref = job_ref(st, spec)
    existing = {pod_node_rank(p) for p in current_pods(st)}
    pods = replicas.build_pods(
        ref,
        plan,
        routes=pod_routes,
        template=spec.template,
        settings=st.settings,
        hostname_labels={n: _hostname(st, n) for n in plan.nodes},
        skip={r for r in existing if r is not None},
    )
    over = _create_children(st, ref, pod_routes, replicas.build_configmap(ref, plan, spec), pods)
    if over:
        return _wait_for_quota(st, spec, over)
    nic_of = {n: net.nic for n, net in nets.items()}
    layout_st = layout_status(plan.layouts[0], nic_of, child_names.layout_configmap_name(st.name))
    layout_st["nodes"] = len(plan.nodes)  # the gang: every replica's pods (replica 0's shape above)
    st.status["layout"] = layout_st
    st.status["replicas"] = replicas.replica_status(plan, {})
    st.status.pop("waitingSince", None)
    return _launched(
        st, spec, len(plan.nodes), f"{len(plan.layouts)} replicas of layout {layout_st['shape']}"
    )


def _replicas_message(plan: replicas.ReplicaPlan) -> str:
    return (
        f"{len(plan.layouts)} replicas, one per cluster ("
        + "; ".join(f"{c}: {plan_message(lay)}" for c, lay in zip(plan.clusters, plan.layouts))
        + ")"
    )


# ---- what a pipeline and replicas share ----------------------------------------------------------
def _outside_admission(st: JobState, spec: JobSpec, nodes: Sequence[str]) -> Decision | None:
    """A launch held to the split Kueue admitted (None: the pods on ``nodes`` are within it,
    kueue_pod_sets.outside_admission). Kueue reserved quota per PodSet and flavor, so a plan
    at launch that splits the pods otherwise would run on quota nobody reserved: the job waits
    for the admitted split's nodes. When the plan its pod sets come from has itself changed
    (nodes came or went), the Workload is stale: deleted, and made again for Kueue from the
    plan now (as Kueue's job framework re-creates a Workload its job no longer matches)."""
    wl = st.obs.workload
    if wl is None or not st.flavor_labels or not queueing.queue_name(st.job):
        return None
    shape = capacity.pod_shape(spec, st.settings.gpu_resource)
    rdma = placement.route_resources(spec, placement_of(st))
    pods = [
        (n, (st.nodes[n].get("metadata") or {}).get("labels") or {}, {**rdma(st.nodes[n]), **shape.requests})
        for n in nodes
    ]
    why = kueue_pod_sets.outside_admission(wl, st.obs.flavors or {}, pods)
    if not why:
        return None
    name = queueing.workload_name(st.name)
    tas = st.obs.queue_topology is not None
    admitted = st.flavor_labels, st.flavor_tolerations
    st.flavor_labels, st.flavor_tolerations = (), ()  # the pod sets as the gate would make them now
    try:
        now = admitting.planned_pod_sets(st, spec, shape, tas)
    finally:
        st.flavor_labels, st.flavor_tolerations = admitted
    st.d.events = [e for e in st.d.events if e.reason != "Planned"]  # announced when it launches
    if not queueing.same_pod_sets((wl.get("spec") or {}).get("podSets"), now):
        st.d.delete_workload = name
        why += f"; the plan its pod sets come from changed: re-creating Workload {name} for Kueue"
    else:
        why += "; waiting for the nodes of the admitted split"
    return _wait_for_nodes(st, spec, why, "WaitingForCapacity")


def _hostname(st: JobState, node: str) -> str | None:
    return (st.nodes[node]["metadata"].get("labels") or {}).get(HOSTNAME_LABEL)


def _create_children(
    st: JobState, ref: JobRef, pod_routes: Mapping[str, PodRoute], configmap: dict, pods: list[dict]
) -> str:
    """The attempt's DRA claim templates, ConfigMap, Service (when missing) and pods, each pod in
    the gang's Volcano PodGroup when it has one; or, when the namespace's ResourceQuotas would
    refuse some of the pods, nothing, and why (quota.py)."""
    over = quota.refusal(st.obs.quotas or (), pods)
    if over:
        return over
    st.d.claim_templates = claim_templates(
        ref.name, ref.namespace, pod_routes.values(), render.child_labels(ref)
    )
    st.d.configmap = configmap
    if st.obs.service is None:
        st.d.service = build_service(ref, st.settings)
    for pod in pods:  # Kueue's admitted flavor: its node labels in the pod's node selector and
        # its tolerations appended, as Kueue's job framework merges them into its jobs' pods
        # (pkg/podset Merge; the pod is pinned to its node anyway)
        node = st.nodes.get(pod["metadata"]["annotations"].get(child_names.ANN_NODE) or "") or {}
        own = list(pod["spec"].get("tolerations") or [])
        flavor, extra = _flavor_for(st, node, own)
        if flavor:
            pod["spec"]["nodeSelector"] = {**flavor, **(pod["spec"].get("nodeSelector") or {})}
        if extra:
            pod["spec"]["tolerations"] = own + [dict(t) for t in extra if t not in own]
        if HOSTNAME_LABEL in flavor:  # admitted by topology: the node is Kueue's pick
            template = (st.job.get("spec") or {}).get("template") or {}
            _as_tas_pod(pod, template, prebuilt.job_workload_name(st.job))
    st.d.create_pods.extend(pods)
    if st.d.podgroup is not None:
        for pod in st.d.create_pods:
            queueing.in_group(pod, st.d.podgroup["metadata"]["name"])
    return ""


def _flavor_for(st: JobState, node: Mapping, own: list) -> tuple[dict, tuple]:
    """The node labels and tolerations of the admitted flavor a pod of tolerations ``own`` runs
    under on ``node`` (tolerations.flavor_choice: the first whose tolerations tolerate it)."""
    if not st.flavor_labels:
        return {}, ()
    choice = tolerations.flavor_choice(node, own, st.flavor_labels, st.flavor_tolerations)
    if choice is None or choice < 0:  # placement checked the node: the labels still say which
        return queueing.flavor_of((node.get("metadata") or {}).get("labels") or {}, st.flavor_labels), ()
    extra = st.flavor_tolerations[choice] if choice < len(st.flavor_tolerations) else ()
    return dict(st.flavor_labels[choice]), tuple(extra)


def _as_tas_pod(pod: dict, template: Mapping, workload: str) -> None:
    """A pod of a Workload Kueue admitted by topology, as Kueue's TAS expects its pods: the
    node selector of its domain (set by the caller) and not Holmes' own pin to the node (the
    template's node affinity as written), the PodSet's required level and its Workload named
    (so Kueue counts the pod as the Workload's usage, not as usage beside it)."""
    affinity = copy.deepcopy(((template.get("spec") or {}).get("affinity")) or {})
    if affinity:
        pod["spec"]["affinity"] = affinity
    else:
        pod["spec"].pop("affinity", None)
    ann = pod["metadata"].setdefault("annotations", {})
    ann[island_topology.ANN_REQUIRED_TOPOLOGY] = island_topology.LABEL_ISLAND
    ann[island_topology.ANN_WORKLOAD] = workload


def _launched(st: JobState, spec: JobSpec, total: int, what: str) -> Decision:
    """Every pod of the attempt created: Pending until they run."""
    st.status["launched"] = True
    st.status["size"] = size(spec, total)
    st.status["pods"] = pod_counts(current_pods(st) + st.d.create_pods)
    if st.d.create_pods:
        event(
            st,
            "Normal",
            "Launched",
            f"attempt {st.attempt}: created {len(st.d.create_pods)} pods "
            f"for {what} (pipeline x data x tensor)",
        )
    set_phase(st, PENDING, "PodsStarting", f"attempt {st.attempt}: waiting for {total} pods to run")
    st.d.requeue_after = st.settings.progress_interval
    return st.d


def _podgroup_first(st: JobState, spec: JobSpec, pod_routes: Mapping[str, PodRoute]) -> str | None:
    """The gang's Volcano PodGroup (``st.d.podgroup``), and why its pods wait for it (None:
    create them)."""
    shape = capacity.pod_shape(spec, st.settings.gpu_resource)
    claimed = sum(1 for r in pod_routes.values() if r.claim is not None and r.claim.gpus)
    st.d.podgroup = queueing.build_podgroup(st.name, st.ns, len(pod_routes), shape, spec.template, claimed)
    started = any(pod_attempt(p) == st.attempt for p in st.pods)
    return queueing.podgroup_wait(st.obs.podgroup, st.d.podgroup, started)


# ---- why it waits ---------------------------------------------------------------------------------
def _terminating_pods(st: JobState) -> list[str]:
    """Pods of earlier attempts still stopping on a node that can still stop them (a pod on a
    lost node never reports back: it is not waited for)."""
    out = []
    for p in st.pods:
        if pod_attempt(p) == st.attempt or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        node = (p.get("spec") or {}).get("nodeName")
        if not node:
            continue  # never scheduled: nothing runs
        if node not in st.nodes or "not Ready" in st.facts.unusable(st.nodes[node]):
            continue
        out.append(p["metadata"]["name"])
    return out


def _wait_for_nodes(st: JobState, spec: JobSpec, why: str, reason: str = "WaitingForNodes") -> Decision:
    refused = refused_nodes(st)
    if refused:  # say so: the job could use them but for the scheduler's word
        listed = "; ".join(
            f"{n} until {v.get('until')} ({v.get('message')})" for n, v in sorted(refused.items())
        )
        why += f"; left out after the scheduler refused pods there: {listed}"
    st.status["pods"] = pod_counts([])
    st.status["size"] = size(spec, None)
    old = cond.get(st.old.get("conditions"), cond.RECONCILING)
    announced = set_phase(st, PENDING, reason, why)
    if not announced and not (old and old.get("reason") == reason and old.get("message") == why):
        event(st, "Normal", reason, why)
    st.d.requeue_after = WAIT_INTERVAL
    return st.d


def _wait_for_quota(st: JobState, spec: JobSpec, why: str) -> Decision:
    """The namespace's ResourceQuota has no room for the gang: no pod is created (none would
    hold its node for a gang that cannot start); woken when a quota's status changes. The plan
    is announced when it launches."""
    st.d.events = [e for e in st.d.events if e.reason != "Planned"]
    st.status["launched"] = False
    st.status["pods"] = pod_counts(current_pods(st))
    st.status["size"] = size(spec, None)
    old = cond.get(st.old.get("conditions"), cond.RECONCILING)
    announced = set_phase(st, PENDING, quota.WAITING_FOR_QUOTA, why)
    if not announced and not (old and old.get("reason") == quota.WAITING_FOR_QUOTA):
        event(st, "Normal", quota.WAITING_FOR_QUOTA, why)
    st.d.requeue_after = until_deadline(st, spec, WAIT_INTERVAL)
    return st.d


def _wait_for_podgroup(st: JobState, spec: JobSpec, why: str) -> Decision:
    """Volcano's queue has not admitted the gang's PodGroup: its pods wait uncreated (as
    Volcano's job controller does), holding nothing."""
    st.status["launched"] = False
    st.status["pods"] = pod_counts(current_pods(st))
    st.status["size"] = size(spec, None)
    set_phase(st, PENDING, "WaitingForPodGroup", why, announce=False)
    st.d.requeue_after = until_deadline(st, spec, WAIT_INTERVAL)
    return st.d


def _wait_for_rendezvous(st: JobState, spec: JobSpec, layout: Layout) -> Decision:
    st.status["launched"] = False
    st.status["size"] = size(spec, len(layout.nodes))
    st.status["pods"] = pod_counts(current_pods(st) + st.d.create_pods)
    set_phase(
        st,
        PENDING,
        "WaitingForRendezvous",
        f"attempt {st.attempt}: rank 0 is created first; the other {len(layout.nodes) - 1} pod(s) "
        "follow once it has an IP, their rendezvous address across member clusters",
        announce=False,
    )
    st.d.requeue_after = until_deadline(st, spec, 1.0)
    return st.d


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
