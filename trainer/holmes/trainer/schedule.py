"""Running the micro-batches of one iteration: 1F1B (or GPipe) across stages, or a plain loop for
one stage. Zero-bubble and interleaved schedules are refused in config.check_schedule.

Pipeline stages use torch.distributed.pipelining with fixed shapes (no shape inference: it
trips on first steps with hooks) and ``scale_grads=False``: the distributed optimizer scales
each bucket by 1/(M*D) when it reduces it. Compute time is measured around each stage forward
and backward, so the rest of the schedule's time is waiting on neighbours (the bubble).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining import schedules as _pp_schedules

from holmes.contract import ModelSpec

from .model import loss_fn
from .tensor_parallel import TensorParallel
from .timing import Stopwatch

# The schedules wait for each batch of p2p sends/receives through this module-level function;
# wrapped once, it times the waits of the runner active in this thread (a span: on CUDA two
# events on the stream, which waits for NCCL's there; no host sync).
_p2p_active = threading.local()
_untimed_wait = _pp_schedules._wait_batch_p2p


def _timed_wait(work: Any) -> Any:
    watch = getattr(_p2p_active, "watch", None)
    if watch is None:
        return _untimed_wait(work)
    with watch.span():
        return _untimed_wait(work)


class _TimedStage(PipelineStage):
    """A PipelineStage that times each forward/backward chunk (``watch``, no device-wide sync)
    and sends each activation over the group of its stage boundary (``boundary_groups``: the
    Layout's p2p families) instead of the one pipeline group, so a boundary inside an RDMA
    island uses IB while one across islands uses sockets."""

    watch: Stopwatch
    boundary_groups: dict[int, Any]  # boundary b (between stages b and b+1) -> group

    def _timed(self, chunk: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self.watch.span():
            return chunk(*args, **kwargs)

    def _on_boundary(self, ops: list[dist.P2POp]) -> list[dist.P2POp]:
        if not self.boundary_groups:
            return ops  # a version-1 Layout: the pipeline group carries the traffic
        out = []
        for op in ops:
            peer_stage = self.stage_index + (1 if op.peer > dist.get_rank() else -1)
            group = self.boundary_groups[min(self.stage_index, peer_stage)]
            out.append(dist.P2POp(op.op, op.tensor, op.peer, group, op.tag))
        return out

    def get_fwd_recv_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._on_boundary(super().get_fwd_recv_ops(fwd_chunk_id))

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._on_boundary(super().get_fwd_send_ops(fwd_chunk_id))

    def get_bwd_recv_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._on_boundary(super().get_bwd_recv_ops(bwd_chunk_id))

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._on_boundary(super().get_bwd_send_ops(bwd_chunk_id))

    def forward_maybe_with_nosync(self, *args: Any, **kwargs: Any):
        return self._timed(super().forward_maybe_with_nosync, *args, **kwargs)

    def backward_maybe_with_nosync(self, *args: Any, **kwargs: Any):
        return self._timed(super().backward_maybe_with_nosync, *args, **kwargs)


class MicroBatchRunner:
    """``run(inputs, targets)`` does forward+backward of all micro-batches of one iteration.

    Returns the sum of the micro-batch losses on the last stage (a 0-dim tensor), else None.
    ``compute`` holds the seconds spent computing since the last ``reset_times``.
    """

    def __init__(
        self,
        module: nn.Module,
        cfg: ModelSpec,
        dtype: torch.dtype,
        *,
        stage: int,
        stages: int,
        micro_batches: int,
        micro_batch_size: int,
        device: torch.device,
        pp_group: Any,
        p2p_groups: dict[int, Any] | None = None,
        schedule: str = "1F1B",
        tp: TensorParallel | None = None,
    ):
        self.module, self.stage, self.stages, self.M = module, stage, stages, micro_batches
        self.first, self.last = stage == 0, stage == stages - 1
        self.watch = Stopwatch(device)
        self.p2p_watch = Stopwatch(device)  # waits in pipeline p2p (transfers and neighbours)
        tp = tp or TensorParallel()
        self.loss_fn = partial(loss_fn, tp=tp)
        if stages == 1:
            self.schedule = None
            return
        # between stages: this rank's part of the sequence (sequence parallelism: 1/T of it);
        # out of the last stage: its V/T vocabulary columns of the logits
        mb, s, h = micro_batch_size, cfg.seq_length, cfg.hidden_size
        if self.first:
            example_in = torch.zeros(mb, s, dtype=torch.long, device=device)
        else:
            example_in = torch.zeros(mb, s // tp.seq_split, h, dtype=dtype, device=device, requires_grad=True)
        out_shape = (mb, s, tp.split(cfg.vocab_size)) if self.last else (mb, s // tp.seq_split, h)
        example_out = torch.zeros(
            *out_shape, dtype=dtype, device=device, requires_grad=True
        )  # so the stage expects an output gradient
        self.pstage = _TimedStage(
            module,
            stage,
            stages,
            device,
            input_args=(example_in,),
            output_args=(example_out,),
            group=pp_group,
        )
        self.pstage.watch = self.watch
        _pp_schedules._wait_batch_p2p = _timed_wait  # idempotent; untimed outside run()
        self.pstage.boundary_groups = dict(p2p_groups or {})
        kind = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe}[schedule]  # checked in TrainConfig
        self.schedule = kind(self.pstage, micro_batches, loss_fn=self.loss_fn, scale_grads=False)

    @property
    def compute(self) -> float:
        """Seconds this stage computed since reset_times (reads the CUDA events once)."""
        return self.watch.seconds()

    @property
    def p2p_wait(self) -> float:
        """Seconds this stage waited in pipeline p2p since reset_times."""
        return self.p2p_watch.seconds()

    def reset_times(self) -> None:
        self.watch.reset()
        self.p2p_watch.reset()

    def run(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> torch.Tensor | None:
        if self.schedule is None:
            return self._run_local(inputs, targets)
        losses: list[torch.Tensor] = []
        _p2p_active.watch = self.p2p_watch
        try:
            if self.first:
                self.schedule.step(inputs, return_outputs=False)
            elif self.last:
                self.schedule.step(target=targets, losses=losses, return_outputs=False)
            else:
                self.schedule.step(return_outputs=False)
        finally:
            _p2p_active.watch = None
        if not self.last:
            return None
        return torch.stack([loss.detach().float() for loss in losses]).sum()

    def _run_local(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32, device=inputs.device)
        with self.watch.span():
            for x, y in zip(inputs.chunk(self.M), targets.chunk(self.M)):
                loss = self.loss_fn(self.module(x), y)
                loss.backward()
                total += loss.detach()
        return total
