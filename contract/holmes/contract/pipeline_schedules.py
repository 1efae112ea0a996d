"""Pipeline schedules: which virtual stages a rank holds under each, and what torch's schedules
accept.

Shared by the planner (choosing a schedule and v), the Layout (placing virtual stages) and the
trainer (running them with torch.distributed.pipelining); what each costs is the planner's
(holmes.plan.pipeline_cost). Pure Python.

With ``v`` virtual stages per rank a pipeline of P rank-stages has P*v virtual stages, run in
order k = 0 .. P*v-1. Where virtual stage k lives:

- ``single`` (1F1B, GPipe): v = 1, virtual stage k is rank-stage k.
- ``looped`` (Interleaved1F1B, InterleavedZeroBubble; Megatron's interleaving): k on rank-stage
  k mod P, as its chunk k div P. Each micro-batch goes round the ranks v times: it crosses
  every boundary v times and the wrap-around link from the last rank-stage to the first v-1
  times, so a layout that interleaves needs a p2p group on that link too (boundary P-1).
- ``vshape`` (ZBVZeroBubble, DualPipeV): v = 2, down the ranks and back up (k < P on k, else on
  2P-1-k). The turn at the last rank-stage stays on one rank, no wrap-around link: every
  activation still travels only between neighbours, over the boundaries Holmes placed.

Split backward (the zero-bubble schedules) runs each micro-batch's input gradient first (to
unblock the previous stage) and its weight gradient later, filling the bubble.
"""

from __future__ import annotations

from dataclasses import dataclass

SINGLE, LOOPED, VSHAPE = "single", "looped", "vshape"


@dataclass(frozen=True)
class ScheduleKind:
    name: str
    placement: str  # single | looped | vshape
    split_backward: bool  # backward split into input and weight gradients (zero bubble)


SCHEDULES = {
    k.name: k
    for k in (
        ScheduleKind("1F1B", SINGLE, False),
        ScheduleKind("GPipe", SINGLE, False),
        ScheduleKind("Interleaved1F1B", LOOPED, False),
        ScheduleKind("InterleavedZeroBubble", LOOPED, True),
        ScheduleKind("ZBVZeroBubble", VSHAPE, True),
        ScheduleKind("DualPipeV", VSHAPE, True),
    )
}
AUTO = "auto"
SCHEDULE_NAMES = tuple(SCHEDULES)

# torch 2.13 (torch/distributed/pipelining/schedules.py, _PipelineScheduleRuntime._step_microbatches)
# runs DualPipeV's OVERLAP_F_B actions through the function registered for that type with
# register_custom_function, else their sub-actions one after the other. Holmes registers none.
DUALPIPEV_OVERLAP = (
    "DualPipeV: torch 2.13 overlaps one chunk's forward with the other chunk's backward only "
    "when an OVERLAP_F_B function is registered on the schedule (register_custom_function, "
    "signature (action, ctx)); Holmes registers none, so each overlapped pair runs forward then "
    "backward, and it is priced as ZB-V's bubble with up to 2P-s micro-batches in flight, no "
    "overlap counted"
)


def kind(name: str) -> ScheduleKind:
    if name not in SCHEDULES:
        raise ValueError(f"pipeline schedule {name!r} is not one of {', '.join(SCHEDULE_NAMES)}")
    return SCHEDULES[name]


def virtual_choices(name: str) -> tuple[int, ...]:
    """The numbers of virtual stages per rank a schedule runs with (looped: the planner tries 2..4)."""
    placement = kind(name).placement
    return {SINGLE: (1,), VSHAPE: (2,), LOOPED: (2, 3, 4)}[placement]


def owner(name: str, pipeline: int, k: int) -> tuple[int, int]:
    """(rank-stage, chunk) of virtual stage k."""
    placement = kind(name).placement
    if placement == VSHAPE:
        return (k, 0) if k < pipeline else (2 * pipeline - 1 - k, 1)
    return k % pipeline, k // pipeline


def virtual_stage(name: str, pipeline: int, stage: int, chunk: int) -> int:
    """The virtual stage index of rank-stage ``stage``'s chunk ``chunk`` (owner's inverse)."""
    if kind(name).placement == VSHAPE:
        return stage if chunk == 0 else 2 * pipeline - 1 - stage
    return chunk * pipeline + stage


def link(name: str, pipeline: int, k: int) -> int | None:
    """The rank-stage boundary the activation from virtual stage k to k+1 travels: b between
    rank-stages b and b+1, ``pipeline - 1`` for the wrap-around link (last to first, looped),
    None when both virtual stages are on one rank."""
    a, _ = owner(name, pipeline, k)
    b, _ = owner(name, pipeline, k + 1)
    if a == b:
        return None
    if abs(a - b) == 1:
        return min(a, b)
    return pipeline - 1  # looped: the last rank-stage hands on to the first


def needs_wrap_link(name: str, pipeline: int, virtual: int) -> bool:
    return kind(name).placement == LOOPED and virtual > 1 and pipeline > 1


def micro_batch_problems(name: str, pipeline: int, micro_batches: int) -> list[str]:
    """What torch's schedule ``name`` refuses for this pipeline and M, said with the fix."""
    p, m, out = pipeline, micro_batches, []
    if p > 1 and m < p:
        out.append(
            f"{name} needs microBatches ({m}) >= pipeline stages ({p}); raise globalBatchSize or "
            "lower microBatchSize"
        )
    if kind(name).placement == LOOPED and p > 1 and m >= p and m % (m // p):
        out.append(f"{name} needs microBatches ({m}) a multiple of microBatches // pipeline ({m // p})")
    if name == "DualPipeV" and m < 2 * p:
        out.append(f"DualPipeV needs microBatches ({m}) >= 2 x pipeline stages ({2 * p})")
    return out
