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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from holmes.contract import names
from holmes.contract.jobspec import JobSpec

from .costmodel import CostModelConfig
from .discovery import NodeNic
from .estimate import evaluate_run
from .measured import CalibrationError as CalibrationError  # re-exported for cli.py
from .measured import Measured, RunLayout
from .measured import read_metrics as read_metrics  # re-exported for cli.py (`holmes plan --measured`)


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
    cal = calibrate(nodes, job, measured, config)
    run = layout if isinstance(layout, RunLayout) else RunLayout.of(layout)
    return cal, evaluate_run(with_rates(nodes, cal.node_tflops), job, run, config).seconds
