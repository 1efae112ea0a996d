"""The engine against a plain single-process PyTorch loop with the same seed and data."""

from dataclasses import replace

import pytest
import torch

from holmes.trainer.config import OptimizerConfig
from tests.helpers.trainer.trainer_harness import (
    TINY,
    assert_matches_reference,
    make_layout,
    reference,
    tiny_config,
    trained,
)


@pytest.mark.parametrize(
    "pipeline, data, split, micro_batches, overlap",
    [
        (2, 1, [3, 1], 8, True),  # uneven stages
        (1, 2, [4], 4, True),  # data parallel only
        (2, 2, [1, 3], 4, True),  # PP x DP with the overlapped optimizer
        (2, 2, [1, 3], 4, False),  # ... and synchronous
    ],
)
def test_engine_matches_single_process_reference_under_sgd(pipeline, data, split, micro_batches, overlap):
    assert_matches_reference(
        tiny_config(overlap=overlap), make_layout(pipeline, data, split, 2, micro_batches)
    )


def test_tied_embeddings_across_stages_match_reference():
    cfg = tiny_config(model=replace(TINY, tied_embeddings=True))
    params = assert_matches_reference(cfg, make_layout(2, 2, [2, 2], 2, 4, embedding=True))
    # the last stage's copy stayed identical to the first stage's embedding
    assert torch.equal(params["head.tied_embedding"], params["embedding.tok.weight"])


def test_overlap_on_and_off_give_the_same_adamw_losses():
    adamw = OptimizerConfig(kind="adamw", learning_rate=3e-3, warmup_iterations=2, weight_decay=0.1)
    lay = make_layout(2, 2, [3, 1], 2, 4)
    on, _ = trained(tiny_config(optimizer=adamw, iterations=5), lay)
    off, _ = trained(tiny_config(optimizer=adamw, iterations=5, overlap=False), lay)
    ref_losses, _, _ = reference(tiny_config(optimizer=adamw, iterations=5))
    assert on == pytest.approx(off, abs=1e-5)
    assert on == pytest.approx(ref_losses, abs=1e-4)


def test_bf16_model_with_fp32_master_weights_tracks_fp32():
    adamw = OptimizerConfig(kind="adamw", learning_rate=3e-3)
    lay = make_layout(2, 2, [2, 2], 2, 4)
    fp32 = trained(tiny_config(optimizer=adamw, iterations=6), lay)
    bf16 = trained(tiny_config(dtype="bfloat16", optimizer=adamw, iterations=6), lay)
    assert all(v.dtype == torch.bfloat16 for v in bf16[1].values())
    assert bf16[0] == pytest.approx(fp32[0], abs=3e-2)
    assert bf16[0][-1] < bf16[0][0]


def test_bf16_gradient_reduce_scatter_tracks_fp32_and_halves_the_bytes():
    """training.gradReduceDtype: bfloat16 sends half the bytes over the DP groups; gradients
    accumulate and land in fp32, so the run tracks the fp32 reduce closely, not exactly."""
    adamw = OptimizerConfig(kind="adamw", learning_rate=3e-3)
    lay = make_layout(2, 2, [2, 2], 2, 4)
    fp32 = trained(tiny_config(optimizer=adamw, iterations=5), lay)
    bf16 = trained(tiny_config(optimizer=adamw, iterations=5, grad_reduce_dtype="bfloat16"), lay)
    assert bf16[0] == pytest.approx(fp32[0], abs=2e-2)
    assert bf16[0] != fp32[0]  # the reduce really ran in bfloat16
    assert all(v.dtype == torch.float32 for v in bf16[1].values())  # the model stays fp32
