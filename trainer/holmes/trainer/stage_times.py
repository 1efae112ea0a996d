"""Every pipeline stage's measured times, gathered at rank 0 for the metrics (and through them
the operator's re-planning: holmes.plan.calibrate).

Each rank times its own stage (compute spans, p2p waits, exposed DP waits: timing.Stopwatch, no
device-wide synchronisation) and divides by its stage's rank count; the vector of every stage's
slots rides on the one all-reduce each iteration already does (grad norm and loss), so the sum is
each stage's mean over its ranks and no collective or host sync is added. The times read after
an iteration are sent with the next one: what iteration i reports was measured in iteration i-1.

Rank 0 keeps the last ``window`` measured iterations after the first ``warmup`` and reports their
medians (``summary``): the Prometheus gauges the operator reads.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any

FIELDS = ("computeSeconds", "p2pWaitSeconds", "dpExposedSeconds")
WARMUP = 2  # measured iterations left out of the medians (allocator, autotuning, first p2p)
WINDOW = 16


class StageTimes:
    def __init__(
        self,
        stage_layers: list[int],
        stage: int,
        ranks_per_stage: int,
        micro_batches: int,
        warmup: int = WARMUP,
        window: int = WINDOW,
    ):
        self.layers, self.stage, self.ranks, self.M = (
            list(stage_layers),
            stage,
            ranks_per_stage,
            micro_batches,
        )
        self.warmup = warmup
        self.own: tuple[float, float, float] | None = None  # this rank's last iteration
        self.measured = 0  # iterations measured so far (all stages)
        self.history: deque[list[tuple[float, ...]]] = deque(maxlen=window)

    @property
    def width(self) -> int:
        return len(self.layers) * len(FIELDS)

    def record(self, compute: float, p2p_wait: float, dp_exposed: float) -> None:
        """This rank's times of the iteration just ended (sent with the next one)."""
        self.own = (compute, p2p_wait, dp_exposed)

    def outgoing(self) -> list[float]:
        """This rank's share of its stage's slots (zeros before the first measurement)."""
        out = [0.0] * self.width
        if self.own is not None:
            base = self.stage * len(FIELDS)
            for i, x in enumerate(self.own):
                out[base + i] = x / self.ranks
        return out

    def incoming(self, summed: list[float]) -> list[dict[str, Any]] | None:
        """The all-reduced slots: every stage's means, as the iteration line's ``stages``."""
        n = len(FIELDS)
        per = [tuple(summed[s * n : (s + 1) * n]) for s in range(len(self.layers))]
        if not all(v[0] > 0 for v in per):
            return None  # the first iteration: nothing measured yet
        self.measured += 1
        if self.measured > self.warmup:
            self.history.append(per)
        return [self._row(s, v) for s, v in enumerate(per)]

    def _row(self, s: int, v: tuple[float, ...]) -> dict[str, Any]:
        row: dict[str, Any] = {"stage": s, "layers": self.layers[s]}
        row.update({k: round(x, 6) for k, x in zip(FIELDS, v)})
        row["layerSeconds"] = round(v[0] / (self.M * self.layers[s]), 6)
        return row

    def summary(self) -> list[dict[str, Any]]:
        """Per stage, the medians over the window (empty until one iteration past the warm-up)."""
        if not self.history:
            return []
        out = []
        for s in range(len(self.layers)):
            med = tuple(statistics.median(it[s][i] for it in self.history) for i in range(len(FIELDS)))
            out.append({**self._row(s, med), "samples": len(self.history)})
        return out
