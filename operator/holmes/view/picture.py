"""What a layout picture shows, from a planned Layout or from a running job's status: the
stages in pipeline order with their island, GPU type, layers and nodes, the networks of their
data-parallel groups and of each stage boundary, and the estimate's per-stage times (pure).

A job's status carries no per-boundary network and no per-stage times (the layout ConfigMap's
layout.json does): from a status, a boundary is known only to stay inside an island or to cross
islands (the planner runs a crossing over sockets), and the schedule is not drawn."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from holmes.contract.layout import Layout


class PictureError(ValueError):
    """A status that does not describe a layout; the message names the field."""


CROSSES_ISLANDS = "crosses islands"  # a boundary's net when only the islands are known


@dataclass(frozen=True)
class StageView:
    index: int
    island: str
    nic: str
    gpu: str  # "" when not known
    layers: tuple[int, int]
    nodes: tuple[str, ...]
    dp_net: str


@dataclass(frozen=True)
class Picture:
    title: str
    pipeline: int
    data: int
    tensor: int
    gpus_per_node: int
    stages: tuple[StageView, ...]
    links: tuple[str, ...]  # boundary b (stage b -> b+1): its NCCL net, or CROSSES_ISLANDS / ""
    estimate: Mapping[str, Any]  # the planner's estimate (stage times only from a Layout)
    micro_batches: int  # 0 when not known (no schedule then)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node once, in rank order (a node shared by two stages is listed by both)."""
        return tuple(dict.fromkeys(n for s in self.stages for n in s.nodes))


def from_layout(layout: Layout, title: str = "") -> Picture:
    est = layout.estimate or {}
    gpu = {e.get("stage"): str(e.get("gpu") or "") for e in est.get("stages", []) if isinstance(e, Mapping)}
    p2p = {g.stage: g.net for g in layout.groups if g.kind == "p2p"}
    pp = next((g.net for g in layout.groups if g.kind == "pp"), "")
    stages = tuple(
        StageView(
            s.index,
            s.island,
            s.nic,
            gpu.get(s.index, ""),
            s.layers,
            tuple(s.nodes or layout.stage_nodes(s.index)),
            s.dp_net,
        )
        for s in layout.stages
    )
    links = tuple(p2p.get(b, pp) for b in range(layout.pipeline - 1))  # version 1: the pp groups' net
    return Picture(
        title,
        layout.pipeline,
        layout.data,
        layout.tensor,
        layout.gpus_per_node,
        stages,
        links,
        est,
        layout.micro_batches,
    )


def _int(m: Mapping[str, Any], key: str, where: str) -> int:
    v = m.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise PictureError(f"{where}.{key}: expected a positive integer, got {v!r}")
    return v


def from_status(job: Mapping[str, Any]) -> Picture:
    """The picture of a HolmesJob's status.layout (``kubectl get hj NAME -o yaml``)."""
    meta = job.get("metadata") or {}
    layout = (job.get("status") or {}).get("layout")
    name = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
    if not isinstance(layout, Mapping) or not layout.get("stages"):
        raise PictureError(
            f"HolmesJob {name}: status.layout has no stages yet (the job is not placed): "
            "draw it once it is Running, or plan it with holmes plan --svg"
        )
    gpus = ((job.get("spec") or {}).get("nodes") or {}).get("gpusPerNode")
    dp_net = {g.get("stage"): str(g.get("net") or "") for g in layout.get("dpGroups") or []}
    stages = []
    for i, s in enumerate(layout["stages"]):
        where = f"status.layout.stages[{i}]"
        span = s.get("layers")
        if not (isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) for x in span)):
            raise PictureError(f"{where}.layers: expected [start, end), got {span!r}")
        nodes = s.get("nodes")
        if not isinstance(nodes, list) or not nodes:
            raise PictureError(f"{where}.nodes: expected the stage's node names, got {nodes!r}")
        stages.append(
            StageView(
                int(s.get("index", i)),
                str(s.get("island") or "?"),
                str(s.get("nic") or "?"),
                str(s.get("gpu") or ""),
                (span[0], span[1]),
                tuple(str(n) for n in nodes),
                dp_net.get(s.get("index", i), ""),
            )
        )
    links = tuple("" if a.island == b.island else CROSSES_ISLANDS for a, b in zip(stages, stages[1:]))
    return Picture(
        f"HolmesJob {name} (from its status)",
        _int(layout, "pipeline", "status.layout"),
        _int(layout, "data", "status.layout"),
        _int(layout, "tensor", "status.layout"),
        gpus
        if isinstance(gpus, int) and gpus > 0
        else _int(layout, "worldSize", "status.layout") // max(1, _int(layout, "nodes", "status.layout")),
        tuple(stages),
        links,
        dict(layout.get("estimate") or {}),
        0,
    )
