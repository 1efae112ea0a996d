"""Hugging Face weights in and out, against transformers itself: tiny random models built here
(nothing is downloaded), the same windows of one token file, fp32."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers  # a test dependency (pyproject test extra): a missing one fails, not skips
import yaml

from holmes.contract import ModelSpec
from holmes.trainer import hf, load_barrier
from holmes.trainer.assemble import load_start_weights, stage_model
from holmes.trainer.config import CheckpointConfig, OptimizerConfig
from holmes.trainer.data import BatchLoader, Sharding, TokenWindows, make_source
from holmes.trainer.evaluate import Evaluator
from holmes.trainer.export import main as export_main
from holmes.trainer.groups import build_groups
from holmes.trainer.model import build_full
from holmes.trainer.tokenize import write_token_file
from tests.helpers.trainer.trainer_harness import (
    free_port,
    make_layout,
    run_ranks,
    tiny_config,
    train_on_layout,
)

SEQ, VOCAB = 16, 98  # even: tensor parallelism 2 splits the vocabulary
LLAMA = ModelSpec(
    layers=3,
    hidden_size=64,
    attention_heads=4,
    seq_length=SEQ,
    vocab_size=VOCAB,
    ffn_hidden_size=160,
    architecture="llama",
    kv_heads=2,
    rope_theta=10000.0,
)


def llama_dir(tmp_path, model: ModelSpec = LLAMA, shard: str = "40KB") -> str:
    """A random LlamaForCausalLM (GQA, untied) as save_pretrained writes it, in several shards."""
    torch.manual_seed(0)
    conf = transformers.LlamaConfig(
        hidden_size=model.hidden_size,
        intermediate_size=model.ffn_hidden_size,
        num_hidden_layers=model.layers,
        num_attention_heads=model.attention_heads,
        num_key_value_heads=model.kv_heads,
        vocab_size=model.vocab_size,
        max_position_embeddings=64,
        rms_norm_eps=model.norm_eps,
        rope_theta=model.rope_theta,
        tie_word_embeddings=model.tied_embeddings,
    )
    path = str(tmp_path / "hf-llama")
    transformers.LlamaForCausalLM(conf).save_pretrained(path, max_shard_size=shard)
    return path


def token_file(tmp_path, windows: int = 19, tail: int = 5, seed: int = 1) -> str:
    """windows x (SEQ+1) random tokens and a shorter tail that evaluation must leave out."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (windows * (SEQ + 1) + tail,), generator=g).tolist()
    path = str(tmp_path / f"tokens-{seed}.bin")
    write_token_file(path, [ids], encode=lambda x: x, vocab_size=VOCAB, tokenizer="test")
    return path


def hf_loss(model, tokens: str) -> float:
    """transformers' own mean next-token loss over the file's non-overlapping SEQ+1 windows."""
    ids = np.fromfile(tokens, dtype=np.uint16).astype(np.int64)
    n = len(ids) // (SEQ + 1)
    w = torch.from_numpy(ids[: n * (SEQ + 1)].reshape(n, SEQ + 1))
    with torch.no_grad():
        logits = model.eval()(input_ids=w[:, :-1]).logits
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), w[:, 1:].reshape(-1)))


def evaluate_on_layout(rank, cfg, layout, tokens, ckpt):
    groups = build_groups(layout, rank, "gloo", 30)
    cpu = torch.device("cpu")
    module = stage_model(cfg, layout, rank, cpu, groups)
    load_start_weights(module, cfg, ckpt, groups.world)
    windows = TokenWindows(tokens, cfg.model.vocab_size, cfg.model.seq_length)
    return Evaluator(module, cfg.model, layout, rank, groups, windows, cpu, torch.float32).run()


def with_init(model: ModelSpec, path: str) -> ModelSpec:
    from holmes.contract.spec_sections import HuggingFaceSource, ModelInit

    return replace(model, init=ModelInit(HuggingFaceSource(path)))


def test_stage_loads_the_same_logits_as_transformers(tmp_path):
    path = llama_dir(tmp_path)
    assert os.path.isfile(os.path.join(path, hf.INDEX))  # sharded, with an index
    ours = build_full(LLAMA, seed=0)
    assert hf.load_stage(ours, LLAMA, path) == len(list(ours.parameters()))
    theirs = transformers.LlamaForCausalLM.from_pretrained(path).eval()
    x = torch.randint(0, VOCAB, (2, SEQ))
    with torch.no_grad():
        assert torch.allclose(ours(x), theirs(input_ids=x).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "pipeline, data, split, tensor, sp",
    [
        (2, 2, [1, 2], 1, False),
        (1, 2, [3], 1, False),
        (1, 1, [3], 1, False),
        (2, 1, [1, 2], 2, False),
        (1, 1, [3], 2, True),
    ],
)
def test_evaluate_matches_transformers_loss_in_any_layout(tmp_path, pipeline, data, split, tensor, sp):
    """Hugging Face weights read slice by slice under tensor parallelism too."""
    path = llama_dir(tmp_path)
    tokens = token_file(tmp_path)
    want = hf_loss(transformers.LlamaForCausalLM.from_pretrained(path), tokens)
    cfg = tiny_config(
        model=with_init(LLAMA, path), micro_batch_size=2, global_batch_size=8, sequence_parallel=sp
    )
    layout = make_layout(pipeline, data, split, 2, 2, tensor=tensor)
    res = run_ranks(layout.world_size, evaluate_on_layout, cfg, layout, tokens, None)
    got = res[0][1]
    assert got["windows"] == 19 and got["tokens"] == 19 * SEQ
    assert got["loss"] == pytest.approx(want, rel=1e-4)
    assert all(out == got for _, out in res.values())  # every rank holds the same result


def test_config_mismatch_is_refused_naming_each_field(tmp_path):
    path = llama_dir(tmp_path)
    wrong = replace(LLAMA, kv_heads=4, ffn_hidden_size=128, rope_theta=500000.0)
    with pytest.raises(hf.HuggingFaceError) as e:
        hf.load_stage(build_full(wrong, seed=0), wrong, path)
    text = str(e.value)
    for field in ("spec.model.kvHeads", "spec.model.ffnHiddenSize", "spec.model.ropeTheta"):
        assert field in text
    assert "num_key_value_heads 2" in text and "spec.model.layers" not in text


def train_then_export(tmp_path, model: ModelSpec, layout, iterations: int = 3) -> tuple:
    ckpt = str(tmp_path / "ckpt")
    cfg = tiny_config(
        model=model,
        micro_batch_size=2,
        global_batch_size=8,
        iterations=iterations,
        optimizer=OptimizerConfig(kind="adamw", learning_rate=3e-3),
        checkpoint=CheckpointConfig(ckpt, interval_iterations=2),
    )
    res = run_ranks(layout.world_size, train_on_layout, cfg, layout)
    first_batch = BatchLoader(make_source(None, model.vocab_size, SEQ, cfg.seed), Sharding(8, 1, 0)).batch(0)
    spec = {
        "model": model.to_spec(),
        "training": {
            "globalBatchSize": 8,
            "microBatchSize": 2,
            "iterations": iterations,
            "learningRate": 3e-3,
        },
        "nodes": {"count": 1, "gpusPerNode": layout.world_size},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "layout.json").write_text(layout.to_json())
    out = str(tmp_path / "export")
    args = ["--job", str(tmp_path / "job.yaml"), "--layout", str(tmp_path / "layout.json")]
    assert export_main([*args, "--checkpoint", ckpt, "--out", out, "--max-shard-gib", str(30e3 / 2**30)]) == 0
    return ckpt, out, res[0][1]["losses"][0], first_batch


@pytest.mark.parametrize(
    "layout",
    [make_layout(2, 2, [2, 1], 2, 2), make_layout(2, 1, [2, 1], 2, 4, tensor=2)],
    ids=["pp2xdp2", "tp2xpp2"],
)
def test_train_export_and_transformers_loss_equals_evaluate_on_the_checkpoint(tmp_path, layout):
    """Init from Hugging Face, train under PP=2 x DP=2 (or TP=2 x PP=2) with checkpoints, export;
    transformers' loss on the exported model equals evaluate on the checkpoint under another
    layout (no tensor parallelism: the checkpoint holds whole tensors)."""
    path = llama_dir(tmp_path)
    model = with_init(LLAMA, path)
    ckpt, out, first_loss, (x, y) = train_then_export(tmp_path, model, layout)
    start_model = transformers.LlamaForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():  # iteration 1 ran on the Hugging Face weights
        logits = start_model(input_ids=x).logits
    assert first_loss == pytest.approx(
        float(F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))), rel=1e-5
    )
    assert os.path.isfile(os.path.join(out, hf.INDEX))  # several shards
    exported = transformers.LlamaForCausalLM.from_pretrained(out)
    tokens = token_file(tmp_path, seed=2)
    want = hf_loss(exported, tokens)
    start = hf_loss(start_model, tokens)
    assert want != pytest.approx(start, rel=1e-4)  # it trained: the weights moved
    cfg = tiny_config(model=model, micro_batch_size=1, global_batch_size=2)
    res = run_ranks(3, evaluate_on_layout, cfg, make_layout(3, 1, [1, 1, 1], 1, 2), tokens, ckpt)
    assert res[0][1]["loss"] == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("tensor", [1, 2])
def test_gpt_exports_to_gpt2(tmp_path, tensor):
    """GPT (tied embeddings across two stages) -> GPT2LMHeadModel, Conv1D matrices transposed;
    trained under tensor parallelism, the fused QKV is stored as its three blocks' slices."""
    model = ModelSpec(
        layers=2, hidden_size=32, attention_heads=4, seq_length=SEQ, vocab_size=VOCAB, tied_embeddings=True
    )
    ckpt, out, _, _ = train_then_export(
        tmp_path, model, make_layout(2, 1, [1, 1], 2, 4, embedding=True, tensor=tensor), iterations=2
    )
    exported = transformers.GPT2LMHeadModel.from_pretrained(out)
    tokens = token_file(tmp_path, seed=3)
    cfg = tiny_config(model=model, micro_batch_size=2, global_batch_size=4)
    res = run_ranks(1, evaluate_on_layout, cfg, make_layout(1, 1, [2], 2, 2), tokens, ckpt)
    assert res[0][1]["loss"] == pytest.approx(hf_loss(exported, tokens), rel=1e-4)


def test_evaluate_cli_under_torchrun(tmp_path):
    path = llama_dir(tmp_path)
    tokens = token_file(tmp_path)
    spec = {
        "model": with_init(LLAMA, path).to_spec(),
        "training": {"globalBatchSize": 8, "microBatchSize": 2, "iterations": 1, "learningRate": 1e-3},
        "nodes": {"count": 1, "gpusPerNode": 2},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "layout.json").write_text(make_layout(2, 1, [2, 1], 2, 2).to_json())
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--rdzv-backend=static",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "-m",
        "holmes.trainer.evaluate",
        "--job",
        str(tmp_path / "job.yaml"),
        "--layout",
        str(tmp_path / "layout.json"),
        "--tokens",
        tokens,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    line = json.loads(p.stdout.strip().splitlines()[-1])
    want = hf_loss(transformers.LlamaForCausalLM.from_pretrained(path), tokens)
    assert line["loss"] == pytest.approx(want, rel=1e-4) and line["tokens"] == 19 * SEQ
    assert line["perplexity"] == pytest.approx(np.exp(line["loss"]), rel=1e-9)


# the bounded meeting point after the weights are loaded (load_barrier.py): a rank on slow
# storage stops the run with its name before any rank waits in a pipeline send
LOAD_LAYOUT = make_layout(3, 1, [1, 1, 1], 1, 3)  # three stages: the first send waits on the next


def _train_loading(rank: int, cfg, layout, slow_rank: int | None, delay: float) -> dict:
    from holmes.trainer import hf
    from holmes.trainer.engine import Trainer

    real = hf.load_stage

    def load_stage(*args, **kwargs):  # this rank's volume is slower than the others'
        if rank == slow_rank:
            time.sleep(delay)
        return real(*args, **kwargs)

    hf.load_stage = load_stage
    t = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    t.train()
    return {"took": t.weight_load_seconds}


def test_every_rank_reports_its_load_time(tmp_path):
    cfg = tiny_config(model=with_init(LLAMA, llama_dir(tmp_path)), micro_batch_size=1, global_batch_size=3)
    out = run_ranks(3, _train_loading, cfg.with_(iterations=1), LOAD_LAYOUT, None, 0.0)
    for rank in range(3):
        took = out[rank][1]["took"]
        assert sorted(took) == [0, 1, 2] and all(s >= 0 for s in took.values()), took


def test_a_stage_on_slow_storage_is_named_before_the_first_send_times_out(tmp_path):
    """Before: ranks 0 and 1 went on to their first pipeline send/receive and failed there after
    the process-group timeout, with gloo's (NCCL's) words about a collective, not the slow rank."""
    cfg = tiny_config(
        model=with_init(LLAMA, llama_dir(tmp_path)),
        micro_batch_size=1,
        global_batch_size=3,
        iterations=1,
        timeout_seconds=4.0,  # the meeting waits 2 s, rank 2 loads 8 s longer than the others
    )
    out = run_ranks(3, _train_loading, cfg, LOAD_LAYOUT, 2, 8.0, allow_exit=True, timeout=90)
    for rank in (0, 1):
        status, text = out[rank]
        assert status == "error" and "WeightLoadError" in text, out[rank]
        assert "rank(s) 2 did not finish loading the Hugging Face weights" in text, text
        assert "HOLMES_TIMEOUT_SECONDS" in text and "faster volume" in text
    assert out[2][0] == "error" and "WeightLoadError" in out[2][1], out[2]


def test_the_message_names_every_late_rank_and_what_each_took():
    msg = load_barrier.late_message([2, 5], 300.0, {0: 12.0, 1: 14.5}, "the weights")
    assert msg.startswith("rank(s) 2, 5 did not finish loading the weights within 300 s")
    assert "rank 0: 12.0 s, rank 1: 14.5 s" in msg
