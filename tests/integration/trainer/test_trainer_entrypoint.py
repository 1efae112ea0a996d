"""The real entry point under torchrun: two launchers (one per "node") x 2 processes, like the
operator's pods."""

import json
import os

import pytest
import yaml

from holmes.contract import ModelCost
from holmes.trainer.config import TrainConfig
from tests.helpers.trainer.trainer_harness import TINY_JOB, finish_nodes, make_layout, start_nodes


def _write(tmp_path, job=TINY_JOB, layout=None):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    layout = layout or make_layout(2, 2, [3, 1], 2, 4, gpus_per_node=2)
    (tmp_path / "layout.json").write_text(layout.to_json())


def _launch(tmp_path, nnodes, nproc, extra_env=None, args=()):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HOLMES_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "HOLMES_TERMINATION_LOG": str(tmp_path / "termination-log"),
        **(extra_env or {}),
    }
    return finish_nodes(start_nodes(tmp_path, nnodes, nproc, env, args=args), timeout=150)


def test_torchrun_two_nodes_of_two_runs_the_layout_and_reports(tmp_path):
    _write(tmp_path)
    outs = _launch(tmp_path, nnodes=2, nproc=2)
    for code, _out, err in outs:
        assert code == 0, err[-3000:]
    lines = [json.loads(l) for l in outs[0][1].splitlines() if l.startswith('{"holmes"')]
    events = [l["holmes"] for l in lines]
    assert events[0] == "start" and events[-1] == "done" and events.count("iteration") == 3
    it = [l for l in lines if l["holmes"] == "iteration"]
    assert [l["iteration"] for l in it] == [1, 2, 3]
    # the job leaves training.activationRecompute at its default (true): the 96 formula
    assert lines[0]["activationRecompute"] is True and lines[0]["flopsFormula"].startswith("96")
    m = TrainConfig.from_job(TINY_JOB).model
    for l in it:
        assert l["loss"] > 0 and l["tokensPerSecond"] > 0 and l["tflopsPerGpu"] > 0
        assert l["tflopsPerGpu"] == pytest.approx(
            ModelCost.of(m).flops_per_iteration(16, recompute=True) / (l["iterationSeconds"] * 4 * 1e12),
            rel=1e-9,
        )
        assert set(l["time"]) == {"compute", "bubble", "exposedComm", "optimizer", "data"}
    assert "checkpoint" in events and os.path.isfile(tmp_path / "ckpt/iter_00000003/holmes.json")
    assert [json.loads(l)["holmes"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()] == events
    assert outs[1][1].strip() == ""  # only rank 0 reports
    from holmes.operator.progress import from_json_lines

    last = from_json_lines((tmp_path / "termination-log").read_text())
    assert last["iteration"] == 3 and last["loss"] == pytest.approx(it[-1]["loss"], abs=1e-6)


def test_a_world_that_does_not_match_the_layout_is_refused_clearly(tmp_path):
    _write(tmp_path)
    outs = _launch(tmp_path, nnodes=1, nproc=2)
    code, out, err = outs[0]
    assert code != 0 and "layout needs 4" in err
    assert json.loads(out.splitlines()[0])["holmes"] == "error"
