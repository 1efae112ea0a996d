"""One iteration's 1F1B schedule per stage, laid out from the planner's per-stage estimate
(pure): when each micro-batch's forward and backward runs on each stage, where a stage idles
(the bubble) and the exposed data-parallel communication after its last backward.

The estimate gives per stage the compute of all micro-batches (``computeSeconds`` = m x (forward
+ backward)) and its pipeline transfers (``p2pSeconds`` = m x (in + out)); a forward is taken as
a third of forward + backward (a quarter with activation recomputation, which runs the forward
again), as in the cost model's FLOP counts. Each boundary's transfer time is recovered from the
stages' p2p sums. The cost model's own iteration time uses a closed form of the same schedule
(plan/costmodel.py), so the two agree to within the transfers' overlap."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Block:
    stage: int
    kind: str  # "F" forward, "B" backward, "DP" exposed data-parallel communication
    micro_batch: int  # -1 for DP
    start: float
    end: float


@dataclass(frozen=True)
class Schedule:
    blocks: tuple[Block, ...]
    seconds: float  # the latest stage's end

    def of(self, stage: int) -> list[Block]:
        return [b for b in self.blocks if b.stage == stage]

    @property
    def pipeline(self) -> float:
        """When the last backward of any stage ends."""
        return max(b.end for b in self.blocks if b.kind != "DP")

    def idle(self, stage: int) -> float:
        """Seconds the stage does not compute while the pipeline runs: its bubble (warm-up,
        cool-down, waiting on slower stages) and its waits on transfers."""
        return self.pipeline - sum(b.end - b.start for b in self.of(stage) if b.kind != "DP")


def order(stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """Non-interleaved 1F1B: P-s-1 warm-up forwards, then one forward one backward, then the
    remaining backwards."""
    warm = min(stages - stage - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


def transfers(p2p: Sequence[float], m: int) -> list[float]:
    """Per boundary b (stage b -> b+1), one micro-batch's transfer seconds, from the stages'
    per-iteration p2p sums (stage s: m x (boundary s-1 + boundary s))."""
    out: list[float] = []
    for s in range(len(p2p) - 1):
        out.append(max(0.0, p2p[s] / m - (out[-1] if out else 0.0)))
    return out


def simulate(
    forward: Sequence[float],
    backward: Sequence[float],
    send: Sequence[float],
    m: int,
    exposed: Sequence[float],
) -> Schedule:
    """The schedule of P stages (per micro-batch forward and backward seconds, per boundary
    transfer seconds, per stage exposed DP seconds)."""
    P = len(forward)
    plans = [order(s, P, m) for s in range(P)]
    done: dict[tuple[int, str, int], float] = {}
    free = [0.0] * P
    nxt = [0] * P
    blocks: list[Block] = []
    while any(nxt[s] < len(plans[s]) for s in range(P)):
        moved = False
        for s in range(P):
            if nxt[s] >= len(plans[s]):
                continue
            kind, i = plans[s][nxt[s]]
            if kind == "F":
                dep = (s - 1, "F", i) if s > 0 else None
                arrive = done[dep] + send[s - 1] if dep in done else None
            else:
                dep = (s + 1, "B", i) if s < P - 1 else (s, "F", i)
                arrive = (done[dep] + (send[s] if s < P - 1 else 0.0)) if dep in done else None
            if dep is not None and arrive is None:
                continue
            start = max(free[s], arrive or 0.0)
            end = start + (forward[s] if kind == "F" else backward[s])
            blocks.append(Block(s, kind, i, start, end))
            done[(s, kind, i)] = free[s] = end
            nxt[s] += 1
            moved = True
        if not moved:  # cannot happen for 1F1B orders; a guard against an endless loop
            raise ValueError("1F1B schedule deadlocked")
    for s in range(P):
        if exposed[s] > 0:
            blocks.append(Block(s, "DP", -1, free[s], free[s] + exposed[s]))
    return Schedule(tuple(blocks), max(b.end for b in blocks))


def from_estimate(estimate: Mapping[str, Any], micro_batches: int) -> Schedule | None:
    """The schedule for a Layout's estimate (None: it holds no per-stage times)."""
    rows = sorted(
        (r for r in estimate.get("stages") or [] if isinstance(r, Mapping)), key=lambda r: int(r["stage"])
    )
    keys = ("computeSeconds", "p2pSeconds", "dpExposedSeconds")
    if (
        not rows
        or micro_batches < 1
        or not all(isinstance(r.get(k), (int, float)) for r in rows for k in keys)
    ):
        return None
    m = micro_batches
    share = 0.25 if estimate.get("activationRecompute") else 1 / 3
    forward = [float(r["computeSeconds"]) / m * share for r in rows]
    backward = [float(r["computeSeconds"]) / m * (1 - share) for r in rows]
    send = transfers([float(r["p2pSeconds"]) for r in rows], m)
    return simulate(forward, backward, send, m, [float(r["dpExposedSeconds"]) for r in rows])
