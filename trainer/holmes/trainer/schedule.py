"""Running the micro-batches of one iteration: a pipeline schedule across stages (1F1B, GPipe,
Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV), or a plain loop for one stage.

Pipeline stages use torch.distributed.pipelining with fixed shapes (no shape inference: it
trips on first steps with hooks) and ``scale_grads=False``: the distributed optimizer scales
each bucket by 1/(M*D) when it reduces it. Compute time is measured around each stage forward
and backward, so the rest of the schedule's time is waiting on neighbours (the bubble).

Virtual stages: a rank runs one PipelineStage per chunk of its Layout stage, numbered by the
schedule's placement (holmes.contract.pipeline_schedules), each sending over the p2p group of
the boundary its neighbour is across (the wrap-around link P-1 for looped schedules).

Weight gradients: a full backward accumulates into ``.grad`` through autograd, which fires the
optimizer's post-accumulate-grad hooks; a split backward's weight step (zero bubble) assigns
``.grad`` itself and fires none. So after every backward chunk the stage hands its chunk's
parameters to ``on_weight_grads`` (DistributedOptimizer.collect_grads), which lands whatever
gradient is left there: either way a bucket's reduce-scatter starts as soon as its last weight
gradient is final.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining import schedules as _pp_schedules
from torch.distributed.pipelining._utils import InferenceMode

from holmes.contract import ModelSpec
from holmes.contract import pipeline_schedules as sched

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
    boundary_groups: dict[int, Any]  # boundary b (between stages b and b+1; P-1: wrap) -> group
    links: tuple[int | None, int | None]  # the boundaries to the previous and next virtual stage
    on_weight_grads: Callable[[], None]  # lands the gradients a backward left in .grad

    def _timed(self, chunk: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self.watch.span():
            return chunk(*args, **kwargs)

    def _on_boundary(self, ops: list[dist.P2POp], towards_next: bool) -> list[dist.P2POp]:
        if not self.boundary_groups or not ops:
            return ops  # a version-1 Layout: the pipeline group carries the traffic
        b = self.links[1 if towards_next else 0]
        if b is None:
            raise RuntimeError(f"virtual stage {self.stage_index}: p2p to a stage on the same rank")
        group = self.boundary_groups[b]
        return [dist.P2POp(op.op, op.tensor, op.peer, group, op.tag) for op in ops]

    def get_fwd_recv_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._on_boundary(super().get_fwd_recv_ops(fwd_chunk_id), towards_next=False)

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._on_boundary(super().get_fwd_send_ops(fwd_chunk_id), towards_next=True)

    def get_bwd_recv_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._on_boundary(super().get_bwd_recv_ops(bwd_chunk_id), towards_next=True)

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._on_boundary(super().get_bwd_send_ops(bwd_chunk_id), towards_next=False)

    def forward_maybe_with_nosync(self, *args: Any, **kwargs: Any):
        return self._timed(super().forward_maybe_with_nosync, *args, **kwargs)

    def backward_maybe_with_nosync(self, backward_type: str, *args: Any, **kwargs: Any):
        out = self._timed(super().backward_maybe_with_nosync, backward_type, *args, **kwargs)
        if backward_type != "input":  # "full" or "weight": this chunk's weight gradients exist now
            self.on_weight_grads()
        return out


class _StaticShapes:
    """Skips torch's first-step warm-up vote. torch 2.13's ``_warmup_p2p`` sends a vote down the
    pipeline and back with ``dist.send``/``dist.recv`` on the stage's ``group`` (the ``pp``
    family, whatever the boundaries' p2p groups are: NCCL would build 2-rank communicators on
    the pp net) and reads the result with ``.item()`` (a host sync). Every Holmes stage is
    built with its input and output shapes (fixed shapes, no inference), so every stage votes
    "static": the outcome is known on every rank without asking. A stage that would need
    inference keeps torch's vote (all ranks decide alike: they build their stages alike)."""

    def _warmup_p2p(self, stages: list[Any], has_backward: bool, p2p_done: bool) -> None:
        if any(InferenceMode.needs_dynamic(s._user_meta, has_backward) for s in stages):
            super()._warmup_p2p(stages, has_backward, p2p_done)  # type: ignore[misc]
            return
        for s in stages:
            s._inference_mode = InferenceMode.STATIC


class _Schedule1F1B(_StaticShapes, Schedule1F1B):
    pass


class _ScheduleGPipe(_StaticShapes, ScheduleGPipe):
    pass


class _ScheduleInterleaved1F1B(_StaticShapes, ScheduleInterleaved1F1B):
    pass


class _ScheduleInterleavedZeroBubble(_StaticShapes, ScheduleInterleavedZeroBubble):
    pass


class _ScheduleZBVZeroBubble(_StaticShapes, ScheduleZBVZeroBubble):
    pass


class _ScheduleDualPipeV(_StaticShapes, ScheduleDualPipeV):
    pass


SCHEDULE_CLASSES: dict[str, type[Any]] = {
    "1F1B": _Schedule1F1B,
    "GPipe": _ScheduleGPipe,
    "Interleaved1F1B": _ScheduleInterleaved1F1B,
    "InterleavedZeroBubble": _ScheduleInterleavedZeroBubble,
    "ZBVZeroBubble": _ScheduleZBVZeroBubble,
    "DualPipeV": _ScheduleDualPipeV,
}


class MicroBatchRunner:
    """``run(inputs, targets)`` does forward+backward of all micro-batches of one iteration.

    Returns the sum of the micro-batch losses on the last stage (a 0-dim tensor), else None.
    ``compute`` holds the seconds spent computing since the last ``reset_times``.
    ``on_weight_grads(params)`` is called after each backward chunk with that chunk's parameters.
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
        on_weight_grads: Callable[[list[nn.Parameter]], None] | None = None,
    ):
        self.module, self.stage, self.stages, self.M = module, stage, stages, micro_batches
        ranges = tuple(getattr(module, "ranges", ((0, cfg.layers),)))
        # the rank holding layer 0 feeds the tokens; the one holding the last layer has the loss
        self.first = any(a == 0 for a, _ in ranges) if stages > 1 else True
        self.last = any(b == cfg.layers for _, b in ranges) if stages > 1 else True
        self.watch = Stopwatch(device)
        self.p2p_watch = Stopwatch(device)  # waits in pipeline p2p (transfers and neighbours)
        tp = tp or TensorParallel()
        self.loss_fn = partial(loss_fn, tp=tp)
        self.schedule: Any = None
        self.chunk_params: list[list[nn.Parameter]] = []  # per virtual stage (opt.count_uses)
        if stages == 1:
            return
        # between stages: this rank's part of the sequence (sequence parallelism: 1/T of it);
        # out of the last stage: its V/T vocabulary columns of the logits
        mb, s, h = micro_batch_size, cfg.seq_length, cfg.hidden_size
        v = len(ranges)
        chunks = [module] if v == 1 else [module.chunk(c) for c in range(v)]
        self.pstages = []
        for c, (chunk, (a, b)) in enumerate(zip(chunks, ranges)):
            k = sched.virtual_stage(schedule, stages, stage, c)
            if a == 0:
                example_in = torch.zeros(mb, s, dtype=torch.long, device=device)
            else:
                example_in = torch.zeros(
                    mb, s // tp.seq_split, h, dtype=dtype, device=device, requires_grad=True
                )
            out_shape = (mb, s, tp.split(cfg.vocab_size)) if b == cfg.layers else (mb, s // tp.seq_split, h)
            example_out = torch.zeros(
                *out_shape, dtype=dtype, device=device, requires_grad=True
            )  # so the stage expects an output gradient
            pstage = _TimedStage(
                chunk,
                k,
                stages * v,
                device,
                input_args=(example_in,),
                output_args=(example_out,),
                group=pp_group,
            )
            pstage.watch = self.watch
            pstage.boundary_groups = dict(p2p_groups or {})
            last_k = stages * v - 1
            pstage.links = (
                sched.link(schedule, stages, k - 1) if k > 0 else None,
                sched.link(schedule, stages, k) if k < last_k else None,
            )
            params = [p for p in chunk.parameters() if p.requires_grad]
            self.chunk_params.append(params)
            pstage.on_weight_grads = partial(on_weight_grads, params) if on_weight_grads else lambda: None
            self.pstages.append(pstage)
        _pp_schedules._wait_batch_p2p = _timed_wait  # idempotent; untimed outside run()
        kind = SCHEDULE_CLASSES[schedule]  # checked in TrainConfig
        target = self.pstages[0] if v == 1 else self.pstages
        self.schedule = kind(target, micro_batches, loss_fn=self.loss_fn, scale_grads=False)

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
        try:  # a V-shaped schedule's first rank holds the first and the last virtual stage
            args = (inputs,) if self.first else ()
            ends = {"target": targets, "losses": losses} if self.last else {}
            self.schedule.step(*args, **ends, return_outputs=False)
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
