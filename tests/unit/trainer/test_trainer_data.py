"""Data: the tokenizer tool, deterministic sharding, the token file's checks (a token file that trains:
tests/integration/trainer/test_trainer_data.py)."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from holmes.trainer.data import BatchLoader, DataError, Sharding, SyntheticSource, TokenFileSource
from holmes.trainer.tokenize import BYTE_VOCAB, byte_decode, byte_encode, write_token_file


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


def test_uint32_token_file_with_ids_above_uint16_and_the_epoch_wrap_around(tmp_path):
    """ids >= 65536 survive (uint32), every window is seen once per epoch, and the next epoch
    is a different order of the same windows."""
    seq, vocab = 4, 100_000
    ids = np.arange(70_000, 70_000 + 4 * seq + 1, dtype=np.uint32)  # 4 windows of seq+1
    path = tmp_path / "big.bin"
    ids.tofile(path)
    (tmp_path / "big.bin.json").write_text(json.dumps({"dtype": "uint32", "vocabSize": vocab}))
    src = TokenFileSource(str(path), vocab, seq, seed=5)
    assert src.windows == 4
    epoch0 = [src.sample(k) for k in range(4)]
    epoch1 = [src.sample(k) for k in range(4, 8)]
    starts0 = sorted(int(w[0]) for w in epoch0)
    assert starts0 == [70_000 + i * seq for i in range(4)]  # each window once, values intact
    assert sorted(int(w[0]) for w in epoch1) == starts0  # the wrap-around sees them all again
    assert [int(w[0]) for w in epoch0] != [int(w[0]) for w in epoch1]  # in a new order
    assert all(w.dtype == torch.int64 and len(w) == seq + 1 for w in epoch0)
    assert torch.equal(src.sample(1), epoch0[1])  # going back to epoch 0 gives the same window
    with pytest.raises(DataError, match="vocabSize"):
        TokenFileSource(str(path), 70_001, seq, seed=5).sample(0)  # an id >= the model's vocabulary
