"""What one rank does to the GPU and the network, seen below every Python wrapper.

:class:`Recorder` is a ``TorchDispatchMode``: every operator the engine, torch's autograd and
torch.distributed.pipelining run reaches it, so nothing escapes by calling a different Python
function. From that stream it keeps

- **collectives and p2p**: every ``c10d`` operator (all-reduce, reduce-scatter, all-gather,
  send, recv, ...) with its group's global ranks, dtype and bytes, in issue order. A replica's
  ranks are numbered after the replicas before it (``rank_offset``, the pods' order), and a group
  outside the replica's world (the outer group over replicas, outer.py) is named to the recorder
  with its ranks (``outside_groups``);
- **host syncs**: operators that make the host wait for the device: ``_local_scalar_dense``
  (``.item()``, ``float(t)``), ``nonzero``, and copies between host and device that block:
  device to host unless ``non_blocking``; host to device unless ``non_blocking`` *and* from
  pinned memory (a pageable source makes the copy synchronous);
- **memory**: every storage an operator creates, by category (the label active when it was
  made, see :meth:`Recorder.label`), until the storage is freed; the peak and its breakdown.

Under FakeTensorMode a data-dependent read has no value to return: the recorder answers it
(1 / 1.0 / True) after recording it, which is what a healthy run would see for the engine's
checks (finite loss, a vote of "static shapes").
"""

from __future__ import annotations

import contextlib
import weakref
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .fakecuda import python_location

# GPU memory a NCCL communicator holds beyond tensors: NCCL_BUFFSIZE (4 MiB) per channel and
# direction for its ring/tree channels, plus proxy and work FIFOs; about 100 MiB for 8-64 ranks.
# A model, not a measurement: operator/holmes/plan/costmodel.py uses the same number.
NCCL_COMMUNICATOR_BYTES = 100 * 2**20
# outer: the replicas' outer optimizer (outer.py): anchor, momentum and the exchange's buffers
CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer",
    "outer",
    "activations",
    "pipelineBuffers",
    "communication",
)

aten = torch.ops.aten
_SCALAR = aten._local_scalar_dense.default
_COPIES = {aten.copy_.default, aten._to_copy.default}
_PIN = {aten._pin_memory.default}
_IS_PINNED = aten.is_pinned.default
_P2P = {"send", "recv_", "recv_any_source_"}


@dataclass
class Collective:
    group: tuple[int, ...]  # global ranks
    op: str  # c10d operator, e.g. allreduce_, _reduce_scatter_base_, send, recv_
    dtype: str
    bytes: int
    peer: int | None = None  # p2p: the other rank (global)
    phase: str = ""
    device: str = "cuda"  # where the tensors are: cuda (a device communicator) or cpu (gloo)
    name: str = ""  # the group's name: two groups of the same ranks are two communicators
    # p2p issued inside dist.batch_isend_irecv (NCCL: the group's communicator); a send or recv
    # issued alone (torch 2.13's _batch_p2p for all-send or all-recv batches) runs on a 2-rank
    # communicator of its own (ProcessGroupNCCL::pointToPoint keys it by the pair)
    batched: bool = False

    def key(self) -> tuple[Any, ...]:
        return (self.op, self.dtype, self.bytes)

    def to_json(self) -> dict[str, Any]:
        out = {"group": list(self.group), "op": self.op, "dtype": self.dtype, "bytes": self.bytes}
        out.update(device=self.device, name=self.name)
        if self.peer is not None:
            out["peer"] = self.peer
            out["batched"] = self.batched
        return out


@dataclass
class HostSync:
    what: str
    where: str
    phase: str


@dataclass
class Memory:
    current: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    peak: int = 0
    peak_by: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    peak_phase: str = ""
    phase_peaks: dict[str, dict[str, int]] = field(default_factory=dict)  # phase -> breakdown at its peak

    @property
    def total(self) -> int:
        return sum(self.current.values())


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


class Recorder(TorchDispatchMode):
    def __init__(self, rank_offset: int = 0) -> None:
        super().__init__()
        self.rank_offset = rank_offset  # global rank of this world's rank 0 (a replica's first)
        self.outside_groups: dict[str, tuple[int, ...]] = {}  # name -> global ranks
        self.collectives: list[Collective] = []
        self.host_syncs: list[HostSync] = []
        self.memory = Memory()
        self.phase = "build"
        self._labels: list[str] = ["activations"]
        self._live: dict[int, tuple[str, int]] = {}  # storage key -> (category, bytes)
        self._pinned: set[int] = set()
        self.host_groups: set[str] = set()  # names of groups that are gloo in a real run
        self._batching = 0  # inside dist.batch_isend_irecv (see batched_p2p)

    # ---- labels and bookkeeping -------------------------------------------------------------
    @contextlib.contextmanager
    def label(self, category: str) -> Iterator[None]:
        """Storages created inside count as ``category``."""
        self._labels.append(category)
        try:
            yield
        finally:
            self._labels.pop()

    @contextlib.contextmanager
    def batched_p2p(self) -> Iterator[None]:
        """Mark the sends and receives issued inside ``dist.batch_isend_irecv`` as batched
        (``Collective.batched``): the c10d operators look alike either way, the communicator
        NCCL runs them on does not. Wraps it where torch's callers look it up."""
        import torch.distributed.distributed_c10d as c10d

        real = c10d.batch_isend_irecv

        def batched(p2p_op_list: Any) -> Any:
            self._batching += 1
            try:
                return real(p2p_op_list)
            finally:
                self._batching -= 1

        c10d.batch_isend_irecv = dist.batch_isend_irecv = batched
        try:
            yield
        finally:
            c10d.batch_isend_irecv = dist.batch_isend_irecv = real

    def relabel(self, tensor: torch.Tensor | None, category: str) -> None:
        """Count ``tensor``'s storage as ``category`` from now on."""
        if tensor is None:
            return
        key = tensor.untyped_storage()._cdata
        if key in self._live:
            old, n = self._live[key]
            self.memory.current[old] -= n
            self.memory.current[category] += n
            self._live[key] = (category, n)

    def add_fixed(self, category: str, nbytes: int) -> None:
        """Memory that no tensor shows (a communicator's buffers), held from now on."""
        self.memory.current[category] += nbytes
        self._check_peak()

    def _check_peak(self) -> None:
        m = self.memory
        total = m.total
        if total > sum(m.phase_peaks.get(self.phase, {}).values()):
            m.phase_peaks[self.phase] = dict(m.current)
        if total > m.peak:
            m.peak, m.peak_by, m.peak_phase = total, dict(m.current), self.phase

    def _free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self.memory.current[entry[0]] -= entry[1]
        self._pinned.discard(key)

    def _track(self, out: Any, pinned: bool = False) -> None:
        grew = False
        for t in _tensors(out):
            if t.device.type == "cpu" and not pinned:
                continue  # host memory: not the GPU's
            st = t.untyped_storage()
            key = st._cdata
            if pinned:
                self._pinned.add(key)
            if key in self._live or t.device.type == "cpu":
                continue
            n = st.nbytes()
            cat = self._labels[-1]
            self._live[key] = (cat, n)
            self.memory.current[cat] += n
            weakref.finalize(st, self._free, key)
            grew = True
        if grew:
            self._check_peak()

    def _sync(self, what: str) -> None:
        self.host_syncs.append(HostSync(what, python_location(), self.phase))

    def on_host_sync(self, what: str) -> None:
        """For fake_cuda's torch.cuda stand-ins."""
        self._sync(what)

    # ---- the dispatch ----------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            self._collective(func, args)
        elif func is _SCALAR:
            t = args[0]
            if t.device.type == "cpu":  # a host read of host memory: no sync
                try:
                    return func(*args, **kwargs)  # FakeTensorMode knows constants
                except DataDependentOutputException:
                    pass
            else:
                self._sync("item (_local_scalar_dense)")
            if t.dtype == torch.bool:
                return True
            return 1.0 if t.dtype.is_floating_point else 1
        elif func is aten.nonzero.default and args[0].device.type != "cpu":
            self._sync("nonzero")
        elif func in _PIN:
            out = aten.clone.default(args[0])
            self._track(out, pinned=True)
            return out
        elif func is _IS_PINNED:
            return args[0].untyped_storage()._cdata in self._pinned
        elif func in _COPIES:
            self._copy(func, args, kwargs)
        out = func(*args, **kwargs)
        self._track(out)
        return out

    def _group(self, arg: Any) -> tuple[tuple[int, ...], str] | None:
        """(global ranks, name) of a c10d operator's process-group argument."""
        if isinstance(arg, torch.ScriptObject):
            try:
                arg = dist.ProcessGroup.unbox(arg)
            except Exception:
                return None
        if not isinstance(arg, dist.ProcessGroup):
            return None
        name = arg.group_name
        if name in self.outside_groups:
            return self.outside_groups[name], name
        return tuple(self.rank_offset + r for r in dist.get_process_group_ranks(arg)), name

    def _copy(self, func: Any, args: tuple, kwargs: dict) -> None:
        if func is aten.copy_.default:
            dst, src = args[0], args[1]
            non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            to = dst.device
        else:
            src = args[0]
            to = kwargs.get("device") or src.device
            non_blocking = bool(kwargs.get("non_blocking", False))
        frm = src.device
        if torch.device(to).type == frm.type:
            return
        if frm.type == "cpu":  # host -> device
            pinned = src.untyped_storage()._cdata in self._pinned
            if not (non_blocking and pinned):
                why = "pageable source" if not pinned else "non_blocking=False"
                self._sync(f"blocking host->device copy ({why})")
        elif not non_blocking:
            self._sync("blocking device->host copy")

    def _collective(self, func: Any, args: tuple) -> None:
        op = func._schema.name.split("::")[-1]
        group, name = next((g for g in map(self._group, args) if g is not None), ((), ""))
        tensors = _tensors(args[0]) if args else []
        if op in ("_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_"):
            tensors = _tensors(args[1])  # the input: what each rank puts on the wire
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        dtype = str(tensors[0].dtype).replace("torch.", "") if tensors else ""
        peer = None
        if op in _P2P and group and len(args) > 2 and isinstance(args[2], int):
            peer = group[args[2]]  # c10d's send/recv take the peer's rank in the group
        device = tensors[0].device.type if tensors else "cpu"
        batched = op in _P2P and self._batching > 0
        self.collectives.append(Collective(group, op, dtype, nbytes, peer, self.phase, device, name, batched))


def device_communicators(
    kinds: dict[str, dict[str, Any]], world: str, world_net: str, calls: list[Collective]
) -> list[dict[str, Any]]:
    """NCCL makes a communicator lazily for each group the first time a collective (or a
    batch_isend_irecv) uses it with device tensors, and one more per peer the first time a send
    or recv is issued alone (torch's ProcessGroupNCCL::pointToPoint keys those by the pair,
    whatever the group's size): torch 2.13's _batch_p2p issues every all-send or all-recv batch
    so, which is all the traffic of the looped and V-shaped schedules and 1F1B's warm-up and
    cool-down. Host (gloo) groups hold no GPU memory and are left out. ``kinds``: group name ->
    its entry as the trainer created it."""
    out: dict[tuple[str, int | None], dict[str, Any]] = {}
    for c in calls:
        if c.device == "cpu":
            continue
        made = kinds.get(c.name) or {
            "kind": "world" if c.name == world else "other",
            "size": len(c.group),
            "net": world_net if c.name == world else "?",
        }
        if c.peer is not None and not c.batched:
            entry = {"kind": f"{made['kind']} pair", "size": 2, "net": made.get("net"), "peer": c.peer}
            out.setdefault((c.name, c.peer), entry)
        else:
            out.setdefault((c.name, None), {k: made[k] for k in ("kind", "size", "net") if k in made})
    return list(out.values())


def sequences_by_group(records: dict[int, list[Collective]]) -> dict[tuple[int, ...], dict[int, list]]:
    """group -> rank -> that rank's sequence of collective keys on the group (p2p excluded)."""
    out: dict[tuple[int, ...], dict[int, list]] = defaultdict(dict)
    for rank, calls in records.items():
        per: dict[tuple[int, ...], list] = defaultdict(list)
        for c in calls:
            if c.op not in _P2P:
                per[c.group].append(c.key())
        for g, seq in per.items():
            out[g][rank] = seq
    return out


def sequence_problems(records: dict[int, list[Collective]]) -> list[str]:
    """Every group's collectives, identical in order, op, dtype and bytes on all its members that
    ran; every send matched by its peer's recv, in order (for pairs that both ran)."""
    problems = []
    for group, per_rank in sequences_by_group(records).items():
        ran = [r for r in group if r in records]
        seqs = {r: per_rank.get(r, []) for r in ran}
        if not ran:
            continue
        first = ran[0]
        for r in ran[1:]:
            a, b = seqs[first], seqs[r]
            if a != b:
                at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                problems.append(
                    f"group {_short(group)}: rank {first} and rank {r} differ at collective #{at} "
                    f"({_at(a, at)} vs {_at(b, at)}): they would deadlock or corrupt data"
                )
    channels: dict[tuple[tuple[int, ...], int | None, int | None, str], list] = defaultdict(list)
    for rank, calls in records.items():
        for c in calls:
            if c.op == "send":
                channels[(c.group, rank, c.peer, "send")].append((c.dtype, c.bytes))
            elif c.op in ("recv_", "recv_any_source_"):
                channels[(c.group, c.peer, rank, "recv")].append((c.dtype, c.bytes))
    for (group, src, dst, kind), seq in channels.items():
        if kind != "send" or dst not in records:
            continue
        got = channels.get((group, src, dst, "recv"), [])
        if got != seq:
            problems.append(
                f"group {_short(group)}: rank {src} sends {len(seq)} messages to rank {dst}, which "
                f"receives {len(got)} from it{' (sizes differ)' if len(got) == len(seq) else ''}"
            )
    for (group, src, dst, kind), seq in channels.items():
        if kind == "recv" and src in records and (group, src, dst, "send") not in channels:
            problems.append(
                f"group {_short(group)}: rank {dst} waits for {len(seq)} messages rank {src} never sends"
            )
    return problems


def _at(seq: list, i: int) -> str:
    return "/".join(map(str, seq[i])) if i < len(seq) else "nothing"


def _short(group: tuple[int, ...]) -> str:
    if len(group) <= 6:
        return str(list(group))
    return f"[{group[0]}, {group[1]}, ..., {group[-1]}] ({len(group)} ranks)"
