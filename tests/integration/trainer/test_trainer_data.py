"""Data: a token file from the tokenizer tool trains on forked gloo ranks and its loss falls (the
tool, sharding and the token file's checks: tests/unit/trainer/test_trainer_data.py)."""

import pathlib

import numpy as np
import pytest

from holmes.trainer.config import DataConfig, OptimizerConfig
from holmes.trainer.tokenize import BYTE_VOCAB, write_token_file
from tests.helpers.trainer.trainer_harness import TINY, make_layout, run_ranks, tiny_config, train_on_layout

REPO = pathlib.Path(__file__).resolve().parents[3]


def test_a_token_file_from_the_tool_trains_and_its_loss_falls(tmp_path):
    docs = [f.read_text() for f in sorted((REPO / "trainer/holmes/trainer").glob("*.py"))]
    path = tmp_path / "code.bin"
    n = write_token_file(str(path), docs)
    assert n > 20_000
    model = TINY.__class__(**{**TINY.__dict__, "vocab_size": BYTE_VOCAB, "seq_length": 32})
    cfg = tiny_config(
        model=model,
        iterations=30,
        data=DataConfig(path=str(path)),
        optimizer=OptimizerConfig(kind="adamw", learning_rate=1e-2, warmup_iterations=3),
    )
    res = run_ranks(2, train_on_layout, cfg, make_layout(1, 2, [4], 2, 4))
    losses = res[0][1]["losses"]
    assert losses[0] == pytest.approx(np.log(BYTE_VOCAB), abs=0.3)  # starts near uniform
    assert sum(losses[-5:]) / 5 < losses[0] - 1.5, losses
