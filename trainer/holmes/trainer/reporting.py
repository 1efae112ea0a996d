"""Rank 0's report: one JSON line per event on stdout (and in --metrics-file), and Prometheus
gauges; their names and keys are the operator's too (holmes.contract.trainer_metrics).

Only rank 0 reports. Keys are camelCase like HolmesJob.status.progress (iteration, loss,
tokensPerSecond, tflopsPerGpu: model FLOPs per second per GPU, with the formula that matches
whether the run recomputes activations, named in the ``start`` line's ``flopsFormula``). Every
line carries ``"holmes": "<event>"`` so a reader can pick them out of other output: ``start``,
``iteration``, ``eval``, ``checkpoint``, ``resume``, ``preempted``, ``done``, ``error``. An
iteration after which training.eval ran carries ``evalLoss`` and ``evalPerplexity`` too.
An iteration line carries ``stages`` once every stage has been timed: per stage its layers,
``computeSeconds`` (forward and backward of all micro-batches), ``layerSeconds`` (that per layer
and micro-batch), ``p2pWaitSeconds`` (waits in pipeline p2p: transfers and neighbours) and
``dpExposedSeconds``, means over the stage's ranks, measured in the previous iteration
(stage_times.py); the gauges ``holmes_trainer_stage_*{stage}`` hold their recent medians, and
the ``start`` line's ``layout`` (degrees, layers per stage, node order) says what ran.
``resume``: the iteration, ``consumedSamples``, ``layoutChanged`` and ``rngRestored`` (only
under the same layout). ``preempted`` (SIGTERM, preempt.py): the iteration all ranks stopped
after, its ``loss``, ``saved`` (and ``path``), the save's ``seconds``, ``signalledRanks`` and
``graceLeftSeconds`` before the save. The latest iteration/preempted/done/error line also
replaces the container's termination message file
(Kubernetes' /dev/termination-log), where the operator reads progress once the pod has ended.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from holmes.contract import trainer_metrics as wire


class MetricsSink:
    """Writes metric records; a no-op on ranks other than 0."""

    def __init__(
        self,
        enabled: bool,
        metrics_file: str | None = None,
        port: int | None = None,
        addr: str = "0.0.0.0",
        stream: TextIO | None = None,
        termination_log: str | None = None,
    ):
        self.enabled = enabled
        self.termination_log = termination_log
        self.stream = stream or sys.stdout
        self.file = open(metrics_file, "a") if enabled and metrics_file else None
        self.server: Any = None  # prometheus_client's WSGI server, while serving
        self.port: int | None = None
        self._gauges: dict[str, Any] = {}
        if enabled and port is not None:
            self._start_prometheus(port, addr)

    def _start_prometheus(self, port: int, addr: str) -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        for key, name in wire.GAUGES.items():  # checkpointIteration: set by checkpoint events
            self._gauges[key] = Gauge(name, f"Holmes trainer {key}", registry=self.registry)
        self._time = Gauge(
            wire.TIME_GAUGE,
            "Where the last iteration's time went",
            [wire.PART_LABEL],
            registry=self.registry,
        )
        self._fabric = Gauge(
            wire.FABRIC_GAUGE,
            "Fabric problems the start-up check found, by kind (training.fabricCheck: warn)",
            [wire.FABRIC_KIND_LABEL],
            registry=self.registry,
        )
        self._stage = {
            key: Gauge(
                name,
                f"Holmes trainer, per pipeline stage: {key} (median over the recent iterations)",
                [wire.STAGE_LABEL],
                registry=self.registry,
            )
            for key, name in wire.STAGE_GAUGES.items()  # stage_times.StageTimes.summary()'s rows
        }
        started = start_http_server(port, addr=addr, registry=self.registry)
        self.server = started[0] if isinstance(started, tuple) else None
        self.port = self.server.server_port if self.server is not None else port

    def fabric_problems(self, counts: dict[str, int]) -> None:
        """How many problems of each kind (wire.FABRIC_KINDS) the start-up check found."""
        if self.enabled and self._gauges:
            for kind in wire.FABRIC_KINDS:
                self._fabric.labels(kind).set(counts.get(kind, 0))

    def stages(self, summary: list[dict[str, Any]]) -> None:
        """Every stage's medians as gauges (rank 0; nothing before the first window)."""
        if not (self.enabled and self._gauges and summary):
            return
        for row in summary:
            for key, gauge in self._stage.items():
                gauge.labels(str(row[wire.STAGE_LABEL])).set(row[key])

    def emit(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        line = json.dumps({wire.EVENT_KEY: event, **fields}, sort_keys=False)
        print(line, file=self.stream, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()
        if self.termination_log and event in wire.LAST_LINE_EVENTS:
            try:
                with open(self.termination_log, "w") as f:  # Kubernetes keeps at most 4 KiB
                    f.write(line[:4000] + "\n")
            except OSError:
                self.termination_log = None
        if event == wire.CHECKPOINT and self._gauges:
            self._gauges["checkpointIteration"].set(fields["iteration"])
        if event == wire.ITERATION and self._gauges:
            for key, gauge in self._gauges.items():
                if fields.get(key) is not None:
                    gauge.set(fields[key])
            for part, secs in (fields.get("time") or {}).items():
                self._time.labels(part).set(secs)

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
