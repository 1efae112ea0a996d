"""Process groups from the Layout, each on the NCCL network the planner chose for it.

Every rank creates every group of ``layout.process_groups()`` in the Layout's order (torch
requires all ranks to take part in each ``new_group``), keeping the ones it belongs to. Every
collective the trainer runs names one of these groups or the world group, whose network is
the Layout's ``worldNet`` (tests/integration/trainer/test_trainer_groups.py records them). On NCCL a
group that spans nodes gets ``ProcessGroupNCCL.Options().config.net_name`` = the group's
``net`` ("IB" or "Socket"), so a DP group inside an InfiniBand island uses IB while a pipeline
group crossing islands uses sockets. NCCL never falls back from a pinned network (fabric.py
checks the pods first); a group inside one node is left unpinned, so NVLink-only tensor
parallelism needs no HCA. gloo takes no options, the same code path builds plain groups.
``NCCL_NET`` overrides every pinned net (ncclenv.py): :func:`init_world` removes it from
the environment before NCCL reads it, and refuses to start when NCCL's configuration files set it;
it refuses TorchComms too (torch 2.13 passes it no per-group options) when the Layout pins
groups to different nets.

Each group's lowest rank logs one JSON line ``{"holmesGroup": {...}}`` (the world group: rank
0), the line the launcher's network hook writes for other frameworks (``holmes.launch.hook``),
so every group's network shows in the pods' logs whatever the framework: ``net`` is the pinned
network (null inside one node), ``applied`` whether it was passed to NCCL, ``why`` when not.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from holmes.contract.layout import Layout

from . import ncclenv
from .tensor_parallel import TensorParallel


@dataclass
class RankGroups:
    """The groups one rank belongs to (None where the kind does not exist for it, or where the
    group would have one member: that needs no communicator). ``world`` is the default group
    (created by init_process_group with the Layout's ``worldNet``): the control plane.
    ``p2p`` maps each stage boundary this rank sits on to its group. ``created`` describes every
    group this process built, for the ``start`` line: kind, size, backend, net, the world group
    first; ``members`` pairs the others with their handles, in the Layout's order.
    ``preemption``: the trainer's gloo group for its per-iteration stop vote (preempt.py), host
    TCP only, outside the Layout."""

    dp: Any
    pp: Any
    embedding: Any
    tp: Any = None
    p2p: dict[int, Any] = field(default_factory=dict)
    world: Any = None
    created: list[dict[str, Any]] = field(default_factory=list)
    members: list[tuple[dict[str, Any], Any]] = field(default_factory=list)
    preemption: Any = None


def pinned_net(layout: Layout, ranks: Iterable[int], net: str) -> str | None:
    """The network a group is pinned to: its Layout ``net`` when it spans nodes, None (NCCL's
    own choice: NVLink, shared memory) when all its ranks are on one node."""
    nodes = {r // layout.gpus_per_node for r in ranks}
    return net if len(nodes) > 1 else None


def nvlink_domain_of(layout: Layout, ranks: Iterable[int]) -> str | None:
    """The NVLink domain every rank's node is in (the Layout's ``nvlinkDomains``), else None."""
    domains = {layout.nvlink_domain(layout.nodes[r // layout.gpus_per_node]) for r in ranks}
    return domains.pop() if len(domains) == 1 else None


LOG_KEY = "holmesGroup"  # the hook's key (holmes.launch.hook.LOG_KEY): one reader for both


def group_line(
    layout: Layout, kind: str, ranks: Iterable[int], backend: str, net: str, planned: str | None = None
) -> dict[str, Any]:
    """The log entry of one group (pure), in the hook's terms. ``planned``: the Layout's net
    where the fabric check moved the group to ``net``."""
    members = list(ranks)
    pinned = pinned_net(layout, members, net)
    entry: dict[str, Any] = {"ranks": members, "kind": kind, "backend": backend, "net": pinned}
    if planned is not None and planned != net:
        entry["planned"] = planned
    domain = nvlink_domain_of(layout, members)
    if pinned is not None and domain is not None:
        # a group over nodes of one NVLink domain (layout version 4): NCCL's multi-node NVLink
        # path through the pod's IMEX channel carries it; the pinned net is NCCL's fallback
        entry["nvlinkDomain"] = domain
    if pinned is None:
        node = layout.nodes[members[0] // layout.gpus_per_node]
        entry.update(applied=False, why=f"all ranks on node {node}: NCCL uses NVLink or shared memory")
    elif backend != "nccl":
        entry.update(applied=False, why=f"backend {backend}: net is what NCCL would get")
    else:
        entry["applied"] = True
    return entry


def log_group(entry: dict[str, Any]) -> None:
    print(json.dumps({LOG_KEY: entry}, separators=(",", ":")), file=sys.stderr, flush=True)


def group_options(backend: str, net: str | None) -> Any:
    """pg_options selecting the NCCL network of one group; None for backends without options
    or for a group left to NCCL's choice."""
    if backend != "nccl" or net is None:
        return None
    from torch.distributed import ProcessGroupNCCL  # only in CUDA builds

    opts = ProcessGroupNCCL.Options()
    opts.config.net_name = net
    return opts


class NetOverrideError(RuntimeError):
    """Something would override every group's pinned network: NCCL_NET in NCCL's configuration
    files, or TorchComms while the Layout pins several nets."""


def guard_nccl_net(
    env: MutableMapping[str, str], home: Path | None = None, etc: Path = ncclenv.ETC_CONF
) -> str | None:
    """Before the first NCCL communicator: refuse an NCCL_NET in NCCL's configuration files
    (``home``: the user's, default ``env``'s ``HOME`` as NCCL reads it), remove one from ``env``
    (this process's: NCCL reads it at its first communicator). A note on what was removed."""
    found = ncclenv.file_override(env, ncclenv.user_home(env) if home is None else home, etc)
    if found is not None:
        raise NetOverrideError(
            ncclenv.file_fix(found, "the Holmes engine pins every group itself, so nothing else turns it off")
        )
    return ncclenv.drop_from_env(env)


def pinned_nets(layout: Layout) -> set[str]:
    """Every net some group of the Layout is pinned to (the world's included)."""
    groups = [tuple(range(layout.world_size))] + [g.ranks for g in layout.process_groups()]
    nets = [layout.world_net] + [g.net for g in layout.process_groups()]
    return {n for ranks, net in zip(groups, nets, strict=True) if (n := pinned_net(layout, ranks, net))}


def torchcomms_note(layout: Layout, enabled: bool) -> str | None:
    """TorchComms on: torch 2.13 hands it no per-group options, so no pinned net would hold.
    Refused when the Layout pins groups to different nets; a warning when to one at most."""
    if not enabled:
        return None
    nets = sorted(pinned_nets(layout))
    why = (
        "TorchComms is on (TORCH_DISTRIBUTED_USE_TORCHCOMMS or torch.distributed.config."
        "use_torchcomms): torch 2.13 passes it no per-group NCCL options, so NCCL picks every "
        "group's network"
    )
    if len(nets) > 1:
        raise NetOverrideError(f"{why}; this Layout pins {' and '.join(nets)}. Unset it to train")
    return f"WARNING: {why}; this Layout pins {nets[0] if nets else 'no network'} only, so training goes on"


def init_world(layout: Layout, backend: str, timeout_s: float) -> None:
    """init_process_group on the Layout's world network: the control-plane collectives (loss and
    grad-norm reduction, the resume decision, checkpoint coordination) run on this group, and
    one communicator must not mix ranks that would pick different transports. On NCCL, what
    would override the pinned nets first: :func:`guard_nccl_net`, :func:`torchcomms_note`."""
    if backend == "nccl":
        from torch.distributed.distributed_c10d import _use_torchcomms_enabled

        for note in (guard_nccl_net(os.environ), torchcomms_note(layout, _use_torchcomms_enabled())):
            if note:
                print(f"holmes.trainer: {note}", file=sys.stderr, flush=True)
    world_net = pinned_net(layout, range(layout.world_size), layout.world_net)  # None on one node
    dist.init_process_group(
        backend, timeout=timedelta(seconds=timeout_s), pg_options=group_options(backend, world_net)
    )


def build_groups(
    layout: Layout,
    rank: int,
    backend: str,
    timeout_s: float,
    need_embedding: bool = False,
    nets: dict[tuple[int, ...], str] | None = None,
) -> RankGroups:
    """``nets``: groups to run on another network than planned (fabric.fallback_nets: keyed by
    ranks, the world group by ()); the world group then gets a communicator of its own."""
    timeout = timedelta(seconds=timeout_s)
    nets = nets or {}
    mine: dict[str, Any] = {}
    p2p: dict[int, Any] = {}
    world_net = nets.get((), layout.world_net)
    world = dist.group.WORLD
    if world_net != layout.world_net:  # the default group was created pinned to the planned net
        pinned = pinned_net(layout, range(layout.world_size), world_net)
        world = dist.new_group(timeout=timeout, backend=backend, pg_options=group_options(backend, pinned))
    created = [{"kind": "world", "size": layout.world_size, "backend": backend, "net": world_net}]
    if rank == 0:
        log_group(group_line(layout, "world", range(layout.world_size), backend, world_net, layout.world_net))
    members: list[tuple[dict[str, Any], Any]] = []
    kinds = ("dp", "tp", "pp", "p2p")
    specs = [g for g in layout.process_groups() if g.kind in kinds]
    if need_embedding:
        specs += layout.process_groups("embedding")  # check_against_layout: a tied model has them
    for g in specs:
        handle = None  # a group of one needs no communicator (every rank skips it alike)
        net = nets.get(tuple(g.ranks), g.net)
        if len(g.ranks) > 1:
            pinned = pinned_net(layout, g.ranks, net)
            handle = dist.new_group(
                list(g.ranks), timeout=timeout, backend=backend, pg_options=group_options(backend, pinned)
            )
            if rank == min(g.ranks):
                log_group(group_line(layout, g.kind, g.ranks, backend, net, g.net))
        if rank not in g.ranks:
            continue
        if handle is not None:
            created.append({"kind": g.kind, "size": len(g.ranks), "backend": backend, "net": net})
            if g.kind == "p2p":
                created[-1]["boundary"] = g.stage
            members.append((created[-1], handle))
        if g.kind == "p2p":
            assert g.stage is not None, "Layout.process_groups gives each p2p group its boundary"
            p2p[g.stage] = handle
            continue
        if g.kind in mine:
            raise RuntimeError(f"rank {rank} is in two {g.kind} groups: the layout is inconsistent")
        mine[g.kind] = handle
    missing = [
        kind
        for kind, degree in (("dp", layout.data), ("tp", layout.tensor), ("pp", layout.pipeline))
        if degree > 1 and mine.get(kind) is None
    ]
    if missing:
        me = layout.rank_info(rank)
        raise RuntimeError(
            f"rank {rank} (stage {me.stage}, dp index {me.dp_index}, tp index {me.tp_index}) found no "
            f"{'/'.join(missing)} group in the layout: it must list a dp and a tp family per stage "
            "and a pp family"
        )
    return RankGroups(
        dp=mine.get("dp"),
        pp=mine.get("pp"),
        embedding=mine.get("embedding"),
        tp=mine.get("tp"),
        p2p=p2p,
        world=world,
        created=created,
        members=members,
    )


def tensor_parallel(layout: Layout, rank: int, groups: RankGroups, sequence_parallel: bool) -> TensorParallel:
    """This rank's place in its tp group (size 1 without tensor parallelism)."""
    if layout.tensor == 1:
        return TensorParallel()
    return TensorParallel(layout.tensor, layout.rank_info(rank).tp_index, groups.tp, sequence_parallel)
