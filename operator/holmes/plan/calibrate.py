"""Calibration: the cost model for one job, from what its trainer measured.

The trainer reports, per stage and iteration, the seconds its ranks spent computing (forward and
backward of every micro-batch), waiting in pipeline p2p, and in exposed DP communication
(``stages`` in its ``iteration`` JSON lines, and gauges per stage). Calibration reads them for
the layout that ran, takes the median over the iterations after the first ``WARMUP`` of the run
(allocator and autotuning warm-up), and turns each stage's compute into the TFLOP/s its GPUs
achieved: the FLOPs the cost model counts for that stage (its layers, and the LM head on the
last) divided by the measured seconds. Every node of the stage gets that rate
(``holmes.dev/measured-tflops`` on the planner's in-memory copy of the node: plan/gpus.py), so a
re-plan prices each island at its measured speed. Communication is not re-fitted: the measured
p2p wait and exposed DP are reported beside the planned ones.

Pure: measurements in, rates out; the planner is called, nothing is read or written.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from holmes.contract import names
from holmes.contract.jobspec import JobSpec

from .costmodel import CostModelConfig
from .discovery import NodeNic

WARMUP = 2  # iterations of a run (from its start or resume) left out of the medians
MIN_SAMPLES = 3  # iterations a calibration needs after the warm-up


class CalibrationError(ValueError):
    """Measurements that cannot calibrate this job; the message says what is missing."""


@dataclass(frozen=True)
class Run:
    """The layout a run used, as far as calibration needs it: node rank order and layers."""

    nodes: tuple[str, ...]
    layers: tuple[int, ...]  # per stage
    tensor: int
    data: int
    micro_batches: int

    @property
    def pipeline(self) -> int:
        return len(self.layers)

    @classmethod
    def of(cls, layout: Any) -> Run:
        """From a Layout (or the trainer's ``start`` line's ``layout``: same keys as JSON)."""
        if isinstance(layout, Mapping):
            try:
                return cls(
                    tuple(layout["nodes"]),
                    tuple(b - a for a, b in layout["stageLayers"]),
                    int(layout["tensor"]),
                    int(layout["data"]),
                    int(layout["microBatches"]),
                )
            except (KeyError, TypeError, ValueError) as e:
                raise CalibrationError(f"the run's layout record lacks {e}: an older trainer?") from None
        return cls(
            tuple(layout.nodes),
            tuple(s.num_layers for s in layout.stages),
            layout.tensor,
            layout.data,
            layout.micro_batches,
        )


@dataclass(frozen=True)
class StageMeasure:
    """One stage, seconds per iteration (medians over the samples, mean over the stage's ranks)."""

    stage: int
    compute: float  # forward + backward of all micro-batches
    p2p_wait: float = 0.0  # in pipeline p2p: transfers and waiting on the neighbours
    dp_exposed: float = 0.0  # DP communication not hidden behind compute


@dataclass(frozen=True)
class Measured:
    run: Run
    stages: tuple[StageMeasure, ...]
    samples: int  # iterations behind the medians
    iteration_seconds: float | None = None


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def from_records(records: Iterable[Mapping[str, Any]], warmup: int = WARMUP) -> Measured:
    """The last run in a trainer's metrics records (its ``start`` line and the ``iteration``
    lines after it): per-stage medians after ``warmup`` iterations."""
    run: Run | None = None
    rows: list[Mapping[str, Any]] = []
    for rec in records:
        event = rec.get("holmes")
        if event == "start":
            if "layout" not in rec:
                raise CalibrationError("the metrics' start line has no layout: written by an older trainer")
            run, rows = Run.of(rec["layout"]), []
        elif event == "iteration" and run is not None and isinstance(rec.get("stages"), list):
            rows.append(rec)
    if run is None:
        raise CalibrationError("no start line in the metrics: give the trainer's --metrics-file output")
    rows = rows[warmup:]
    if len(rows) < MIN_SAMPLES:
        raise CalibrationError(
            f"{len(rows)} iteration(s) with stage times after the first {warmup}: "
            f"calibration needs at least {MIN_SAMPLES} (run longer)"
        )
    per: dict[int, dict[str, list[float]]] = {}
    for rec in rows:
        for s in rec["stages"]:
            d = per.setdefault(int(s["stage"]), {"c": [], "p": [], "e": []})
            d["c"].append(float(s["computeSeconds"]))
            d["p"].append(float(s.get("p2pWaitSeconds", 0.0)))
            d["e"].append(float(s.get("dpExposedSeconds", 0.0)))
    if sorted(per) != list(range(run.pipeline)):
        raise CalibrationError(f"stage times for stages {sorted(per)}, the run has {run.pipeline}")
    stages = tuple(
        StageMeasure(s, _median(per[s]["c"]), _median(per[s]["p"]), _median(per[s]["e"]))
        for s in range(run.pipeline)
    )
    secs = _median([float(r["iterationSeconds"]) for r in rows if "iterationSeconds" in r])
    return Measured(run, stages, len(rows), secs or None)


def metric_records(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The trainer's metric records among ``lines`` (other output, and a line still being
    written, which is never a whole JSON object, are skipped)."""
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "holmes" in rec:
            out.append(rec)
    return out


def read_metrics(path: str) -> Measured:
    """A trainer's metrics JSON-lines file (``--metrics-file``; other lines are skipped)."""
    try:
        with open(path) as f:
            records = metric_records(f)
    except OSError as e:
        raise CalibrationError(f"cannot read the metrics file {path}: {e.strerror or e}") from None
    return from_records(records)


@dataclass(frozen=True)
class StageRate:
    stage: int
    island: str
    gpu: str
    planned_compute: float  # seconds per iteration, the cost model before calibration
    measured_compute: float
    tflops: float  # achieved per GPU

    @property
    def ratio(self) -> float:
        """measured / planned compute time (> 1: slower than the model thought)."""
        return self.measured_compute / self.planned_compute if self.planned_compute else float("inf")


@dataclass(frozen=True)
class Calibration:
    stages: tuple[StageRate, ...]
    node_tflops: Mapping[str, float] = field(default_factory=dict)  # achieved TFLOP/s per GPU

    @property
    def islands(self) -> dict[str, float]:
        """Mean achieved TFLOP/s per GPU of each island's stages."""
        out: dict[str, list[float]] = {}
        for s in self.stages:
            out.setdefault(s.island, []).append(s.tflops)
        return {k: sum(v) / len(v) for k, v in out.items()}


def calibrate(
    nodes: Sequence[Any], job: JobSpec | Mapping[str, Any], measured: Measured, config: CostModelConfig
) -> Calibration:
    """Per-stage achieved TFLOP/s (and per node, for re-planning) from the measurements."""
    from .estimate import evaluate_run

    cand = evaluate_run(nodes, job, measured.run, config)
    M = measured.run.micro_batches
    rates: list[StageRate] = []
    node_tflops: dict[str, list[float]] = {}
    for s, (cost, n, sn, m) in enumerate(zip(cand.costs, cand.layers, cand.stage_nodes, measured.stages)):
        planned = M * (cost.fwd(n) + cost.bwd(n))
        if not m.compute > 0:
            raise CalibrationError(f"stage {s}: measured compute {m.compute} s is not positive")
        tflops = planned * cost.cfg.flops_per_second / m.compute / 1e12
        gpu = cand.gpus[s].name if cand.gpus else "-"
        rates.append(StageRate(s, cand.stage_sets[s].island_name(), gpu, planned, m.compute, tflops))
        for node in sn:
            node_tflops.setdefault(node.name, []).append(tflops)
    return Calibration(tuple(rates), {k: sum(v) / len(v) for k, v in node_tflops.items()})


def with_rates(nodes: Sequence[Any], node_tflops: Mapping[str, float]) -> list[Any]:
    """The nodes with ``holmes.dev/measured-tflops`` set where a rate is known (copies: what the
    planner reads for this job only; never written to the cluster)."""
    if not node_tflops:
        return list(nodes)
    out: list[Any] = []
    for n in nodes:
        if isinstance(n, NodeNic):
            rate = node_tflops.get(n.name)
            labels = {**n.labels, names.LABEL_MEASURED_TFLOPS: f"{rate:.6g}"} if rate else n.labels
            out.append(n if not rate else _replace_labels(n, labels))
            continue
        meta = n.get("metadata") or {}
        name = meta.get("name")
        rate = node_tflops.get(name) if isinstance(name, str) else None
        if not rate:
            out.append(n)
            continue
        labels = {**(meta.get("labels") or {}), names.LABEL_MEASURED_TFLOPS: f"{rate:.6g}"}
        out.append({**n, "metadata": {**meta, "labels": labels}})
    return out


def _replace_labels(n: NodeNic, labels: Mapping[str, str]) -> NodeNic:
    from dataclasses import replace

    return replace(n, labels=dict(labels))


def assess(
    nodes: Sequence[Any],
    job: JobSpec | Mapping[str, Any],
    layout: Any,
    measured: Measured,
    config: CostModelConfig,
) -> tuple[Calibration, float]:
    """The calibration, and the running layout's iteration seconds under it (what a re-plan's
    estimate is compared with: both sides on the same calibrated model)."""
    from .estimate import evaluate_run

    cal = calibrate(nodes, job, measured, config)
    run = layout if isinstance(layout, Run) else Run.of(layout)
    return cal, evaluate_run(with_rates(nodes, cal.node_tflops), job, run, config).seconds
