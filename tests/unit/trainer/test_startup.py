"""The one start-up of training, evaluation and the dry run (startup.py): what it checks, and the
errors that say what to fix. No process group: the world is the caller's to join."""

from __future__ import annotations

import pytest
import yaml
from holmes_dev.jobs import holmes_job

from holmes.trainer.startup import StartupError, configure, start, torchrun_ranks
from tests.helpers.trainer.trainer_harness import make_layout

JOB = holmes_job(
    "tiny",
    {
        "model": {"layers": 4, "hiddenSize": 32, "attentionHeads": 4, "seqLength": 16, "vocabSize": 64},
        "training": {"globalBatchSize": 16, "microBatchSize": 2, "iterations": 3, "learningRate": 1e-3},
        "parallelism": {"pipeline": 2, "data": 2},
        "nodes": {"count": 2, "gpusPerNode": 2},
    },
)


@pytest.fixture
def files(tmp_path):
    """job.yaml, the job's own layout (16 samples an iteration) and one of the same model that
    runs 8 samples an iteration."""
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(JOB))
    (tmp_path / "layout.json").write_text(make_layout(2, 2, [3, 1], 2, 4, gpus_per_node=2).to_json())
    (tmp_path / "half.json").write_text(make_layout(2, 2, [3, 1], 2, 2, gpus_per_node=2).to_json())
    return tmp_path


def test_training_checks_the_whole_job_evaluation_only_the_model(files):
    job = str(files / "job.yaml")
    cfg, layout = configure(job, str(files / "layout.json"), training=True, world=4)
    assert layout.world_size == 4 and cfg.global_batch_size == 16
    with pytest.raises(StartupError, match="globalBatchSize is 16"):
        configure(job, str(files / "half.json"), training=True)
    cfg, layout = configure(job, str(files / "half.json"), training=False)  # any layout of the model
    assert layout.micro_batches == 2


def test_overrides_and_the_checkpoint_directory_reach_the_config(files):
    cfg, _ = configure(
        str(files / "job.yaml"),
        str(files / "layout.json"),
        training=True,
        checkpoint_dir="/ckpt",
        iterations=7,
        dtype="bf16",
        optimizer="sgd",
    )
    assert (cfg.checkpoint.path, cfg.iterations, cfg.dtype, cfg.optimizer.kind) == (
        "/ckpt",
        7,
        "bfloat16",
        "sgd",
    )


def test_a_world_that_does_not_match_the_layout_is_refused(files):
    with pytest.raises(StartupError, match="torchrun started 2 processes but the layout needs 4"):
        configure(str(files / "job.yaml"), str(files / "layout.json"), training=False, world=2)


def test_a_missing_file_and_a_bad_job_say_which(files):
    with pytest.raises(StartupError, match="nope.json"):
        configure(str(files / "job.yaml"), str(files / "nope.json"), training=True)
    bad = dict(JOB, spec={**JOB["spec"], "training": {**JOB["spec"]["training"], "microBatchSize": 0}})
    (files / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(StartupError, match="microBatchSize"):
        configure(str(files / "bad.yaml"), str(files / "layout.json"), training=True)


def test_without_torchrun_the_error_names_the_variables_and_torchrun():
    with pytest.raises(
        StartupError, match="RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set"
    ) as e:
        torchrun_ranks({})
    assert "torchrun --nnodes" in str(e.value) and e.value.rank is None
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "a", "MASTER_PORT": "1"}
    assert torchrun_ranks(env) == (3, 1)


def test_start_names_the_rank_that_cannot_start(files, monkeypatch):
    for k, v in {
        "RANK": "2",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "x",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(StartupError, match="layout needs 4") as e:
        start(str(files / "job.yaml"), str(files / "layout.json"), training=True)
    assert e.value.rank == 2
    monkeypatch.setenv("WORLD_SIZE", "4")
    started = start(str(files / "job.yaml"), str(files / "layout.json"), training=True, backend="gloo")
    assert (started.rank, started.backend, started.device.type, started.cfg.dtype) == (
        2,
        "gloo",
        "cpu",
        "float32",
    )
