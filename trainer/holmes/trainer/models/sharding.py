"""Which parameters tensor parallelism splits, and how: one rule per parameter name. The models
take their local shapes from it, and initialisation, Hugging Face import and export, checkpoints
and the optimizer's grad norm read the same rule, so a rank's slice of a parameter is the same
slice of the one global tensor everywhere.

Column-parallel matrices (attention Q/K/V, the MLP's first matmuls) split their output rows,
their biases with them; row-parallel ones (the residual projections) split their input columns;
the embedding and the LM head split the vocabulary rows. GPT's fused QKV holds three blocks
(Q, K, V) along its rows: each block is split on its own, so a rank holds the same heads of all
three. Everything else (norms, the projections' biases, learned positions) is replicated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Split:
    dim: int  # the dimension split over the tensor-parallel group
    parts: int = 1  # equal blocks along dim, each split on its own (GPT's fused QKV: 3)


_RULES = [
    (re.compile(r"embedding\.tok\.weight|head\.out\.weight|head\.tied_embedding"), Split(0)),
    (re.compile(r"layers\.\d+\.attn\.qkv\.(weight|bias)"), Split(0, 3)),
    (re.compile(r"layers\.\d+\.attn\.(q|k|v)\.weight"), Split(0)),
    (re.compile(r"layers\.\d+\.mlp\.(fc|gate|up)\.(weight|bias)"), Split(0)),
    (re.compile(r"layers\.\d+\.(attn|mlp)\.proj\.weight"), Split(1)),
]


def split_of(name: str) -> Split | None:
    """How the parameter ``name`` is split over the tensor group; None: replicated."""
    for pattern, split in _RULES:
        if pattern.fullmatch(name):
            return split
    return None


def ranges(size: int, split: Split, size_tp: int, rank: int) -> list[tuple[int, int]]:
    """Rank ``rank``'s index ranges along ``split.dim`` of a global extent ``size``, in the order
    its local tensor holds them."""
    part = size // split.parts
    n = part // size_tp
    return [(k * part + rank * n, k * part + (rank + 1) * n) for k in range(split.parts)]


def take(full: torch.Tensor, name: str, size_tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s slice of the global tensor ``full`` of parameter ``name``."""
    split = split_of(name)
    if split is None or size_tp == 1:
        return full
    spans = ranges(full.shape[split.dim], split, size_tp, rank)
    pieces = [full.narrow(split.dim, a, b - a) for a, b in spans]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=split.dim)


def stored_shape(name: str, shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    """The global tensor's shape in checkpoints: a fused parameter's blocks get a dimension of
    their own, so each rank's slice is one regular shard of it ([3h, h] is stored [3, h, h])."""
    split = split_of(name)
    shape = tuple(shape)
    if split is None or split.parts == 1:
        return shape
    d = split.dim
    return shape[:d] + (split.parts, shape[d] // split.parts) + shape[d + 1 :]


def assemble(slices: list[torch.Tensor], name: str) -> torch.Tensor:
    """The global tensor of parameter ``name`` from every rank's slice, in tp-rank order (the
    inverse of :func:`take`)."""
    split = split_of(name)
    if split is None or len(slices) == 1:
        return slices[0]
    blocks = [s.chunk(split.parts, dim=split.dim) for s in slices]
    return torch.cat([b[k] for k in range(split.parts) for b in blocks], dim=split.dim)
