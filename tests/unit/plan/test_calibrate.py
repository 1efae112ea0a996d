"""Calibration (measured stage times in, per-stage / per-node rates out) and `holmes plan --measured`."""

import json
from pathlib import Path

import pytest

from holmes.cli import load_nodes, main
from holmes.contract import load_job
from holmes.plan import CostModelConfig, plan
from holmes.plan.calibrate import assess, calibrate, with_rates
from holmes.plan.estimate import evaluate_run
from holmes.plan.measured import MIN_SAMPLES, WARMUP, CalibrationError, RunLayout, from_records, read_metrics

ROOT = Path(__file__).resolve().parents[3]
MIXED = str(ROOT / "examples" / "nodes" / "mixed-gpus.yaml")
JOB = str(ROOT / "examples" / "jobs" / "gpt-7b.yaml")


def planned_compute(nodes, job, run):
    c = evaluate_run(nodes, job, run, CostModelConfig())
    return [run.micro_batches * (x.fwd(n) + x.bwd(n)) for x, n in zip(c.costs, c.layers)]


def records(run, computes, iterations=WARMUP + MIN_SAMPLES, jitter=0.0):
    """A trainer's metrics lines for ``run``: stage compute seconds per iteration."""
    start = {
        "holmes": "start",
        "layout": {
            "nodes": list(run.nodes),
            "stageLayers": [[sum(run.layers[:s]), sum(run.layers[: s + 1])] for s in range(run.pipeline)],
            "tensor": run.tensor,
            "data": run.data,
            "pipeline": run.pipeline,
            "microBatches": run.micro_batches,
        },
    }
    out = [start]
    for i in range(iterations):
        k = 1 + jitter * (i % 3 - 1)  # median 1 over any three in a row
        out.append(
            {
                "holmes": "iteration",
                "iteration": i + 1,
                "iterationSeconds": sum(computes) * k,
                "stages": [
                    {
                        "stage": s,
                        "layers": n,
                        "computeSeconds": c * k,
                        "p2pWaitSeconds": 0.1,
                        "dpExposedSeconds": 0.01,
                    }
                    for s, (n, c) in enumerate(zip(run.layers, computes))
                ],
            }
        )
    return out


@pytest.fixture(scope="module")
def mixed():
    nodes, job = load_nodes(MIXED), load_job(JOB)
    return nodes, job, RunLayout.of(plan(nodes, job))


def test_rates_out_of_measured_times(mixed):
    nodes, job, run = mixed
    planned = planned_compute(nodes, job, run)
    # stage 0 (A100s) as planned, stage 1 (H100s) twice as slow as the table says
    measured = from_records(records(run, [planned[0], 2 * planned[1]], jitter=0.05))
    assert measured.samples == MIN_SAMPLES and measured.run == run
    cal = calibrate(nodes, job, measured, CostModelConfig())
    a100, h100 = cal.stages
    assert a100.tflops == pytest.approx(312 * 0.66, rel=1e-3) and a100.ratio == pytest.approx(1, rel=1e-3)
    assert h100.tflops == pytest.approx(989.4 * 0.66 / 2, rel=1e-3) and h100.ratio == pytest.approx(
        2, rel=1e-3
    )
    assert cal.islands == {
        "west/infiniband": pytest.approx(a100.tflops),
        "east/infiniband": pytest.approx(h100.tflops),
    }
    assert {cal.node_tflops[n] for n in run.nodes[:4]} | {cal.node_tflops[n] for n in run.nodes[4:]} == {
        a100.tflops,
        h100.tflops,
    }


def test_measured_rates_move_layers_and_the_calibrated_estimate_holds(mixed):
    nodes, job, run = mixed
    planned = planned_compute(nodes, job, run)
    measured = from_records(records(run, [planned[0], 3 * planned[1]]))
    cal, now_s = assess(nodes, job, run, measured, CostModelConfig())
    best = plan(with_rates(nodes, cal.node_tflops), job)
    assert best.stages[1].num_layers < run.layers[1]  # the slow H100 stage gives layers away
    assert best.estimate["iterationSeconds"] < now_s
    # the calibrated model reproduces the measured stage compute of the running layout
    again = planned_compute(with_rates(nodes, cal.node_tflops), job, run)
    assert again == pytest.approx([planned[0], 3 * planned[1]], rel=1e-6)


def test_bad_measurements_say_what_is_missing(mixed, tmp_path):
    nodes, job, run = mixed
    with pytest.raises(CalibrationError, match="needs at least 3"):
        from_records(records(run, [1.0, 1.0], iterations=WARMUP + 1))
    with pytest.raises(CalibrationError, match="no start line"):
        from_records(records(run, [1.0, 1.0])[1:])
    with pytest.raises(CalibrationError, match="cannot read the metrics file"):
        read_metrics(str(tmp_path / "missing.jsonl"))


def write(tmp_path, recs):
    p = tmp_path / "metrics.jsonl"
    p.write_text("not json\n" + "\n".join(json.dumps(r) for r in recs) + "\n")
    return str(p)


def test_holmes_plan_measured_prints_the_calibrated_plan_and_the_change(mixed, tmp_path, capsys):
    nodes, job, run = mixed
    planned = planned_compute(nodes, job, run)
    path = write(tmp_path, records(run, [planned[0], 3 * planned[1]]))
    assert main(["plan", "--nodes", MIXED, "--job", JOB, "--measured", path]) == 0
    out = capsys.readouterr().out
    assert (
        "Calibrated plan" in out
        and "would re-plan" in out
        and f"layers {run.layers[0]}/{run.layers[1]} ->" in out
    )
    assert main(["plan", "--nodes", MIXED, "--job", JOB, "--measured", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["wouldReplan"] and doc["gain"] > 0.1 and doc["stages"][1]["tflopsPerGpu"] < 989.4 * 0.66 / 2.9
    # measured as planned: no change
    same = write(tmp_path, records(run, planned))
    assert main(["plan", "--nodes", MIXED, "--job", JOB, "--measured", same]) == 0
    assert "change: none" in capsys.readouterr().out


def test_holmes_plan_measured_refuses_a_file_without_stage_times(tmp_path, capsys):
    path = write(tmp_path, [{"holmes": "iteration", "iteration": 1}])
    assert main(["plan", "--nodes", MIXED, "--job", JOB, "--measured", path]) == 2
    assert "no start line" in capsys.readouterr().err


def test_the_operators_cached_nodes_take_the_measured_rates(mixed):
    """The operator's node cache keeps each node's classification key on it (watches.slim_node);
    a copy with the measured rate must be classified by its own labels, not the cached ones (the
    re-plan once judged every slow stage as planned: its calibrated estimate was the table's)."""
    from holmes.operator.watches import slim_node

    nodes, job, run = mixed
    cached = [slim_node(n) for n in nodes]
    plan(cached, job)  # classified once with the table's rates
    planned = planned_compute(nodes, job, run)
    measured = from_records(records(run, [planned[0], 3 * planned[1]]))
    cal, _ = assess(cached, job, run, measured, CostModelConfig())
    again = planned_compute(with_rates(cached, cal.node_tflops), job, run)
    assert again == pytest.approx([planned[0], 3 * planned[1]], rel=1e-6)
    best = plan(with_rates(cached, cal.node_tflops), job)
    assert best.stages[1].num_layers < run.layers[1]
