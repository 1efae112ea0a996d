"""Time spent in spans of the hot path without a device-wide synchronisation.

On CUDA a span is a pair of events recorded on the current stream: the gap between them is what
that stream spent on the span's work, or waiting in it (a ``work.wait()`` makes the compute
stream wait for NCCL's stream, so a span around it measures the exposed communication). The
events are read only when :meth:`Stopwatch.seconds` is asked, once per iteration, after the
engine's one read of the device (the grad norm), so they have completed and nothing waits; a
span still running (the synchronous optimizer's all-gathers) is waited for, the last event
alone. ``torch.cuda.synchronize()`` would instead wait for every stream, NCCL's
included: the all-gathers launched by ``step()`` would finish before the next forward could be
queued, and the CPU could never run ahead of the GPU. On the CPU a span is wall-clock time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class Stopwatch:
    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = torch.device(device).type == "cuda"
        self._spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._cpu = 0.0

    @contextmanager
    def span(self) -> Iterator[None]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._spans.append((start, end))
        else:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self._cpu += time.perf_counter() - t0

    def seconds(self) -> float:
        """Total seconds of the spans since the last reset (waits for the last event only)."""
        total = self._cpu
        if self._spans:
            last = self._spans[-1][1]
            if not last.query():  # the engine reads after the iteration's one sync: done by then
                last.synchronize()
            total += sum(s.elapsed_time(e) for s, e in self._spans) / 1000.0
        return total

    def reset(self) -> None:
        self._spans.clear()
        self._cpu = 0.0
