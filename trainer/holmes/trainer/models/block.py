"""The pre-norm residual block every architecture shares; each supplies its own parts."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, ln1: nn.Module, attn: nn.Module, ln2: nn.Module, mlp: nn.Module):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = ln1, attn, ln2, mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))
