"""Graceful preemption: on SIGTERM, finish the iteration, agree on it, maybe save, exit 83.

Kubernetes stops a pod (deletion, eviction, preemption) with SIGTERM to its main process and
SIGKILL ``terminationGracePeriodSeconds`` later (the operator passes that as
``HOLMES_GRACE_SECONDS``; 30 when unset, as Kubernetes' default). torchrun (its elastic agent)
turns SIGTERM into an exception, sends SIGTERM to its workers' process groups, waits up to its
shutdown timeout (``--shutdown-timeout`` / ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, default 30 s),
then SIGKILLs them and exits 1, whatever the workers' exit codes (``holmes.trainer.run`` keeps
them).

In a worker, :class:`Preemption` is the SIGTERM handler: it only notes the time (the process
must not die in the middle of a collective). Only some pods may be stopped (one evicted node),
so the ranks agree through :class:`StopVote`: a gloo group over the world, built once, and per
iteration one asynchronous all-reduce of a 1-element CPU int (how many ranks were signalled),
launched when the iteration starts and waited for after its step, so it overlaps the iteration;
it never touches a GPU stream (a per-iteration NCCL all-reduce of a flag would make the host
wait for the device). Every rank launches it at the same point of every iteration, so the
collectives match. A signal that arrives during iteration i stops training after iteration i+1
at the latest (after i when it arrives before i's vote starts).

Then, if a checkpoint is wanted (``training.checkpoint.onPreemption``, or one was due at that
iteration anyway) and the estimated save time (the last save's, plus :data:`MARGIN_SECONDS`
and a quarter) fits in the least grace any rank has left, every rank saves; all decide alike
(one more all-reduce on the same group). The trainer then exits with
``holmes.contract.names.EXIT_PREEMPTED`` (83) on every rank.
"""

from __future__ import annotations

import math
import os
import signal
import time
from datetime import timedelta
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from holmes.contract.names import ENV_GRACE_SECONDS

DEFAULT_GRACE_SECONDS = 30.0  # Kubernetes' default terminationGracePeriodSeconds
TORCHRUN_SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
TORCHRUN_DEFAULT_SHUTDOWN_SECONDS = 30.0  # torchrun's SIGTERM -> SIGKILL wait when not set
MARGIN_SECONDS = 3.0  # leaving after the save: destroying groups, the launcher reaping workers
ENV_EXIT_DIR = "HOLMES_EXIT_DIR"  # where a worker notes its exit code for holmes.trainer.run


class Preemption:
    """Whether (and when) this process got SIGTERM. ``install`` makes the handler (main thread
    only); uninstalled, it is never requested (tests and tools that do not stop gracefully)."""

    def __init__(self) -> None:
        self.signalled_at: float | None = None

    def install(self) -> Preemption:
        signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signalled_at is None:  # only note it: the iteration boundary acts on it
            self.signalled_at = time.monotonic()

    def request(self) -> None:
        """As if SIGTERM had come now."""
        self._on_signal(signal.SIGTERM, None)

    @property
    def requested(self) -> bool:
        return self.signalled_at is not None

    def seconds_left(self, grace: float) -> float:
        """Of ``grace`` seconds from the signal; infinite when none came."""
        if self.signalled_at is None:
            return math.inf
        return grace - (time.monotonic() - self.signalled_at)


def grace_seconds(env: dict[str, str] | Any = None) -> float:
    """How long a worker has from SIGTERM to SIGKILL: ``HOLMES_GRACE_SECONDS`` (default 30),
    capped under torchrun by its shutdown timeout (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, which
    holmes.trainer.run sets to the grace; 30 s when torchrun runs us without it)."""
    env = os.environ if env is None else env
    grace = _seconds(env.get(ENV_GRACE_SECONDS), DEFAULT_GRACE_SECONDS)
    if env.get(TORCHRUN_SHUTDOWN_ENV):
        grace = min(grace, _seconds(env.get(TORCHRUN_SHUTDOWN_ENV), TORCHRUN_DEFAULT_SHUTDOWN_SECONDS))
    elif env.get("TORCHELASTIC_RUN_ID") is not None:
        grace = min(grace, TORCHRUN_DEFAULT_SHUTDOWN_SECONDS)
    return grace


def _seconds(value: str | None, default: float) -> float:
    """A number of seconds from the environment; unset or unreadable: ``default`` (a stop must
    not fail on a typo)."""
    try:
        return float(value) if value else default
    except ValueError:
        return default


def save_seconds_needed(last_save_seconds: float | None) -> float:
    """What a save must leave room for: the last one's time and a quarter (none yet: nothing,
    i.e. try) plus the margin to leave."""
    return (last_save_seconds or 0.0) * 1.25 + MARGIN_SECONDS


class StopVote:
    """All ranks agree at the same iteration boundary whether any rank got SIGTERM (module
    docstring). Collective: every rank builds it, launches and reads each vote alike."""

    def __init__(self, timeout_s: float, backend: str = "gloo"):
        self.group = dist.new_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        self._count: torch.Tensor | None = None
        self._work: Any = None

    def launch(self, stop: bool) -> None:
        """Start this iteration's vote (asynchronous, host memory only)."""
        self._count = torch.tensor([int(stop)], dtype=torch.int32)
        self._work = dist.all_reduce(self._count, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def result(self) -> int:
        """How many ranks had been signalled when the vote started (0: go on)."""
        if self._count is None:
            raise RuntimeError("StopVote.result() before launch()")
        self._work.wait()
        self._work = None
        return int(self._count[0])

    def save_fits(self, seconds_left: float, seconds_needed: float) -> tuple[bool, float]:
        """Whether the largest need fits in the least time left over all ranks, and that time."""
        t = torch.tensor([seconds_left, -seconds_needed], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        left, needed = float(t[0]), -float(t[1])
        return needed < left, left


def note_exit(rank: int, code: int, env: dict[str, str] | Any = None) -> None:
    """Tell holmes.trainer.run (through ``HOLMES_EXIT_DIR``) how this worker ends: torchrun
    loses workers' exit codes when it was itself stopped by SIGTERM."""
    d = (os.environ if env is None else env).get(ENV_EXIT_DIR)
    if not d:
        return
    try:
        with open(os.path.join(d, f"rank{rank}"), "w") as f:
            f.write(f"{code}\n")
    except OSError:
        pass  # best effort: the launcher then reports the signal instead
