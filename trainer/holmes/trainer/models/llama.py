"""Llama style: rotary position embeddings, RMSNorm, SwiGLU MLP, grouped-query attention, no
biases. Computes what transformers' LlamaForCausalLM computes (rotate-half RoPE, norms in fp32),
so its weights load unpermuted (hf.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from holmes.contract import ModelSpec

from ..tensor_parallel import TensorParallel
from . import block
from .parallel import RowLinear, VocabEmbedding


class Embedding(nn.Module):
    """Token embedding only: positions enter through the rotary embedding in attention."""

    def __init__(self, cfg: ModelSpec, tp: TensorParallel):
        super().__init__()
        self.tok = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, tp)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids)


class Norm(nn.Module):
    """RMSNorm computed in fp32 and scaled in the input dtype, as Llama does (bf16 runs match)."""

    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.eps = cfg.norm_eps
        self.weight = nn.Parameter(torch.ones(cfg.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotary(seq: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape [seq, head_dim] in fp32; frequency i rotates features i and i + d/2."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim)
    )
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    """Query heads and KV heads split over the tensor group alike (T divides both), so each
    rank's query heads share exactly its KV heads."""

    def __init__(self, cfg: ModelSpec, tp: TensorParallel):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.tp, self.heads, self.kv_heads = tp, tp.split(cfg.attention_heads), tp.split(cfg.kv_heads)
        assert cfg.rope_theta is not None, "ModelSpec sets rope_theta for every llama model"
        self.head_dim, self.theta = d, cfg.rope_theta
        self.q = nn.Linear(h, self.heads * d, bias=False)
        self.k = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v = nn.Linear(h, self.kv_heads * d, bias=False)
        self.proj = RowLinear(cfg.attention_heads * d, h, False, tp)
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None  # not a buffer: rebuilt per device

    def _cos_sin(self, seq: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._rope is None or self._rope[0].shape[0] < seq or self._rope[0].device != x.device:
            self._rope = rotary(seq, self.head_dim, self.theta, x.device)
        cos, sin = self._rope
        return cos[:seq].to(x.dtype), sin[:seq].to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.to_full(x)
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self._cos_sin(s, x)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.proj(y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: proj(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelSpec, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.gate = nn.Linear(cfg.hidden_size, tp.split(cfg.ffn_hidden_size), bias=False)
        self.up = nn.Linear(cfg.hidden_size, tp.split(cfg.ffn_hidden_size), bias=False)
        self.proj = RowLinear(cfg.ffn_hidden_size, cfg.hidden_size, False, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.to_full(x)
        return self.proj(F.silu(self.gate(x)) * self.up(x))


def Block(cfg: ModelSpec, tp: TensorParallel) -> block.Block:
    return block.Block(Norm(cfg), Attention(cfg, tp), Norm(cfg), MLP(cfg, tp))
