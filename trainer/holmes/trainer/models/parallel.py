"""The layers whose parameters tensor parallelism splits (models/sharding.py says which slice).

Column-parallel matmuls are plain ``nn.Linear`` with 1/T of the output features: the block calls
``tp.to_full`` once on its input, before all of them. These are the other two kinds: the
row-parallel matmul, whose partial sums are reduced before its bias is added, and the
vocabulary-parallel embedding. With T = 1 both are exactly nn.Linear and nn.Embedding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..tensor_parallel import TensorParallel


class RowLinear(nn.Module):
    """y = reduce(x_local @ W_local^T) + b: W's input columns are split, b is replicated."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features, tp.split(in_features)))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.linear(x, self.weight, self.bias)
        y = self.tp.from_partial(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabEmbedding(nn.Module):
    """Token embedding whose rows (the vocabulary) are split: rank t holds ids
    [t*V/T, (t+1)*V/T) and contributes zeros for the others; ``tp.from_partial`` sums them."""

    def __init__(self, vocab: int, hidden: int, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(tp.split(vocab), hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        rows = self.weight.shape[0]
        local = ids - self.tp.rank * rows
        outside = (local < 0) | (local >= rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.from_partial(out.masked_fill(outside.unsqueeze(-1), 0.0))
