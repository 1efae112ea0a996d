"""Re-planning a running job from its measured stage speeds (``spec.parallelism.replan``).

The trainer reports each stage's compute, p2p wait and exposed DP time (status.progress.stages).
Once ``MIN_SAMPLES`` iterations of the running layout are measured (after the trainer's
warm-up), the planner calibrates the cost model for this job (each node priced at the TFLOP/s
its stage achieved: holmes.plan.calibrate) and plans again. The job re-plans when:

- the best layout under the calibrated model is estimated faster than the running layout under
  the same model by more than ``threshold`` x (1 + re-plans so far): each re-plan needs a larger
  gain than the last (hysteresis), and
- that layout was not run before in this job (``status.adaptation.tried``): never back to a
  layout already measured, so two layouts cannot take turns, and
- fewer than ``maxReplans`` re-plans happened (a bound per job), and the job has a checkpoint
  to resume from (``training.checkpoint``).

Then the gang restarts into the new layout from a checkpoint: at once when the stopping
trainers write one (``training.checkpoint.onPreemption``), else after the next periodic one
(``status.adaptation.pendingAfterCheckpoint``). A re-plan is a restart of its own kind
(``restartsByReason.replan``), never counted against ``runPolicy.backoffLimit``. The rates stay
in ``status.adaptation.measuredTflops``, so every later plan of the job (the relaunch, an
elastic resize, a restart after a failure) prices its nodes as measured. While a job is not
Running (queued, suspended, restarting, resizing) nothing is judged: the verdict needs a
measured, running layout.

Pure: the planner is passed in (``plan`` and ``calibrated``); the caller applies the verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from holmes.contract import JobSpec, Layout
from holmes.plan import PlanError
from holmes.plan.calibrate import Calibration, with_rates
from holmes.plan.measured import MIN_SAMPLES, Measured, RunLayout, StageMeasure

PlanFn = Callable[[list, JobSpec], Layout]


def signature(layout: Layout | Mapping) -> str:
    """A layout's identity for hysteresis: node rank order, layers per stage, degrees."""
    run = RunLayout.of(layout) if not isinstance(layout, RunLayout) else layout
    return f"{','.join(run.nodes)}|{'/'.join(map(str, run.layers))}|t{run.tensor}d{run.data}"


def measured_in(progress: Mapping, layout: Layout) -> Measured | None:
    """The running layout's stage measurements from status.progress.stages (None: none yet, or
    of another layout)."""
    stages = progress.get("stages")
    if not isinstance(stages, list) or len(stages) != layout.pipeline:
        return None
    out = []
    for s, (st, rec) in enumerate(zip(layout.stages, sorted(stages, key=lambda r: r.get("stage", -1)))):
        if rec.get("stage") != s or rec.get("layers") != st.num_layers:
            return None
        compute = rec.get("computeSeconds")
        if not isinstance(compute, (int, float)) or compute <= 0:
            return None
        out.append(
            StageMeasure(
                s,
                float(compute),
                float(rec.get("p2pWaitSeconds") or 0),
                float(rec.get("dpExposedSeconds") or 0),
            )
        )
    samples = min(int(r.get("samples") or 0) for r in stages)
    return Measured(RunLayout.of(layout), tuple(out), samples, progress.get("iterationSeconds"))


@dataclass(frozen=True)
class Verdict:
    act: bool
    reason: str  # Replanned | Measuring | PlanHolds | ReplanLimit | NeedsCheckpoint | Disabled
    message: str
    layout: Layout | None = None
    node_tflops: Mapping[str, float] = field(default_factory=dict)
    record: Mapping[str, Any] = field(default_factory=dict)  # status.adaptation.last


def measured_nodes(nodes: Sequence[Mapping], adaptation: Mapping | None, spec: JobSpec) -> Sequence[Mapping]:
    """The nodes priced at the job's measured rates (copies), when it has any and re-planning is
    on; else ``nodes`` themselves. A step of every placement of the job (placement.py)."""
    rates = dict((adaptation or {}).get("measuredTflops") or {})
    if not rates or not spec.parallelism.replan.enabled:
        return nodes
    return with_rates(nodes, rates)


def _stage_line(cal: Calibration) -> str:
    return "; ".join(
        f"stage {s.stage} ({s.island}, {s.gpu}) {s.measured_compute:.3g} s compute vs "
        f"{s.planned_compute:.3g} s planned ({s.tflops:.3g} TFLOP/s per GPU)"
        for s in cal.stages[:6]
    )


def _split(layout: Layout) -> str:
    layers = "/".join(str(s.num_layers) for s in layout.stages)
    return f"{layers} on {', '.join(s.island for s in layout.stages)}"


def judge(
    spec: JobSpec,
    adaptation: Mapping | None,
    layout: Layout,
    progress: Mapping,
    nodes: list,
    plan: PlanFn,
    calibrated: Callable[[list, JobSpec, Layout, Measured], tuple[Calibration, float]],
) -> Verdict:
    """Whether the running ``layout`` should give way to another, from the measurements."""
    pol = spec.parallelism.replan
    if not pol.enabled:
        return Verdict(False, "Disabled", "parallelism.replan.enabled is false")
    if not (spec.training.checkpoint and spec.training.checkpoint.path):
        return Verdict(
            False, "NeedsCheckpoint", "re-planning resumes from a checkpoint: set training.checkpoint.path"
        )
    adaptation = adaptation or {}
    done = int(adaptation.get("replans") or 0)
    if done >= pol.max_replans:
        return Verdict(
            False, "ReplanLimit", f"{done} re-plan(s) done, parallelism.replan.maxReplans={pol.max_replans}"
        )
    measured = measured_in(progress, layout)
    have = measured.samples if measured else 0
    if measured is None or have < MIN_SAMPLES:
        return Verdict(False, "Measuring", f"{have} of {MIN_SAMPLES} iterations of this layout measured")
    try:
        cal, now_s = calibrated(nodes, spec, layout, measured)
        best = plan(with_rates(nodes, cal.node_tflops), spec)
    except PlanError as e:
        return Verdict(False, "PlanHolds", f"cannot re-plan now: {e}")
    best_s = float(best.estimate["iterationSeconds"])
    gain = now_s / best_s - 1 if best_s > 0 else 0.0
    need = pol.threshold * (1 + done)
    seen = {signature(layout), *(adaptation.get("tried") or [])}
    measured_s = f" (measured {measured.iteration_seconds:.3g} s)" if measured.iteration_seconds else ""
    head = (
        f"measured over {measured.samples} iterations: {_stage_line(cal)}; calibrated estimate of the "
        f"running layout {_split(layout)}: {now_s:.3g} s/iteration{measured_s}"
    )
    record = {
        "iteration": int(progress.get("iteration") or 0),
        "from": _split(layout),
        "estimatedBefore": round(now_s, 6),
        "measuredBefore": measured.iteration_seconds,
        "to": _split(best),
        "estimatedAfter": round(best_s, 6),
        "stageTflops": {str(s.stage): round(s.tflops, 6) for s in cal.stages},
    }
    if signature(best) == signature(layout) or gain <= need:
        return Verdict(
            False,
            "PlanHolds",
            f"{head}; the best layout {_split(best)} is estimated {best_s:.3g} s ({gain:+.1%}), "
            f"not more than the {need:.0%} a re-plan needs",
        )
    if signature(best) in seen:
        return Verdict(
            False,
            "PlanHolds",
            f"{head}; the best layout {_split(best)} ({best_s:.3g} s) was run before in this job: "
            "not going back to it (hysteresis)",
        )
    return Verdict(
        True,
        "Replanned",
        f"{head}; re-planned to {_split(best)}, estimated {best_s:.3g} s/iteration "
        f"({gain:.1%} faster, more than the {need:.0%} needed; re-plan {done + 1} of {pol.max_replans})",
        best,
        dict(cal.node_tflops),
        record,
    )


def adapted(adaptation: Mapping | None, verdict: Verdict, layout: Layout) -> dict:
    """status.adaptation after a re-plan."""
    assert verdict.layout is not None  # a verdict that acts carries its new layout
    old = dict(adaptation or {})
    tried = list(dict.fromkeys([*(old.get("tried") or []), signature(layout), signature(verdict.layout)]))
    return {
        **old,
        "replans": int(old.get("replans") or 0) + 1,
        # the nodes just measured get their new rate; others keep theirs from earlier layouts
        "measuredTflops": {
            k: round(v, 6)
            for k, v in sorted({**(old.get("measuredTflops") or {}), **verdict.node_tflops}.items())
        },
        "tried": tried[-8:],
        "last": dict(verdict.record),
    }


RESTART = "replan"  # status.restartsByReason key of a re-plan relaunch
VERDICTS = ("Replanned", "PlanHolds", "ReplanLimit")  # judged on measurements: shown as a condition
JUDGE_EVERY = 8  # iterations between two verdicts on one layout (planning is not free)


def due(adaptation: Mapping, progress: Mapping) -> bool:
    """Whether to judge now: new iterations since the last verdict, at most every JUDGE_EVERY."""
    last = adaptation.get("judgedIteration")
    it = int(progress.get("iteration") or 0)
    return last is None or it >= int(last) + JUDGE_EVERY or it < int(last)


def with_planned(stages: list, layout: Layout) -> list:
    """status.progress.stages with the plan's numbers next to the measured ones."""
    planned = {s.get("stage"): s for s in (layout.estimate or {}).get("stages", [])}
    out = []
    for row in stages:
        p = planned.get(row.get("stage"))
        if p is None:
            out.append(row)
            continue
        out.append(
            {
                **row,
                "plannedComputeSeconds": p.get("computeSeconds"),
                "plannedP2pSeconds": round(
                    float(p.get("p2pSeconds", 0)) + float(p.get("bubbleSeconds", 0)), 6
                ),
                "plannedDpExposedSeconds": p.get("dpExposedSeconds"),
            }
        )
    return out


@dataclass(frozen=True)
class Step:
    """What a running job's reconcile does about its layout: status.adaptation to write (None:
    unchanged), the Replanned Event, the Replanned condition (status, reason, message) and,
    when the gang relaunches now, why it can (``relaunch``: the checkpoint it resumes from)."""

    adaptation: dict | None = None
    event: str = ""
    condition: tuple[bool, str, str] | None = None
    relaunch: str = ""


def step(
    spec: JobSpec,
    adaptation: Mapping,
    layout: Layout,
    progress: Mapping,
    nodes: list,
    plan: PlanFn,
    calibrated: Callable,
) -> Step:
    """Judge the measured layout (``judge``) when due; a re-plan relaunches at once when the
    stopping trainers write a checkpoint (training.checkpoint.onPreemption), else after the next
    periodic checkpoint (``pendingAfterCheckpoint``)."""
    state = dict(adaptation)
    ckpt = int(progress.get("checkpointIteration") or 0)
    if "pendingAfterCheckpoint" in state:  # decided: waiting for the next periodic checkpoint
        if ckpt <= int(state["pendingAfterCheckpoint"]):
            return Step()
        state.pop("pendingAfterCheckpoint")
        return Step(adaptation=state, relaunch=f"checkpoint at iteration {ckpt} written")
    if not due(state, progress):
        return Step()
    v = judge(spec, state, layout, progress, nodes, plan, calibrated)
    if v.reason not in VERDICTS:  # nothing measured to judge yet (or nothing to judge with)
        return Step()
    condition = (v.act, v.reason, v.message)
    if not v.act:
        return Step(
            adaptation={**state, "judgedIteration": int(progress.get("iteration") or 0)}, condition=condition
        )
    after = adapted(state, v, layout)
    ckpt_spec = spec.training.checkpoint  # judge() acts only on a job that checkpoints
    if ckpt_spec is not None and ckpt_spec.on_preemption:
        why = "the stopping trainers write a checkpoint (training.checkpoint.onPreemption)"
        return Step(adaptation=after, event=v.message, condition=condition, relaunch=why)
    return Step(adaptation={**after, "pendingAfterCheckpoint": ckpt}, event=v.message, condition=condition)
