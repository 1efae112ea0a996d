"""Placement: the layout a job runs in now, or why it waits. One function, ``place``, over data
the I/O layer observed before deciding (``PlacementFacts``: the cost model of this reconcile,
each node's facts under it, what the other workloads hold). Its steps, each a plain function:

1. size (elastic.py): ``nodes.count``, else for an elastic job a smaller count down to
   ``minCount``; each count tried runs steps 2-5;
2. measured rates (replan.measured_nodes): each node priced at the TFLOP/s this job's stages
   achieved there (status.adaptation.measuredTflops);
3. capacity (``on_free_capacity``, capacity.py): first on the nodes its pods could ever use,
   then on what the jobs ahead of it in the queue leave free;
4. member clusters (``fit``, members.py): across members, islands stay inside a member and no
   stage spans two;
5. the layout search (holmes.plan.plan) under the cost model of this reconcile.

Pure: no client, no clock of its own, no call back into the I/O layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property

from holmes.contract import JobSpec, Layout
from holmes.contract.names import RESOURCE_GPU
from holmes.plan import (
    Budget,
    CostModelConfig,
    InsufficientNodes,
    PlanError,
    PlanTooLarge,
    classify_nodes,
    plan,
)
from holmes.plan.budget import DEFAULT_UNITS
from holmes.plan.calibrate import Calibration, assess
from holmes.plan.measured import Measured

from . import (
    capacity,
    compute_domains,
    device_claims,
    elastic,
    kueue_pod_sets,
    members,
    node_selection,
    replan,
    replicas,
    routes,
)
from .island_topology import island_of, label_value
from .routes import NodeNetwork

# The search a job ahead in the queue may cost each job behind it (a fiftieth of a job's own
# budget, ~0.3 s here): one whose weighing needs more keeps the free nodes it could use, as a
# waiting head does, until its own placement launches it or refuses it (Stalled, out of the queue).
AHEAD_UNITS = DEFAULT_UNITS // 50


@dataclass(frozen=True)
class PlacementFacts:
    """What placement decides on besides the job, observed before deciding (pipeline.py)."""

    cost_model: CostModelConfig  # as of this reconcile (its file re-read when changed)
    network: Callable[[Mapping], NodeNetwork]  # a node's NIC kind, RDMA resource, NCCL env
    unusable: Callable[[Mapping], str]  # why a node cannot run pods ("" if it can)
    # what the other workloads hold and want: read by the first decision step that places
    read_workloads: Callable[[], capacity.Workloads] = capacity.Workloads

    @cached_property
    def workloads(self) -> capacity.Workloads:
        """Read once, and only when this decision places: a running job's reconciles (most of
        them on a busy cluster) never do, and the read is a pass over every pod of the cluster."""
        return self.read_workloads()


@dataclass(frozen=True)
class Placement:
    """One job's placement question: where it may go and what it competes with."""

    facts: PlacementFacts
    nodes: Sequence[Mapping]  # the hub's nodes, or the members' union (members.union_nodes)
    job: Mapping  # the HolmesJob (its place in the queue)
    across_members: bool = False
    flavor_labels: Sequence[Mapping[str, str]] = ()  # Kueue's admitted flavors (one must hold)
    flavor_tolerations: Sequence[tuple] = ()  # each flavor_labels' tolerations (its pods get them)
    priority_classes: Mapping[str, int] = field(default_factory=dict)
    gpu_resource: str = RESOURCE_GPU
    raw_priority_namespaces: tuple[str, ...] = ()  # capacity.priority_of
    # the job's pods can get IMEX channels (compute_domains.py): else the planner sees no
    # NVLink domain, so no group spans nodes on NVLink the pods could not use
    nvlink_channels: bool = True

    @property
    def key(self) -> str:
        meta = self.job.get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"

    @cached_property
    def claim_holds(self) -> list[device_claims.ClaimHold]:
        """What the DRA claims hold on these nodes: once per placement, whatever sizes it tries."""
        driver = self.facts.cost_model.nic_mapping.dra_gpu_driver
        return device_claims.holds(self.facts.workloads.claims, self.nodes, driver)

    @cached_property
    def cost_model(self) -> CostModelConfig:
        """The cost model the layout search plans with (without NVLink domains where the pods
        can get no IMEX channel)."""
        model = self.facts.cost_model
        return model if self.nvlink_channels else compute_domains.without_domains(model)


def place(
    spec: JobSpec,
    where: Placement,
    adaptation: Mapping | None,
    restarted: bool,
    since: datetime,
    now: datetime,
) -> elastic.Sized:
    """The layout to launch, or why to wait (step 1 over steps 2-5). Raises PlanError when the
    job cannot be planned at all (PlanTooLarge when every size it tries together would search
    more than one budget: one job's placement is bounded however many sizes it tries)."""
    nodes = list(replan.measured_nodes(where.nodes, adaptation, spec))
    budget = Budget()
    return elastic.plan_size(
        lambda ns, job: on_free_capacity(ns, job, where, budget), nodes, spec, restarted, since, now
    )


def on_free_capacity(
    nodes: Sequence[Mapping], spec: JobSpec, where: Placement, budget: Budget | None = None
) -> Layout:
    """Step 3: could the job ever run on these nodes (InsufficientNodes if not); then what the
    jobs ahead of it take, and a layout on what is left (WaitingForCapacity if none). The job's
    own searches spend ``budget``; each job ahead is weighed on ``AHEAD_UNITS`` of its own (one
    too large to weigh keeps the free nodes it could use), so a huge spec ahead in the queue
    costs others a small fixed search at most."""
    budget = budget if budget is not None else Budget()
    gpu = where.gpu_resource
    shape = job_shape(spec, where)
    rdma = route_resources(spec, where)
    own = node_selection.selected(nodes, spec)  # the planner takes no other: nor need the views
    possible, excluded = capacity.free_view(own, shape, capacity.Ledger(), gpu, rdma)
    try:
        fit(possible, spec, where, budget)
    except InsufficientNodes:  # said on every node: the planner names what its selector left out
        possible, excluded = capacity.free_view(nodes, shape, capacity.Ledger(), gpu, rdma)
        try:
            fit(possible, spec, where, budget)
        except InsufficientNodes as e:
            raise InsufficientNodes(node_selection.with_exclusions(str(e), excluded)) from None
    state = capacity.shared_state(
        where.job,
        where.facts.workloads,
        where.priority_classes or {},
        gpu_resource=gpu,
        raw_priority=where.raw_priority_namespaces,
    )
    led = capacity.Ledger.of(
        state.pods, state.launched, skip_job=where.key, gpu_resource=gpu, claims=where.claim_holds
    )
    blocked: dict[str, str] = {}
    for w in node_selection.bearing_on(state.ahead, node_selection.selected_names(nodes, spec), nodes):
        # only the nodes its selector matches: it keeps none that it could never use
        mine = node_selection.selected(nodes, w.spec)
        view, _ = capacity.free_view(node_selection.without(mine, blocked), w.shape, led, gpu)
        ahead = Budget(AHEAD_UNITS)  # its two searches share one budget, as in its own placement
        try:  # it fits now: it takes what it would (one search, the common case)
            capacity.take(led, fit(view, w.spec, where, ahead).nodes, w.shape, w.job)
            continue
        except PlanTooLarge:  # too costly to weigh in another job's placement: as if it waits
            keep_for(w, view, blocked, where)
            continue
        except PlanError:
            pass
        try:  # could it ever run here?
            fit(capacity.free_view(mine, w.shape, capacity.Ledger(), gpu)[0], w.spec, where, ahead)
        except PlanTooLarge:
            keep_for(w, view, blocked, where)
            continue
        except PlanError:
            continue  # it cannot run here at all: it holds nothing
        keep_for(w, view, blocked, where)  # it waits: what it could use now stays free for it
    view, _ = capacity.free_view(node_selection.without(own, blocked), shape, led, gpu, rdma)
    try:
        return fit(view, spec, where, budget)
    except InsufficientNodes:
        pass
    fitting = [  # named in the message: only nodes its selector lets it take
        x
        for x in view  # of its own nodes already
        if free_gpus(x, where) >= spec.nodes.gpus_per_node and not where.facts.unusable(x)
    ]
    raise capacity.WaitingForCapacity(capacity.waiting_message(spec, shape, fitting, led, blocked)) from None


def job_shape(spec: JobSpec, where: Placement) -> capacity.PodShape:
    """One pod of the job, on the nodes of Kueue's admitted flavors only."""
    return replace(
        capacity.pod_shape(spec, where.gpu_resource),
        flavor_labels=tuple(where.flavor_labels),
        flavor_tolerations=tuple(where.flavor_tolerations),
    )


def queued_pods(
    spec: JobSpec, where: Placement, topology: bool = False
) -> list[kueue_pod_sets.PodGroup] | None:
    """The pods the job would run, one PodGroup each (its island, every resource it requests
    there), as planned on the nodes its pods could ever use whatever holds them now: what it
    asks Kueue's quota for before it may plan on free capacity. None: it cannot be planned
    there (it then asks for one shape, ``nodes.count`` pods). ``topology``: the island is the
    value of Holmes' island level (core/island_topology.py), else of the job's cluster label."""
    shape = job_shape(spec, where)
    rdma = route_resources(spec, where)
    own = node_selection.selected(where.nodes, spec)
    possible, _ = capacity.free_view(own, shape, capacity.Ledger(), where.gpu_resource, rdma)
    try:
        if spec.training.across_islands.mode == replicas.REPLICAS:
            usable = [n for n in possible if not where.facts.unusable(n)]
            # replicas claim no IMEX channel (launching.py): planned without NVLink domains
            model = compute_domains.without_domains(where.facts.cost_model)
            names = replicas.plan_replicas(spec, usable, model).nodes
        else:
            names = fit(possible, spec, where, Budget()).nodes
    except PlanError:
        return None
    by_name = {(n.get("metadata") or {}).get("name"): n for n in possible}
    label = spec.nodes.cluster_label
    out = []
    for name in names:
        node = by_name[name]
        cluster = ""
        if topology:
            nic = classify_nodes([node], where.facts.cost_model.nic_mapping)[0]
            island, cluster = island_of(nic), label_value(nic.cluster)
        else:
            island = ((node.get("metadata") or {}).get("labels") or {}).get(label) or ""
        out.append(kueue_pod_sets.PodGroup(island, {**rdma(node), **shape.requests}, cluster=cluster))
    return out


def route_resources(spec: JobSpec, where: Placement) -> Callable[[Mapping], Mapping[str, float]]:
    """A node's RDMA devices or SR-IOV VFs one pod of the job requests there (its route,
    routes.py), for capacity to count against what the node has free."""
    notes = (spec.template.get("metadata") or {}).get("annotations") or {}

    def of(node: Mapping) -> Mapping[str, float]:
        name = (node.get("metadata") or {}).get("name") or ""
        nic = classify_nodes([node], where.facts.cost_model.nic_mapping)[0]  # remembered per node
        if nic.rdma_resource is None or not nic.usable:
            return {}  # nothing to count, or a node the planner leaves out anyway
        net = where.facts.network(node)
        got = routes.rdma_requests(
            net, name, network=spec.network, islands=spec.islands, template_annotations=notes
        )
        return {k: float(v) for k, v in got.items()}

    return of


def free_gpus(node: Mapping, where: Placement) -> int:
    """The GPUs of a node of the free view, counted as the planner counts them (device plugin
    or DRA, less those taken)."""
    return classify_nodes([node], where.facts.cost_model.nic_mapping)[0].gpus


def keep_for(w: capacity.Waiting, view: Sequence[Mapping], blocked: dict[str, str], where: Placement) -> None:
    """A job ahead that waits keeps the nodes of ``view`` it could use free for itself."""
    for n in view:
        if free_gpus(n, where) >= w.spec.nodes.gpus_per_node:
            blocked.setdefault(n["metadata"]["name"], w.job)


def fit(nodes: Sequence[Mapping], spec: JobSpec, where: Placement, budget: Budget) -> Layout:
    """Steps 4-5: the layout search on these nodes, within ``budget``; across members, islands
    stay inside members and a layout with a stage across members is refused."""
    if not where.across_members:
        return plan(list(nodes), spec, where.cost_model, budget)
    local = members.island_labels(nodes, spec.nodes.cluster_label)
    return members.within_members(plan(local, spec, where.cost_model, budget), local)


def at_least(spec: JobSpec, where: Placement, least: int) -> int:
    """Nodes of the largest layout of at least ``least`` nodes (elastic growth; PlanError if
    none plans now): steps 3-5 at each count, the nodes as observed."""
    budget = Budget()
    return len(
        elastic.plan_at_least(
            lambda ns, job: on_free_capacity(ns, job, where, budget), list(where.nodes), spec, least
        ).nodes
    )


def calibrated(
    where: Placement, nodes: list, spec: JobSpec, layout: Layout, measured: Measured
) -> tuple[Calibration, float]:
    """The job's calibration from its measurements, and its running layout's seconds under it
    (replan.py), on the nodes as ``fit`` sees them."""
    if where.across_members:
        nodes = members.island_labels(nodes, spec.nodes.cluster_label)
    return assess(nodes, spec, layout, measured, where.facts.cost_model)
