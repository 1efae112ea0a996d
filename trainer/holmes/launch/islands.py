"""Which NCCL network a process group gets, from the Layout JSON alone (pure, standard library).

One rule, the planner's: a group whose members all sit on one RDMA island (one cluster, one NIC
kind: InfiniBand or RoCE) uses ``IB``; any other group uses ``Socket``; a group whose members all
sit on one node gets none (:meth:`Islands.pinned`): NCCL runs it over NVLink or shared memory.
A node's island is the island of the stage it hosts (a stage inside one island names it, e.g.
``east/infiniband``); a node of a mixed stage (``mixed:...``: nodes of several islands) is known
only to be on sockets, so any group holding it uses ``Socket``, as the Layout's own groups of
that stage do.

This reads the Layout's documented JSON fields directly instead of importing
``holmes.contract``: it runs inside the user's image, where only this package is copied.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

IB, SOCKET = "IB", "Socket"
RDMA_KINDS = ("infiniband", "roce")
MIXED_PREFIX = "mixed:"


@dataclass(frozen=True)
class Islands:
    gpus_per_node: int
    world_size: int
    node_island: tuple[str | None, ...]  # per node rank: its RDMA island, None when not on one

    @classmethod
    def from_layout(cls, layout: Mapping[str, Any]) -> Islands:
        G, nodes = int(layout["gpusPerNode"]), list(layout["nodes"])
        per_stage = int(layout["data"]) * int(layout["tensor"])
        stages = list(layout["stages"])
        rdma = [
            s["island"] if s["nic"] in RDMA_KINDS and not s["island"].startswith(MIXED_PREFIX) else None
            for s in stages
        ]
        node_island: list[str | None] = []
        for i in range(len(nodes)):
            hosted = {r // per_stage for r in range(i * G, (i + 1) * G)}
            isl = {rdma[s] for s in hosted}
            node_island.append(isl.pop() if len(isl) == 1 else None)
        return cls(G, len(nodes) * G, tuple(node_island))

    @classmethod
    def read(cls, path: str) -> Islands:
        with open(path) as f:
            return cls.from_layout(json.load(f))

    def net(self, ranks: Iterable[int]) -> str:
        """IB iff every rank's node is on one and the same RDMA island."""
        ranks = list(ranks)
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"ranks {bad} are outside the Layout's world of {self.world_size} ranks")
        found = {self.node_island[r // self.gpus_per_node] for r in ranks}
        return IB if len(found) == 1 and None not in found else SOCKET

    def nodes(self, ranks: Iterable[int]) -> set[int]:
        """The node ranks hosting ``ranks``."""
        return {r // self.gpus_per_node for r in ranks}

    def pinned(self, ranks: Iterable[int]) -> str | None:
        """The net to pin a group to: :meth:`net` when it spans nodes, None inside one node
        (NVLink-only tensor parallelism needs no HCA, and a pinned IB would make it fail
        whenever the pod's IB is unusable)."""
        ranks = list(ranks)
        net = self.net(ranks)  # validates the ranks
        return net if len(self.nodes(ranks)) > 1 else None

    def nets_in_use(self) -> set[str]:
        """The nets the Layout's multi-node groups can need: IB when an RDMA island has two
        nodes or more, Socket when two nodes are not on one island."""
        out: set[str] = set()
        islands = [i for i in self.node_island if i is not None]
        if any(islands.count(i) > 1 for i in set(islands)):
            out.add(IB)
        if len(self.node_island) > 1 and (None in self.node_island or len(set(islands)) > 1):
            out.add(SOCKET)
        return out
