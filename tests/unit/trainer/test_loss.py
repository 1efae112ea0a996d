"""The last stage's loss: bf16 logits are upcast a chunk at a time, never kept whole in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from holmes.trainer.model import loss_fn


def _logits(dtype=torch.bfloat16):
    torch.manual_seed(0)
    x = torch.randn(3, 7, 50).to(dtype).requires_grad_()
    return x, torch.randint(0, 50, (3, 7))


def test_chunked_bf16_loss_and_gradient_equal_the_whole_fp32_computation():
    x, y = _logits()
    chunked = loss_fn(x, y, chunk_elements=4 * 50)  # 6 chunks of 4 rows (the last one 1)
    chunked.backward()
    g_chunked, x.grad = x.grad.clone(), None
    whole = F.cross_entropy(x.float().reshape(-1, 50), y.reshape(-1))
    whole.backward()
    assert chunked.dtype == torch.float32
    assert abs(chunked.item() - whole.item()) < 1e-6
    assert torch.equal(g_chunked, x.grad)


def _saved_fp32_bytes(fn) -> int:
    saved = []

    def pack(t):
        if t.dtype == torch.float32:
            saved.append(t.numel() * 4)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(saved)


def test_no_fp32_copy_of_the_logits_is_kept_for_backward():
    x, y = _logits()
    assert _saved_fp32_bytes(lambda: loss_fn(x, y, chunk_elements=4 * 50)) == 0
    # the unchunked path keeps the fp32 log-softmax of every row: what chunking avoids
    assert _saved_fp32_bytes(lambda: loss_fn(x, y, chunk_elements=10**9)) >= x.numel() * 4
