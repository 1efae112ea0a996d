"""Topology: islands of nodes that share a fabric, and the bandwidth between sets of nodes.

An *island* is (cluster label x NIC kind): its nodes reach each other over RDMA (InfiniBand or
RoCE) or, for Ethernet, over sockets. Between islands only sockets work (IB and RoCE cannot do
RDMA to each other; different clusters are different fabrics), at the host network's speed and,
across clusters, at most the bandwidth of the link between them (:class:`ClusterLink`: one per
pair of clusters that lists one, ``cross_cluster_gbps``/``cross_cluster_latency_ms`` for the rest).

Bandwidths are Gbit/s per node (all of a node's NICs together); efficiencies turn line rate
into what NCCL achieves (see :class:`holmes.plan.costmodel.CostModelConfig`). A Socket group
reaches at most its TCP flows times ``socket_flow_gbps``: the pods get enough flows for their
link (``NCCL_SOCKET_NTHREADS`` x ``NCCL_NSOCKS_PERTHREAD``, :func:`holmes.plan.nccl.socket_threads`)
unless the job's template fixes them; NCCL's own default is one flow. An island whose job names a
vendor net plugin (``spec.islands[].netPlugin``) runs its inside groups on that plugin's net, at
``plugin_efficiency`` of the node's line rate.

Below the island and above the node sits the NVLink domain (rack-scale NVLink, GB200/GB300
NVL72: ``NodeNic.nvlink_domain``, GPU Feature Discovery's clique): nodes whose GPUs reach each
other over NVLink. A set of nodes inside one domain (:attr:`NodeSet.nvlink_domain`) moves its
bytes over NVLink, not its NICs (plan/nvlink.py prices and places it).

Inside an island, nodes under one switch talk with fewer hops: where NVIDIA Topograph labels the
nodes with their switches (:data:`TOPOGRAPH_LABELS`), an island lists its nodes switch by switch
(:func:`switch_path`), so the blocks the planner cuts from it (a stage, a data-parallel group)
sit under as few leaf switches as the island allows.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from holmes.contract.names import ETHERNET, INFINIBAND, RDMA_KINDS, ROCE

from .discovery import NodeNic
from .nccl import SOCKET_MAX_FLOWS, SOCKET_MAX_THREADS, socket_threads

IB_NET, SOCKET_NET = "IB", "Socket"


@dataclass(frozen=True)
class Island:
    name: str  # "cluster/kind"
    cluster: str
    nic: str
    nodes: tuple[NodeNic, ...]  # switch by switch (switch_path), then by name

    @property
    def gbps(self) -> float:
        return min(n.gbps for n in self.nodes)


@dataclass(frozen=True)
class ClusterLink:
    """The network between one pair of clusters (a WAN between sites, a fast Ethernet between
    halls), per node and per direction."""

    between: tuple[str, ...]  # the two clusters' names (holmes.dev/cluster), in either order
    gbps: float  # per node, each direction
    latency_ms: float  # one way: each pipeline message and each step of a ring waits for it

    def __post_init__(self) -> None:
        if len(self.between) != 2:
            raise ValueError(
                f"ClusterLink.between must name two clusters, got {list(self.between)}: write [east, west]"
            )
        if self.between[0] == self.between[1]:
            raise ValueError(
                f"ClusterLink.between pairs cluster {self.between[0]!r} with itself: a link joins two "
                "different clusters (inside one the nodes' own NICs count)"
            )
        if not (math.isfinite(self.gbps) and self.gbps > 0):
            raise ValueError(f"ClusterLink.gbps must be a finite number > 0, got {self.gbps}")
        if not (math.isfinite(self.latency_ms) and self.latency_ms >= 0):
            raise ValueError(f"ClusterLink.latency_ms must be a finite number >= 0, got {self.latency_ms}")

    @property
    def pair(self) -> frozenset[str]:
        return frozenset(self.between)

    @property
    def name(self) -> str:
        return "-".join(sorted(self.between))

    def describe(self) -> str:
        return f"{self.name} at {self.gbps:g} Gbit/s, {self.latency_ms:g} ms"


@dataclass(frozen=True)
class Fabric:
    """The network constants the topology needs (a slice of CostModelConfig)."""

    net_efficiency: tuple[tuple[str, float], ...] = ((INFINIBAND, 0.9), (ROCE, 0.5))
    socket_efficiency: float = 0.6
    socket_gbps: float = 25.0  # host TCP network of RDMA nodes (per node)
    # the link between two clusters that ``links`` does not list: per node, each direction
    cross_cluster_gbps: float = 25.0
    cross_cluster_latency_ms: float = 0.0  # one way, between clusters (a WAN: tens of ms)
    # one TCP flow of NCCL's socket transport (one socket driven by one thread); NCCL's docs'
    # 4 threads x 4 sockets for a generic 100 Gbit/s network make it 100/16
    socket_flow_gbps: float = 6.25
    plugin_efficiency: float = 0.8  # a vendor net plugin (EFA, TCPX): share of the line rate
    # the links of particular pairs of clusters (each pair at most once); clusters not yet
    # present are allowed (they may join later)
    links: tuple[ClusterLink, ...] = ()

    def __post_init__(self) -> None:
        seen: dict[frozenset[str], int] = {}
        for i, link in enumerate(self.links):
            if link.pair in seen:
                raise ValueError(
                    f"Fabric.links[{i}] lists the pair {link.name} again (Fabric.links[{seen[link.pair]}] "
                    "already does): keep one entry per pair of clusters"
                )
            seen[link.pair] = i

    def rdma_efficiency(self, kind: str) -> float:
        return dict(self.net_efficiency)[kind]

    def link(self, a: str, b: str) -> ClusterLink:
        """The link between clusters ``a`` and ``b``: the one ``links`` lists, else the
        cross-cluster default."""
        pair = frozenset((a, b))
        for link in self.links:
            if link.pair == pair:
                return link
        return ClusterLink((a, b), self.cross_cluster_gbps, self.cross_cluster_latency_ms)

    def describe(self, link: ClusterLink) -> str:
        """The link in words, saying when it is the cross-cluster default (no entry in links)."""
        return link.describe() + ("" if link in self.links else " (crossCluster default)")

    def links_among(self, clusters: Iterable[str]) -> list[ClusterLink]:
        """The link of every pair ``clusters`` form (none within one cluster)."""
        return [self.link(a, b) for a, b in itertools.combinations(sorted(set(clusters)), 2)]

    def slowest_link(self, clusters: Iterable[str]) -> ClusterLink | None:
        """The slowest link among the pairs ``clusters`` form (least bandwidth, then most
        latency): what a group spanning them is bounded by; None within one cluster."""
        return min(self.links_among(clusters), key=lambda k: (k.gbps, -k.latency_ms, k.name), default=None)


# NVIDIA Topograph's switch labels, widest tier first. Which ones a cluster carries depends on
# Topograph's version: block/spine/datacenter (0.1), leaf/spine/core (later 0.x), and from 1.0
# the tiers fabric.topograph.run/tier-N, tier 0 the switch nearest the node.
TOPOGRAPH_LABELS = tuple(
    f"network.topology.nvidia.com/{t}" for t in ("datacenter", "core", "spine", "block", "leaf")
)
_FABRIC_TIER = re.compile(r"^fabric\.topograph\.run/tier-(\d+)$")


def switch_levels(labels: Iterable[Mapping[str, str]]) -> tuple[str, ...]:
    """The Topograph switch label keys any of these nodes' labels carry, widest tier first."""
    keys = {k for ls in labels for k in ls}
    tiers = {int(m[1]): k for k in keys if (m := _FABRIC_TIER.match(k))}
    return (*(k for k in TOPOGRAPH_LABELS if k in keys), *(tiers[t] for t in sorted(tiers, reverse=True)))


def switch_path(nic: NodeNic, levels: Sequence[str]) -> tuple[str, ...]:
    """The node's switches at ``levels`` (widest first; "" where it carries no such label)."""
    return tuple(nic.labels.get(k, "") for k in levels)


def islands_of(nodes: Iterable[NodeNic]) -> list[Island]:
    groups: dict[tuple[str, str], list[NodeNic]] = {}
    for n in nodes:
        groups.setdefault((n.cluster, n.nic), []).append(n)
    levels = switch_levels(n.labels for ns in groups.values() for n in ns)
    return [
        Island(f"{c}/{k}", c, k, tuple(sorted(ns, key=lambda n: (switch_path(n, levels), n.name))))
        for (c, k), ns in sorted(groups.items())
    ]


@dataclass(frozen=True)
class NodeSet:
    """Summary of a set of nodes (a stage, a DP group's nodes) for the cost model."""

    count: int
    kinds: frozenset[str]
    clusters: frozenset[str]
    min_gbps: float
    min_socket_gbps: float  # slowest host-network link among them
    socket_flows_gbps: float = math.inf  # the fewest TCP flows among them x one flow's Gbit/s
    plugins: frozenset[str | None] = frozenset({None})  # the nodes' vendor net plugins
    domains: frozenset[str | None] = frozenset({None})  # the nodes' NVLink domains (None: none)

    @property
    def nvlink_domain(self) -> str | None:
        """The one NVLink domain every node of the set is in, else None."""
        return next(iter(self.domains)) if len(self.domains) == 1 else None

    @property
    def single_island(self) -> bool:
        return len(self.kinds) == 1 and len(self.clusters) == 1

    @property
    def rdma_island(self) -> bool:
        return self.single_island and next(iter(self.kinds)) in RDMA_KINDS

    @property
    def plugin(self) -> str | None:
        """The vendor net plugin of a set inside one island that names one."""
        return next(iter(self.plugins)) if self.single_island and len(self.plugins) == 1 else None

    @property
    def net(self) -> str:
        """NCCL net of a group over these nodes: the island's vendor plugin when it names one
        (an explicit choice wins), else IB iff one RDMA island, else Socket."""
        return self.plugin or (IB_NET if self.rdma_island else SOCKET_NET)

    @property
    def nic(self) -> str:
        """The set's NIC kind, or the slowest kind when mixed (ethernet < roce < infiniband)."""
        for k in (ETHERNET, ROCE, INFINIBAND):
            if k in self.kinds:
                return k
        raise AssertionError("empty node set")

    def island_name(self) -> str:
        if self.single_island:
            return f"{next(iter(self.clusters))}/{next(iter(self.kinds))}"
        return "mixed:" + "+".join(sorted(f"{c}" for c in self.clusters)) + "/" + "+".join(sorted(self.kinds))


def summarize(nodes: Sequence[NodeNic], fabric: Fabric) -> NodeSet:
    # a stage holds hundreds of nodes of a few kinds of link: price each kind once
    links = {(n.nic, n.gbps, n.socket_fixed) for n in nodes}
    return NodeSet(
        count=len(nodes),
        kinds=frozenset({nic for nic, _, _ in links}),
        clusters=frozenset({n.cluster for n in nodes}),
        min_gbps=min(gbps for _, gbps, _ in links),
        min_socket_gbps=min(_socket_gbps(nic, gbps, fabric) for nic, gbps, _ in links),
        socket_flows_gbps=min(_socket_flows(nic, gbps, fixed, fabric) for nic, gbps, fixed in links)
        * fabric.socket_flow_gbps,
        plugins=frozenset({n.net_plugin for n in nodes}),
        domains=frozenset({n.nvlink_domain for n in nodes}),
    )


def merge(a: NodeSet, b: NodeSet) -> NodeSet:
    return NodeSet(
        a.count + b.count,
        a.kinds | b.kinds,
        a.clusters | b.clusters,
        min(a.min_gbps, b.min_gbps),
        min(a.min_socket_gbps, b.min_socket_gbps),
        min(a.socket_flows_gbps, b.socket_flows_gbps),
        a.plugins | b.plugins,
        a.domains | b.domains,
    )


def socket_gbps(n: NodeNic, fabric: Fabric) -> float:
    """A node's TCP bandwidth: its own NICs if Ethernet, else the host network."""
    return _socket_gbps(n.nic, n.gbps, fabric)


def _socket_gbps(nic: str, gbps: float, fabric: Fabric) -> float:
    return gbps if nic == ETHERNET else min(fabric.socket_gbps, gbps)


def socket_flows(n: NodeNic, fabric: Fabric) -> int:
    """TCP flows per connection of the node's Socket groups: what Holmes renders for the
    node's TCP link, or what the job's template fixes, as NCCL clamps it."""
    return _socket_flows(n.nic, n.gbps, n.socket_fixed, fabric)


def _socket_flows(nic: str, gbps: float, fixed: tuple[int | None, int | None], fabric: Fabric) -> int:
    threads, socks = socket_threads(_socket_gbps(nic, gbps, fabric), fabric.socket_flow_gbps)
    fixed_threads, fixed_socks = fixed
    threads = min(SOCKET_MAX_THREADS, threads if fixed_threads is None else fixed_threads)
    socks = socks if fixed_socks is None else fixed_socks
    if threads < 1 or socks < 1:  # NCCL then runs the data on its one control connection
        return 1
    return min(SOCKET_MAX_FLOWS, threads * socks)


def group_bandwidth_gbps(s: NodeSet, fabric: Fabric, net: str | None = None) -> float:
    """Achieved per-node bandwidth of a collective over these nodes on ``net`` (default: the net
    the set would use). RDMA needs one RDMA island; sockets go over the host network, capped by
    the slowest link between its clusters when the set spans clusters."""
    net = net or s.net
    if net == IB_NET:
        if not s.rdma_island:
            raise ValueError("an IB group needs nodes on one RDMA island")
        return s.min_gbps * fabric.rdma_efficiency(next(iter(s.kinds)))
    if net != SOCKET_NET:  # a vendor net plugin, inside its island
        if net != s.plugin:
            raise ValueError(f"a {net} group needs nodes on one island whose job names that plugin")
        return s.min_gbps * fabric.plugin_efficiency
    bw = s.min_socket_gbps
    slowest = fabric.slowest_link(s.clusters)
    if slowest is not None:
        bw = min(bw, slowest.gbps)
    return min(bw * fabric.socket_efficiency, s.socket_flows_gbps)


def link_latency_s(s: NodeSet, fabric: Fabric) -> float:
    """Seconds one message between nodes of ``s`` waits for the links between its clusters (the
    most one-way latency among their pairs; a message fans out over all of them); 0 within one
    cluster, where the bytes dominate."""
    return max((k.latency_ms for k in fabric.links_among(s.clusters)), default=0.0) / 1e3


def boundary_crossings(stage_clusters: Sequence[Iterable[str]], fabric: Fabric) -> list[str]:
    """``boundary 0|1 over east-west at 10 Gbit/s, 20 ms`` for each pipeline boundary whose stages
    sit in different clusters (each stage given by its nodes' clusters)."""
    stages = [sorted(set(c)) for c in stage_clusters]
    out = []
    for s in range(len(stages) - 1):
        links = fabric.links_among(stages[s] + stages[s + 1])
        if links and stages[s] != stages[s + 1]:
            out.append(f"boundary {s}|{s + 1} over " + "; ".join(fabric.describe(k) for k in links))
    return out
