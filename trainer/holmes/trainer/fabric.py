"""Fabric preflight: does this pod have the network its Layout's groups were planned on?

Every NCCL group is pinned to its Layout network (``config.net_name``, groups.py), and NCCL
never falls back from a pinned network: when a pod cannot open its HCA (no /dev/infiniband, no
RDMA resource, a wrong GID index), the first collective of every IB-pinned group fails with
``ncclInvalidUsage`` ("network IB not found"). So the checks run *before any NCCL group exists*,
and every rank's findings travel over the host (gloo) group, never over a communicator that
might be the broken one. Per ``training.fabricCheck`` (fail | warn | off):

1. devices, on every rank that is in a group pinned to IB: NCCL_IB_DISABLE is not set,
   /dev/infiniband has a uverbs device, the HCAs that NCCL_IB_HCA names exist under
   /sys/class/infiniband with an ACTIVE port, and each RoCE port has a routable RoCE v2 GID
   (at NCCL_IB_GID_INDEX when set, else one NCCL picks itself). All ranks gather all findings
   and decide alike: ``fail`` stops every rank with one
   message; ``warn`` runs every IB group that has a member without usable IB on Socket instead
   (what "train anyway, slower" can mean once nets are pinned), and says which;
2. groups: each rank then creates its communicators with one small all-reduce per group (in
   the Layout's order, the same on every rank) and catches what fails; the failures are
   gathered over the host group and stop every rank with one report naming the group, its
   network and NCCL's error (and NCCL's log file, NCCL_DEBUG_FILE, when the user set one).

Groups inside one node (tensor parallelism) are not pinned (groups.py): NCCL runs them over
NVLink or shared memory and needs no HCA for them. The checks below the I/O line are pure.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from holmes.launch.podnet import gid_problems, read_hcas, select_hcas

MODES = ("fail", "warn", "off")


class FabricError(RuntimeError):
    """training.fabricCheck: fail, and a rank's fabric is not what its Layout expects."""


@dataclass(frozen=True)
class Finding:
    rank: int
    node: str
    group: str  # e.g. "dp group (4 ranks)", "p2p group of boundary 1", "world group"
    expected: str
    actual: str

    def message(self) -> str:
        where = f"rank {self.rank} on node {self.node}"
        return f"{where}: {self.group} expects {self.expected}, found {self.actual}"


def group_label(created: Mapping[str, Any]) -> str:
    """A group as the start line lists it (RankGroups.created), in words."""
    if created["kind"] == "world":
        return "world group"
    if created["kind"] == "p2p":
        return f"p2p group of boundary {created.get('boundary')}"
    return f"{created['kind']} group ({created['size']} ranks)"


# ---- devices: what NCCL's IB transport needs in the pod --------------------------------------


def rdma_problems(sys_root: Path, dev_root: Path, env: Mapping[str, str]) -> list[str]:
    """What stops NCCL's IB transport (InfiniBand or RoCE) in this pod; empty when all is there.
    On RoCE ports the GID NCCL will use must be RoCE v2 and routable: NCCL_IB_GID_INDEX's when
    set, else one NCCL (>= 2.21) picks itself."""
    problems: list[str] = []
    if env.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0"):
        problems.append(f"NCCL_IB_DISABLE={env['NCCL_IB_DISABLE']} in the pod env (it turns IB/RoCE off)")
    ib_dev = dev_root / "infiniband"
    if not (ib_dev.is_dir() and any(ib_dev.glob("uverbs*"))):
        problems.append(
            f"no {ib_dev}/uverbs* device in the pod (request the node's RDMA resource, or mount {ib_dev})"
        )
    cls = sys_root / "class" / "infiniband"
    hcas = {h.name: h for h in read_hcas(sys_root)}
    if not hcas:
        problems.append(f"no RDMA device under {cls}")
        return problems
    chosen, missing = select_hcas(list(hcas), env.get("NCCL_IB_HCA"))
    if missing:
        problems.append(
            f"NCCL_IB_HCA={env.get('NCCL_IB_HCA')} names {', '.join(missing)}, not under {cls} "
            f"(present: {', '.join(hcas)})"
        )
    active = []
    for hca, port in chosen:
        ports = [p for p in hcas[hca].ports if port is None or p.port == port]
        if port is not None and not ports:
            problems.append(f"{hca} has no port {port}")
        active += [p for p in ports if p.active]
    if chosen and not active:
        names = ", ".join(sorted({h for h, _ in chosen}))
        problems.append(f"no ACTIVE port on {names} (link down or not cabled)")
    return problems + gid_problems(active, env)


def nccl_log_path(env: Mapping[str, str], hostname: str | None = None, pid: int | None = None) -> str | None:
    """NCCL_DEBUG_FILE with NCCL's %h and %p filled in as NCCL does: %h is the hostname cut at
    its first dot (``gpu-1.cluster.local`` -> ``gpu-1``), %p the process id."""
    raw = env.get("NCCL_DEBUG_FILE")
    if not raw:
        return None
    host = (hostname or socket.gethostname()).split(".", 1)[0]
    return raw.replace("%h", host).replace("%p", str(os.getpid() if pid is None else pid))


# ---- the decision (pure) ---------------------------------------------------------------------


def ib_groups_of(layout: Any, rank: int) -> list[str]:
    """This rank's groups that would be pinned to IB, in words (empty: it needs no HCA)."""
    from .groups import pinned_net

    out = ["world group"] if layout.world_net == "IB" else []
    for g in layout.process_groups():
        if rank in g.ranks and len(g.ranks) > 1 and pinned_net(layout, g.ranks, g.net) == "IB":
            label = (
                f"p2p group of boundary {g.stage}"
                if g.kind == "p2p"
                else f"{g.kind} group ({len(g.ranks)} ranks)"
            )
            out.append(label)
    return out


def fallback_nets(layout: Any, without_ib: set[int]) -> dict[tuple[int, ...], str]:
    """Under warn: every IB group with a member that cannot use IB runs on Socket (a group's
    members must agree on one network). Keys: the group's ranks; the world group's key is ()."""
    if not without_ib:
        return {}
    out: dict[tuple[int, ...], str] = {}
    if layout.world_net == "IB":
        out[()] = "Socket"
    for g in layout.process_groups():
        if g.net == "IB" and without_ib & set(g.ranks):
            out[tuple(g.ranks)] = "Socket"
    return out


# ---- the preflight itself (collectives on the host group and on each group) ------------------


@dataclass
class FabricReport:
    mode: str
    devices: str  # checked | skipped (why)
    groups: str  # checked | skipped (why)
    findings: list[Finding]
    nets: dict[tuple[int, ...], str] = field(default_factory=dict)  # groups moved off IB (warn)

    def messages(self) -> list[str]:
        out = [f.message() for f in self.findings]
        if self.nets:
            out.append(
                f"fabricCheck warn: {len(self.nets)} group(s) planned on IB run on Socket instead, "
                "as some of their ranks cannot use IB (fix the pods' RDMA setup for the planned speed)"
            )
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "check": self.mode,
            "devices": self.devices,
            "groups": self.groups,
            "problems": self.messages(),
        }


def _gather(local: list[Any], host_group: Any) -> list[Any]:
    import torch.distributed as dist

    everyone: list[Any] = [None] * dist.get_world_size(host_group)
    dist.all_gather_object(everyone, local, group=host_group)
    return [x for part in everyone for x in part]


def check_devices(
    *,
    mode: str,
    rank: int,
    layout: Any,
    backend: str,
    host_group: Any,
    env: Mapping[str, str] | None = None,
    root: str | None = None,
) -> FabricReport:
    """Step 1, before any NCCL group is created; every rank calls it (a host collective).
    Device checks run on NCCL, or on any backend when ``root`` (HOLMES_FABRIC_ROOT: where sys/
    and dev/ are) is set."""
    if mode == "off":
        return FabricReport(mode, "skipped (fabricCheck: off)", "skipped (fabricCheck: off)", [])
    env = os.environ if env is None else env
    if not (backend == "nccl" or root):
        return FabricReport(mode, f"skipped (backend {backend} does not use RDMA)", "pending", [])
    base = Path(root or "/")
    node = layout.nodes[rank // layout.gpus_per_node]
    ib = ib_groups_of(layout, rank)
    problems = rdma_problems(base / "sys", base / "dev", env) if ib else []
    local = [vars(Finding(rank, node, ", ".join(ib), "IB (InfiniBand/RoCE)", p)) for p in problems]
    findings = [Finding(**f) for f in _gather(local, host_group)]
    _decide(mode, findings, "devices")
    nets = fallback_nets(layout, {f.rank for f in findings})
    return FabricReport(mode, "checked", "pending", findings, nets)


def check_groups(
    report: FabricReport, *, rank: int, layout: Any, groups: Any, device: Any, host_group: Any
) -> None:
    """Step 2: create each communicator now (one 1-element all-reduce per group, the pp group
    excepted: it carries no traffic) and stop every rank with one report if any failed."""
    if report.mode == "off":
        return
    import torch
    import torch.distributed as dist

    node = layout.nodes[rank // layout.gpus_per_node]
    probe = torch.zeros(1, device=device)
    failed = []
    for created, pg in [(groups.created[0], groups.world)] + list(groups.members):
        if created["kind"] == "pp":
            continue
        try:
            dist.all_reduce(probe, group=pg)
        except Exception as e:  # NCCL: "network IB not found", ncclInvalidUsage, a timeout
            failed.append(
                vars(Finding(rank, node, group_label(created), created["net"], f"{type(e).__name__}: {e}"))
            )
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # start-up only: asynchronous errors surface here
    found = [Finding(**f) for f in _gather(failed, host_group)]
    report.groups = "checked"
    if found:
        log = nccl_log_path(os.environ)
        raise FabricError(
            "cannot create these communicators: "
            + "; ".join(f.message() for f in found[:8])
            + (f" (and {len(found) - 8} more)" if len(found) > 8 else "")
            + (f". NCCL's log on this rank: {log}" if log else ". Set NCCL_DEBUG=INFO to see why")
        )


def _decide(mode: str, findings: list[Finding], what: str) -> None:
    if mode == "fail" and findings:
        shown = "; ".join(f.message() for f in findings[:8])
        more = f" (and {len(findings) - 8} more)" if len(findings) > 8 else ""
        raise FabricError(
            f"fabric check failed ({what}): {shown}{more}. Fix the pods' RDMA setup, or set "
            "training.fabricCheck: warn to train anyway on Socket at the slower speed"
        )
