"""Why each pipeline stage got its layer count, in the cost model's own numbers.

The cost model's iteration is ``pipeline + DP tail``:

- pipeline: ``(m-1)`` steady 1F1B steps of the slowest stage, plus warm-up/cool-down (every
  stage's forward and backward once, and the p2p in between);
- DP tail: how long the last stage to finish runs past the pipeline's end. Stage ``s`` ends its
  last backward earlier than stage 0 by the backward drain of stages ``0..s-1`` (the *hiding
  window*), so only ``exposed DP - window`` of its exposed DP communication sticks out.

A layer moved from stage i to stage j trades these terms: it may make j's step the slowest one
(``m-1`` times) while shrinking i's DP time. The lines below evaluate such single-layer moves
with the cost model (nothing here is a rule of thumb) and name the terms that change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .costmodel import StageCost, fits, timeline
from .partition import PartitionError, uniform

REL = 1.05  # DP rates within 5% count as the same fabric speed
ALL_MOVES_UP_TO = 12  # stages; beyond, moves touch only the stages the lines talk about
SUB = "  - "  # a sub-point of the line before


@dataclass(frozen=True)
class Breakdown:
    """One partition's iteration, split into the terms a layer move trades."""

    layers: tuple[int, ...]
    seconds: float
    pipeline: float
    steps: int  # m - 1 steady steps
    step: float  # the slowest steady step
    step_stage: int
    fill: float  # warm-up / cool-down: pipeline - steps * step
    tail: float  # seconds - pipeline
    tail_stage: int  # the stage that finishes last
    exposed: tuple[float, ...]  # per stage: exposed DP communication
    window: tuple[float, ...]  # per stage: backward drain it hides DP behind (0 for stage 0)

    @property
    def steady(self) -> float:
        return self.steps * self.step


def breakdown(costs: Sequence[StageCost], layers: Sequence[int]) -> Breakdown:
    tl = timeline(costs, layers)
    m = costs[0].shape.micro_batches
    k = max(range(len(tl.steps)), key=lambda s: (tl.steps[s], -s))
    last = max(range(len(tl.finishes)), key=lambda s: (tl.finishes[s], -s))
    window = tuple(max(0.0, tl.pipeline + e - f) for e, f in zip(tl.exposed, tl.finishes))
    return Breakdown(
        tuple(layers),
        tl.seconds,
        tl.pipeline,
        m - 1,
        tl.steps[k],
        k,
        tl.pipeline - (m - 1) * tl.steps[k],
        tl.seconds - tl.pipeline,
        last,
        tuple(tl.exposed),
        window,
    )


@dataclass(frozen=True)
class Move:
    src: int
    dst: int
    after: Breakdown | None  # None: does not fit in GPU memory


def move(costs: Sequence[StageCost], layers: Sequence[int], src: int, dst: int) -> Move | None:
    """One layer from ``src`` to ``dst``; None when src has only one layer."""
    if layers[src] <= 1:
        return None
    new = list(layers)
    new[src] -= 1
    new[dst] += 1
    return Move(src, dst, breakdown(costs, new) if fits(costs, new) else None)


def dp_per_layer(c: StageCost, n: int) -> float:
    """DP communication one more layer adds to this stage (reduce-scatter + all-gather)."""
    return sum(c.dp_times(n + 1)) - sum(c.dp_times(n))


# ---- text ---------------------------------------------------------------------------------------


def _s(x: float) -> str:
    return f"{x:.3g} s" if abs(x) >= 0.001 or x == 0 else f"{x * 1e3:.2g} ms"


def _d(x: float) -> str:
    return ("+" if x > 0 else "-" if x < 0 else "±") + _s(abs(x))


def _parts(layers: Sequence[int], before: Sequence[int] | None = None) -> str:
    """``19/17``; for long pipelines the stages that differ from ``before``, or runs (``3x20``)."""
    if len(layers) <= 8:
        return "/".join(map(str, layers))
    if before is not None:
        changed = [f"stage {s}: {b}->{a}" for s, (a, b) in enumerate(zip(layers, before)) if a != b]
        if changed:
            return ", ".join(changed)
    runs: list[list[int]] = []
    for n in layers:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return "/".join(f"{n}x{k}" if k > 1 else str(n) for n, k in runs)


def _stages(i: int, j: int) -> str:
    return f"stage {i}" if i == j else f"stages {i}..{j}"


def step_line(costs: Sequence[StageCost], layers: Sequence[int]) -> str:
    """Each stage's steady step = layers x per-layer time + a fixed part (p2p, LM head): the
    partition evens the steps out, so a stage with a larger fixed part gets fewer layers."""
    per_layer = [c.layer_fwd + c.layer_bwd for c in costs]
    parts = []
    for s, (c, n) in enumerate(zip(costs, layers)):
        fixed = c.step(n) - n * per_layer[s]
        what = [
            w
            for w, x in (
                ("p2p in", c.place.p2p_in),
                ("p2p out", c.place.p2p_out),
                ("LM head", c.head_fwd + c.head_bwd),
            )
            if x > 0
        ]
        parts.append((s, n, fixed, ", ".join(what) or "nothing"))
    # consecutive stages with the same fixed part, for long pipelines
    groups: list[list[tuple[int, int, float, str]]] = []
    for p in parts:
        if (
            groups
            and f"{groups[-1][-1][2]:.4g}" == f"{p[2]:.4g}"
            and groups[-1][-1][3] == p[3]
            and groups[-1][-1][1] == p[1]
        ):
            groups[-1].append(p)
        else:
            groups.append([p])
    same = len({f"{x:.4g}" for x in per_layer}) == 1
    cells = []
    for g in groups[:8]:
        s0, n, fixed, named = g[0]
        t = per_layer[s0]
        cells.append(
            f"{_stages(s0, g[-1][0])} {n} x {_s(t)} + {_s(fixed)} ({named}: {fixed / t:.2g} layers' worth)"
        )
    more = f"; ... {len(groups) - 8} more groups" if len(groups) > 8 else ""
    head = "steady step = layers x per-layer time + fixed part" + (
        f" (one layer: {_s(per_layer[0])} forward+backward per micro-batch)" if same else ""
    )
    return head + ": " + "; ".join(cells) + more


def bound_line(b: Breakdown, where: Sequence[str]) -> str:
    if len(b.layers) == 1:
        share = b.tail / b.seconds
        return (
            f"iteration {_s(b.seconds)} = {b.steps + 1} micro-batches x {_s(b.step)} "
            f"+ {_s(b.tail)} exposed DP; "
            + (
                f"bound: compute and exposed DP ({share:.0%} of the iteration)"
                if share >= 0.02
                else f"bound: compute (DP adds only {share:.1%})"
            )
        )
    head = (
        f"iteration {_s(b.seconds)} = pipeline {_s(b.pipeline)} ({b.steps} steady 1F1B steps x "
        f"{_s(b.step)}, stage {b.step_stage}'s step, the slowest; + {_s(b.fill)} warm-up/cool-down)"
    )
    t = b.tail_stage
    if b.tail <= 1e-9:
        return head + "; all DP communication is hidden: the slowest steady step bounds the iteration"
    if t == 0:
        tail = (
            f" + {_s(b.tail)} exposed DP of stage 0 ({where[0]}), which ends the backward and has no "
            f"drain to hide behind"
        )
    else:
        tail = (
            f" + {_s(b.tail)}: stage {t} ({where[t]}) finishes last, its {_s(b.exposed[t])} of exposed DP "
            f"outlasting the {_s(b.window[t])} backward drain of {_stages(0, t - 1)} it hides behind"
        )
    share = b.tail / b.seconds
    bound = (
        f"bound: the slowest steady step and stage {t}'s exposed DP ({share:.0%} of the iteration)"
        if share >= 0.02
        else f"bound: the slowest steady step (DP adds only {share:.1%})"
    )
    return head + tail + "; " + bound


def _terms(a: Breakdown, b: Breakdown) -> str:
    """What changes from partition a to b, largest first."""
    terms = []
    ds = b.steady - a.steady
    if abs(ds) >= 1e-4:
        who = (
            f"stage {b.step_stage}'s step becomes the slowest, "
            if b.step_stage != a.step_stage
            else f"stage {b.step_stage}'s step "
        )
        terms.append((abs(ds), f"steady state {_d(ds)} ({who}{_s(a.step)} -> {_s(b.step)}, x{a.steps})"))
    df = b.fill - a.fill
    if abs(df) >= 1e-4:
        terms.append((abs(df), f"warm-up/cool-down {_d(df)}"))
    dt = b.tail - a.tail
    if abs(dt) >= 1e-4:
        if a.tail_stage == b.tail_stage:
            t = a.tail_stage
            what = f"stage {t}'s exposed DP {_s(a.exposed[t])} -> {_s(b.exposed[t])}" + (
                f", hiding window {_s(a.window[t])} -> {_s(b.window[t])}"
                if t and _s(a.window[t]) != _s(b.window[t])
                else ""
            )
        else:
            what = f"last to finish: stage {a.tail_stage} -> stage {b.tail_stage}"
        terms.append((abs(dt), f"DP tail {_d(dt)} ({what})"))
    terms.sort(key=lambda x: -x[0])
    return ", ".join(t for _, t in terms) or f"no change: stage {b.step_stage}'s step is still the slowest"


def move_text(cur: Breakdown, mv: Move) -> str:
    what = f"one layer from stage {mv.src} to stage {mv.dst}"
    if mv.after is None:
        return f"{what} does not fit in GPU memory"
    b = mv.after
    return (
        f"{what} ({_parts(b.layers, cur.layers)}): {_terms(cur, b)}; "
        f"{_s(b.seconds)}, {_d(b.seconds - cur.seconds)}"
    )


def _candidates(P: int, focus: Sequence[int]) -> list[tuple[int, int]]:
    stages = range(P) if P <= ALL_MOVES_UP_TO else sorted(set(focus) | {0, P - 1})
    return [(i, j) for i in stages for j in stages if i != j]


def partition_lines(
    costs: Sequence[StageCost], layers: Sequence[int], where: Sequence[str], mode: str
) -> list[str]:
    """The 'why' lines about the partition: what bounds the iteration, why each stage (the two that
    differ most) has its layer count, and how the uniform split and the next-best move compare."""
    P, L = len(layers), sum(layers)
    cur = breakdown(costs, layers)
    out = [bound_line(cur, where)]
    if P == 1:
        return out
    out.append(step_line(costs, layers))
    rate = [dp_per_layer(c, n) for c, n in zip(costs, layers)]
    hi, lo = max(rate), min(rate)
    differ = hi > REL * lo + 1e-12
    if differ:
        # the pair a reader asks about: a slow-DP stage with the most layers vs a fast-DP stage
        # with the fewest
        a = max((s for s in range(P) if rate[s] * 1.01 >= hi), key=lambda s: (layers[s], -s))
        b = min((s for s in range(P) if rate[s] <= lo * 1.01), key=lambda s: (layers[s], s))
    else:
        a = min(range(P), key=lambda s: (layers[s], -s))
        b = max(range(P), key=lambda s: (layers[s], -s))
    tried = {
        (i, j): move(costs, layers, i, j) for i, j in _candidates(P, (a, b, cur.step_stage, cur.tail_stage))
    }
    moves = {k: v for k, v in tried.items() if v is not None}

    if differ:
        ratio = rate[a] / rate[b] if rate[b] > 0 else float("inf")
        why = (
            f"its DP communication is {ratio:.2g}x slower per layer ({_s(rate[a])} vs {_s(rate[b])}; "
            f"{_s(cur.exposed[a])} exposed vs {_s(cur.exposed[b])})"
        )
        if layers[a] < layers[b]:
            head = (
                f"stage {a} on {where[a]} gets {layers[a]} of {L} layers, stage {b} on {where[b]} "
                f"{layers[b]}: {why}"
            )
        elif layers[a] == layers[b]:
            head = (
                f"stage {a} on {where[a]} gets {layers[a]} of {L} layers, as many as stage {b} on "
                f"{where[b]}, although {why}"
            )
        else:
            head = (
                f"stage {a} on {where[a]} gets {layers[a]} of {L} layers, more than stage {b} on "
                f"{where[b]} ({layers[b]}), although {why}"
            )
    elif layers[a] != layers[b]:
        per_layer = [c.layer_fwd + c.layer_bwd for c in costs]
        unlike = max(per_layer[a], per_layer[b]) > REL * min(per_layer[a], per_layer[b])
        head = (
            f"stage {a} on {where[a]} gets {layers[a]} of {L} layers, stage {b} on {where[b]} {layers[b]}: "
            + (
                f"the stages' DP fabrics are alike, their GPUs are not (one layer {_s(per_layer[a])} vs "
                f"{_s(per_layer[b])} forward+backward per micro-batch)"
                if unlike
                else "the stages' DP fabrics are alike, their fixed per-step costs differ"
            )
        )
    else:
        head = f"every stage gets {layers[0]} of {L} layers: the stages' DP fabrics are alike"
    # the two moves between the stages the line names: why not one more / one fewer
    why_not = [moves[k] for k in ((a, b), (b, a)) if k in moves]
    unload = moves.get((a, b))
    if (
        differ
        and layers[a] >= layers[b]
        and unload is not None
        and unload.after is not None
        and unload.after.seconds > cur.seconds
    ):
        # the verdict the reader is after: why the slow-DP stage keeps that many layers
        head += (
            f"; moving one of its layers to stage {b} costs more than it saves "
            f"({_d(unload.after.seconds - cur.seconds)} net)"
        )
    out.append(head + (":" if why_not else ""))
    out.extend(SUB + move_text(cur, mv) for mv in why_not)

    tail = []
    if mode != "uniform":
        try:
            even = uniform(P, L)
        except PartitionError:
            even = None
        if even is not None and tuple(even) == tuple(layers):
            tail.append("this is the uniform split")
        elif even is not None:
            if fits(costs, even):
                u = breakdown(costs, even).seconds
                tail.append(
                    f"uniform split ({_parts(even, layers)}): {_s(u)} ({_d(u - cur.seconds)}, "
                    f"{u / cur.seconds - 1:+.1%})"
                )
            else:
                tail.append(f"uniform split ({_parts(even, layers)}) does not fit in GPU memory")
    fitting = [(mv, mv.after) for mv in moves.values() if mv.after is not None]
    if fitting:
        nxt, after = min(fitting, key=lambda f: (f[1].seconds, f[0].src, f[0].dst))
        t = after.seconds
        if t < cur.seconds * (1 - 1e-9):
            tail.append(
                "a faster neighbour exists: "
                + move_text(cur, nxt)
                + (" (the job fixes the partition)" if mode != "adaptive" else "")
            )
        elif t <= cur.seconds * (1 + 1e-9):
            tail.append(
                f"equally fast: one layer from stage {nxt.src} to stage {nxt.dst} "
                f"({_parts(after.layers, cur.layers)})"
            )
        elif (nxt.src, nxt.dst) not in ((a, b), (b, a)):
            tail.append("next-best move: " + move_text(cur, nxt))
        else:
            tail.append(
                f"next-best single-layer move: stage {nxt.src} -> {nxt.dst} "
                f"({_parts(after.layers, cur.layers)}) at {_s(t)} ({t / cur.seconds - 1:+.2%})"
            )
    if tail:
        out.append(f"partition {mode} {_parts(layers)}, {_s(cur.seconds)}: " + "; ".join(tail))
    return out
