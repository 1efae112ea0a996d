"""What a pipeline schedule costs, as the planner prices it: the bubble it leaves, the micro-batches
a rank holds at its peak, the actions one micro-batch costs a rank and the boundaries its
activation crosses. Where virtual stages live is the contract's (holmes.contract.pipeline_schedules:
the trainer runs the same placement); what it costs is the planner's alone. Pure Python.

Per micro-batch a rank-stage spends t = F + B (backward = input grad + weight grad, B ~ 2F).
The idle time each schedule leaves, in units of t, over an iteration of M micro-batches:

- 1F1B, GPipe: (P-1) t (warm-up and cool-down), exact with even stages.
- the schedules with virtual stages: simulated on torch's own action order for (P, v, M), read
  from ``pipeline_bubble_table.json`` beside this module (written by hack/gen_bubble_table.py,
  ``make bubble-table``; F : I : W = 1 : 1 : 1).
- outside the table (P or M beyond it) the papers' many-micro-batch figures, which the
  simulation matches everywhere in the table except ZB-V at M < 2P-1 (torch's ZB-V then drops the
  micro-batches its warm-up counted on: up to twice the figure). Interleaved1F1B: (P-1) t / v
  (Narayanan et al. 2021). Zero bubble: the weight gradients (W ~ t/3) fill the bubble; what stays
  is the input-grad chain's: ZB-H1 keeps ~1/3 of the plain bubble (Qi et al. 2024), a V-shape with
  v = 2 halves it again (ZB-V); DualPipeV is ZB-V's bubble with both directions' micro-batches in
  flight.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from holmes.contract import pipeline_schedules as sched

TABLE_FILE = "pipeline_bubble_table.json"
# A run: (schedule, P, v, first M, last M, idle units): every M from first to last that torch's
# schedule accepts (pipeline_schedules.micro_batch_problems) idles that many units.
RUN_COLUMNS = ("schedule", "pipeline", "virtual", "first_micro_batches", "last_micro_batches", "idle_units")
Key = tuple[str, int, int, int]  # (schedule, pipeline stages, virtual stages per rank, micro-batches)


@dataclass(frozen=True)
class BubbleTable:
    idle_units: Mapping[Key, float]
    max_pipeline: int
    max_micro_batches: int


def expand_runs(runs: list[list[Any]]) -> dict[Key, float]:
    """The table's runs as one entry per (schedule, P, v, M) torch accepts."""
    out: dict[Key, float] = {}
    for name, pipeline, virtual, first, last, units in runs:
        for m in range(first, last + 1):
            if not sched.micro_batch_problems(name, pipeline, m):
                out[(name, pipeline, virtual, m)] = float(units)
    return out


def read_table(text: str, source: str = TABLE_FILE) -> BubbleTable:
    """The bubble table from its JSON; an unreadable one says how to write it again."""
    try:
        doc = json.loads(text)
        if list(doc["columns"]) != list(RUN_COLUMNS):
            raise ValueError(f"columns {doc['columns']}, expected {list(RUN_COLUMNS)}")
        return BubbleTable(expand_runs(doc["runs"]), int(doc["max_pipeline"]), int(doc["max_micro_batches"]))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{source}: not a bubble table ({e}); regenerate it with `make bubble-table`"
        ) from None


@cache
def table() -> BubbleTable:
    """The table shipped beside this module (package data), read on first use."""
    try:
        text = files("holmes.plan").joinpath(TABLE_FILE).read_text()
    except FileNotFoundError:
        raise RuntimeError(
            f"holmes.plan has no {TABLE_FILE}: write it with `make bubble-table`, or install a "
            "build of holmes that ships it (package data)"
        ) from None
    return read_table(text)


SIMULATED, PAPERS = "simulated on torch's schedule order", "the papers' many-micro-batch figure"
_ZERO_BUBBLE_LEFT = 1 / 3


def _paper_units(name: str, pipeline: int, virtual: int) -> float:
    p = pipeline - 1
    k = sched.kind(name)
    if k.placement == sched.SINGLE:
        return float(p)
    left = _ZERO_BUBBLE_LEFT if k.split_backward else 1.0
    return p * left / virtual


def bubble_basis(name: str, pipeline: int, virtual: int, micro_batches: int) -> str:
    """Where bubble_units' figure comes from (said in the planner's explanation)."""
    if sched.kind(name).placement == sched.SINGLE:
        return "exact for 1F1B's order"
    if (name, pipeline, virtual, micro_batches) in table().idle_units:
        return SIMULATED
    t = table()
    return f"{PAPERS} (the simulated table covers P <= {t.max_pipeline}, M <= {t.max_micro_batches})"


def bubble_units(name: str, pipeline: int, virtual: int, micro_batches: int) -> float:
    """Idle time per iteration, in units of one micro-batch's forward+backward on a rank-stage."""
    key = (name, pipeline, virtual, micro_batches)
    return table().idle_units.get(key, _paper_units(name, pipeline, virtual))


def bubble_fraction(name: str, pipeline: int, virtual: int, micro_batches: int) -> float:
    """The bubble's share of the iteration (bubble / (bubble + M))."""
    b = bubble_units(name, pipeline, virtual, micro_batches)
    return b / (b + micro_batches)


def in_flight(name: str, pipeline: int, virtual: int, micro_batches: int, stage: int = 0) -> float:
    """Micro-batches whose activations rank-stage ``stage`` holds at its peak, in units of one
    micro-batch through all its layers (its v chunks together)."""
    p, m = pipeline, micro_batches
    k = sched.kind(name)
    if name == "GPipe":
        return float(m)
    if k.placement == sched.SINGLE:
        return float(min(m, p - stage))
    if name == "DualPipeV":
        return float(min(m, 2 * p - stage))  # two directions' warm-ups in flight
    if k.placement == sched.VSHAPE:
        return float(min(m, p))  # ZB-V: the same peak as 1F1B, spread evenly over the ranks
    # looped: Megatron's interleaved warm-up holds (P-1)*2 + (v-1)*P chunk micro-batches
    return float(min(m, ((p - stage - 1) * 2 + (virtual - 1) * p + 1) / virtual))


def actions(name: str, virtual: int) -> int:
    """The schedule's actions one micro-batch costs a rank: per chunk a forward and a backward, or
    under a split backward a forward, an input-gradient and a weight-gradient pass."""
    return (3 if sched.kind(name).split_backward else 2) * virtual


def crossings(name: str, pipeline: int, virtual: int) -> dict[int, int]:
    """How many times one micro-batch's activation crosses each boundary forward (the same
    back): boundary -> count; ``pipeline - 1`` is the wrap-around link (looped)."""
    out: dict[int, int] = {}
    for k in range(pipeline * virtual - 1):
        b = sched.link(name, pipeline, k)
        if b is not None:
            out[b] = out.get(b, 0) + 1
    return out
