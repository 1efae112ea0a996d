"""How much searching one job's planning may do, so that no spec, however large, holds the
operator (or ``holmes plan``) for long: a budget counted in units of search work, not seconds,
so a spec plans or is refused the same way on every machine and under any load.

A unit is one node or one layer placed in one candidate layout (what the layout search's cost
grows with: it summarises each candidate's nodes and partitions its layers). On the 2 shared
cores this project is tested on, a unit costs about 1 to 2 us (5 to 15 before issue 47's
speed-up, which spends the same units): a GPT-175B-like job with automatic degrees
(bench/plan_scaling.py) spends 236,976 units on 4,096 nodes (0.5 s, was 2.4 s) and 466,352 on
8,192 (0.45 s, was 3.4 s); with tensor and pipeline fixed it spends a few thousand. A 96-layer
h=4096 job on 16,384 or 32,768 nodes spends all of ``DEFAULT_UNITS`` in under a second here (4 s
before); sizes past the spec's bounds (``holmes.contract.jobspec``: 1,024 layers, 65,536
nodes...) never reach it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import PlanTooLarge

DEFAULT_UNITS = 1_500_000


@dataclass
class Budget:
    """Units of search work left for one job's placement (shared by every plan it tries)."""

    units: int = DEFAULT_UNITS
    spent: int = 0

    def spend(self, units: int, what: str) -> None:
        """Count ``units`` of work about to be done on ``what``; PlanTooLarge past the budget."""
        self.spent += units
        if self.spent > self.units:
            raise PlanTooLarge(
                f"too large to plan within the budget: {what} would bring the search to "
                f"{self.spent:,} units of work (a node or a layer placed in one candidate "
                f"layout), over the budget of {self.units:,}; fix parallelism.tensor and "
                "parallelism.pipeline to numbers (fewer candidates), or use fewer nodes or layers"
            )
