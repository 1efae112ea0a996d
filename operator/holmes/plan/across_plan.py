"""``holmes plan`` for a job allowed to cross islands as replicas (acrossIslands.mode replicas or
auto): the planner's pipeline over all the nodes against one replica per cluster, each planned
on its own cluster's nodes with its share of the batch, plus the outer exchange over the link
(holmes.plan.across prices both).

Which link: the pipeline's estimate prices each of its boundaries on the link of the two
clusters it joins (the planner); the replicas' exchange is a ring over the clusters in replica
order (cluster-name order), priced at its slowest hop (the least bandwidth, the most latency of
its hops: every step of a ring waits for its slowest hop). With two clusters both are the one
pair's link."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from holmes.contract import JobSpec, Layout, ModelCost

from . import across
from .costmodel import CostModelConfig
from .discovery import classify_node, classify_nodes
from .errors import PlanError
from .planner import plan
from .topology import ClusterLink, Fabric, boundary_crossings, summarize


@dataclass(frozen=True)
class AcrossPlan:
    pipeline: Layout
    replica: Layout  # the slowest cluster's replica layout
    replicas: int
    pipeline_s: float  # seconds per iteration
    replicas_s: float  # a replica's iteration plus the outer exchange amortised over H
    exchange_s: float  # one outer step
    pick: str
    lines: tuple[str, ...]
    hidden: float = 0.0  # the share of the exchange overlapped with compute (overlapSteps)


def hidden_fraction(exchange_s: float, fragments: int, overlap_steps: int, compute_s: float) -> float:
    """The share of the outer exchange the trainer hides (outer.py, acrossIslands.overlapSteps
    tau): each fragment's exchange travels while the replica computes tau iterations, so up to
    tau * compute_s of its exchange_s / fragments is hidden; the rest is waited for when it lands."""
    if overlap_steps == 0 or exchange_s <= 0:
        return 0.0
    return min(1.0, overlap_steps * compute_s / (exchange_s / fragments))


def clusters_of(nodes: Sequence[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for n in nodes:
        out.setdefault(classify_node(n).cluster, []).append(n)
    return out


def replica_job(job: JobSpec, replicas: int, per_replica: int) -> JobSpec:
    """The job one replica of ``replicas`` runs: its share of the batch on ``per_replica`` nodes,
    its own pipeline and data degrees; PlanError when the batch does not split into them."""
    t = job.training
    if t.global_batch_size % (replicas * t.micro_batch_size):
        raise PlanError(
            f"spec.training.globalBatchSize {t.global_batch_size} does not split into {replicas} replicas "
            f"of whole micro-batches of {t.micro_batch_size}: make it a multiple of "
            f"{replicas * t.micro_batch_size}"
        )
    # mode replicas also for auto: the replica's trainer runs the outer optimizer (its memory)
    across = replace(t.across_islands, mode="replicas")
    return replace(
        job,
        training=replace(t, global_batch_size=t.global_batch_size // replicas, across_islands=across),
        nodes=replace(job.nodes, count=per_replica, min_count=None),
        parallelism=replace(job.parallelism, pipeline="auto", data="auto"),
    )


def replica_layouts(
    groups: dict[str, list[Any]], job: JobSpec, cfg: CostModelConfig
) -> list[tuple[str, Layout]]:
    """One replica per cluster, in cluster-name order, each planned on its own cluster's nodes
    with as many nodes as the smallest cluster has, at most its share of spec.nodes.count (the
    replicas pair their optimizer shards rank by rank, so they run the same shape); PlanError
    naming the cluster that cannot hold one."""
    per_replica = min(min(len(g) for g in groups.values()), job.nodes.count // len(groups))
    if per_replica < 1:
        raise PlanError(
            f"spec.nodes.count {job.nodes.count} gives no node to each of {len(groups)} replicas (one "
            f"per cluster: {', '.join(sorted(groups))}): make it at least {len(groups)}"
        )
    rjob = replica_job(job, len(groups), per_replica)
    out = []
    for name, members in sorted(groups.items()):
        try:
            out.append((name, plan(members, rjob, cfg)))
        except PlanError as e:
            raise PlanError(f"a replica on cluster {name} cannot be planned: {e}") from None
    return out


def replica_ring(clusters: Sequence[str], fabric: Fabric) -> list[ClusterLink]:
    """The hops of the replicas' ring over ``clusters`` in replica order (one hop for two)."""
    R = len(clusters)
    hops = [(clusters[i], clusters[(i + 1) % R]) for i in range(R if R > 2 else 1)]
    return [fabric.link(a, b) for a, b in hops]


def ring_link(hops: Sequence[ClusterLink]) -> across.Link:
    """The ring priced as one link: its slowest hop's bandwidth and its longest hop's latency."""
    return across.Link(min(h.gbps for h in hops), max(h.latency_ms for h in hops) / 1e3)


def exchange_link(nodes: Sequence[Any], hops: Sequence[ClusterLink], fabric: Fabric) -> across.Link:
    """The link as the outer group sees it. The group is a Socket group over the host network
    (rank r of every replica), like the pipeline's traffic between clusters: per node it gets
    the slower of the ring's slowest hop and the hosts' sockets, at the socket efficiency and
    within the TCP flows NCCL opens (topology.group_bandwidth_gbps, with the ring's hop as the
    link)."""
    ring = ring_link(hops)
    hosts = summarize(classify_nodes(nodes), fabric)
    gbps = min(min(hosts.min_socket_gbps, ring.gbps) * fabric.socket_efficiency, hosts.socket_flows_gbps)
    return across.Link(gbps, ring.latency_s)


def pipeline_crossings(layout: Layout, nodes: Sequence[Any], fabric: Fabric) -> list[str]:
    """The layout's stage boundaries between clusters, each with its link."""
    cluster = {n.name: n.cluster for n in classify_nodes(nodes)}
    return boundary_crossings([[cluster[name] for name in s.nodes] for s in layout.stages], fabric)


def compare_across(nodes: Sequence[Any], job: JobSpec, cfg: CostModelConfig) -> AcrossPlan | None:
    """None when the nodes are in one cluster (nothing to cross); PlanError when a replica
    cannot be planned on a cluster, saying why."""
    groups = clusters_of(nodes)
    if len(groups) < 2:
        return None
    t, spec = job.training, job.training.across_islands
    R = len(groups)
    pipeline = plan(nodes, job, cfg)
    replicas = [lay for _, lay in replica_layouts(groups, job, cfg)]
    per_replica = len(replicas[0].nodes)
    slowest = max(replicas, key=lambda lay: lay.estimate["iterationSeconds"])
    exchange_bytes = 2 if spec.exchange_dtype == "bfloat16" else 4
    params = ModelCost.of(job.model).total_params
    work = across.AcrossWork(
        compute_s=slowest.estimate["iterationSeconds"],
        micro_batches=pipeline.micro_batches,
        activation_bytes=0.0,  # the pipeline's own estimate prices its link; not used below
        model_bytes=params * exchange_bytes / per_replica,  # each node sends its ranks' shards
        tokens_per_iteration=t.global_batch_size * job.model.seq_length,
        replicas=R,
    )
    hops = replica_ring(sorted(groups), cfg.fabric)
    link = exchange_link(nodes, hops, cfg.fabric)
    exchange = across.exchange_s(work, link, spec.fragments)
    hidden = hidden_fraction(exchange, spec.fragments, spec.overlap_steps, work.compute_s)
    rep_s = across.replicas_iteration_s(work, link, spec.inner_steps, hidden, spec.fragments)
    pipe_s = pipeline.estimate["iterationSeconds"]
    ratio, assumption = across.assumed_tokens_ratio(spec.inner_steps)
    pipe_tok, rep_tok = pipe_s, rep_s * ratio  # same tokens per iteration: compare per iteration
    pick = "replicas" if rep_tok < pipe_tok else "pipeline"
    faster = max(pipe_tok, rep_tok) / min(pipe_tok, rep_tok)
    crossings = pipeline_crossings(pipeline, nodes, cfg.fabric)
    if len(hops) == 1:
        ring = f"over the link {cfg.fabric.describe(hops[0])}"
    else:
        order = " -> ".join([*sorted(groups), sorted(groups)[0]])
        slow = min(hops, key=lambda h: (h.gbps, -h.latency_ms, h.name))
        ring = f"over the replicas' ring {order}, priced at its slowest hop {cfg.fabric.describe(slow)}" + (
            f" and its longest latency, {link.latency_s * 1e3:g} ms"
            if link.latency_s * 1e3 > slow.latency_ms
            else ""
        )
    lines = (
        f"pipeline across the clusters: {pipe_s:.2f} s/iteration "
        f"(P={pipeline.pipeline} D={pipeline.data} T={pipeline.tensor}; "
        + ("; ".join(crossings) or "no stage boundary between clusters")
        + ")",
        f"replicas, one per cluster ({R}): {slowest.estimate['iterationSeconds']:.2f} s/iteration "
        f"(P={slowest.pipeline} D={slowest.data} T={slowest.tensor} on {per_replica} nodes) + "
        f"{exchange:.2f} s outer exchange every {spec.inner_steps} steps {ring} ({link.gbps:.3g} Gbit/s "
        f"per node on the hosts' sockets) = {rep_s:.2f} s/iteration",
        f"convergence: {assumption}",
        f"faster per token: {pick}, {faster:.2f}x",
    )
    shown: tuple[str, ...] = lines
    if spec.overlap_steps:  # after the replicas' line, whose s/iteration it explains
        shown = (
            *lines[:2],
            f"overlap: {hidden:.0%} of the exchange hidden behind {spec.overlap_steps} inner steps' compute "
            f"(acrossIslands.overlapSteps; each of the {spec.fragments} fragments' exchanges travels while "
            "the replica trains on)",
            *lines[2:],
        )
    return AcrossPlan(pipeline, slowest, R, pipe_s, rep_s, exchange, pick, shown, hidden)
