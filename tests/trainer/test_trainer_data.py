"""Data: the tokenizer tool, deterministic sharding, and a token file that trains."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from holmes.trainer.config import DataConfig, OptimizerConfig
from holmes.trainer.data import BatchLoader, DataError, Sharding, SyntheticSource, TokenFileSource
from holmes.trainer.tokenize import BYTE_VOCAB, byte_decode, byte_encode, write_token_file
from tests.trainer.trainer_harness import TINY, make_layout, run_ranks, tiny_config, train_on_layout

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_byte_tokenizer_round_trips_and_cli_writes_file_and_sidecar(tmp_path):
    text = "héllo, Holmes ✓"
    assert byte_decode(byte_encode(text)) == text
    src = tmp_path / "a.txt"
    src.write_text(text)
    out = tmp_path / "tokens.bin"
    proc = subprocess.run(
        [sys.executable, "-m", "holmes.trainer.tokenize", "--out", str(out), str(src)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(proc.stdout)["tokens"] == len(text.encode()) + 1
    ids = np.fromfile(out, dtype=np.uint16)
    assert ids.tolist() == byte_encode(text)
    assert json.loads((tmp_path / "tokens.bin.json").read_text())["vocabSize"] == BYTE_VOCAB


def test_global_batch_is_the_same_samples_whatever_the_dp_degree():
    src = SyntheticSource(64, 16, seed=3)
    whole = BatchLoader(src, Sharding(8, 1, 0)).batch(5)[0]
    parts = torch.cat([BatchLoader(src, Sharding(8, 4, d)).batch(5)[0] for d in range(4)])
    assert torch.equal(whole, parts)
    assert not torch.equal(whole, BatchLoader(src, Sharding(8, 1, 0)).batch(6)[0])


def test_token_file_errors_say_what_to_fix(tmp_path):
    with pytest.raises(DataError, match="tokenize"):
        TokenFileSource(str(tmp_path / "missing.bin"), 257, 16, 0)
    p = tmp_path / "t.bin"
    write_token_file(str(p), ["abc"])
    with pytest.raises(DataError, match="fewer than one sample"):
        TokenFileSource(str(p), 257, 16, 0)
    with pytest.raises(DataError, match="vocabSize"):
        TokenFileSource(str(p), 64, 2, 0)


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
