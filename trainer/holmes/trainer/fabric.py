"""Fabric preflight: does this pod have the network its Layout's groups were planned on?

Every NCCL group is pinned to its Layout network (``config.net_name``, groups.py), and NCCL
never falls back from a pinned network: when a pod cannot open its HCA (no /dev/infiniband, no
RDMA resource, a wrong GID index), the first collective of every IB-pinned group fails with
``ncclInvalidUsage`` ("network IB not found"). So the checks run *before any NCCL group exists*,
and every rank's findings travel over the rendezvous store (TCP), never over a communicator
that might be the broken one. Per ``training.fabricCheck`` (fail | warn | off):

1. devices, on every rank that is in a group pinned to IB: NCCL_IB_DISABLE is not set,
   /dev/infiniband has a uverbs device, the HCAs that NCCL_IB_HCA names exist under
   /sys/class/infiniband with an ACTIVE port, and each RoCE port has a routable RoCE v2 GID
   (at NCCL_IB_GID_INDEX when set, else one NCCL picks itself). All ranks get all findings and
   decide alike: ``fail`` stops every rank with one
   message; ``warn`` runs every IB group that has a member without usable IB on Socket instead
   (what "train anyway, slower" can mean once nets are pinned), and says which;
2. groups: each rank then creates its communicators with one small all-reduce per group (in
   the Layout's order, the same on every rank), and on each p2p group one lone send from its
   lower rank to the other: torch 2.13's ``_batch_p2p`` issues all-send and all-recv batches
   op by op, which ProcessGroupNCCL runs on a second communicator keyed by the pair, so the
   pipeline's traffic would otherwise create it blocking in step 1. Each creation is timed
   (``groupSeconds`` in the summary). It catches what fails; the failures are shared
   and stop every rank with one report naming the group, its network and NCCL's error (and
   NCCL's log file, NCCL_DEBUG_FILE, when the user set one).

Every step is bounded (:func:`step_seconds`, ``HOLMES_FABRIC_STEP_SECONDS``): when one rank
fails to create a communicator its peers block in ``ncclCommInitRank`` and would meet NCCL's
timeout (600 s) or the watchdog long before any report. So the probes run in a thread waited
for at most one step, each rank writes its findings to the store before waiting for the others
(:class:`StoreExchange`), and a rank that gives no answer in time is named by the others.

Groups inside one node (tensor parallelism) are not pinned (groups.py): NCCL runs them over
NVLink or shared memory and needs no HCA for them. The checks below the I/O line are pure; the
module imports only the standard library at its top (the launcher runs it in the user's image).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
import time
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

    world = pinned_net(layout, range(layout.world_size), layout.world_net)
    out = ["world group"] if world == "IB" else []
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
    seconds: dict[str, float] = field(default_factory=dict)  # this rank: each probe, as created

    def messages(self) -> list[str]:
        out = [f.message() for f in self.findings]
        if self.nets:
            out.append(
                f"fabricCheck warn: {len(self.nets)} group(s) planned on IB run on Socket instead, "
                "as some of their ranks cannot use IB (fix the pods' RDMA setup for the planned speed)"
            )
        return out

    def counts(self) -> dict[str, int]:
        """The findings per kind of contract.trainer_metrics.FABRIC_KINDS (the metrics port's
        series; the messages go in the start and done lines)."""
        return {"devices": len(self.findings), "socketFallback": len(self.nets)}

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "check": self.mode,
            "devices": self.devices,
            "groups": self.groups,
            "problems": self.messages(),
        }
        if self.seconds:
            out["groupSeconds"] = {k: round(v, 4) for k, v in self.seconds.items()}
        return out


# ---- every rank's answer, bounded (the c10d store: TCP, no communicator) -------------------


STEP_ENV = "HOLMES_FABRIC_STEP_SECONDS"
STEP_MAX_S = 150.0


def step_seconds(env: Mapping[str, str], timeout_s: float) -> float:
    """How long one preflight step may take: ``$HOLMES_FABRIC_STEP_SECONDS``, else a quarter of
    the process-group timeout, at most 150 s (NCCL creates thousands of ranks' communicators
    well within that; a hung peer is found long before the 600 s NCCL/gloo timeouts)."""
    raw = env.get(STEP_ENV)
    if not raw:
        return min(STEP_MAX_S, timeout_s / 4)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < timeout_s:
        raise FabricError(
            f"{STEP_ENV}={raw} must be a number of seconds above 0 and below the process-group "
            f"timeout ({timeout_s:g} s, training.timeoutSeconds / HOLMES_TIMEOUT_SECONDS)"
        )
    return value


@dataclass
class Answers:
    """One step's answers: each rank's, by rank; the ranks that gave none in time; what
    went wrong with the store itself, if anything."""

    by_rank: dict[int, Any]
    missing: list[int]
    waited_s: float
    lost: str | None = None

    def missing_messages(self, layout: Any) -> list[str]:
        out = [
            f"rank {r} on node {layout.nodes[r // layout.gpus_per_node]} did not answer within "
            f"{self.waited_s:g} s (it stopped or hangs before this check: see its log)"
            for r in self.missing
        ]
        if self.lost:
            out.append(
                f"the rendezvous store stopped answering ({self.lost}): only this rank's "
                "findings are known, see the other ranks' logs"
            )
        return out

    @property
    def incomplete(self) -> bool:
        return bool(self.missing or self.lost)


class StoreExchange:
    """Each rank writes its answer to the c10d store *before* waiting for the others, so a rank
    that gives up still reports what it found, and the others read it. One verdict per step,
    set once (``compare_set``): ``all`` by the last rank to answer, or ``abort <rank>`` by the
    first rank whose wait ran out; every rank reads the same verdict, so all go on or all stop.
    Each rank then waits (briefly) until every rank that answered has read: the store may live
    in a rank's process, which must not leave before the others have read. The store is TCP to
    the rendezvous host: no NCCL or gloo communicator is involved."""

    def __init__(self, store: Any, prefix: str, rank: int, world: int, poll_s: float = 0.05):
        self.store, self.prefix, self.rank, self.world, self.poll_s = store, prefix, rank, world, poll_s

    def _wait(self, done: Any, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not done() and time.monotonic() < end:
            time.sleep(self.poll_s)

    def share(self, step: str, mine: Any, wait_s: float) -> Answers:
        key = f"{self.prefix}/{step}"
        try:
            self.store.append(f"{key}/answers", json.dumps([self.rank, mine]) + "\n")
            if self.store.add(f"{key}/count", 1) == self.world:
                self.store.compare_set(f"{key}/verdict", "", "all")
            self._wait(lambda: self.store.check([f"{key}/verdict"]), wait_s)
            verdict = self.store.compare_set(f"{key}/verdict", "", f"abort {self.rank}")
            by_rank = {}
            for line in self.store.get(f"{key}/answers").decode().splitlines():
                r, answer = json.loads(line)
                by_rank[int(r)] = answer
        except RuntimeError as e:  # torch's DistError: the store's host went away
            return Answers({self.rank: mine}, [], wait_s, lost=f"{type(e).__name__}: {e}".split("\n")[0])
        try:  # every answer is read: the store's host may now leave at any moment
            self.store.add(f"{key}/read", 1)
            self._wait(lambda: self.store.add(f"{key}/read", 0) >= len(by_rank), min(wait_s, 5.0))
        except RuntimeError:
            pass
        missing = [] if verdict == b"all" else sorted(set(range(self.world)) - set(by_rank))
        return Answers(by_rank, missing, wait_s)


class LocalExchange:
    """The dry run's: one rank in the process over the fake group, no peer to wait for."""

    def __init__(self, rank: int):
        self.rank = rank

    def share(self, step: str, mine: Any, wait_s: float) -> Answers:
        return Answers({self.rank: mine}, [], wait_s)


_ROUNDS = itertools.count()  # a process that builds several trainers: every rank in one order


def exchange_for(host_group: Any, rank: int) -> StoreExchange | LocalExchange:
    """The default group's store (what every rank rendezvoused on), under a prefix of its own
    per torchrun restart and per trainer built; the fake group (the dry run) has none."""
    import torch.distributed as dist

    if dist.get_backend(host_group) == "fake":
        return LocalExchange(rank)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"holmes-fabric/{restart}/{next(_ROUNDS)}"
    store = dist.distributed_c10d._get_default_store()
    return StoreExchange(store, prefix, rank, dist.get_world_size())


def check_devices(
    *,
    mode: str,
    rank: int,
    layout: Any,
    backend: str,
    host_group: Any,
    env: Mapping[str, str] | None = None,
    root: str | None = None,
    timeout_s: float = 600.0,
) -> FabricReport:
    """Step 1, before any NCCL group is created; every rank calls it and every rank's findings
    reach every rank within the step's deadline (:func:`step_seconds`). Device checks run on
    NCCL, or on any backend when ``root`` (HOLMES_FABRIC_ROOT: where sys/ and dev/ are) is set."""
    if mode == "off":
        return FabricReport(mode, "skipped (fabricCheck: off)", "skipped (fabricCheck: off)", [])
    env = os.environ if env is None else env
    if not (backend == "nccl" or root):
        return FabricReport(mode, f"skipped (backend {backend} does not use RDMA)", "pending", [])
    deadline = step_seconds(env, timeout_s)
    base = Path(root or "/")
    node = layout.nodes[rank // layout.gpus_per_node]
    ib = ib_groups_of(layout, rank)
    problems = rdma_problems(base / "sys", base / "dev", env) if ib else []
    local = [vars(Finding(rank, node, ", ".join(ib), "IB (InfiniBand/RoCE)", p)) for p in problems]
    answers = exchange_for(host_group, rank).share("devices", local, deadline)
    findings = [Finding(**f) for r in sorted(answers.by_rank) for f in answers.by_rank[r]]
    if answers.incomplete:
        raise FabricError(
            "fabric check failed (devices): "
            + "; ".join(answers.missing_messages(layout) + [f.message() for f in findings][:8])
        )
    _decide(mode, findings, "devices")
    nets = fallback_nets(layout, {f.rank for f in findings})
    return FabricReport(mode, "checked", "pending", findings, nets)


def probe_groups(
    pairs: list[tuple[dict[str, Any], Any]],
    device: Any,
    deadline_s: float,
    bounded: bool = True,
    seconds: dict[str, float] | None = None,
) -> tuple[list[tuple[dict[str, Any], str]], dict[str, Any] | None]:
    """One 1-element all-reduce per group (creating its communicator), and on a p2p group one
    lone send from its group rank 0 to 1 (creating the pair's communicator, which torch's
    _batch_p2p uses: the module docstring), each waited for on the device and timed into
    ``seconds`` (by group label; the pair's as ``<label> send/recv``). Run in a thread the
    caller waits for at most ``deadline_s``: a rank whose peer failed to create a communicator
    blocks in ``ncclCommInitRank`` (no timeout of its own reaches it sooner than NCCL's). The
    failures, as (group, error); the group still being created when the deadline passed, if
    any. ``bounded=False`` runs inline (the dry run: its recorders are thread-local)."""
    import torch
    import torch.distributed as dist

    failed: list[tuple[dict[str, Any], str]] = []
    current: list[dict[str, Any] | None] = [None]
    timed = seconds if seconds is not None else {}

    def settle() -> None:
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # asynchronous errors surface here

    def pair(probe: Any, pg: Any) -> None:
        # alone, not in batch_isend_irecv: the communicator ProcessGroupNCCL keys by the pair
        if dist.get_rank(pg) == 0:
            dist.isend(probe, group=pg, group_dst=1).wait()
        else:
            dist.irecv(probe, group=pg, group_src=0).wait()

    def run() -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)  # the current device is per thread
        probe = torch.zeros(1, device=device)
        for created, pg in pairs:
            current[0] = created
            label = group_label(created)
            try:
                t0 = time.perf_counter()
                dist.all_reduce(probe, group=pg)
                settle()
                timed[label] = time.perf_counter() - t0
                if created["kind"] == "p2p" and created["size"] == 2:
                    t0 = time.perf_counter()
                    pair(probe, pg)
                    settle()
                    timed[f"{label} send/recv"] = time.perf_counter() - t0
            except Exception as e:  # NCCL: "network IB not found", ncclInvalidUsage, a timeout
                failed.append((created, f"{type(e).__name__}: {e}"))
        current[0] = None

    if not bounded:
        run()
        return failed, None
    worker = threading.Thread(target=run, name="holmes-fabric-probe", daemon=True)
    worker.start()
    worker.join(deadline_s)
    return list(failed), current[0] if worker.is_alive() else None


def check_groups(
    report: FabricReport,
    *,
    rank: int,
    layout: Any,
    groups: Any,
    device: Any,
    host_group: Any,
    timeout_s: float = 600.0,
) -> None:
    """Step 2: create each communicator now (:func:`probe_groups`, the pp group excepted: it
    carries no traffic), within the step's deadline, and stop every rank with one report if any
    failed, hung or did not answer. A probe still hanging is left behind in its thread: the
    rank stops anyway (the trainer's entry point leaves with ``os._exit``)."""
    if report.mode == "off":
        return
    import torch.distributed as dist

    deadline = step_seconds(os.environ, timeout_s)
    node = layout.nodes[rank // layout.gpus_per_node]
    pairs = [
        (c, pg) for c, pg in [(groups.created[0], groups.world)] + list(groups.members) if c["kind"] != "pp"
    ]
    exchange = exchange_for(host_group, rank)
    bounded = dist.get_backend(host_group) != "fake"
    failed, stuck = probe_groups(pairs, device, deadline, bounded=bounded, seconds=report.seconds)
    mine = [vars(Finding(rank, node, group_label(c), c["net"], error)) for c, error in failed]
    if stuck is not None:
        mine.append(
            vars(
                Finding(
                    rank,
                    node,
                    group_label(stuck),
                    stuck["net"],
                    f"no communicator after {deadline:g} s (still being created: a peer of this "
                    "group failed to create it, or cannot be reached)",
                )
            )
        )
    # peers still in their own probe answer up to one deadline after this rank
    answers = exchange.share("groups", mine, 2 * deadline)
    report.groups = "checked"
    found = [Finding(**f) for r in sorted(answers.by_rank) for f in answers.by_rank[r]]
    if found or answers.incomplete:
        messages = [f.message() for f in found]
        shown = "; ".join(answers.missing_messages(layout) + messages[:8])
        more = f" (and {len(messages) - 8} more)" if len(messages) > 8 else ""
        log = nccl_log_path(os.environ)
        raise FabricError(
            "fabric check failed (groups): cannot create these communicators: "
            + shown
            + more
            + (f". NCCL's log on this rank: {log}" if log else ". Set NCCL_DEBUG=INFO to see why")
            + ". Fix the pods' network for these groups (training.fabricCheck cannot train around "
            "a communicator that does not exist)"
        )


def _decide(mode: str, findings: list[Finding], what: str) -> None:
    if mode == "fail" and findings:
        shown = "; ".join(f.message() for f in findings[:8])
        more = f" (and {len(findings) - 8} more)" if len(findings) > 8 else ""
        raise FabricError(
            f"fabric check failed ({what}): {shown}{more}. Fix the pods' RDMA setup, or set "
            "training.fabricCheck: warn to train anyway on Socket at the slower speed"
        )
