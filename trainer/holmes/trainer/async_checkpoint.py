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
   The staging buffer is in shared memory and reaches the checkpoint process once; a save
   sends only where each tensor lies in it (:class:`StagedState`), and each tensor there
   owns exactly its bytes, so DCP's writer writes it without a copy. The checkpoint process
   runs at a lower CPU priority (``CHECKPOINT_NICE``): background work that yields to the
   training process where they share cores. The planner caches its plans
   (``enable_plan_caching``), so saves after the first plan nothing when nothing changed.
   Then, on a thread of this module, the **commit**: every rank reports whether its write
   finished (gathered over the checkpoint group), and only when all did does rank 0 write
   ``holmes.json`` (checkpoint.write_marker). A save that failed anywhere leaves a directory
   without the marker, which nothing resumes from (checkpoint.py).

Both threads use the checkpoint group (gloo, its own long timeout) and only one save is in
flight, so its collectives never interleave with another's; the training thread never uses
that group while a save is in flight (a resume happens before the first save). Failures are
raised on the training thread at the next point every rank passes alike (the next save,
:meth:`wait` at the end or on preemption): a rank that raised earlier would leave the others
waiting in their next collective.
"""

from __future__ import annotations

import multiprocessing.util
import os
import signal
import time
import uuid
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
_NOWHERE = object()  # no checkpoint process has the staging buffer yet

# A staged state's layout in its buffer: (key, the global shape of a Chunks or None for a plain
# tensor, [(chunk offsets or None, byte offset in the buffer, shape, dtype)]).
Recipe = list[tuple[str, tuple[int, ...] | None, list[tuple[Any, int, tuple[int, ...], torch.dtype]]]]


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
        self._token = ""  # names the buffer to the checkpoint process
        self._sent_to: Any = _NOWHERE  # the checkpoint process that has it (its pid)

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._synchronize_after_execute

    @property
    def staged_bytes(self) -> int:
        """Host memory the staging buffer holds."""
        return 0 if self._flat is None else self._flat.numel()

    def _buffer(self, tensors: list[torch.Tensor]) -> list[int]:
        """Where each tensor goes in the one buffer, kept while the shapes stay the same."""
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
            self._token = uuid.uuid4().hex
            self._sent_to = _NOWHERE
        return offsets

    def stage(self, state: dict[str, Any]) -> StagedState:
        from torch.distributed.tensor import DTensor

        sources: list[torch.Tensor] = []
        shapes: list[tuple[str, tuple[int, ...] | None, list[tuple[int, ...] | None]]] = []
        for key, value in state.items():
            if isinstance(value, checkpoint.Chunks):
                shapes.append((key, tuple(value.shape), [tuple(o) for o, _ in value._pieces]))
                sources += [t for _, t in value._pieces]
            elif isinstance(value, DTensor):  # the one chunk it is, at its offsets
                (chunk,) = value.__create_chunk_list__()
                shapes.append((key, tuple(value.shape), [tuple(chunk.offsets)]))
                sources.append(value.to_local())
            elif isinstance(value, torch.Tensor):
                shapes.append((key, None, [None]))
                sources.append(value)
            else:
                raise TypeError(f"checkpoint state {key}: cannot stage a {type(value).__name__}")
        offsets = iter(zip(self._buffer(sources), sources))
        recipe: Recipe = [
            (key, size, [(o, at, tuple(t.shape), t.dtype) for o, (at, t) in zip(chunks, offsets)])
            for key, size, chunks in shapes
        ]
        assert self._flat is not None
        views = _views(self._flat, recipe)
        for dst, src in zip(views, sources):
            dst.copy_(src.detach(), non_blocking=self.pin)
        if self.pin and torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()  # the writer reads the buffers next
        return StagedState(self, recipe, _state(views, recipe))

    def transfer(self) -> tuple[str, torch.Tensor | None]:
        """What a pickled :class:`StagedState` carries besides its recipe: this buffer's token,
        and the buffer itself (a shared-memory handle) only if the checkpoint process has not
        received it yet, so a save sends a few kilobytes, not a handle per tensor."""
        from torch.distributed.checkpoint import _async_process_executor as executor

        proc = executor._CHECKPOINT_PROCESS
        dest = None if proc is None else proc._save_process.pid
        send = self._flat if self._sent_to != dest else None
        self._sent_to = dest
        return self._token, send

    def synchronize_staging(self) -> None:
        """Nothing to wait for: :meth:`stage` returns staged state."""

    def close(self) -> None:
        if self._flat is not None and self._registered:
            torch.cuda.cudart().cudaHostUnregister(self._flat.data_ptr())
        self._flat, self._specs, self._registered = None, [], False
        self._token, self._sent_to = "", _NOWHERE


def _views(flat: torch.Tensor, recipe: Recipe) -> list[torch.Tensor]:
    """One tensor per piece of ``recipe``, each on a storage of exactly its own bytes in
    ``flat`` (no copy): DCP's file writer clones a tensor whose storage is larger than itself,
    which views of the one buffer would all be."""
    whole = flat.numpy()
    return [
        torch.from_numpy(whole[at : at + _nbytes(shape, dtype)]).view(dtype).view(shape)
        for _, _, pieces in recipe
        for _, at, shape, dtype in pieces
    ]


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def _state(tensors: list[torch.Tensor], recipe: Recipe) -> dict[str, Any]:
    """The state dict ``recipe`` describes, on its pieces' ``tensors`` (:func:`_views`)."""
    views = iter(tensors)
    out: dict[str, Any] = {}
    for key, size, pieces in recipe:
        if size is None:
            out[key] = next(views)
        else:
            out[key] = checkpoint.Chunks(size, [(o, next(views)) for o, _, _, _ in pieces])
    return out


class StagedState(dict[str, Any]):
    """A staged state (:meth:`HostStager.stage`): DCP's state dict, whose tensors live in the
    stager's buffer. Sent to the checkpoint process (pickled through its pipe), it is its
    recipe and the buffer's token; the buffer (shared memory) goes along only the first time,
    and the checkpoint process keeps it (:func:`_rebuild_staged`). Pickled by torch's
    reductions instead, it would be a shared-memory handle fetched from this process and a
    rebuilt tensor per tensor, every save, on threads of the training process."""

    def __init__(self, stager: HostStager, recipe: Recipe, state: dict[str, Any]):
        super().__init__(state)
        self._stager, self._recipe = stager, recipe

    def __reduce__(self) -> tuple[Any, ...]:
        token, flat = self._stager.transfer()
        return (_rebuild_staged, (token, flat, self._recipe))


_RECEIVED: dict[str, torch.Tensor] = {}  # in the checkpoint process: token -> staging buffer


def _rebuild_staged(token: str, flat: torch.Tensor | None, recipe: Recipe) -> dict[str, Any]:
    """In the checkpoint process: the staged state, on the staging buffer it keeps (a new one
    replaces the old: a rank has one)."""
    if flat is not None:
        _RECEIVED.clear()
        _RECEIVED[token] = flat
    if token not in _RECEIVED:
        raise checkpoint.CheckpointError(
            f"the checkpoint process never received staging buffer {token} (it has "
            f"{sorted(_RECEIVED) or 'none'}): a save sent it a recipe without its buffer"
        )
    return _state(_views(_RECEIVED[token], recipe), recipe)


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
            self._started = _starter().submit(self._start_process, start_process_info(group))

    def _start_process(self, info: Any) -> None:
        """Spawn the checkpoint process while training goes on (its start, a fresh interpreter
        importing torch and a gloo group over every rank, would otherwise fall on the first
        save): torch 2.13 keeps one per process, which async_save then finds."""
        from torch.distributed.checkpoint import _async_process_executor as executor

        t0 = time.perf_counter()
        if executor._CHECKPOINT_PROCESS is None:
            executor._CHECKPOINT_PROCESS = executor._AsyncCheckpointProcess(pg_init_info=info)
            # at exit, before multiprocessing terminates (SIGTERM, ignored) and joins its daemon
            # children; a finalizer, not atexit: a forked multiprocessing child runs no atexit
            multiprocessing.util.Finalize(None, stop_checkpoint_process, exitpriority=100)
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
            died = self._checkpoint_process_death()
            if died is not None:
                # The other ranks' checkpoint processes wait for this one in their gloo group
                # (until its 30-minute timeout) and so would this rank in the exchange below:
                # this rank stops now, and the job restarts from its newest complete checkpoint.
                raise CheckpointProcessDied(
                    self.rank, died, f"while checkpoint {path} was being written"
                ) from e
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

    def _checkpoint_process_death(self, settle: float = 1.0) -> str | None:
        """How this rank's checkpoint process ended, if it has (a save's failure is then this
        rank's alone: DCP reports a failure inside a save to every rank, a dead process to none).
        ``settle``: how long to wait for its exit (a save that failed on its pipe's EOF)."""
        from torch.distributed.checkpoint import _async_process_executor as executor

        proc = executor._CHECKPOINT_PROCESS
        if self.writer != AsyncCheckpointerType.PROCESS or proc is None:
            return None
        sp = proc._save_process
        deadline = time.monotonic() + settle
        while _exists(sp.pid) and sp.is_alive():
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        sp.join(timeout=1.0)  # gone: reaped for its exit code (by whichever thread asked first)
        # a thread that reaped it first sets the code a moment after its waitpid; this one's
        # waitpid then fails (ECHILD) and reads None until it does (seen under load)
        end = time.monotonic() + 2.0
        while sp.exitcode is None and time.monotonic() < end:
            time.sleep(0.01)
        code = sp.exitcode
        if code is None:
            return f"(pid {sp.pid}) ended"
        if code < 0:
            try:
                return f"(pid {sp.pid}) was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"(pid {sp.pid}) was killed by signal {-code}"
        return f"(pid {sp.pid}) exited with code {code}"

    def poll(self) -> Saved | None:
        """The in-flight save if it committed meanwhile (not collective: a failure waits for
        :meth:`wait`). Raises :class:`CheckpointProcessDied` at once, not at the next save: the
        iterations trained meanwhile would all be lost."""
        p, saved = self._pending, None
        if p is not None and p.done():
            if p.exception() is None or isinstance(p.exception(), CheckpointProcessDied):
                saved = self._collect()
        if self._started is not None and self._started.done():
            died = self._checkpoint_process_death(settle=0)  # is it still there?
            if died is not None:
                when = "between saves" if self._pending is None else "while a checkpoint was being written"
                raise CheckpointProcessDied(self.rank, died, when)
        return saved

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


def _exists(pid: int) -> bool:
    """Whether ``pid`` still runs: not a zombie, not reaped. Neither its reaping (waitpid
    answers only the first of two threads that ask; the other reads it as alive) nor its
    sentinel pipe (held open by a process that inherited it) says so reliably."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][:1] not in ("Z", "X")
    except (OSError, IndexError):
        return False


class CheckpointProcessDied(checkpoint.CheckpointError):
    """This rank's checkpoint process is gone (the OOM killer, a kill). Its peers in the save's
    gloo ring wait for it (gloo tells only its neighbours) and this rank would wait for them in
    the exchange of outcomes: the rank stops instead, and the job restarts from its newest
    complete checkpoint as after a crash."""

    def __init__(self, rank: int, how: str, when: str):
        super().__init__(
            f"rank {rank}: its checkpoint process {how} {when}; the rank stops so that the job "
            "restarts from its newest complete checkpoint. If it was the kernel's OOM killer, "
            "give the pods more memory (the dry run reports host memory per node)"
        )


_STARTER: ThreadPoolExecutor | None = None


def _starter() -> ThreadPoolExecutor:
    """The thread that starts the checkpoint process, one per process and kept until it
    exits: the process dies with the thread that started it (:func:`_die_with_parent`), so
    not a checkpointer's own thread, which ends with it while a later one (a second Trainer
    in one process) reuses the process."""
    global _STARTER
    if _STARTER is None:
        _STARTER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="holmes-checkpoint-start")
    return _STARTER


def _forget_starter() -> None:
    global _STARTER
    _STARTER = None  # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_forget_starter)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
CHECKPOINT_NICE = 10  # the checkpoint process's niceness: it yields the CPU to training


class _IgnoringStopSignals(_ProcessGroupInitInfo):
    """torch's start information for the checkpoint process, which ignores the pod's stop
    signals from the moment it unpickles this (its first step after the interpreter's start).
    A pod's SIGTERM reaches the whole process group (torchrun signals its workers' groups; a
    runtime may signal every process) and would kill it, losing the save on preemption
    (preempt.py) that goes through it. Python's spawn resets a blocked signal mask, and only
    the main thread may set dispositions, hence here (and its niceness, CHECKPOINT_NICE, for
    its whole life). It ends on request (:func:`stop_checkpoint_process`), and by SIGKILL
    when its rank's process ends (the kernel's parent-death signal): its pipe's EOF is read
    only between saves, so a rank that left while it started or wrote left it waiting in its
    gloo group for half an hour, holding the rank's stdout and stderr open (a launcher's
    reader, a test's, waited as long)."""

    def __init__(self, group: Any):
        super().__init__(group)
        self.rank_pid = os.getpid()

    def __setstate__(self, state: dict[str, Any]) -> None:
        # first: the rank may be gone already (then its pid is no longer this one's parent)
        _die_with_parent()
        if os.getppid() != state["rank_pid"]:
            os._exit(0)
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        os.nice(CHECKPOINT_NICE)
        self.__dict__.update(state)


def _die_with_parent() -> None:
    """SIGKILL this process when the thread that started it ends (prctl PR_SET_PDEATHSIG):
    :func:`_starter`'s, which lives as long as the rank's process."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def stop_checkpoint_process(timeout: float = 30.0) -> None:
    """End this process's checkpoint process (at exit, before multiprocessing's own exit hook
    would SIGTERM it, which it ignores, and join it for ever): ask it to stop, which it
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
