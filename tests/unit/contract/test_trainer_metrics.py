"""The trainer's metrics are a wire format (holmes.contract.trainer_metrics): what the rank-0
trainer writes (holmes.trainer.reporting), as lines and as gauges, the operator reads back
(holmes.operator.progress) number for number."""

from __future__ import annotations

import io
import json

import pytest

from holmes.contract import trainer_metrics as wire
from holmes.operator import progress
from holmes.trainer.reporting import MetricsSink

# one value per progress key, none of them a gauge's 0 ("not yet")
NUMBERS = {key: float(i + 2) + 0.25 for i, key in enumerate(wire.PROGRESS_GAUGES)}
WANT = {k: int(v) if k in wire.INTEGER_KEYS else v for k, v in NUMBERS.items()}
ROWS = [
    {wire.STAGE_LABEL: s, **{k: float(10 * s + i + 1) for i, k in enumerate(wire.STAGE_GAUGES)}}
    for s in (0, 1)
]


@pytest.fixture
def sink(tmp_path):
    out = MetricsSink(
        enabled=True,
        port=0,
        addr="127.0.0.1",
        stream=io.StringIO(),
        termination_log=str(tmp_path / "termination-log"),
    )
    yield out
    out.close()


def test_every_progress_number_in_a_line_reads_back(sink, tmp_path):
    sink.emit(wire.ITERATION, **NUMBERS, learningRate=0.1, stages=ROWS, time={"compute": 1.0})
    line = sink.stream.getvalue().splitlines()[-1]
    assert json.loads(line)[wire.EVENT_KEY] == wire.ITERATION
    read = progress.from_json_lines("other output\n" + line)
    assert {k: read[k] for k in wire.PROGRESS_GAUGES} == WANT
    assert read[wire.STAGES] == [
        {k: int(v) if k in wire.STAGE_INTEGER_KEYS else v for k, v in r.items()} for r in ROWS
    ]
    # the termination message is the latest line of an event the operator reads after the end
    sink.emit(wire.CHECKPOINT, iteration=9, path="/c", seconds=0.5)
    assert (tmp_path / "termination-log").read_text().strip() == line
    sink.emit(wire.DONE, iteration=3, loss=1.5, fabricWarnings=["rank 1: dp group expects IB"])
    last = progress.from_json_lines((tmp_path / "termination-log").read_text())
    assert last == {"iteration": 3, "loss": 1.5, wire.FABRIC_WARNINGS: ["rank 1: dp group expects IB"]}


def test_every_progress_gauge_and_stage_gauge_reads_back(sink):
    sink.emit(wire.ITERATION, **{k: v for k, v in NUMBERS.items() if k != "checkpointIteration"})
    sink.emit(wire.CHECKPOINT, iteration=NUMBERS["checkpointIteration"])  # its gauge's only writer
    sink.stages(ROWS)
    sink.fabric_problems({"socketFallback": 1})
    read = progress.scrape(f"http://127.0.0.1:{sink.port}/metrics")
    assert {k: read[k] for k in wire.PROGRESS_GAUGES} == {
        k: round(v, 6) if k not in wire.INTEGER_KEYS else int(v) for k, v in NUMBERS.items()
    }
    assert [r[wire.STAGE_LABEL] for r in read[wire.STAGES]] == [0, 1]
    assert read[wire.STAGES][1]["computeSeconds"] == ROWS[1]["computeSeconds"]
    assert read[wire.FABRIC_WARNINGS] == [progress.fabric_warning("socketFallback", 1)]


def test_the_names_are_unique():
    gauges = [*wire.GAUGES.values(), *wire.STAGE_GAUGES.values(), wire.FABRIC_GAUGE, wire.TIME_GAUGE]
    assert len(set(gauges)) == len(gauges) and all(g.startswith("holmes_trainer_") for g in gauges)
    assert set(wire.LAST_LINE_EVENTS) <= set(wire.EVENTS) and set(wire.PROGRESS_EVENTS) <= set(wire.EVENTS)
