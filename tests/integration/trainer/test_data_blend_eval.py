"""Data beyond one file: a tokenizer.json with its end-of-document id, blends of token files,
evaluation windows, and training.eval's loss in the metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from holmes.contract.spec_sections import EvalSpec
from holmes.trainer.config import DataConfig, OptimizerConfig
from holmes.trainer.data import BatchLoader, BlendSource, DataError, Sharding, TokenWindows, make_source
from holmes.trainer.tokenize import write_token_file
from tests.helpers.trainer.trainer_harness import TINY, make_layout, run_ranks, tiny_config, train_on_layout


def word_tokenizer(tmp_path, specials=("<unk>", "</s>")) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate([*specials, "the", "cat", "sat", "on", "mat", "."])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(specials))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def tokenize(tmp_path, *args: str) -> subprocess.CompletedProcess:
    docs = []
    for i, text in enumerate(["the cat sat", "on the mat ."]):
        (tmp_path / f"d{i}.txt").write_text(text)
        docs.append(str(tmp_path / f"d{i}.txt"))
    out = str(tmp_path / "tok.bin")
    cmd = [sys.executable, "-m", "holmes.trainer.tokenize", "--out", out, *args, *docs]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_tokenizer_json_separates_documents_with_its_eos_id(tmp_path):
    tok = word_tokenizer(tmp_path)
    p = tokenize(tmp_path, "--tokenizer", tok)
    assert p.returncode == 0, p.stderr
    ids = np.fromfile(tmp_path / "tok.bin", dtype=np.uint16).tolist()
    assert ids == [2, 3, 4, 1, 5, 2, 6, 7, 1]  # </s> is id 1; no other special tokens added
    side = json.loads((tmp_path / "tok.bin.json").read_text())
    assert side["eos"] == 1 and side["vocabSize"] == 8


def test_eos_from_tokenizer_config_or_flag_and_a_clear_error_without(tmp_path):
    tok = word_tokenizer(tmp_path, specials=("<unk>", "<|endoftext|>", "<|im_end|>"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    assert tokenize(tmp_path, "--tokenizer", tok).returncode == 0
    assert np.fromfile(tmp_path / "tok.bin", dtype=np.uint16).tolist()[3] == 2  # tokenizer_config's
    assert tokenize(tmp_path, "--tokenizer", tok, "--eos-token", "<|endoftext|>").returncode == 0
    assert np.fromfile(tmp_path / "tok.bin", dtype=np.uint16).tolist()[3] == 1  # the flag wins
    bad = tokenize(tmp_path, "--tokenizer", tok, "--eos-token", "<nope>")
    assert bad.returncode == 2 and "'<nope>'" in bad.stderr and "Traceback" not in bad.stderr
    (tmp_path / "tokenizer_config.json").unlink()
    bare = word_tokenizer(tmp_path, specials=("<unk>", "<pad>"))
    none = tokenize(tmp_path, "--tokenizer", bare)
    assert none.returncode == 2 and "--eos-token" in none.stderr


def files(tmp_path, n: int, seq: int = 4, windows: int = 50) -> list[str]:
    """n token files whose tokens say which file they come from (file j holds only id j)."""
    out = []
    for j in range(n):
        path = str(tmp_path / f"f{j}.bin")
        write_token_file(path, [[j] * (windows * seq + 1)], encode=lambda x: x, vocab_size=16, tokenizer="t")
        out.append(path)
    return out


def test_blend_draws_in_proportion_and_is_layout_invariant(tmp_path):
    paths = files(tmp_path, 3)
    blend = ((paths[0], 5.0), (paths[1], 3.0), (paths[2], 2.0))
    src = make_source(None, 16, 4, seed=1, blend=blend)
    assert isinstance(src, BlendSource)
    drawn = Counter(int(src.sample(k)[0]) for k in range(2048))
    assert drawn == {0: 1024, 1: 614, 2: 410}  # 512 : 307.2 : 204.8 per 1024, largest remainder
    first_100 = Counter(int(src.sample(k)[0]) for k in range(100))
    assert abs(first_100[0] - 50) <= 2 and abs(first_100[2] - 20) <= 2  # spread, not in runs
    whole = BatchLoader(src, Sharding(8, 1, 0)).batch(3)[0]
    parts = torch.cat([BatchLoader(src, Sharding(8, 4, d)).batch(3)[0] for d in range(4)])
    assert torch.equal(whole, parts)
    again = make_source(None, 16, 4, seed=1, blend=blend)
    assert all(torch.equal(src.sample(k), again.sample(k)) for k in (0, 517, 5000))  # any k, directly
    with pytest.raises(DataError, match=r"blend\[1\].weight"):
        make_source(None, 16, 4, seed=1, blend=((paths[0], 5000.0), (paths[1], 1.0)))


def test_eval_windows_are_consecutive_and_leave_the_tail_out(tmp_path):
    path = str(tmp_path / "w.bin")
    write_token_file(path, [list(range(23))], encode=lambda x: x, vocab_size=64, tokenizer="t")
    w = TokenWindows(path, 64, seq_length=4)
    assert w.count == 4  # 23 tokens = 4 windows of 5, tail of 3
    assert [w.window(i).tolist() for i in (0, 3)] == [[0, 1, 2, 3, 4], [15, 16, 17, 18, 19]]
    with pytest.raises(DataError, match="fewer than one window"):
        TokenWindows(path, 64, seq_length=30)


def test_training_eval_reports_the_same_loss_under_any_layout(tmp_path):
    """training.eval every 2 iterations: the evalLoss in the iteration records is the same under
    PP=2 x DP=2 and one process, and falls as the model learns the data it is evaluated on."""
    path = str(tmp_path / "e.bin")
    g = torch.Generator().manual_seed(0)
    pattern = torch.randint(0, 64, (17,), generator=g).tolist()
    write_token_file(path, [pattern * 40], encode=lambda x: x, vocab_size=64, tokenizer="t")
    cfg = tiny_config(
        iterations=6,
        data=DataConfig(path=path),
        eval=EvalSpec(path, interval_iterations=2, windows=9),
        optimizer=OptimizerConfig(kind="adamw", learning_rate=1e-2),
    )
    multi = run_ranks(4, train_on_layout, cfg, make_layout(2, 2, [1, 3], 2, 4))[0][1]["records"]
    single = run_ranks(1, train_on_layout, cfg, make_layout(1, 1, [4], 2, 8))[0][1]["records"]
    evals = [r.get("evalLoss") for r in multi]
    assert [e is not None for e in evals] == [False, True, False, True, False, True]
    assert evals[1::2] == pytest.approx([r["evalLoss"] for r in single if "evalLoss" in r], rel=1e-5)
    assert evals[5] < evals[1]
    assert multi[1]["evalPerplexity"] == pytest.approx(np.exp(evals[1]))


def test_spec_fields_reach_the_trainer_config():
    from holmes.contract import load_job
    from holmes.trainer.config import TrainConfig

    spec = {
        "model": {**{k: v for k, v in TINY.to_spec().items() if k != "kvHeads"}, "architecture": "gpt"},
        "training": {
            "globalBatchSize": 16,
            "microBatchSize": 2,
            "iterations": 10,
            "learningRate": 1.0e-3,
            "decay": "linear",
            "minLearningRate": 1.0e-4,
            "betas": [0.8, 0.99],
            "data": {"blend": [{"path": "/a.bin", "weight": 2}, {"path": "/b.bin", "weight": 1}]},
            "eval": {"data": {"path": "/v.bin"}, "intervalIterations": 5},
        },
        "nodes": {"count": 1, "gpusPerNode": 1},
    }
    cfg = TrainConfig.from_jobspec(load_job(spec))
    o = cfg.optimizer
    assert (o.decay, o.min_learning_rate, *o.betas) == ("linear", 1e-4, 0.8, 0.99)
    assert cfg.data.blend == (("/a.bin", 2.0), ("/b.bin", 1.0))
    assert cfg.eval == EvalSpec("/v.bin", 5, None)
    from holmes.trainer.engine import learning_rate

    assert [round(learning_rate(o, i, 10), 6) for i in (0, 5, 9)] == [0.001, 0.00055, 0.00019]
