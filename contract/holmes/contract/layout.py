"""The Layout contract: what the planner decides, the operator stores in a ConfigMap and
the trainer executes. JSON with camelCase keys, versioned; pure Python, no third-party import.

The JSON stays O(nodes + stages) so it fits a ConfigMap (1 MiB) at thousands of nodes:
per-rank facts and the member ranks of every process group are *derived* by the rules
below, never listed.

Rank numbering (G = gpusPerNode, T = tensor, D = data, P = pipeline, W = P*D*T = nodes*G):
- ``nodes[i]`` is node rank i and hosts global ranks ``[i*G, (i+1)*G)``; local rank is
  ``rank % G`` -- exactly torchrun's numbering, so the launcher needs no rank remapping.
- Stage s owns the contiguous block ``[s*D*T, (s+1)*D*T)``. Inside it the tensor index is
  innermost: ``tp = r % T``, ``dp = (r - s*D*T) // T`` (Megatron's order, pipeline outermost).
  The planner chooses the *order of nodes*; that is how it puts a stage on one NIC island.

Process groups (``groups`` in JSON holds one *family* per kind and stage; expand with
:meth:`Layout.process_groups`):
- ``dp`` of stage s: for each tp index t, ranks ``s*D*T + t + k*T`` for k < D.
- ``tp`` of stage s: for each dp index d, ranks ``s*D*T + d*T + t`` for t < T.
- ``pp``: for each j < D*T, ranks ``s*D*T + j`` for s < P (one group spans all stages): the
  pipeline's bookkeeping (stage numbering); its traffic goes over the ``p2p`` groups.
- ``p2p`` of boundary b (between stages b and b+1, version 2): for each j < D*T, the ranks
  ``(b*D*T + j, (b+1)*D*T + j)``: one group per stage boundary, so a boundary inside one RDMA
  island uses IB even when another boundary crosses islands on sockets.
- ``embedding``: first and last stage ranks of each pp group (tied embeddings, P > 1).
- ``ep`` of stage s (a mixture of experts, ``expert`` E > 1, E divides D): the ranks that split
  a layer's experts and all-to-all their tokens, Megatron's order ``tp-cp-ep-dp-pp``: for each
  expert-data index k < D/E and tp index t, ranks ``s*D*T + t + e*T + k*E*T`` for e < E, so a
  group is E x T consecutive ranks of one stage (one node when E x T <= gpusPerNode).

``net`` is the NCCL network of a group: ``IB`` (InfiniBand and RoCE) or ``Socket``, or inside
an island whose job names a vendor net plugin (``spec.islands[].netPlugin``) that plugin's NCCL
net name (e.g. ``AWS Libfabric``), passed to NCCL as the group's ``net_name`` like the others.
``worldNet`` (version 2) is the network of the world group, which carries the control-plane
collectives (loss and grad-norm reduction, the resume decision, checkpoint coordination): IB
only when every rank is on one RDMA island, else Socket, so one communicator never mixes ranks
that would pick different transports. Version 1 documents (no ``worldNet``, no ``p2p``) are
still read: their world is Socket and their pipeline traffic stays on the ``pp`` groups.

Virtual stages (version 3, written only when ``pipelineSchedule`` runs more than one stage per
rank): each stage lists its ``chunks``, the layer ranges of its virtual stages in chunk order,
placed by the schedule (pipeline_schedules.owner: looped or V-shaped), so every chunk of a rank
stays on that rank's island; ``layers`` is then the span of its chunks. A looped schedule adds
the p2p family of boundary P-1: the wrap-around link from the last stage's ranks to the
first's, ranks ``((P-1)*D*T + j, j)``. Documents without virtual stages stay version 2.

Tensor groups across nodes (version 4, written only when ``tensor`` > ``gpusPerNode``): on
rack-scale NVLink (GB200/GB300 NVL72) a tensor group may span ``tensor / gpusPerNode``
consecutive nodes, and only nodes of one NVLink domain (GPU Feature Discovery's
``nvidia.com/gpu.clique``). ``nvlinkDomains`` maps each domain to the layout's nodes in it, so
every consumer checks the rule without the cluster (an older reader refuses the version rather
than running a tensor group over a NIC). Version 4 may hold virtual stages too (``chunks``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import pipeline_schedules as sched
from .names import NIC_KINDS

LAYOUT_VERSION = 2
VIRTUAL_VERSION = 3  # the version of a layout with virtual stages (chunks)
NVLINK_VERSION = 4  # the version of a layout whose tensor groups span nodes of an NVLink domain
READABLE_VERSIONS = (1, 2, 3, 4)
NETS = ("IB", "Socket")


def is_net(name: object) -> bool:
    """IB, Socket, or a vendor net plugin's name (a non-empty string without outer spaces)."""
    return name in NETS or (isinstance(name, str) and bool(name) and name == name.strip())


_NET_HINT = "IB, Socket or a vendor net plugin's name"
GROUP_KINDS = ("dp", "tp", "pp", "p2p", "embedding", "ep")


class LayoutError(ValueError):
    """A Layout document that breaks the contract; the message says which field and why."""


@dataclass(frozen=True)
class Stage:
    index: int
    layers: tuple[int, int]  # half-open [start, end) of transformer layers
    island: str  # cluster label x NIC kind, e.g. "east/infiniband"
    nic: str  # infiniband | roce | ethernet (the stage's nodes' kind, or the slowest when mixed)
    dp_net: str  # NCCL net of this stage's DP groups
    nodes: tuple[str, ...] = ()  # node names hosting this stage's ranks (derived, for humans)
    # the layer ranges of this stage's virtual stages, in chunk order (version 3); () = one: layers
    chunks: tuple[tuple[int, int], ...] = ()

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """The layer ranges this stage holds, one per virtual stage (chunk order)."""
        return self.chunks or (self.layers,)

    @property
    def num_layers(self) -> int:
        return sum(b - a for a, b in self.ranges)


@dataclass(frozen=True)
class GroupFamily:
    kind: str  # dp | tp | pp | p2p | embedding | ep
    net: str  # IB | Socket
    stage: int | None = None  # dp/tp/ep: the stage; p2p: the boundary after this stage; pp/embedding: None

    def at(self) -> int:
        """The stage of a dp, tp or p2p family (validate() makes sure they have one)."""
        if self.stage is None:
            raise LayoutError(f"group {self.kind} needs a stage")
        return self.stage


@dataclass(frozen=True)
class ProcessGroup:
    kind: str
    ranks: tuple[int, ...]
    net: str
    stage: int | None = None


@dataclass(frozen=True)
class RankInfo:
    rank: int
    node: str
    node_rank: int
    local_rank: int
    stage: int
    dp_index: int
    tp_index: int


@dataclass(frozen=True)
class Layout:
    tensor: int
    pipeline: int
    data: int
    gpus_per_node: int
    nodes: tuple[str, ...]
    stages: tuple[Stage, ...]
    groups: tuple[GroupFamily, ...]
    micro_batch_size: int
    micro_batches: int  # per iteration, per DP rank (1F1B depth)
    estimate: dict[str, Any] = field(default_factory=dict)
    explanation: tuple[str, ...] = ()
    version: int = LAYOUT_VERSION
    world_net: str = "Socket"  # the world group's network (control-plane collectives)
    expert: int = 1  # expert-parallel degree (a mixture of experts); JSON "expert" when > 1
    schedule: str = "1F1B"  # the pipeline schedule the chunks are placed for (JSON pipelineSchedule)
    # version 4: each NVLink domain (nvidia.com/gpu.clique) and the layout's nodes in it
    nvlink_domains: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        validate(self)

    @property
    def tensor_spans_nodes(self) -> bool:
        """Tensor groups reach over ``tensor / gpusPerNode`` nodes of one NVLink domain."""
        return self.tensor > self.gpus_per_node

    def nvlink_domain(self, node: str) -> str | None:
        """The NVLink domain a node of the layout is in (None: not listed)."""
        return next((d for d, ns in self.nvlink_domains if node in ns), None)

    # ---- derived facts -------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.pipeline * self.data * self.tensor

    @property
    def num_layers(self) -> int:
        return max(b for s in self.stages for _, b in s.ranges)

    @property
    def virtual_stages(self) -> int:
        """Virtual stages per rank (v): 1 unless the schedule interleaves."""
        return len(self.stages[0].ranges)

    def virtual_layers(self) -> list[tuple[int, int]]:
        """The layer range of each virtual stage, in pipeline order."""
        owners = (
            sched.owner(self.schedule, self.pipeline, k) for k in range(self.pipeline * self.virtual_stages)
        )
        return [self.stages[st].ranges[c] for st, c in owners]

    @property
    def embedding_split(self) -> bool:
        """The first and last virtual stage sit on different ranks (a tied embedding is summed)."""
        if self.pipeline == 1:
            return False
        last = sched.owner(self.schedule, self.pipeline, self.pipeline * self.virtual_stages - 1)[0]
        return last != 0

    @property
    def ranks_per_stage(self) -> int:
        return self.data * self.tensor

    def rank_info(self, rank: int) -> RankInfo:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} outside world of size {self.world_size}")
        node_rank, local = divmod(rank, self.gpus_per_node)
        stage, within = divmod(rank, self.ranks_per_stage)
        dp, tp = divmod(within, self.tensor)
        return RankInfo(rank, self.nodes[node_rank], node_rank, local, stage, dp, tp)

    def stage_ranks(self, stage: int) -> range:
        n = self.ranks_per_stage
        return range(stage * n, (stage + 1) * n)

    def stage_nodes(self, stage: int) -> tuple[str, ...]:
        r = self.stage_ranks(stage)
        first, last = r.start // self.gpus_per_node, (r.stop - 1) // self.gpus_per_node
        return self.nodes[first : last + 1]

    def process_groups(self, kind: str | None = None) -> Iterator[ProcessGroup]:
        """Every process group of the layout, in a fixed order all ranks agree on."""
        T, D, P, n = self.tensor, self.data, self.pipeline, self.ranks_per_stage
        for fam in self.groups:
            if kind is not None and fam.kind != kind:
                continue
            if fam.kind == "dp":
                base = fam.at() * n
                for t in range(T):
                    yield ProcessGroup("dp", tuple(range(base + t, base + n, T)), fam.net, fam.stage)
            elif fam.kind == "tp":
                base = fam.at() * n
                for d in range(D):
                    yield ProcessGroup(
                        "tp", tuple(range(base + d * T, base + (d + 1) * T)), fam.net, fam.stage
                    )
            elif fam.kind == "pp":
                for j in range(n):
                    yield ProcessGroup("pp", tuple(j + s * n for s in range(P)), fam.net)
            elif fam.kind == "p2p":
                for j in range(n):  # boundary P-1: the wrap-around link (looped virtual stages)
                    pair = (fam.at() * n + j, (fam.at() + 1) % P * n + j)
                    yield ProcessGroup("p2p", pair, fam.net, fam.stage)
            elif fam.kind == "embedding":
                last = sched.owner(self.schedule, P, P * self.virtual_stages - 1)[0]
                for j in range(n):
                    yield ProcessGroup("embedding", (j, j + last * n), fam.net)
            elif fam.kind == "ep":
                base, E = fam.at() * n, self.expert
                for k in range(D // E):
                    for t in range(T):
                        ranks = tuple(base + t + e * T + k * E * T for e in range(E))
                        yield ProcessGroup("ep", ranks, fam.net, fam.stage)

    def groups_of(self, rank: int) -> dict[str, ProcessGroup]:
        """The groups this rank belongs to, by kind (p2p: see :meth:`p2p_groups_of`)."""
        return {g.kind: g for g in self.process_groups() if rank in g.ranks and g.kind != "p2p"}

    def p2p_groups_of(self, rank: int) -> dict[int, ProcessGroup]:
        """This rank's stage-boundary groups by boundary (up to two: before and after its stage)."""
        return {g.stage: g for g in self.process_groups("p2p") if rank in g.ranks and g.stage is not None}

    # ---- JSON ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        virtual = self.version == VIRTUAL_VERSION or self.virtual_stages > 1
        return {
            "version": self.version,
            "worldSize": self.world_size,
            "worldNet": self.world_net,
            "tensor": self.tensor,
            "pipeline": self.pipeline,
            "data": self.data,
            "gpusPerNode": self.gpus_per_node,
            "microBatchSize": self.micro_batch_size,
            "microBatches": self.micro_batches,
            **({"expert": self.expert} if self.expert > 1 else {}),
            **({"pipelineSchedule": self.schedule} if virtual or self.version == NVLINK_VERSION else {}),
            "nodes": list(self.nodes),
            "stages": [
                {
                    "index": s.index,
                    "layers": list(s.layers),
                    "island": s.island,
                    "nic": s.nic,
                    "dpNet": s.dp_net,
                    "nodes": list(s.nodes or self.stage_nodes(s.index)),
                    **({"chunks": [list(c) for c in s.ranges]} if virtual else {}),
                }
                for s in self.stages
            ],
            "groups": [
                {"kind": g.kind, "net": g.net, **({"stage": g.stage} if g.stage is not None else {})}
                for g in self.groups
            ],
            **(
                {"nvlinkDomains": {d: list(ns) for d, ns in self.nvlink_domains}}
                if self.nvlink_domains
                else {}
            ),
            "estimate": self.estimate,
            "explanation": list(self.explanation),
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Layout:
        if not isinstance(d, dict):
            raise LayoutError("layout must be a JSON object")
        version = d.get("version")
        if version not in READABLE_VERSIONS:
            raise LayoutError(
                f"layout version {version!r} is not supported (this build reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}): plan the job again with this Holmes"
            )
        try:
            stages = tuple(
                Stage(
                    index=int(s["index"]),
                    layers=(int(s["layers"][0]), int(s["layers"][1])),
                    island=str(s["island"]),
                    nic=str(s["nic"]),
                    dp_net=str(s["dpNet"]),
                    nodes=tuple(s.get("nodes", ())),
                    chunks=tuple((int(c[0]), int(c[1])) for c in s.get("chunks", ())),
                )
                for s in d["stages"]
            )
            groups = tuple(
                GroupFamily(kind=g["kind"], net=g["net"], stage=g.get("stage")) for g in d["groups"]
            )
            layout = cls(
                tensor=int(d["tensor"]),
                pipeline=int(d["pipeline"]),
                data=int(d["data"]),
                gpus_per_node=int(d["gpusPerNode"]),
                nodes=tuple(d["nodes"]),
                stages=stages,
                groups=groups,
                micro_batch_size=int(d["microBatchSize"]),
                micro_batches=int(d["microBatches"]),
                estimate=dict(d.get("estimate", {})),
                explanation=tuple(d.get("explanation", ())),
                version=version,
                world_net=str(d["worldNet"]) if version >= 2 else "Socket",
                expert=int(d.get("expert", 1)),
                schedule=str(d.get("pipelineSchedule", "1F1B")),
                nvlink_domains=tuple(
                    (str(k), tuple(str(n) for n in v)) for k, v in dict(d.get("nvlinkDomains") or {}).items()
                ),
            )
        except KeyError as e:
            raise LayoutError(f"layout is missing the field {e.args[0]!r}") from None
        except (TypeError, ValueError, IndexError) as e:
            if isinstance(e, LayoutError):
                raise
            raise LayoutError(f"layout has a malformed field: {e}") from None
        if "worldSize" in d and int(d["worldSize"]) != layout.world_size:
            raise LayoutError(f"worldSize {d['worldSize']} != pipeline*data*tensor = {layout.world_size}")
        return layout

    @classmethod
    def from_json(cls, text: str) -> Layout:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise LayoutError(f"layout is not valid JSON: {e}") from None


def validate(layout: Layout) -> None:
    """Check the invariants every consumer relies on; raise LayoutError naming the broken one."""
    T, D, P, G = layout.tensor, layout.data, layout.pipeline, layout.gpus_per_node
    for name, v in (
        ("tensor", T),
        ("data", D),
        ("pipeline", P),
        ("gpusPerNode", G),
        ("microBatchSize", layout.micro_batch_size),
        ("microBatches", layout.micro_batches),
    ):
        if v < 1:
            raise LayoutError(f"{name} must be >= 1, got {v}")
    if G % T and T % G:
        raise LayoutError(
            f"tensor {T} must divide gpusPerNode {G}, or be a multiple of it whose groups span the "
            "nodes of one NVLink domain"
        )
    if layout.expert < 1 or D % layout.expert:
        raise LayoutError(f"expert {layout.expert} must be >= 1 and divide data {D}")
    if len(layout.nodes) * G != P * D * T:
        raise LayoutError(
            f"{len(layout.nodes)} nodes x {G} GPUs = {len(layout.nodes) * G} ranks, "
            f"but pipeline*data*tensor = {P}*{D}*{T} = {P * D * T}"
        )
    if len(set(layout.nodes)) != len(layout.nodes):
        raise LayoutError("a node appears twice in nodes: every GPU is used at most once")
    if len(layout.stages) != P:
        raise LayoutError(f"{len(layout.stages)} stages listed for pipeline={P}")
    _validate_virtual(layout)
    _validate_nvlink(layout)
    for i, s in enumerate(layout.stages):
        if s.index != i:
            raise LayoutError(f"stage {i} has index {s.index}: stages must be listed in pipeline order")
        if s.nic not in NIC_KINDS:
            raise LayoutError(f"stage {i} nic {s.nic!r} is not one of {', '.join(NIC_KINDS)}")
        if not is_net(s.dp_net):
            raise LayoutError(f"stage {i} dpNet {s.dp_net!r} is not {_NET_HINT}")
    if not is_net(layout.world_net):
        raise LayoutError(f"worldNet {layout.world_net!r} is not {_NET_HINT}")
    if layout.version < 2 and any(g.kind == "p2p" for g in layout.groups):
        raise LayoutError("group kind p2p needs layout version 2")
    for g in layout.groups:
        if g.kind not in GROUP_KINDS:
            raise LayoutError(f"group kind {g.kind!r} is not one of {', '.join(GROUP_KINDS)}")
        if not is_net(g.net):
            raise LayoutError(f"group {g.kind} net {g.net!r} is not {_NET_HINT}")
        if g.kind == "ep" and layout.expert == 1:
            raise LayoutError("group ep needs expert > 1 (a mixture of experts split over ranks)")
        if g.kind in ("dp", "tp", "ep") and (g.stage is None or not 0 <= g.stage < P):
            raise LayoutError(f"group {g.kind} needs a stage in [0, {P}), got {g.stage!r}")
        links = P if sched.needs_wrap_link(layout.schedule, P, layout.virtual_stages) else P - 1
        if g.kind == "p2p" and (g.stage is None or not 0 <= g.stage < links):
            raise LayoutError(f"group p2p needs a boundary stage in [0, {links}), got {g.stage!r}")
        if g.kind == "embedding" and not layout.embedding_split:
            raise LayoutError(
                "group embedding needs the first and last stage on different ranks (pipeline > 1, "
                "not V-shaped): on the same ranks the tied embedding is one tensor"
            )
    if layout.version >= 2:
        boundaries = sorted(g.at() for g in layout.groups if g.kind == "p2p")
        wrap = sched.needs_wrap_link(layout.schedule, P, layout.virtual_stages)
        want = list(range(P if wrap else P - 1))
        if boundaries != want:
            raise LayoutError(
                f"a version-{layout.version} layout needs one p2p group family per stage boundary "
                f"0..{want[-1] if want else -1}"
                + (" (P-1: the wrap-around link of looped virtual stages)" if wrap else "")
                + f", got boundaries {boundaries}"
            )


def _validate_virtual(layout: Layout) -> None:
    """Schedule, chunks and layers: every virtual stage in pipeline order holds the next
    non-empty run of layers, and each stage's span covers its chunks."""
    P = layout.pipeline
    if layout.schedule not in sched.SCHEDULES:
        raise LayoutError(
            f"pipelineSchedule {layout.schedule!r} is not one of {', '.join(sched.SCHEDULE_NAMES)}"
        )
    counts = {len(s.ranges) for s in layout.stages}
    if len(counts) != 1:
        raise LayoutError(f"every stage must hold the same number of chunks, got {sorted(counts)}")
    v = counts.pop()
    choices = sched.virtual_choices(layout.schedule)
    if v not in choices:
        raise LayoutError(
            f"pipelineSchedule {layout.schedule} runs {' or '.join(map(str, choices))} "
            f"virtual stages per rank, but the stages list {v} chunks"
        )
    single = sched.kind(layout.schedule).placement == sched.SINGLE
    if layout.version == VIRTUAL_VERSION and single or layout.version < VIRTUAL_VERSION and v > 1:
        raise LayoutError(
            f"virtual stages (chunks, pipelineSchedule) need layout version {VIRTUAL_VERSION}, and "
            f"version {VIRTUAL_VERSION} is only for them: got version {layout.version} with "
            f"{layout.schedule} and {v} chunk(s) per stage"
        )
    if layout.version < VIRTUAL_VERSION and layout.schedule != "1F1B":
        raise LayoutError(
            f"a version-{layout.version} layout is planned for 1F1B, got pipelineSchedule {layout.schedule}"
        )
    start = 0
    for k, (a, b) in enumerate(layout.virtual_layers()):
        if a != start or b <= a:
            st, c = sched.owner(layout.schedule, P, k)
            raise LayoutError(
                f"virtual stage {k} (stage {st} chunk {c}) layers {[a, b]} must start at {start} "
                "and hold at least one layer"
            )
        start = b
    for i, s in enumerate(layout.stages):
        if s.chunks and s.layers != (min(a for a, _ in s.chunks), max(b for _, b in s.chunks)):
            raise LayoutError(f"stage {i} layers {list(s.layers)} must be the span of its chunks")


def _validate_nvlink(layout: Layout) -> None:
    """Version 4 iff tensor groups span nodes, and then each group's nodes in one listed domain."""
    spans = layout.tensor_spans_nodes
    if spans != (layout.version == NVLINK_VERSION):
        raise LayoutError(
            f"tensor groups across nodes (tensor {layout.tensor} > gpusPerNode {layout.gpus_per_node}) "
            f"need layout version {NVLINK_VERSION}, and version {NVLINK_VERSION} is only for them: got "
            f"version {layout.version}"
        )
    if not spans:
        if layout.nvlink_domains:
            raise LayoutError(f"nvlinkDomains belongs to a version-{NVLINK_VERSION} layout only")
        return
    seen: dict[str, str] = {}
    for d, ns in layout.nvlink_domains:
        for n in ns:
            if n not in layout.nodes or n in seen:
                raise LayoutError(
                    f"nvlinkDomains[{d!r}] lists node {n!r}, which is "
                    + ("not in nodes" if n not in layout.nodes else f"in domain {seen[n]!r} already")
                )
            seen[n] = d
    span = layout.tensor // layout.gpus_per_node
    for first in range(0, len(layout.nodes), span):
        group = layout.nodes[first : first + span]
        domains = {seen.get(n) for n in group}
        if len(domains) != 1 or None in domains:
            raise LayoutError(
                f"the tensor group on nodes {', '.join(group)} spans "
                + (
                    "nodes in no NVLink domain"
                    if None in domains
                    else f"NVLink domains {sorted(map(str, domains))}"
                )
                + ": a tensor group wider than a node must lie on nodes of one domain (nvlinkDomains)"
            )


def layout_signature(layout: Layout) -> dict[str, Any]:
    """What two worlds must share to pair their optimizer state rank by rank: the shape, each
    stage's layers, the micro-batching and, with virtual stages, the schedule and each chunk's
    layers (the spans alone may coincide). The trainer checks it on resume (a checkpoint's
    meta) and when replicas meet (outer.join); the operator refuses replicas whose layouts
    differ in it (operator.core.replicas)."""
    return {
        "pipeline": layout.pipeline,
        "data": layout.data,
        "tensor": layout.tensor,
        "stageLayers": [list(s.layers) for s in layout.stages],
        "microBatchSize": layout.micro_batch_size,
        "microBatches": layout.micro_batches,
        **(
            {
                "pipelineSchedule": layout.schedule,
                "chunks": [[list(c) for c in s.chunks] for s in layout.stages],
            }
            if layout.virtual_stages > 1
            else {}
        ),
    }
