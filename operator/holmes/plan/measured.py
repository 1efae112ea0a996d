"""What a trainer measured, as calibration (calibrate.py) and re-planning read it: the layout a
run used (``RunLayout``) and its per-stage seconds (``Measured``), from the trainer's metric records
(its ``start`` line and the ``iteration`` lines after it). Data and parsing only."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WARMUP = 2  # iterations of a run (from its start or resume) left out of the medians
MIN_SAMPLES = 3  # iterations a calibration needs after the warm-up


class CalibrationError(ValueError):
    """Measurements that cannot calibrate this job; the message says what is missing."""


@dataclass(frozen=True)
class RunLayout:
    """The layout a run used, as far as calibration needs it: node rank order and layers."""

    nodes: tuple[str, ...]
    layers: tuple[int, ...]  # per stage
    tensor: int
    data: int
    micro_batches: int
    expert: int = 1  # a mixture of experts' expert-parallel degree

    @property
    def pipeline(self) -> int:
        return len(self.layers)

    @classmethod
    def of(cls, layout: Any) -> RunLayout:
        """From a Layout (or the trainer's ``start`` line's ``layout``: same keys as JSON)."""
        if isinstance(layout, Mapping):
            try:
                return cls(
                    tuple(layout["nodes"]),
                    _layer_counts(layout),
                    int(layout["tensor"]),
                    int(layout["data"]),
                    int(layout["microBatches"]),
                    int(layout.get("expert", 1)),
                )
            except (KeyError, TypeError, ValueError) as e:
                raise CalibrationError(f"the run's layout record lacks {e}: an older trainer?") from None
        return cls(
            tuple(layout.nodes),
            tuple(s.num_layers for s in layout.stages),
            layout.tensor,
            layout.data,
            layout.micro_batches,
            layout.expert,
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
    run: RunLayout
    stages: tuple[StageMeasure, ...]
    samples: int  # iterations behind the medians
    iteration_seconds: float | None = None


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def from_records(records: Iterable[Mapping[str, Any]], warmup: int = WARMUP) -> Measured:
    """The last run in a trainer's metrics records (its ``start`` line and the ``iteration``
    lines after it): per-stage medians after ``warmup`` iterations."""
    run: RunLayout | None = None
    rows: list[Mapping[str, Any]] = []
    for rec in records:
        event = rec.get("holmes")
        if event == "start":
            if "layout" not in rec:
                raise CalibrationError("the metrics' start line has no layout: written by an older trainer")
            run, rows = RunLayout.of(rec["layout"]), []
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


def _layer_counts(layout: Mapping[str, Any]) -> tuple[int, ...]:
    """Layers per stage from a start line: the sum of a stage's chunks under virtual stages
    (its ``stageLayers`` entry is then only the span its chunks cover), else its one range."""
    if "chunks" in layout:
        return tuple(sum(b - a for a, b in chunks) for chunks in layout["chunks"])
    return tuple(b - a for a, b in layout["stageLayers"])
