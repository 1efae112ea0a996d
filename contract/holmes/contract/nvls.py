"""NVLink SHARP (NVLS) per rank: on only where it pays, and what it costs in GPU memory.

NVLS (NCCL's NVLS/NVLSTree algorithms, Hopper and later on NVSwitch nodes) offloads reductions
to the switch: it speeds up all-reduce, reduce-scatter and all-gather among GPUs of one node.
Its price is memory, which this module models from NCCL 2.30's source (``transport/nvls.cc``):

- ``ncclNvlsBufferSetup`` allocates, per communicator and GPU, ``nvlsChannels x 2 x
  NCCL_NVLS_CHUNKSIZE x NCCL_STEPS x nHeads`` bytes (16 channels on Hopper, 24 on a single
  Blackwell node, 32 across nodes: ``ncclNvlsTuning``; chunk 128 KiB; ``NCCL_STEPS`` 8,
  ``include/device.h``; ``nHeads`` the communicator's GPUs on the node, ``graph/search.cc``),
  so 32 MiB per local GPU on Hopper: 256 MiB for a communicator of 8 GPUs of a node (older
  NCCLs' 4 MiB steps made that a gigabyte, NCCL issue 864);
- it does so lazily: with runtime connection (``NCCL_RUNTIME_CONNECT``, on by default,
  ``init.cc``) only when a collective first picks the NVLS algorithm (``group.cc``), so a
  communicator that never reduces large messages (the world group's barriers, a p2p pair:
  ``nvlsCanConnect`` refuses p2p) allocates nothing. The estimate counts the groups that run
  the bandwidth-bound collectives: tp, dp and the tied embedding's.

The multicast granularity the driver rounds the buffer to is not known before the GPU runs
(unproven on CPU). NCCL has no per-communicator switch (torch 2.13's
``ProcessGroupNCCL.Options.config`` exposes blocking, CTA and CGA limits and net_name, NCCL's
ncclConfig_t only ``nvlsCTAs``): ``NCCL_NVLS_ENABLE`` is read once per process. So the choice is
per rank, from its groups:

- a group **pays** when it is a tensor- or data-parallel group entirely inside one node with at
  least :data:`MIN_RANKS` GPUs (the bandwidth-bound collectives NVLS accelerates);
- a rank turns NVLS on when one of its groups pays, and then every communicator it holds that
  **reduces** large messages with two or more GPUs on a node costs :func:`communicator_bytes`;
  otherwise NVLS is off and costs nothing.

"On" is written ``NCCL_NVLS_ENABLE=2`` (NCCL's own default), never 1: with 1 NCCL skips its
multicast-support check (``ncclNvlsInit``) and every communicator of two or more GPUs on the
node fails at init where multicast does not work (Fabric Manager down, a VM, a driver
mismatch); with 2 NCCL checks ``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`` and falls back to
its other algorithms quietly.

A pod runs one node's ranks and its environment reaches all of them, so the switch is set per
node (:func:`decide`): on when every stage with ranks on the node turns it on. Stages share a
node only when a stage has fewer ranks than the node has GPUs; where they disagree the node
goes off (the conservative side: off never spends memory the estimate did not count), and a
stage counts NVLS's memory only when one of its nodes runs with it. The variable is always
set, "0" as well as "2": NCCL's default turns NVLS on wherever the hardware has it, which
would spend memory the estimate counted as zero (NeMo sets 0 for the same reason).

The groups are those the planner's memory model counts per GPU (world, dp, tp, the p2p group of
each boundary the stage sits on, the tied embedding's). Pure Python: the planner
(holmes.plan.costmodel) and the trainer's dry run both count with it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .layout import Layout

ENV = "NCCL_NVLS_ENABLE"

ON = "2"  # NCCL checks multicast support and falls back quietly; never "1" (module docstring)
OFF = "0"
# NCCL 2.30, transport/nvls.cc (ncclNvlsTuning, ncclNvlsBufferSetup): the buffers per local GPU
# of a communicator are channels x 2 (reduce, broadcast) x chunk x NCCL_STEPS
NVLS_CHUNK = 128 * 2**10  # NCCL_NVLS_CHUNKSIZE's default
NCCL_STEPS = 8  # include/device.h
CHANNELS_HOPPER = 16  # NVLS_NCHANNELS_SM90
CHANNELS_BLACKWELL_NODE = 24  # NVLS_NCHANNELS_SM100_NVL: a communicator inside one node
CHANNELS_BLACKWELL_NODES = 32  # NVLS_NCHANNELS_SM100: across nodes
BLACKWELL = ("B100", "B200", "GB200")
REDUCING = ("tp", "dp", "embedding")  # groups whose large collectives NCCL may run on NVLS
MIN_RANKS = 4  # GPUs of one node in a group for NVLS to pay
# GPU families whose SXM boards sit on NVSwitch with multicast (NVLS): Hopper and Blackwell
NVSWITCH_FAMILIES = ("H100", "H200", "H800", "H20", "GH200", "B100", "B200", "GB200")
_NOT_NVSWITCH = ("PCIE", "NVL")  # PCIe cards and the two-GPU NVL bridge have no NVSwitch


def nvswitch_gpu(name: str | None, gpus_per_node: int) -> bool:
    """Whether a node of ``gpus_per_node`` GPUs named ``name`` (a GPU product or the planner's
    short name) has NVLS: an NVSwitch board (4 or 8 SXM GPUs) of a Hopper or later family."""
    if not name or gpus_per_node < 4:
        return False
    return all(_nvswitch_product(part) for part in name.split("+"))  # a mixed stage: every type


def _nvswitch_product(name: str) -> bool:
    words = re.split(r"[^A-Z0-9]+", name.upper())
    if any(w in _NOT_NVSWITCH or w.endswith("PCIE") for w in words):
        return False
    return any(w in NVSWITCH_FAMILIES for w in words)


@dataclass(frozen=True)
class GroupSpan:
    kind: str  # world | dp | tp | p2p | embedding
    local: int  # most of its ranks on one node
    nodes: int

    @property
    def eligible(self) -> bool:
        """NCCL sets NVLS up for it (two or more of its GPUs on a node) and it runs the large
        reductions that make NCCL allocate the buffers (module docstring)."""
        return self.local >= 2 and self.kind in REDUCING

    @property
    def pays(self) -> bool:
        return self.kind in ("tp", "dp") and self.nodes == 1 and self.local >= MIN_RANKS


def communicator_bytes(group: GroupSpan, blackwell: bool) -> int:
    """NVLS's buffers on one GPU of ``group`` (NCCL 2.30 ``ncclNvlsBufferSetup``: one head per
    GPU of the communicator on the node)."""
    if not blackwell:
        channels = CHANNELS_HOPPER
    else:
        channels = CHANNELS_BLACKWELL_NODE if group.nodes == 1 else CHANNELS_BLACKWELL_NODES
    return channels * 2 * NVLS_CHUNK * NCCL_STEPS * group.local


def _blackwell(name: str | None) -> bool:
    words = re.split(r"[^A-Z0-9]+", (name or "").upper())
    return any(w in BLACKWELL for w in words)


def _span(kind: str, ranks: list[int], gpus_per_node: int) -> GroupSpan:
    per: dict[int, int] = {}
    for r in ranks:
        per[r // gpus_per_node] = per.get(r // gpus_per_node, 0) + 1
    return GroupSpan(kind, max(per.values()), len(per))


def stage_groups(
    tensor: int, data: int, pipeline: int, gpus_per_node: int, stage: int, tied: bool
) -> list[GroupSpan]:
    """The communicators a GPU of ``stage`` holds, as the Layout's rank rules place them (its
    first rank stands for all: the stage's block is laid out alike)."""
    T, D, P, G = tensor, data, pipeline, gpus_per_node
    base = stage * D * T
    world = T * D * P
    out = [GroupSpan("world", min(G, world), math.ceil(world / G))]
    if D > 1:
        out.append(_span("dp", [base + k * T for k in range(D)], G))
    if T > 1:
        out.append(_span("tp", [base + t for t in range(T)], G))
    if stage > 0:
        out.append(_span("p2p", [base - D * T, base], G))
    if stage < P - 1:
        out.append(_span("p2p", [base, base + D * T], G))
    if tied and P > 1 and stage in (0, P - 1):
        out.append(_span("embedding", [0, (P - 1) * D * T], G))
    return out


@dataclass(frozen=True)
class NvlsChoice:
    enabled: bool
    communicators: int  # eligible communicators, each allocating NVLS buffers when enabled
    why: str
    cost: int = 0  # their buffers together, when enabled

    @property
    def bytes(self) -> int:
        return self.cost if self.enabled else 0

    def env(self) -> dict[str, str]:
        """NCCL's process-wide switch for this rank."""
        return {ENV: ON if self.enabled else OFF}


def choose(
    gpu: str | None, tensor: int, data: int, pipeline: int, gpus_per_node: int, stage: int, tied: bool
) -> NvlsChoice:
    """NVLS on or off for a GPU of ``stage`` (module docstring), and why."""
    if not nvswitch_gpu(gpu, gpus_per_node):
        return NvlsChoice(False, 0, f"{gpu or 'unknown GPU'} x {gpus_per_node}: no NVSwitch multicast")
    groups = stage_groups(tensor, data, pipeline, gpus_per_node, stage, tied)
    eligible = [g for g in groups if g.eligible]
    blackwell = _blackwell(gpu)
    cost = sum(communicator_bytes(g, blackwell) for g in eligible)
    paying = [g.kind for g in groups if g.pays]
    if not paying:
        why = f"no tp/dp group of {MIN_RANKS}+ GPUs inside one node: NVLS would cost memory only"
        return NvlsChoice(False, len(eligible), why, cost)
    each = ", ".join(f"{g.kind} {communicator_bytes(g, blackwell) // 2**20} MiB" for g in eligible)
    return NvlsChoice(True, len(eligible), f"{'/'.join(paying)} inside one node; buffers: {each}", cost)


@dataclass(frozen=True)
class Decision:
    """NVLS for a whole layout: per stage (what the memory estimate counts) and per node (what
    its pod's environment says)."""

    stages: tuple[NvlsChoice, ...]
    nodes: tuple[bool, ...]

    def node_env(self, node_rank: int) -> dict[str, str]:
        """The pod of ``node_rank``'s process-wide switch (every rank on the node shares it)."""
        return {ENV: ON if self.nodes[node_rank] else OFF}


def node_stages(tensor: int, data: int, pipeline: int, gpus_per_node: int) -> list[range]:
    """The stages with ranks on each node (ranks fill nodes in order, a stage's block after the
    previous one's, as the Layout's rank rules place them)."""
    R, G = tensor * data, gpus_per_node
    nodes = math.ceil(pipeline * R / G)
    return [range(n * G // R, min(pipeline, ((n + 1) * G - 1) // R + 1)) for n in range(nodes)]


def decide(
    gpus: Sequence[str | None], tensor: int, data: int, pipeline: int, gpus_per_node: int, tied: bool
) -> Decision:
    """NVLS per stage and per node; ``gpus``: each stage's GPU type (the planner's name). See the
    module docstring for nodes holding several stages."""
    T, D, P, G = tensor, data, pipeline, gpus_per_node
    own = [choose(gpus[s], T, D, P, G, s, tied) for s in range(P)]
    on_node = node_stages(T, D, P, G)
    nodes = tuple(all(own[s].enabled for s in stages) for stages in on_node)
    holders: list[list[int]] = [[] for _ in range(P)]  # each stage's nodes (one pass, not P)
    for n, stages in enumerate(on_node):
        for s in stages:
            holders[s].append(n)
    out = []
    for s, c in enumerate(own):
        mine = holders[s]
        if c.enabled and not any(nodes[n] for n in mine):
            n = mine[0]
            other = next(j for j in on_node[n] if not own[j].enabled)
            why = (
                f"off: node {n} also holds stage {other} ({own[other].why}) and NCCL_NVLS_ENABLE "
                "is one per pod, set off where the node's stages disagree"
            )
            c = replace(c, enabled=False, why=why)
        out.append(c)
    return Decision(tuple(out), nodes)


def from_layout(layout: Layout, tied: bool) -> Decision:
    """:func:`decide` on the GPU types the planner priced each stage with (the Layout's estimate;
    a stage with none recorded: no NVSwitch assumed, NVLS off). ``tied``: tied embeddings with
    more than one stage (the embedding group's communicator)."""
    rows = {int(r["stage"]): r for r in (layout.estimate.get("stages") or []) if "stage" in r}
    gpus = [rows.get(s, {}).get("gpu") for s in range(layout.pipeline)]
    return decide(gpus, layout.tensor, layout.data, layout.pipeline, layout.gpus_per_node, tied)
