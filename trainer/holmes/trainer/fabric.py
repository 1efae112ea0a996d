"""Fabric preflight: does this pod have the network its Layout's groups were planned on?

NCCL quietly runs a group over sockets when a pod cannot open its HCA (no /dev/infiniband, no
RDMA resource, a wrong GID index), and a plan built for InfiniBand then trains at Ethernet
speed without a word. At start-up each rank checks, per ``training.fabricCheck`` (fail | warn |
off):

1. devices, when any of its groups is on IB: NCCL_IB_DISABLE is not set, /dev/infiniband has
   a uverbs device, the HCAs that NCCL_IB_HCA names exist under /sys/class/infiniband with an
   ACTIVE port, and NCCL_IB_GID_INDEX is a populated GID on RoCE ports;
2. transports, on NCCL: each group runs one small collective in the Layout's order and the
   network NCCL logged for it ("Using network IB", "via NET/Socket/0") must be the Layout's.

Every rank's findings are gathered on the world group so that all ranks take the same
decision (fail: all stop with the same message; warn: rank 0 reports them in its ``start``
line, its metrics and so the job's status). The checks below the I/O line are pure.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def select_hcas(present: list[str], spec: str | None) -> tuple[list[tuple[str, int | None]], list[str]]:
    """The (hca, port) pairs NCCL_IB_HCA selects among ``present``, and the names it asks for
    that are missing. The syntax is NCCL's: ``mlx5_0:1,mlx5_1`` matches by prefix, a leading
    ``=`` by exact name, a leading ``^`` excludes; unset selects every HCA."""
    if not spec:
        return [(h, None) for h in present], []
    text = spec.strip()
    exclude = text.startswith("^")
    text = text.lstrip("^")
    exact = text.startswith("=")
    text = text.lstrip("=")
    wanted: list[tuple[str, int | None]] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, port = item.partition(":")
        wanted.append((name, int(port) if port.isdigit() else None))

    def hits(name: str) -> list[str]:
        return [h for h in present if (h == name if exact else h.startswith(name))]

    if exclude:
        gone = {h for name, _ in wanted for h in hits(name)}
        return [(h, None) for h in present if h not in gone], []
    chosen: list[tuple[str, int | None]] = []
    missing: list[str] = []
    for name, port in wanted:
        found = hits(name)
        if not found:
            missing.append(name if port is None else f"{name}:{port}")
        chosen += [(h, port) for h in found]
    return chosen, missing


def _zero_gid(gid: str) -> bool:
    return not gid or set(gid.replace(":", "")) <= {"0"}


def rdma_problems(sys_root: Path, dev_root: Path, env: Mapping[str, str]) -> list[str]:
    """What stops NCCL's IB transport (InfiniBand or RoCE) in this pod; empty when all is there."""
    problems: list[str] = []
    if env.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0"):
        problems.append(f"NCCL_IB_DISABLE={env['NCCL_IB_DISABLE']} in the pod env (it turns IB/RoCE off)")
    ib_dev = dev_root / "infiniband"
    if not (ib_dev.is_dir() and any(ib_dev.glob("uverbs*"))):
        problems.append(
            f"no {ib_dev}/uverbs* device in the pod (request the node's RDMA resource, or mount {ib_dev})"
        )
    cls = sys_root / "class" / "infiniband"
    present = sorted(p.name for p in cls.iterdir()) if cls.is_dir() else []
    if not present:
        problems.append(f"no RDMA device under {cls}")
        return problems
    chosen, missing = select_hcas(present, env.get("NCCL_IB_HCA"))
    if missing:
        problems.append(
            f"NCCL_IB_HCA={env.get('NCCL_IB_HCA')} names {', '.join(missing)}, not under {cls} "
            f"(present: {', '.join(present)})"
        )
    active: list[tuple[str, str]] = []
    for hca, port in chosen:
        ports_dir = cls / hca / "ports"
        ports = [str(port)] if port is not None else sorted(p.name for p in ports_dir.glob("*"))
        for p in ports:
            state = _read(ports_dir / p / "state")
            if not state:
                problems.append(f"{hca} has no port {p}")
            elif "ACTIVE" in state:
                active.append((hca, p))
    if chosen and not active:
        names = ", ".join(sorted({h for h, _ in chosen}))
        problems.append(f"no ACTIVE port on {names} (link down or not cabled)")
    gid = env.get("NCCL_IB_GID_INDEX", "").strip()
    if gid:
        if not gid.isdigit():
            problems.append(f"NCCL_IB_GID_INDEX={gid} is not a number")
        else:
            for hca, p in active:
                port_dir = cls / hca / "ports" / p
                if _read(port_dir / "link_layer") != "Ethernet":
                    continue  # InfiniBand ports address by LID; the GID index is RoCE's
                value = _read(port_dir / "gids" / gid)
                if _zero_gid(value):
                    problems.append(
                        f"NCCL_IB_GID_INDEX={gid} is empty on RoCE port {hca}:{p} "
                        "(pick a populated RoCE v2 index, as show_gids lists)"
                    )
    return problems


def device_findings(
    rank: int, node: str, created: Iterable[Mapping[str, Any]], sys_root: Path, dev_root: Path, env: Mapping
) -> list[Finding]:
    ib = [group_label(g) for g in created if g.get("net") == "IB"]
    if not ib:
        return []
    problems = rdma_problems(sys_root, dev_root, env)
    return [Finding(rank, node, ", ".join(ib), "IB (InfiniBand/RoCE)", p) for p in problems]


# ---- transports: what NCCL actually chose ------------------------------------------------------

_NET = re.compile(r"NCCL INFO (?:.*?Using network (\S+)|.*\bvia NET/([^/\s]+))")


def net_name(plugin: str) -> str:
    """NCCL's net plugin name as the Layout says it: IB (also IBext and the like) or Socket."""
    return "IB" if plugin.upper().startswith("IB") else plugin


def transports_in(text: str) -> set[str]:
    """The networks NCCL logged (NCCL_DEBUG=INFO) in this piece of its debug output."""
    found: set[str] = set()
    for m in _NET.finditer(text):
        found.add(net_name(m.group(1) or m.group(2)))
    return found


def transport_finding(rank: int, node: str, created: Mapping[str, Any], seen: set[str]) -> Finding | None:
    """A mismatch between the group's planned net and what NCCL logged for it; None when they
    agree or NCCL used no network (ranks on one node talk over NVLink or shared memory)."""
    want = created["net"]
    if not seen or seen == {want}:
        return None
    return Finding(rank, node, group_label(created), want, f"NCCL using {', '.join(sorted(seen))}")


class NcclLog:
    """Follows this process's NCCL debug file, reading what was appended since the last call."""

    def __init__(self, path: str | None):
        self.path = path
        self.offset = self._size()

    def _size(self) -> int:
        try:
            return os.path.getsize(self.path) if self.path else 0
        except OSError:
            return 0

    def new_text(self) -> str:
        if not self.path:
            return ""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return ""
        self.offset += len(data)
        return data.decode("utf-8", "replace")


def nccl_log_path(env: Mapping[str, str]) -> str | None:
    """NCCL_DEBUG_FILE with NCCL's %h (host) and %p (pid) filled in."""
    raw = env.get("NCCL_DEBUG_FILE")
    if not raw:
        return None
    return raw.replace("%h", socket.gethostname()).replace("%p", str(os.getpid()))


def configure_nccl_debug(env: MutableMapping[str, str], mode: str, tmpdir: str = "/tmp") -> str | None:
    """Before the first communicator: make NCCL log the network each communicator uses, into a
    file this process reads. The user's own NCCL_DEBUG* settings are kept; a level below INFO
    means transports go unconfirmed. Returns the log's path, or None when nothing will be read."""
    if mode == "off":
        return None
    env.setdefault("NCCL_DEBUG", "INFO")
    env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    env.setdefault("NCCL_DEBUG_FILE", os.path.join(tmpdir, "holmes-nccl.%h.%p.log"))
    if env["NCCL_DEBUG"].upper() not in ("INFO", "TRACE"):
        return None
    return nccl_log_path(env)


# ---- the preflight itself (collectives on the world group and on each group) ------------------


@dataclass
class FabricReport:
    mode: str
    devices: str  # checked | skipped (why)
    transports: str  # checked | skipped (why)
    findings: list[Finding]

    def messages(self) -> list[str]:
        return [f.message() for f in self.findings]

    def summary(self) -> dict[str, Any]:
        return {
            "check": self.mode,
            "devices": self.devices,
            "transports": self.transports,
            "problems": self.messages(),
        }


def _gather(local: list[Finding], world: Any) -> list[Finding]:
    import torch.distributed as dist

    everyone: list[Any] = [None] * dist.get_world_size(world)
    dist.all_gather_object(everyone, [vars(f) for f in local], group=world)
    return [Finding(**f) for part in everyone for f in part]


def _decide(mode: str, findings: list[Finding], what: str) -> None:
    if mode == "fail" and findings:
        shown = "; ".join(f.message() for f in findings[:8])
        more = f" (and {len(findings) - 8} more)" if len(findings) > 8 else ""
        raise FabricError(
            f"fabric check failed ({what}): {shown}{more}. Fix the pods' RDMA setup, or set "
            "training.fabricCheck: warn to train anyway at the slower speed"
        )


def preflight(
    *,
    mode: str,
    rank: int,
    node: str,
    backend: str,
    groups: Any,
    device: Any,
    env: Mapping[str, str] | None = None,
    root: str | None = None,
) -> FabricReport:
    """Check this rank's fabric; every rank calls it at the same point (it runs collectives).

    ``groups`` is the RankGroups (its ``members``: this rank's groups in the Layout's order,
    the same on every rank, so no two ranks wait on each other). Device checks run on
    NCCL, or on any backend when ``root`` (HOLMES_FABRIC_ROOT: where sys/ and dev/ are) is set;
    transports are confirmed on NCCL only (gloo has one transport, TCP).
    """
    if mode == "off":
        return FabricReport(mode, "skipped (fabricCheck: off)", "skipped (fabricCheck: off)", [])
    env = os.environ if env is None else env
    import torch
    import torch.distributed as dist

    log = NcclLog(nccl_log_path(env) if backend == "nccl" else None)
    if backend == "nccl" or root:
        base = Path(root or "/")
        devices = "checked"
        local = device_findings(rank, node, groups.created, base / "sys", base / "dev", env)
    else:
        devices, local = f"skipped (backend {backend} does not use RDMA)", []
    findings = _gather(local, groups.world)  # also the world communicator's first collective
    _decide(mode, findings, "devices")

    if backend != "nccl":
        return FabricReport(mode, devices, f"skipped (backend {backend})", findings)
    if not log.path:
        return FabricReport(mode, devices, "skipped (NCCL_DEBUG below INFO: nothing to read)", findings)
    found = [transport_finding(rank, node, groups.created[0], transports_in(log.new_text()))]  # world
    probe = torch.zeros(1, device=device)
    for created, pg in groups.members:
        dist.all_reduce(probe, group=pg)
        torch.cuda.current_stream(device).synchronize()  # start-up only: its connections are up now
        found.append(transport_finding(rank, node, created, transports_in(log.new_text())))
    local = [f for f in found if f is not None]
    transport = _gather(local, groups.world)
    _decide(mode, transport, "transports")
    return FabricReport(mode, devices, "checked", findings + transport)
