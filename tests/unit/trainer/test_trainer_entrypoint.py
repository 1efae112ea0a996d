"""The entry point's pieces in-process: the config checked against the layout, the paper FLOPs
formula and the metrics endpoint, the parameter count (the real entry point under torchrun:
tests/integration/trainer/test_trainer_entrypoint.py)."""

import os
import urllib.request

import pytest

from holmes.contract import ModelCost, ModelSpec
from holmes.trainer.config import TrainConfig, TrainerConfigError
from holmes.trainer.reporting import MetricsSink
from tests.helpers.trainer.trainer_harness import TINY_JOB, make_layout


def test_numbers_from_the_environment_are_parsed_and_a_bad_one_is_a_usage_error(monkeypatch, capsys):
    from holmes.trainer.__main__ import parse_args

    base = ["--job", "job.yaml", "--layout", "layout.json"]
    monkeypatch.setenv("HOLMES_METRICS_PORT", "9400")
    monkeypatch.setenv("HOLMES_TIMEOUT_SECONDS", "")  # empty: unset
    monkeypatch.setenv("HOLMES_BUCKET_ELEMENTS", "1024")
    a = parse_args(base)
    assert (a.metrics_port, a.timeout_seconds, a.bucket_elements) == (9400, None, 1024)
    assert parse_args([*base, "--metrics-port", "81"]).metrics_port == 81  # the flag wins
    monkeypatch.setenv("HOLMES_TIMEOUT_SECONDS", "2.5")
    assert parse_args(base).timeout_seconds == 2.5
    # exit 2 (cannot start: configuration), naming the option, instead of a ValueError traceback
    monkeypatch.setenv("HOLMES_METRICS_PORT", "ninety")
    with pytest.raises(SystemExit) as e:
        parse_args(base)
    assert e.value.code == 2 and "--metrics-port: invalid int value: 'ninety'" in capsys.readouterr().err


def test_config_checks_against_layout():
    cfg = TrainConfig.from_job(TINY_JOB)
    assert cfg.model.ffn_hidden_size == 128 and cfg.optimizer.kind == "adamw" and cfg.checkpoint.path is None
    lay = make_layout(2, 2, [3, 1], 2, 4, gpus_per_node=2)
    cfg.check_against_layout(lay)
    from dataclasses import replace

    with pytest.raises(TrainerConfigError, match="tensor 2 but no tp group family"):
        cfg.check_against_layout(replace(lay, tensor=2, data=1))
    tp_layout = make_layout(2, 1, [3, 1], 2, 8, gpus_per_node=2, tensor=2)
    cfg.check_against_layout(tp_layout)
    odd = cfg.with_(model=replace(cfg.model, vocab_size=cfg.model.vocab_size + 1))
    with pytest.raises(TrainerConfigError, match="cannot split this model: 2 must divide model.vocabSize"):
        odd.check_against_layout(tp_layout)
    with pytest.raises(TrainerConfigError, match="model.seqLength"):
        cfg.with_(model=replace(cfg.model, seq_length=15), sequence_parallel=True).check_against_layout(
            tp_layout
        )
    with pytest.raises(TrainerConfigError, match="globalBatchSize is 32"):
        cfg.with_(global_batch_size=32).check_against_layout(lay)
    with pytest.raises(TrainerConfigError, match="cover 4 layers"):
        cfg.with_(model=replace(cfg.model, layers=6)).check_against_layout(lay)
    tied = cfg.with_(model=replace(cfg.model, tied_embeddings=True))
    with pytest.raises(
        TrainerConfigError, match="tiedEmbeddings is true but the layout has no embedding group"
    ):
        tied.check_against_layout(lay)
    tied.check_against_layout(make_layout(2, 2, [3, 1], 2, 4, gpus_per_node=2, embedding=True))
    with pytest.raises(TrainerConfigError, match="does not tie embeddings"):
        cfg.check_against_layout(make_layout(2, 2, [3, 1], 2, 4, gpus_per_node=2, embedding=True))


def test_paper_flops_formula_and_prometheus_endpoint():
    m = ModelSpec(layers=36, hidden_size=4096, attention_heads=32, seq_length=2048, vocab_size=50257)
    # design §1: 96 samples/s on 64 GPUs -> 196.8 TFLOPS/GPU
    assert ModelCost.of(m).flops_per_iteration(96, recompute=True) / (1.0 * 64 * 1e12) == pytest.approx(
        196.8, abs=0.1
    )
    sink = MetricsSink(enabled=True, port=0, addr="127.0.0.1", stream=open(os.devnull, "w"))
    try:
        sink.emit("iteration", iteration=7, loss=2.5, tokensPerSecond=1000.0, time={"bubble": 0.25})
        body = urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/metrics", timeout=5).read().decode()
        assert "holmes_trainer_loss 2.5" in body and "holmes_trainer_iteration 7.0" in body
        assert 'holmes_trainer_time_seconds{part="bubble"} 0.25' in body
    finally:
        sink.close()


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_count_is_the_planners_and_matches_the_module(tied):
    from dataclasses import replace

    from holmes.contract.jobspec import JobSpec
    from holmes.trainer.model import build_full

    spec = JobSpec.from_manifest(TINY_JOB)
    m = TrainConfig.from_jobspec(replace(spec, model=replace(spec.model, tied_embeddings=tied))).model
    module = build_full(m, seed=0)
    assert ModelCost.of(m).total_params == sum(p.numel() for p in module.parameters())
