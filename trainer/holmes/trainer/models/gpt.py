"""GPT-2 style: learned positions, LayerNorm, GELU (tanh) MLP, full multi-head attention, biases."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from holmes.contract import ModelSpec

from . import block


class Embedding(nn.Module):
    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos = nn.Embedding(cfg.seq_length, cfg.hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tok(ids) + self.pos(positions)


def Norm(cfg: ModelSpec) -> nn.Module:
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.heads = cfg.attention_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.fc = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size)
        self.proj = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


def Block(cfg: ModelSpec) -> block.Block:
    return block.Block(Norm(cfg), Attention(cfg), Norm(cfg), MLP(cfg))
