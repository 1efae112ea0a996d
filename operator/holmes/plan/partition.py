"""Layer partitions: how many transformer layers each pipeline stage gets.

``adaptive`` is exact: it minimises the slowest stage, ``max_s cost_s(n_s)``, over integer
``n_s >= 1`` with ``sum n_s = layers``, for any per-stage costs that do not decrease with the
layer count (each stage's own speed, DP fabric, embedding/head). Greedy water-filling is exact
for this min-max problem: start every stage at one layer and give each further layer to the
stage whose cost after taking it is smallest. Proof: let X* be the optimum and cap_s the most
layers stage s can take within X*. While layers remain, some stage has n_s < cap_s (else the
stages already hold sum cap_s >= layers), so the chosen stage ends at cost <= X*; hence the
final maximum is <= X*. Ties go to the lower stage index, so the result is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

Cost = Callable[[int], float]


class PartitionError(ValueError):
    pass


def adaptive(costs: Sequence[Cost], layers: int) -> tuple[int, ...]:
    P = len(costs)
    if not 1 <= P <= layers:
        raise PartitionError(f"{P} stages cannot share {layers} layers with at least one layer each")
    n = [1] * P
    heap = [(costs[s](2), s) for s in range(P)]
    heapq.heapify(heap)
    for _ in range(layers - P):
        _, s = heapq.heappop(heap)
        n[s] += 1
        heapq.heappush(heap, (costs[s](n[s] + 1), s))
    return tuple(n)


def uniform(stages: int, layers: int) -> tuple[int, ...]:
    """Equal layers, Megatron's default; the ``layers % stages`` extra layers go one each to the
    first stages."""
    if not 1 <= stages <= layers:
        raise PartitionError(f"{stages} stages cannot share {layers} layers with at least one layer each")
    q, r = divmod(layers, stages)
    return tuple(q + (1 if s < r else 0) for s in range(stages))


def check_explicit(parts: Sequence[int], stages: int, layers: int) -> tuple[int, ...]:
    parts = tuple(parts)
    if len(parts) != stages:
        raise PartitionError(f"partition lists {len(parts)} stages but the pipeline has {stages}")
    if any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in parts):
        raise PartitionError(f"partition {list(parts)}: every stage needs a positive integer layer count")
    if sum(parts) != layers:
        raise PartitionError(f"partition {list(parts)} sums to {sum(parts)}, the model has {layers} layers")
    return parts


def bottleneck(costs: Sequence[Cost], parts: Sequence[int]) -> float:
    return max(c(n) for c, n in zip(costs, parts))
