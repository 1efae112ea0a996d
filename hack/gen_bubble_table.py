"""Generate the planner's bubble table (operator/holmes/plan/pipeline_bubble_table.json): each
schedule's bubble, simulated on torch's own action orders.

    .venv/bin/python hack/gen_bubble_table.py   # rewrites the table (make bubble-table)

For every (schedule, P, v, M) the planner may meet (P <= MAX_PIPELINE, M <= MAX_MICRO_BATCHES,
the M torch accepts), torch 2.13's torch.distributed.pipelining computes each rank's action order
(the ``pipeline_order`` its runtime executes; for GPipe ``_get_pipeline_order``, the
same order its loop runs), and holmes.plan.pipeline_simulation replays it with the cost
model's per-action shares (F : I : W = 1 : 1 : 1, B = I + W) to give the idle units. The
planner runs without torch, so it reads the table (holmes.plan.pipeline_cost), written as runs
of equal idle units over M (975 entries, 72 runs); tests/unit/plan/test_pipeline_bubble_table.py
regenerates it from torch and compares, so the table cannot drift from the torch installed.

torch builds these orders in its schedules' constructors, which want real pipeline stages and a
process group; the order functions read only a few sizes, so the schedule objects here are made
without their constructors and given exactly the attributes those functions read. A torch that
reads more fails loudly here (AttributeError), and the simulation refuses an order that misses
an action.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from torch.distributed.pipelining import schedules as ts

from holmes.contract import pipeline_schedules as sched
from holmes.plan.pipeline_cost import RUN_COLUMNS, TABLE_FILE
from holmes.plan.pipeline_simulation import Action, idle_units

MAX_PIPELINE = 8
MAX_MICRO_BATCHES = 32
OUT = Path(__file__).resolve().parents[1] / "operator/holmes/plan" / TABLE_FILE

CLASSES = {
    "GPipe": ts.ScheduleGPipe,
    "Interleaved1F1B": ts.ScheduleInterleaved1F1B,
    "InterleavedZeroBubble": ts.ScheduleInterleavedZeroBubble,
    "ZBVZeroBubble": ts.ScheduleZBVZeroBubble,
    "DualPipeV": ts.ScheduleDualPipeV,
}


def _flatten(a: ts._Action | None) -> list[Action]:
    """Compute actions only (torch's None steps and grad reductions are not work); an overlapped
    forward-backward runs its sub-actions one after the other on the rank's compute."""
    if a is None:
        return []
    if a.sub_actions:
        return [x for s in a.sub_actions for x in _flatten(s)]
    op = a.computation_type.value
    if op not in ("F", "B", "I", "W"):
        return []
    return [Action(a.stage_index, op, a.microbatch_index)]


def torch_orders(name: str, pipeline: int, virtual: int, micro_batches: int) -> dict[int, list[Action]]:
    """Each rank's compute actions in the order torch's schedule ``name`` runs them. Not 1F1B:
    torch 2.13's Schedule1F1B._get_pipeline_order (a picture, not what its runtime runs) starts a
    rank without warm-up forwards at micro-batch 1 and ends it at M; its runtime does not."""
    if name not in CLASSES:
        raise ValueError(f"no torch order for {name!r}: one of {', '.join(CLASSES)}")
    cls = CLASSES[name]
    s = cls.__new__(cls)
    s._n_microbatches = micro_batches
    s.pp_group_size = pipeline
    s._num_stages = s.num_stages = pipeline * virtual
    s.n_local_stages = virtual
    s.number_of_rounds = max(1, micro_batches // pipeline)
    s.microbatches_per_round = micro_batches // s.number_of_rounds
    if sched.kind(name).placement == sched.SINGLE:
        raw = s._get_pipeline_order()
    else:
        s.pipeline_order = {r: s._calculate_single_rank_operations(r) for r in range(pipeline)}
        if name == "InterleavedZeroBubble":
            s.pipeline_order = s._add_bubbles_to_actions(pipeline * virtual)
        raw = s.pipeline_order
    return {r: [x for a in acts for x in _flatten(a)] for r, acts in raw.items()}


def torch_idle_units(name: str, pipeline: int, virtual: int, micro_batches: int) -> float:
    return idle_units(torch_orders(name, pipeline, virtual, micro_batches), virtual, micro_batches)


def grid() -> list[tuple[str, int, int, int]]:
    """Every (schedule, P, v, M) torch accepts within the table's bounds, for the schedules with
    virtual stages (1F1B's and GPipe's (P-1) t is exact with even stages: no table needed)."""
    return [
        (name, p, v, m)
        for name in sched.SCHEDULE_NAMES
        if sched.kind(name).placement != sched.SINGLE
        for p in range(2, MAX_PIPELINE + 1)
        for v in sched.virtual_choices(name)
        for m in range(p, MAX_MICRO_BATCHES + 1)
        if not sched.micro_batch_problems(name, p, m)
    ]


def runs(rows: dict[tuple[str, int, int, int], float]) -> list[list[object]]:
    """The rows as runs: per (schedule, P, v), consecutive M of the grid with equal idle units
    (rounded to 6 places) in one [schedule, P, v, first M, last M, idle units]."""
    out: list[list[object]] = []
    for (name, p, v, m), x in sorted(rows.items()):
        units = round(x, 6)
        if out and out[-1][:3] == [name, p, v] and out[-1][5] == units:
            out[-1][4] = m
        else:
            out.append([name, p, v, m, m, units])
    return out


def render(rows: dict[tuple[str, int, int, int], float], torch_version: str) -> str:
    """The table's JSON: what made it, its bounds and one run a line (a diff shows what moved)."""
    head = {
        "generated_by": "hack/gen_bubble_table.py (make bubble-table): do not edit",
        "torch": torch_version,
        "about": "Idle units (the bubble, in one micro-batch's forward+backward on a rank) per "
        "(schedule, pipeline stages, virtual stages per rank, micro-batches), simulated on torch's "
        "action orders (holmes.plan.pipeline_simulation); a run covers every M from first to last "
        "that torch accepts. Read through holmes.plan.pipeline_cost.bubble_units.",
        "max_pipeline": MAX_PIPELINE,
        "max_micro_batches": MAX_MICRO_BATCHES,
        "columns": list(RUN_COLUMNS),
    }
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    body = ",\n".join(f"    {json.dumps(r)}" for r in runs(rows))
    return "{\n" + "\n".join(lines) + '\n  "runs": [\n' + body + "\n  ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    import torch

    rows = {key: torch_idle_units(*key) for key in grid()}
    args.out.write_text(render(rows, torch.__version__.split("+")[0]))
    print(f"{len(rows)} entries in {len(runs(rows))} runs -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
