"""Checkpoints that do not stop training: stage to host memory, write in the background.

A save (:meth:`AsyncCheckpointer.save`, collective over the checkpoint group) has two parts:

1. **Staging**, on the training thread: every tensor of the rank's state (what it writes: its
   share of the stage's weights and its optimizer shard) is copied into one host buffer this
   rank keeps from one save to the next (:class:`HostStager`; pinned on a GPU, so the
   device-to-host copies are DMA transfers). This is what the iteration pays: one copy of the
   rank's state at memory bandwidth. The buffer exists once, of exactly that size, so staging
   is bounded to one copy of the state: a save waits for the previous one to finish before it
   overwrites it.
2. **Writing**, in a checkpoint process of this rank's own (``torch.distributed.checkpoint
   .async_save`` with torch 2.13's process-based executor: a spawned daemon with a gloo group
   of its own over all ranks, started at the first save and kept): DCP's plan exchange and the
   file writes, while the next iterations run, without holding the training process's GIL
   (on a thread, DCP's planning and writing took it from a Python-dispatched training loop).
   The staged state reaches it as shared-memory handles (the staging buffer is allocated in
   shared memory), not a copy; the planner caches its plans (``enable_plan_caching``), so
   saves after the first send no plan when nothing changed. Then, on a thread of this module,
   the **commit**: every rank reports
   whether its write finished (gathered over the checkpoint group), and only when all did
   does rank 0 write ``holmes.json`` (checkpoint.write_marker). A save that failed anywhere
   leaves a directory without the marker, which nothing resumes from (checkpoint.py).

Both threads use the checkpoint group (gloo, its own long timeout) and only one save is in
flight, so its collectives never interleave with another's; the training thread never uses
that group while a save is in flight (a resume happens before the first save). Failures are
raised on the training thread at the next point every rank passes alike (the next save,
:meth:`wait` at the end or on preemption): a rank that raised earlier would leave the others
waiting in their next collective.
"""

from __future__ import annotations

import atexit
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._async_process_executor import _ProcessGroupInitInfo
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from . import checkpoint

ALIGN = 512  # bytes between tensors in the staging buffer (every dtype's alignment, and more)


def staging_offsets(nbytes: list[int]) -> tuple[list[int], int]:
    """Where each tensor of ``nbytes`` starts in one staging buffer, and its size."""
    offsets, at = [], 0
    for n in nbytes:
        offsets.append(at)
        at += -(-n // ALIGN) * ALIGN
    return offsets, at


class HostStager:
    """``torch.distributed.checkpoint``'s AsyncStager protocol for Holmes' state: a copy of each
    tensor (plain, :class:`checkpoint.Chunks` pieces, a DTensor's local shard) into host memory
    kept between saves. A DTensor is staged as the one chunk it is (its offsets in the global
    tensor), so the checkpoint's metadata is the same as a synchronous save's.

    The host memory is bounded to what the rank writes, exactly: one buffer of
    :func:`staging_offsets`' size (the rank's state is its share of the stage's weights,
    checkpoint.model_tensors, and its optimizer shard), allocated once and pinned on a GPU by
    registering it with CUDA (``cudaHostRegister``), not through torch's caching host allocator,
    which rounds every pinned block up to a power of two and keeps it. ``staged_bytes`` is that
    size; a state of another shape replaces the buffer."""

    _synchronize_after_execute = False  # stage() returns only once the copies have landed

    def __init__(self, pin: bool | None = None, shared: bool = False):
        self.pin = torch.cuda.is_available() if pin is None else pin
        self.shared = shared  # in shared memory: a checkpoint process reads it without a copy
        self._flat: torch.Tensor | None = None
        self._specs: list[tuple[tuple[int, ...], torch.dtype]] = []
        self._registered = False

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._synchronize_after_execute

    @property
    def staged_bytes(self) -> int:
        """Host memory the staging buffer holds."""
        return 0 if self._flat is None else self._flat.numel()

    def _buffers(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """One host view per tensor, in one buffer kept while the shapes stay the same."""
        specs = [(tuple(t.shape), t.dtype) for t in tensors]
        offsets, total = staging_offsets([t.numel() * t.element_size() for t in tensors])
        if self._flat is None or specs != self._specs:
            self.close()
            self._flat = torch.empty(total, dtype=torch.uint8, device="cpu")
            if self.shared:  # before registering: share_memory_ moves the storage
                self._flat.share_memory_()
            if self.pin:
                # exact size, page-locked for DMA; the caching host allocator would round it up
                torch.cuda.cudart().cudaHostRegister(self._flat.data_ptr(), total, 0)
                self._registered = True
            self._specs = specs
        flat = self._flat
        return [
            flat[o : o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for o, t in zip(offsets, tensors)
        ]

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        from torch.distributed.tensor import DTensor

        sources: list[torch.Tensor] = []
        for key, value in state.items():
            if isinstance(value, checkpoint.Chunks):
                sources += [t for _, t in value._pieces]
            elif isinstance(value, DTensor):
                sources.append(value.to_local())
            elif isinstance(value, torch.Tensor):
                sources.append(value)
            else:
                raise TypeError(f"checkpoint state {key}: cannot stage a {type(value).__name__}")
        bufs = iter(self._buffers(sources))

        def copy(t: torch.Tensor) -> torch.Tensor:
            buf = next(bufs)
            buf.copy_(t.detach(), non_blocking=self.pin)
            return buf

        out: dict[str, Any] = {}
        for key, value in state.items():
            if isinstance(value, checkpoint.Chunks):
                out[key] = checkpoint.Chunks(tuple(value.shape), [(o, copy(t)) for o, t in value._pieces])
            elif isinstance(value, DTensor):
                (chunk,) = value.__create_chunk_list__()
                local = copy(value.to_local())
                out[key] = checkpoint.Chunks(tuple(value.shape), [(tuple(chunk.offsets), local)])
            else:
                out[key] = copy(value)
        if self.pin and torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()  # the writer thread reads the buffers next
        return out

    def synchronize_staging(self) -> None:
        """Nothing to wait for: :meth:`stage` returns staged state."""

    def close(self) -> None:
        if self._flat is not None and self._registered:
            torch.cuda.cudart().cudaHostUnregister(self._flat.data_ptr())
        self._flat, self._specs, self._registered = None, [], False


@dataclass
class Saved:
    """One committed checkpoint."""

    iteration: int
    path: str
    stage_seconds: float  # what the training thread paid
    total_seconds: float  # staging to commit


class AsyncCheckpointer:
    """At most one save in flight; see the module docstring. ``group``: the checkpoint group
    (it needs a CPU backend: gloo). ``on_commit`` runs on the training thread for each save
    that committed, from :meth:`poll` or :meth:`wait`."""

    def __init__(
        self,
        group: Any,
        rank: int,
        on_commit: Callable[[Saved], None] | None = None,
        writer: str = "process",
    ):
        """``writer``: "process" (the default: a checkpoint process of its own) or "thread"
        (DCP's thread in this process, as before issue 54; the bench compares them)."""
        self.group, self.rank, self.on_commit = group, rank, on_commit
        if writer not in ("process", "thread"):
            raise ValueError(f"writer {writer!r}: process or thread")
        self.writer = AsyncCheckpointerType.PROCESS if writer == "process" else AsyncCheckpointerType.THREAD
        self.stager = HostStager(shared=writer == "process")
        self._commit = ThreadPoolExecutor(max_workers=1, thread_name_prefix="holmes-checkpoint")
        self._pending: Future[Saved] | None = None
        self.in_flight_iteration: int | None = None
        self.start_seconds: float | None = None  # the checkpoint process's start, once it is up
        self._started: Future[None] | None = None
        if writer == "process":
            self._started = self._commit.submit(self._start_process, start_process_info(group))

    def _start_process(self, info: Any) -> None:
        """Spawn the checkpoint process while training goes on (its start, a fresh interpreter
        importing torch and a gloo group over every rank, would otherwise fall on the first
        save): torch 2.13 keeps one per process, which async_save then finds."""
        from torch.distributed.checkpoint import _async_process_executor as executor

        t0 = time.perf_counter()
        if executor._CHECKPOINT_PROCESS is None:
            executor._CHECKPOINT_PROCESS = executor._AsyncCheckpointProcess(pg_init_info=info)
            atexit.register(stop_checkpoint_process)
        self.start_seconds = time.perf_counter() - t0

    def ready(self) -> None:
        """Block until the checkpoint process is up (the first save does; the bench, to time
        the steady state apart from the one-time start)."""
        if self._started is not None:
            self._started.result()

    def save(self, root: str, iteration: int, state: dict[str, Any], meta: dict[str, Any]) -> str:
        """Stage ``state`` and start writing it as ``iter_<iteration>``; returns the directory.
        Waits first for the previous save (and raises its failure) and the checkpoint process's
        start."""
        self.wait()
        self.ready()
        path = checkpoint.iteration_dir(root, iteration)
        t0 = time.perf_counter()
        upload = dcp.async_save(
            state,
            checkpoint_id=path,
            process_group=self.group,
            async_stager=self.stager,
            async_checkpointer_type=self.writer,
            planner=DefaultSavePlanner(enable_plan_caching=True),
        )
        staged = time.perf_counter() - t0
        if not isinstance(upload, Future):  # an AsyncSaveResponse: staging of its own (not ours)
            upload = upload.upload_completion
        self.in_flight_iteration = iteration
        self._pending = self._commit.submit(self._finish, upload, path, iteration, meta, t0, staged)
        return path

    def _finish(
        self, upload: Future, path: str, iteration: int, meta: dict[str, Any], t0: float, staged: float
    ) -> Saved:
        """The commit thread: every rank's write outcome gathered, then the marker (rank 0)."""
        errors: dict[int, str] = {}
        try:
            upload.result()
        except BaseException as e:  # reported to every rank below, raised on the training thread
            errors = _causes(e, self.rank)
        outcomes: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(outcomes, errors, group=self.group)
        failed = {r: e for each in outcomes for r, e in each.items()}
        if failed:
            raise checkpoint.CheckpointError(
                f"checkpoint {path} was not completed: "
                + "; ".join(f"rank {r}: {e}" for r, e in sorted(failed.items()))
                + f". It has no {checkpoint.MARKER} and is never resumed from; check the volume "
                "behind spec.training.checkpoint.path (space, permissions) on those ranks' nodes"
            )
        if self.rank == 0:
            checkpoint.write_marker(path, iteration, meta)
        dist.barrier(group=self.group)  # no rank reports the save done before the marker exists
        return Saved(iteration, path, staged, time.perf_counter() - t0)

    def poll(self) -> Saved | None:
        """The in-flight save if it committed meanwhile (not collective: a failure waits for
        :meth:`wait`)."""
        p = self._pending
        if p is None or not p.done() or p.exception() is not None:
            return None
        return self._collect()

    def wait(self) -> Saved | None:
        """Block until the in-flight save (if any) is committed; raise its failure here."""
        if self._pending is None:
            return None
        self._pending.exception()  # blocks
        return self._collect()

    def _collect(self) -> Saved:
        p, self._pending, self.in_flight_iteration = self._pending, None, None
        assert p is not None
        saved = p.result()  # raises the commit's CheckpointError
        if self.on_commit is not None:
            self.on_commit(saved)
        return saved

    def close(self) -> None:
        """Wait for the in-flight save, then free the staging buffers and the thread."""
        try:
            self.wait()
        finally:
            self._commit.shutdown(wait=True)
            self.stager.close()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _IgnoringStopSignals(_ProcessGroupInitInfo):
    """torch's start information for the checkpoint process, which ignores the pod's stop
    signals from the moment it unpickles this (its first step after the interpreter's start).
    A pod's SIGTERM reaches the whole process group (torchrun signals its workers' groups; a
    runtime may signal every process) and would kill it, losing the save on preemption
    (preempt.py) that goes through it. Python's spawn resets a blocked signal mask, and only
    the main thread may set dispositions, hence here. It ends on request
    (:func:`stop_checkpoint_process`), on its pipe's EOF when its rank dies, or by SIGKILL at
    the end of the pod's grace period."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        self.__dict__.update(state)


def stop_checkpoint_process(timeout: float = 30.0) -> None:
    """End this process's checkpoint process (at exit; before multiprocessing's own exit hook,
    which would SIGTERM it, which it blocks, and join it for ever): ask it to stop, which it
    does between saves, then SIGKILL it if it has not within ``timeout`` seconds."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    proc, executor._CHECKPOINT_PROCESS = executor._CHECKPOINT_PROCESS, None
    if proc is None or not proc._save_process.is_alive():
        return
    try:
        proc._send(executor._CheckpointSaveProcessControlOpts.TERMINATE)
    except OSError:
        pass  # its pipe is gone: it is exiting already
    proc._save_process.join(timeout)
    if proc._save_process.is_alive():
        proc._save_process.kill()
        proc._save_process.join(5)


def start_process_info(group: Any) -> Any:
    """Collective over ``group``: where the checkpoint processes' own gloo group meets (torch's
    _ProcessGroupInitInfo: a free port on rank 0, broadcast), or None when this process has its
    checkpoint process already (a second Trainer in one process)."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    if executor._CHECKPOINT_PROCESS is not None:
        return None
    return _IgnoringStopSignals(group)


def _causes(error: BaseException, rank: int) -> dict[int, str]:
    """rank -> what failed there: DCP gathers every rank's failure into one CheckpointException
    (keyed by rank in the checkpoint group, which spans the world)."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(error, CheckpointException):
        return {r: f"{type(e).__name__}: {str(e)[:300]}" for r, (e, _) in error.failures.items()}
    return {rank: f"{type(error).__name__}: {str(error)[:300]}"}
