"""Replicas across islands (``spec.training.acrossIslands.mode: replicas``, or ``auto`` when the
planner picks them): one replica per cluster, each a torch world of its own with Holmes' layout
inside it, meeting every innerSteps steps in the outer group (holmes.trainer.outer). Pure.

- ``choose``: pipeline or replicas for this job on these nodes (auto: holmes.plan.across_plan's
  verdict; one cluster: nothing to cross, the pipeline).
- ``plan_replicas``: each cluster's replica layout (across_plan.replica_layouts), refused when the
  replicas would not pair their optimizer shards rank by rank (``check_paired``: the contract's
  layout signature, which the trainer checks when they meet).
- ``slots``: where each replica's pods start in the job's pod numbering, its rendezvous and
  metrics ports and the outer group's address (replica 0's first pod, a port of its own).
- ``build_configmap``: the job's ConfigMap with every replica's layout (``layout-<r>.json``),
  replica 0's also as ``layout.json`` and the replica table as ``replicas.json``.
- ``build_pods``: every replica's pods (render.build_pod with the replica's slot).
- ``replica_status``: status.replicas, each replica's cluster, nodes and progress.

The outer group runs over the pod network (or the hosts' with hostNetwork) between islands:
the trainer pins it to NCCL's Socket transport (outer.OUTER_NET), as Holmes pins every group
that crosses islands (holmes.plan.nccl); each replica's pods keep their island's route
(routes.py) for the groups inside the replica.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from holmes.contract import JobSpec, Layout
from holmes.contract.layout import layout_signature
from holmes.plan import PlanError
from holmes.plan.across_plan import clusters_of, compare_across, replica_job, replica_layouts
from holmes.plan.costmodel import CostModelConfig

from . import child_names, render
from .render import JobRef, RenderSettings, ReplicaSlot
from .routes import PodRoute

PIPELINE, REPLICAS = "pipeline", "replicas"
REPLICAS_FILE = "replicas.json"
# the key of each replica's numbers (replica -> numbers) in what the progress reader returns
REPLICAS_READ = "replicas"


@dataclass(frozen=True)
class ReplicaPlan:
    """One layout per cluster, in cluster-name order (replica r is the r-th)."""

    clusters: tuple[str, ...]
    layouts: tuple[Layout, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every replica's nodes in pod order (replica 0's first)."""
        return tuple(n for lay in self.layouts for n in lay.nodes)

    def first(self, replica: int) -> int:
        return sum(len(lay.nodes) for lay in self.layouts[:replica])


def choose(spec: JobSpec, nodes: Sequence[Any], cfg: CostModelConfig) -> str:
    """``replicas`` or ``pipeline`` for this job on these nodes. mode replicas on nodes of one
    cluster is one replica (the trainer's outer step then runs on itself): still replicas."""
    mode = spec.training.across_islands.mode
    if mode == REPLICAS:
        return REPLICAS
    if mode != "auto":
        return PIPELINE
    verdict = compare_across(nodes, spec, cfg)  # None: one cluster, nothing to cross
    return verdict.pick if verdict is not None else PIPELINE


def plan_replicas(spec: JobSpec, nodes: Sequence[Any], cfg: CostModelConfig) -> ReplicaPlan:
    """One replica per cluster of ``nodes``; PlanError saying why when a cluster cannot hold one
    or the replicas' layouts differ (their optimizer shards pair rank by rank)."""
    planned = replica_layouts(clusters_of(nodes), spec, cfg)
    check_paired(planned)
    return ReplicaPlan(tuple(n for n, _ in planned), tuple(lay for _, lay in planned))


def check_paired(planned: Sequence[tuple[str, Layout]]) -> None:
    """PlanError unless every replica's layout has one signature (the trainer's, from the
    contract: replicas whose signatures differ are refused when they meet)."""
    shapes = {name: layout_signature(lay) for name, lay in planned}
    if len({json.dumps(s, sort_keys=True) for s in shapes.values()}) > 1:
        raise PlanError(
            "the replicas' best layouts differ ("
            + "; ".join(f"cluster {n}: {describe(s)}" for n, s in shapes.items())
            + "), and replicas pair their optimizer shards rank by rank: give every cluster the "
            "same nodes (count and GPUs), or set parallelism.pipeline and parallelism.data"
        )


def describe(sig: Mapping[str, Any]) -> str:
    chunks = f" chunks {sig['chunks']}" if "chunks" in sig else ""
    return f"{sig['pipeline']}x{sig['data']}x{sig['tensor']} layers {sig['stageLayers']}{chunks}"


def slots(job: JobRef, plan: ReplicaPlan, settings: RenderSettings) -> list[ReplicaSlot]:
    """Each replica's place. Fixed ports: every replica's rank 0 on the fixed pair (they run on
    different nodes), the outer store on the rendezvous port + 1. A port range: consecutive
    pairs of the range from the attempt's own (render.job_ports), one per replica, and the next
    pair's first port for the outer store, so pods sharing a host network do not clash."""
    master, metrics = render.job_ports(job, settings)
    count = len(plan.layouts)
    if settings.port_range:
        lo, hi = settings.port_range
        pairs = max(1, (hi - lo + 1) // 2)
        base = (master - lo) // 2

        def pair(k: int) -> tuple[int, int]:
            p = lo + 2 * ((base + k) % pairs)
            return p, p + 1

        ports, outer = [pair(r) for r in range(count)], pair(count)[0]
    else:
        ports, outer = [(master, metrics)] * count, master + 1
    addr = f"{child_names.pod_addr(job.name, job.namespace, job.attempt, 0)}:{outer}"
    return [
        ReplicaSlot(r, count, plan.first(r), ports[r], addr, child_names.replica_layout_file(r))
        for r in range(count)
    ]


def build_configmap(
    job: JobRef, plan: ReplicaPlan, spec: JobSpec, files: Mapping[str, str] | None = None
) -> dict:
    table = [
        {"replica": r, "cluster": c, "first": plan.first(r), "nodes": list(lay.nodes)}
        for r, (c, lay) in enumerate(zip(plan.clusters, plan.layouts))
    ]
    more = {child_names.replica_layout_file(r): lay.to_json(indent=1) for r, lay in enumerate(plan.layouts)}
    more[REPLICAS_FILE] = json.dumps(table, indent=1)
    # job.yaml as each replica's world reads it: its share of globalBatchSize (the trainer checks
    # its layout runs exactly that many samples; replicas read disjoint ones), what it was planned as
    share = replica_job(spec, len(plan.layouts), len(plan.layouts[0].nodes))
    return render.build_configmap(job, plan.layouts[0], share, {**more, **(files or {})})


def read_plan(data: Mapping[str, str]) -> ReplicaPlan | None:
    """The ReplicaPlan a ConfigMap's data holds (None: a pipeline job's)."""
    raw = data.get(REPLICAS_FILE)
    if not raw:
        return None
    table = json.loads(raw)
    return ReplicaPlan(
        tuple(row["cluster"] for row in table),
        tuple(Layout.from_json(data[child_names.replica_layout_file(row["replica"])]) for row in table),
    )


def build_pods(
    job: JobRef,
    plan: ReplicaPlan,
    *,
    routes: Mapping[str, PodRoute],
    template: Mapping[str, Any] | None,
    settings: RenderSettings,
    hostname_labels: Mapping[str, str | None],
    skip: set[int] = frozenset(),  # type: ignore[assignment]
) -> list[dict]:
    """Every replica's pods but those numbered in ``skip`` (already there)."""
    out = []
    for slot, layout in zip(slots(job, plan, settings), plan.layouts):
        for k, node in enumerate(layout.nodes):
            if slot.first + k in skip:
                continue
            out.append(
                render.build_pod(
                    job,
                    layout,
                    k,
                    route=routes[node],
                    template=template,
                    settings=settings,
                    hostname_label=hostname_labels.get(node),
                    replica=slot,
                )
            )
    return out


def replica_status(plan: ReplicaPlan, progress: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """status.replicas: per replica its cluster, node count and, once its rank 0 reported, the
    iteration and the last outer step it took part in."""
    out = []
    for r, (cluster, layout) in enumerate(zip(plan.clusters, plan.layouts)):
        row: dict[str, Any] = {"replica": r, "cluster": cluster, "nodes": len(layout.nodes)}
        seen = progress.get(r) or {}
        for key in ("iteration", "outerStep", "checkpointIteration"):
            if isinstance(seen.get(key), int):
                row[key] = seen[key]
        out.append(row)
    return out


def merged_status(
    plan: ReplicaPlan, before: Sequence[Mapping[str, Any]] | None, read: Mapping[int, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """status.replicas with the numbers just read; a replica not read this time keeps its last."""
    seen: dict[int, dict[str, Any]] = {}
    for row in before or []:
        if isinstance(row, Mapping) and isinstance(row.get("replica"), int):
            seen[row["replica"]] = dict(row)
    for r, numbers in read.items():
        seen.setdefault(r, {}).update({k: v for k, v in (numbers or {}).items() if v is not None})
    return replica_status(plan, seen)
