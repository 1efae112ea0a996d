"""Which pipeline schedule (and how many virtual stages per GPU) a planned layout runs.

Given the chosen placement (stages on islands, layers per stage), each schedule of
holmes.contract.pipeline_schedules is priced on the cost model's clock:

- bubble: 1F1B's fill and drain (the pipeline time beyond M steady steps) scaled by the
  schedule's idle units over 1F1B's P-1: simulated on torch's own action order for this P, v
  and M where the planner's table has it (pipeline_cost) (interleaving divides it by v, zero bubble fills
  most of it with deferred weight gradients, ZB-V less so at M < 2P-1), else the papers' figure;
- p2p: every micro-batch crosses each boundary once per chunk; a looped schedule also crosses
  the link from the last stage back to the first (often the slowest: it joins the two outer
  islands) v-1 times, a V-shaped one only its neighbours' links, twice;
- overhead: a fixed cost per schedule action (v chunks run v times 1F1B's actions, a split
  backward three per chunk, not two) and a split backward's extra over a full one;
- memory: the micro-batches each stage holds in flight under the schedule, and torch's receive
  buffers per chunk; a V-shaped schedule puts the head on the first stage;
- chunks: each stage's layers split into v chunks, evenly, the remainder away from the chunk
  holding the head (its FLOPs sit there).

The fastest that fits memory wins (ties: the simpler, in SCHEDULE_NAMES order);
``training.pipelineSchedule``/``virtualStages`` narrow the choice. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from holmes.contract import pipeline_schedules as sched
from holmes.contract.jobspec import JobSpec

from . import pipeline_cost
from .candidate import Candidate
from .costmodel import StageCost, timeline


@dataclass(frozen=True)
class ScheduleOption:
    name: str
    virtual: int
    seconds: float  # the iteration on the cost model's clock
    bubble_seconds: float  # the pipeline's fill and drain under this schedule
    p2p_seconds: float  # per iteration on the busiest stage
    memory_gib: float  # the fullest stage
    chunks: tuple[tuple[int, ...], ...]  # per stage: layers per chunk
    problem: str = ""  # why it cannot run here ("" when it can)
    stage_memory_gib: tuple[float, ...] = ()  # per stage (the dry run checks each)
    overhead_seconds: float = 0.0  # per iteration on the busiest stage: actions, split backward
    bubble_units: float = 0.0  # idle units, in one micro-batch's forward+backward (1F1B: P-1)
    bubble_basis: str = ""  # where bubble_units comes from (pipeline_cost.bubble_basis)


def chunk_split(layers: Sequence[int], name: str, virtual: int) -> tuple[tuple[int, ...], ...] | None:
    """Per stage, its layers over its ``virtual`` chunks (evenly; the remainder away from the
    chunk with the head); None when a stage has fewer layers than chunks."""
    P = len(layers)
    if any(n < virtual for n in layers):
        return None
    last_owner = sched.owner(name, P, P * virtual - 1)
    out = []
    for s, n in enumerate(layers):
        base, extra = divmod(n, virtual)
        order = sorted(range(virtual), key=lambda c: (s, c) == last_owner)  # the head's chunk last
        counts = [base] * virtual
        for c in order[:extra]:
            counts[c] += 1
        out.append(tuple(counts))
    return tuple(out)


def _placed_costs(c: Candidate, name: str, virtual: int) -> list[StageCost]:
    """The candidate's stage costs with this schedule's in-flight micro-batches, and the head on
    the first stage when the schedule is V-shaped."""
    P, m = len(c.costs), c.degrees.micro_batches
    vshape = sched.kind(name).placement == sched.VSHAPE
    out = []
    for s, cost in enumerate(c.costs):
        inflight = max(1, round(pipeline_cost.in_flight(name, P, virtual, m, s)))
        last = (s == 0) if vshape else cost.place.last
        place = replace(cost.place, inflight=inflight, last=last)
        out.append(StageCost(cost.model, cost.shape, place, cost.cfg))
    return out


def price(c: Candidate, name: str, virtual: int) -> ScheduleOption:
    P, m = len(c.costs), c.degrees.micro_batches
    problems = sched.micro_batch_problems(name, P, m)
    chunks = chunk_split(c.layers, name, virtual)
    if chunks is None:
        problems.append(f"a stage has fewer layers than {virtual} chunks")
    costs = _placed_costs(c, name, virtual)
    base = timeline(c.costs, c.layers)
    fill = base.pipeline - m * max(base.steps)  # 1F1B's fill and drain beyond M steady steps
    # p2p per micro-batch: each boundary's time x its crossings (wrap: boundary P-1)
    cross = pipeline_cost.crossings(name, P, virtual) if P > 1 else {}
    link = [c.costs[b].place.p2p_out for b in range(P - 1)] + [c.wrap_p2p]
    p2p = []
    for s in range(P):
        adjacent = {b for b in (s - 1, s) if 0 <= b < P - 1}
        if s in (0, P - 1):
            adjacent.add(P - 1)  # the wrap-around link, if the schedule crosses it
        p2p.append(sum(cross.get(b, 0) * link[b] for b in adjacent))
    # and a fixed cost per message a step waits for: each chunk's input from a remote stage, and
    # its output's gradient back (cost model's p2p_message_seconds)
    cfg = c.costs[0].cfg
    latency = cfg.p2p_message_seconds
    waits = _waits(name, P, virtual)
    p2p = [x + latency * w for x, w in zip(p2p, waits)]
    # beyond the FLOPs: a fixed cost per schedule action, and a split backward's extra over a
    # full one (cost model's pipeline_action_seconds, split_backward_ratio)
    extra = [
        cfg.pipeline_action_seconds * pipeline_cost.actions(name, virtual) + _split_extra(cost, n, name)
        for cost, n in zip(costs, c.layers)
    ]
    steps = [cost.fwd(n) + cost.bwd(n) + p + x for cost, n, p, x in zip(costs, c.layers, p2p, extra)]
    # the fill and drain run 1F1B's steps, each with its own two actions
    fill += (P - 1) * 2 * cfg.pipeline_action_seconds
    units = pipeline_cost.bubble_units(name, P, virtual, m) if P > 1 else 0.0
    bubble = fill * units / (P - 1) if P > 1 else 0.0
    pipeline = m * max(steps) + bubble
    seconds = base.seconds - base.pipeline + pipeline
    # each further chunk holds receive buffers of its own: an activation in and a gradient in.
    # A split backward keeps each micro-batch's graph from its input-gradient pass to its weight
    # pass: under activation recompute the rebuilt blocks stay alive in between, so every
    # micro-batch in flight holds whole activations, as without recompute (the dry run's gpt-7b
    # under ZBV: 152 GiB of activations per GPU where recompute would keep 10)
    mem_costs = costs
    if sched.kind(name).split_backward and costs[0].cfg.activation_recompute:
        mem_costs = [
            StageCost(x.model, x.shape, x.place, replace(x.cfg, activation_recompute=False)) for x in costs
        ]
    mems = [cost.memory(n) + (virtual - 1) * 2 * _buffer_side(cost) for cost, n in zip(mem_costs, c.layers)]
    memory = max(mems)
    if any(mem > cost.mem_cap for mem, cost in zip(mems, costs)):
        problems.append(f"needs {memory / 2**30:.1f} GiB on its fullest GPU")
    return ScheduleOption(
        name,
        virtual,
        seconds,
        bubble,
        m * max(p2p),
        memory / 2**30,
        chunks or (),
        "; ".join(problems),
        tuple(x / 2**30 for x in mems),
        m * max(extra),
        units,
        pipeline_cost.bubble_basis(name, P, virtual, m) if P > 1 else "",
    )


def _split_extra(cost: StageCost, layers: int, name: str) -> float:
    """What a split backward costs a micro-batch beyond the full backward (none without a split)."""
    if not sched.kind(name).split_backward:
        return 0.0
    return (cost.cfg.split_backward_ratio - 1.0) * cost.bwd(layers)


def _waits(name: str, pipeline: int, virtual: int) -> list[int]:
    """Per stage, the p2p messages one micro-batch makes it wait for (a chunk whose neighbour
    virtual stage is on another GPU: its input forward, its output's gradient backward)."""
    out = [0] * pipeline
    last = pipeline * virtual - 1
    for k in range(last + 1):
        s, _ = sched.owner(name, pipeline, k)
        out[s] += (k > 0 and sched.link(name, pipeline, k - 1) is not None) + (
            k < last and sched.link(name, pipeline, k) is not None
        )
    return out


def _buffer_side(cost: StageCost) -> float:
    """torch's receive buffers for one side of one chunk: one activation per micro-batch."""
    m, s = cost.model, cost.shape
    sp = s.tensor if s.sequence_parallel else 1
    return s.micro_batches * s.micro_batch * m.seq / sp * m.hidden * cost.cfg.activation_bytes


def options(c: Candidate, job: JobSpec) -> list[ScheduleOption]:
    """Every schedule and v the job allows on this candidate, priced."""
    t = job.training
    P = c.degrees.pipeline
    if P == 1:
        return [price(c, "1F1B", 1)]
    if job.framework != "holmes":
        names: Sequence[str] = ("1F1B",)  # an external engine runs one stage per GPU
    elif t.pipeline_schedule == sched.AUTO:
        names = [n for n in sched.SCHEDULE_NAMES if n != "GPipe"]  # GPipe never beats 1F1B here
    else:
        names = (t.pipeline_schedule,)
    out = []
    for name in names:
        choices = sched.virtual_choices(name)
        if t.virtual_stages is not None and t.virtual_stages in choices:
            choices = (t.virtual_stages,)
        out += [price(c, name, v) for v in choices]
    return out


def choose(c: Candidate, job: JobSpec) -> tuple[ScheduleOption, list[ScheduleOption]]:
    """The fastest option that runs here, and every option priced (for the explanation).
    A schedule the job names that cannot run here is still returned, with its problem."""
    priced = options(c, job)
    runnable = [o for o in priced if not o.problem]
    if not runnable:
        return priced[0], priced
    order = {n: i for i, n in enumerate(sched.SCHEDULE_NAMES)}
    best = min(runnable, key=lambda o: (round(o.seconds, 9), order[o.name], o.virtual))
    return best, priced
