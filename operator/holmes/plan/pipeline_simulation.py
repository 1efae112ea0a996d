"""A pipeline schedule's makespan, by discrete-event simulation of its per-rank action lists.

torch's multi-stage schedules fix, for every rank, the order in which it runs its actions
(``pipeline_order``: forward F, full backward B, input gradient I, weight gradient W of a virtual
stage for a micro-batch). Each rank runs its list in order and an action starts when the rank is
free and its inputs have arrived:

- F of virtual stage k for micro-batch m needs F of k-1 for m (the activation);
- B or I of k for m needs B or I of k+1 for m (the gradient), and F of k for m (its graph);
  the last virtual stage's needs only its own F (the loss);
- W of k for m needs I of k for m.

An input made on the same rank is there when it is made. One made on another rank is a message
(an activation forward, a gradient backward): free by default (``idle_units``, the bubble table:
what the schedule's order and dependencies leave), or priced by ``Messages``: each directed rank
pair is a ``Link`` on which messages serialize first in, first out (a fixed overhead plus their
bytes at its bandwidth), then travel its one-way latency, all in flight together; with
``Messages.rendezvous`` a message leaves only once its receiver asked for it. Pure: no torch, no
I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Link:
    """One direction between two ranks. A message holds the link for ``overhead_s`` plus its
    bytes at ``bytes_per_s`` (the next one waits: bandwidth serializes), then arrives
    ``latency_s`` later (messages in flight overlap: latency does not serialize).
    ``burst_bytes``: a token bucket that deep, full at the start, refilling at the bandwidth (a
    tbf shaper's burst): bytes it holds leave at once. 0 for a plain line."""

    bytes_per_s: float = math.inf
    latency_s: float = 0.0
    overhead_s: float = 0.0
    burst_bytes: float = 0.0

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0:
            raise ValueError(f"Link.bytes_per_s must be > 0, got {self.bytes_per_s}")
        for name in ("latency_s", "overhead_s", "burst_bytes"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"Link.{name} must be >= 0, got {getattr(self, name)}")


FREE = Link()


@dataclass(frozen=True)
class Messages:
    """What a message between ranks costs: ``nbytes`` each (an activation or its gradient), on
    ``link(src_rank, dst_rank)``. ``rendezvous``: a message's bytes leave only once its receiver
    has posted the receive and a notice of it has crossed back (gloo's unbound-buffer send waits
    for the receiver's NOTIFY_RECV_READY; torch posts a receive when the action needing it is
    next on its rank). The notice has no bytes but queues behind the data already on the
    reverse direction: on a plain line an activation then waits for the gradient ahead of it."""

    nbytes: float
    link: Callable[[int, int], Link] = field(default=lambda _src, _dst: FREE)
    rendezvous: bool = False


Key = tuple[int, str, int]  # (virtual stage, op, micro-batch) of an action
_DONE, _POST, _SEND = "done", "post", "send"


class _LinkState:
    """A link's queue: when it is next free, and its bucket's tokens then."""

    def __init__(self, link: Link) -> None:
        self.link, self.free_at, self.tokens = link, 0.0, link.burst_bytes

    def send(self, at: float, nbytes: float) -> float:
        """The arrival time of a message handed to the link at ``at`` (after every earlier one)."""
        ln = self.link
        start = max(at, self.free_at) + ln.overhead_s
        tokens = min(ln.burst_bytes, self.tokens + (start - self.free_at) * ln.bytes_per_s)
        if tokens >= nbytes:
            self.tokens, done = tokens - nbytes, start
        else:
            self.tokens, done = 0.0, start + (nbytes - tokens) / ln.bytes_per_s
        self.free_at = done
        return done + ln.latency_s


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


def makespan(
    orders: Mapping[int, Sequence[Action]],
    durations: Mapping[str, float],
    messages: Messages | None = None,
) -> float:
    """The time from the first action to the last, each rank running ``orders[rank]`` in order
    with ``durations[op]`` per action and inputs from other ranks priced by ``messages`` (None:
    free). Raises ValueError when the orders deadlock or miss an action another one needs."""
    return _run(orders, durations, messages, 0.0, {})


def _run(
    orders: Mapping[int, Sequence[Action]],
    durations: Mapping[str, float],
    messages: Messages | None,
    start: float,
    links: dict[tuple[int, int], _LinkState],
) -> float:
    """One pass of the orders, every rank starting at ``start``, on ``links`` as earlier passes
    left them; the time the last rank finishes."""
    all_actions = [a for acts in orders.values() for a in acts]
    for a in all_actions:
        if a.op not in OPS:
            raise ValueError(f"action {a}: op must be one of {', '.join(OPS)}")
    last_stage = max(a.stage for a in all_actions)
    backward_op = {(a.stage, a.micro_batch): a.op for a in all_actions if a.op in (FULL_BACKWARD, INPUT_GRAD)}
    rank_of = {(a.stage, a.op, a.micro_batch): r for r, acts in orders.items() for a in acts}
    needs = {a: _needs(a, last_stage, backward_op) for a in all_actions}
    # who waits for what another rank makes: (producer) -> the ranks it goes to
    remote: dict[Key, set[int]] = {}
    for r, acts in orders.items():
        for a in acts:
            for n in needs[a]:
                if rank_of.get(n, r) != r:
                    remote.setdefault(n, set()).add(r)
    rendezvous = messages is not None and messages.rendezvous
    ready: dict[tuple[Key, int], float] = {}  # (input, rank) -> when it is there
    made: dict[tuple[Key, int], float] = {}  # (input, rank) -> when its maker finished it
    asked: dict[tuple[Key, int], float] = {}  # (input, rank) -> when the receive's notice landed
    pointer = {r: 0 for r in orders}
    free = {r: start for r in orders}
    # events in time order, so each link takes its messages in the order they are sent
    events: list[tuple[float, int, str, Key, int]] = []
    seq = 0

    def push(at: float, kind: str, key: Key, rank: int) -> None:
        nonlocal seq
        heapq.heappush(events, (at, seq, kind, key, rank))
        seq += 1

    def link(src: int, dst: int) -> _LinkState:
        assert messages is not None
        if (src, dst) not in links:
            links[(src, dst)] = _LinkState(messages.link(src, dst))
        return links[(src, dst)]

    def post(r: int) -> None:
        """The receives of rank r's next action, posted once it is the rank's next (rendezvous)."""
        if rendezvous and pointer[r] < len(orders[r]):
            for n in needs[orders[r][pointer[r]]]:
                if rank_of.get(n, r) != r:
                    push(free[r], _POST, n, r)

    def run_ready(r: int) -> None:
        acts = orders[r]
        while pointer[r] < len(acts):
            a = acts[pointer[r]]
            there = [ready.get((n, r)) for n in needs[a]]
            if any(t is None for t in there):
                return
            end = max([free[r], *(t for t in there if t is not None)]) + durations[a.op]
            key = (a.stage, a.op, a.micro_batch)
            free[r] = ready[(key, r)] = end
            pointer[r] += 1
            if key in remote:
                push(end, _DONE, key, r)
            post(r)

    for r in orders:
        post(r)
        run_ready(r)
    while events:
        at, _, kind, key, rank = heapq.heappop(events)
        src = rank_of[key]
        if kind == _DONE:  # key's maker finished: each receiver's copy may leave
            for dst in sorted(remote[key]):
                made[(key, dst)] = at
                if messages is None:
                    ready[(key, dst)] = at
                elif not rendezvous or asked.get((key, dst), math.inf) <= at:
                    # now, ahead of any notice the rank posts at this instant (torch sends first)
                    ready[(key, dst)] = link(src, dst).send(at, messages.nbytes)
                elif (key, dst) in asked:
                    push(asked[(key, dst)], _SEND, key, dst)
                else:
                    continue
                run_ready(dst)
        elif kind == _POST:  # rank posted its receive: the notice crosses back, behind that link's queue
            asked[(key, rank)] = landed = link(rank, src).send(at, 0.0)
            if (key, rank) in made:
                push(max(landed, made[(key, rank)]), _SEND, key, rank)
        else:  # _SEND: the data leaves on its link
            ready[(key, rank)] = link(src, rank).send(at, messages.nbytes if messages else 0.0)
            run_ready(rank)
    if any(pointer[r] < len(acts) for r, acts in orders.items()):
        stuck = {r: acts[pointer[r]] for r, acts in orders.items() if pointer[r] < len(acts)}
        raise ValueError(f"the schedule deadlocks: each rank waits on an action never run ({stuck})")
    return max(free.values())


def steady_iteration_s(
    orders: Mapping[int, Sequence[Action]],
    durations: Mapping[str, float],
    messages: Messages,
    iterations: int = 8,
) -> float:
    """Seconds per iteration once the links' buckets have settled: ``iterations`` passes of the
    orders, each starting when the last rank ended the one before (the step's closing
    all-reduce), the links carrying their queues and tokens over; the mean of the last half (a
    bucket starts full). Equals ``makespan`` for links without a bucket."""
    if iterations < 2:
        raise ValueError(f"iterations must be >= 2 (the first half is left out), got {iterations}")
    links: dict[tuple[int, int], _LinkState] = {}
    ends = [0.0]
    for _ in range(iterations):
        ends.append(_run(orders, durations, messages, ends[-1], links))
    half = iterations // 2
    return (ends[-1] - ends[-1 - half]) / half


def idle_units(orders: Mapping[int, Sequence[Action]], virtual: int, micro_batches: int) -> float:
    """The bubble in units of one micro-batch's forward+backward on a rank (t): the makespan
    beyond the M t every rank computes, with each chunk's actions at UNIT_SHARES / v, messages
    free."""
    durations = {op: share / virtual for op, share in UNIT_SHARES.items()}
    return makespan(orders, durations) - micro_batches


def one_f_one_b(pipeline: int, micro_batches: int) -> dict[int, list[Action]]:
    """1F1B's order as torch's Schedule1F1B runtime runs it: rank r starts with min(M, P - r)
    forwards, then a backward and a forward in turn, then the remaining backwards."""
    orders = {}
    for r in range(pipeline):
        warm = min(micro_batches, pipeline - r)
        acts = [Action(r, FORWARD, m) for m in range(warm)]
        for m in range(micro_batches):
            acts.append(Action(r, FULL_BACKWARD, m))
            if warm + m < micro_batches:
                acts.append(Action(r, FORWARD, warm + m))
        orders[r] = acts
    return orders


def gpipe(pipeline: int, micro_batches: int) -> dict[int, list[Action]]:
    """GPipe's order: every forward, then every backward."""
    return {
        r: [Action(r, op, m) for op in (FORWARD, FULL_BACKWARD) for m in range(micro_batches)]
        for r in range(pipeline)
    }
