"""What the layout search (planner.py) weighs: the degrees it tries and one costed placement, a
``Candidate``. Data only, so the search, the explanation (explain.py) and the estimate of a
fixed layout (estimate.py) all read it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass

from .costmodel import StageCost, StageEstimate
from .discovery import NodeNic
from .gpus import StageGpu
from .topology import NodeSet


@dataclass(frozen=True)
class Degrees:
    tensor: int
    pipeline: int
    data: int
    micro_batches: int
    expert: int = 1  # expert-parallel degree (a mixture of experts), divides data

    def describe(self) -> str:
        """``tensor 8 x pipeline 9 x data 2`` (``x expert E`` for a mixture of experts)."""
        return f"tensor {self.tensor} x pipeline {self.pipeline} x data {self.data}" + (
            f" x expert {self.expert}" if self.expert > 1 else ""
        )


@dataclass
class Candidate:
    seconds: float
    degrees: Degrees
    nodes: tuple[NodeNic, ...]  # node rank order
    stage_sets: list[NodeSet]
    stage_nodes: list[tuple[NodeNic, ...]]
    layers: tuple[int, ...]
    stages: list[StageEstimate]
    pp_net: str
    emb_net: str | None
    costs: list[StageCost]
    world_net: str  # the world group's net (control-plane collectives)
    p2p_nets: tuple[str, ...]  # per stage boundary
    gpus: tuple[StageGpu, ...] = ()  # per stage: what its compute and memory are priced with
    wrap_p2p: float = 0.0  # seconds per micro-batch on the last -> first stage link (looped schedules)
    wrap_net: str = "Socket"  # that link's p2p group's net

    def key(self, order_index: int) -> tuple[float, int, int, int, int]:
        d = self.degrees
        return (round(self.seconds, 9), d.pipeline, d.tensor, d.expert, order_index)
