"""GPT-2 style: learned positions, LayerNorm, GELU (tanh) MLP, full multi-head attention, biases."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from holmes.contract import ModelSpec

from ..tensor_parallel import TensorParallel
from . import block
from .parallel import RowLinear, VocabEmbedding


class Embedding(nn.Module):
    def __init__(self, cfg: ModelSpec, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.tok = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.pos = nn.Embedding(cfg.seq_length, cfg.hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)[self.tp.seq_slice(ids.shape[1])]
        return self.tok(ids) + self.pos(positions)


def Norm(cfg: ModelSpec) -> nn.Module:
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)


class Attention(nn.Module):
    """Heads split over the tensor group: each rank runs heads/T of them end to end."""

    def __init__(self, cfg: ModelSpec, tp: TensorParallel):
        super().__init__()
        self.tp, self.heads, self.head_dim = tp, tp.split(cfg.attention_heads), cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, 3 * tp.split(cfg.hidden_size))
        self.proj = RowLinear(cfg.hidden_size, cfg.hidden_size, True, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.to_full(x)
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelSpec, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.fc = nn.Linear(cfg.hidden_size, tp.split(cfg.ffn_hidden_size))
        self.proj = RowLinear(cfg.ffn_hidden_size, cfg.hidden_size, True, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(self.tp.to_full(x)), approximate="tanh"))


def Block(cfg: ModelSpec, tp: TensorParallel) -> block.Block:
    return block.Block(Norm(cfg), Attention(cfg, tp), Norm(cfg), MLP(cfg, tp))
