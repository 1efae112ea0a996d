"""A pipeline schedule's makespan, by discrete-event simulation of its per-rank action lists.

torch's multi-stage schedules fix, for every rank, the order in which it runs its actions
(``pipeline_order``: forward F, full backward B, input gradient I, weight gradient W of a virtual
stage for a micro-batch). Each rank runs its list in order and an action starts when the rank is
free and its inputs have arrived:

- F of virtual stage k for micro-batch m needs F of k-1 for m (the activation);
- B or I of k for m needs B or I of k+1 for m (the gradient), and F of k for m (its graph);
  the last virtual stage's needs only its own F (the loss);
- W of k for m needs I of k for m.

Messages are free here (the planner prices p2p apart), so what the simulation gives is the idle
time the schedule's order and dependencies leave: its bubble. Pure: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FORWARD, FULL_BACKWARD, INPUT_GRAD, WEIGHT_GRAD = "F", "B", "I", "W"
OPS = (FORWARD, FULL_BACKWARD, INPUT_GRAD, WEIGHT_GRAD)


@dataclass(frozen=True)
class Action:
    stage: int  # virtual stage
    op: str  # F | B | I | W
    micro_batch: int


# One micro-batch through a rank's layers costs t = F + B with B ~ 2F (the papers' and the
# cost model's ratio), split evenly into I and W: per chunk of v, each is a share of t / v.
UNIT_SHARES = {FORWARD: 1 / 3, FULL_BACKWARD: 2 / 3, INPUT_GRAD: 1 / 3, WEIGHT_GRAD: 1 / 3}


def _needs(
    a: Action, last_stage: int, backward_op: Mapping[tuple[int, int], str]
) -> list[tuple[int, str, int]]:
    k, m = a.stage, a.micro_batch
    if a.op == FORWARD:
        return [(k - 1, FORWARD, m)] if k > 0 else []
    if a.op == WEIGHT_GRAD:
        return [(k, INPUT_GRAD, m)]
    if k == last_stage:
        return [(k, FORWARD, m)]
    nxt = backward_op.get((k + 1, m))
    if nxt is None:
        raise ValueError(
            f"virtual stage {k + 1} has no backward for micro-batch {m}: the order is incomplete"
        )
    return [(k, FORWARD, m), (k + 1, nxt, m)]


def makespan(orders: Mapping[int, Sequence[Action]], durations: Mapping[str, float]) -> float:
    """The time from the first action to the last, each rank running ``orders[rank]`` in order
    with ``durations[op]`` per action. Raises ValueError when the orders deadlock or miss an
    action another one needs."""
    all_actions = [a for acts in orders.values() for a in acts]
    for a in all_actions:
        if a.op not in OPS:
            raise ValueError(f"action {a}: op must be one of {', '.join(OPS)}")
    last_stage = max(a.stage for a in all_actions)
    backward_op = {(a.stage, a.micro_batch): a.op for a in all_actions if a.op in (FULL_BACKWARD, INPUT_GRAD)}
    done: dict[tuple[int, str, int], float] = {}
    pointer = {r: 0 for r in orders}
    free = {r: 0.0 for r in orders}
    remaining = len(all_actions)
    while remaining:
        progressed = False
        for r, acts in orders.items():
            while pointer[r] < len(acts):
                a = acts[pointer[r]]
                needs = _needs(a, last_stage, backward_op)
                if any(n not in done for n in needs):
                    break
                start = max([free[r], *(done[n] for n in needs)])
                free[r] = done[(a.stage, a.op, a.micro_batch)] = start + durations[a.op]
                pointer[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: acts[pointer[r]] for r, acts in orders.items() if pointer[r] < len(acts)}
            raise ValueError(f"the schedule deadlocks: each rank waits on an action never run ({stuck})")
    return max(free.values())


def idle_units(orders: Mapping[int, Sequence[Action]], virtual: int, micro_batches: int) -> float:
    """The bubble in units of one micro-batch's forward+backward on a rank (t): the makespan
    beyond the M t every rank computes, with each chunk's actions at UNIT_SHARES / v."""
    durations = {op: share / virtual for op, share in UNIT_SHARES.items()}
    return makespan(orders, durations) - micro_batches
