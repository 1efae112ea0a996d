"""The llama architecture under the engine: PP x DP with the overlapped optimizer, recompute and
tied embeddings against the single-process reference, as the GPT parity tests do."""

from dataclasses import replace

import pytest
import torch

from holmes.contract import ModelCost, ModelSpec
from holmes.trainer.config import OptimizerConfig
from holmes.trainer.model import build_full
from tests.helpers.trainer.trainer_harness import assert_matches_reference, make_layout, tiny_config

LLAMA = ModelSpec(
    layers=4,
    hidden_size=32,
    attention_heads=4,
    seq_length=16,
    vocab_size=64,
    ffn_hidden_size=48,
    architecture="llama",
    kv_heads=2,
)


@pytest.mark.parametrize(
    "pipeline, data, split, micro_batches, overlap, recompute",
    [
        (2, 2, [1, 3], 4, True, False),  # PP x DP with the overlapped optimizer
        (2, 2, [3, 1], 4, True, True),  # ... with activation recompute
        (2, 1, [2, 2], 8, False, False),  # synchronous
    ],
)
def test_llama_matches_single_process_reference(pipeline, data, split, micro_batches, overlap, recompute):
    cfg = tiny_config(model=LLAMA, overlap=overlap, activation_recompute=recompute)
    assert_matches_reference(cfg, make_layout(pipeline, data, split, 2, micro_batches))


def test_llama_adamw_with_tied_embeddings_across_stages():
    adamw = OptimizerConfig(kind="adamw", learning_rate=3e-3, warmup_iterations=1, weight_decay=0.1)
    cfg = tiny_config(model=replace(LLAMA, tied_embeddings=True), optimizer=adamw, iterations=5)
    params = assert_matches_reference(cfg, make_layout(2, 2, [2, 2], 2, 4, embedding=True), param_atol=1e-5)
    assert torch.equal(params["head.tied_embedding"], params["embedding.tok.weight"])


@pytest.mark.parametrize(
    "model",
    [
        LLAMA,
        replace(LLAMA, tied_embeddings=True),
        replace(LLAMA, architecture="gpt", kv_heads=4, ffn_hidden_size=128),
    ],
)
def test_parameter_count_matches_the_built_model(model):
    """ModelCost (the planner's and the start line's count) equals the parameters torch builds."""
    built = sum(p.numel() for p in build_full(model, seed=0).parameters())
    assert ModelCost.of(model).total_params == built
