"""Tensor parallelism (Megatron-style) inside a node: the communication a layer needs, written as
autograd functions over the Layout's ``tp`` group, and the vocabulary-parallel cross-entropy.

A block's matmuls come in pairs: a column-parallel one (each rank holds a slice of the output
features: attention heads, MLP columns) then a row-parallel one (each rank holds the matching
input slice and produces a partial sum). Between pairs the residual stream is whole:

- without sequence parallelism it is replicated on every rank: ``to_full`` is the identity
  forward and all-reduces the gradient backward; ``from_partial`` all-reduces forward;
- with sequence parallelism (``parallelism.sequenceParallel``) each rank keeps its 1/T of the
  sequence between pairs (norms run on 1/T of the tokens, p2p sends 1/T): ``to_full``
  all-gathers the sequence (reduce-scatters the gradient), ``from_partial`` reduce-scatters
  (all-gathers the gradient). Same bytes as the all-reduce (one all-reduce = reduce-scatter +
  all-gather), 1/T of the norm regions' activations.

Parameters outside the pairs (norms, row-parallel biases, learned positions) are replicated. Their
gradients are equal on every rank without sequence parallelism (their inputs are), and partial
sums over the sequence with it: the distributed optimizer all-reduces those over the tp group
before its data-parallel reduce-scatter, and counts replicated parameters once in the grad norm.

The models have no dropout, so no per-rank RNG streams are needed. Activations are [batch, seq,
hidden]; the sequence is dimension 1, so the sequence collectives reorder through one copy (a
no-op copy at micro-batch size 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallel:
    """One rank's place in its tensor-parallel group. ``size`` 1 (the default) makes every
    method an identity and the model exactly the single-GPU one."""

    size: int = 1
    rank: int = 0
    group: Any = None
    sequence_parallel: bool = False

    def split(self, n: int) -> int:
        """This rank's share of n features (the spec checks guarantee n % size == 0)."""
        if n % self.size:
            raise ValueError(f"{n} does not split over tensor parallelism {self.size}")
        return n // self.size

    @property
    def seq_split(self) -> int:
        """By how much the residual stream's sequence is split between the layer pairs."""
        return self.size if self.sequence_parallel else 1

    def seq_slice(self, seq: int) -> slice:
        """This rank's positions of the residual stream (all of them without sequence parallelism)."""
        n = seq // self.seq_split
        return slice(self.rank * n, (self.rank + 1) * n) if self.seq_split > 1 else slice(0, seq)

    def to_full(self, x: torch.Tensor) -> torch.Tensor:
        """Residual stream -> the whole input a column-parallel matmul needs."""
        if self.size == 1:
            return x
        if self.sequence_parallel:
            return _GatherSequence.apply(x, self)
        return _CopyToGroup.apply(x, self)

    def from_partial(self, y: torch.Tensor) -> torch.Tensor:
        """A row-parallel matmul's partial sums -> the residual stream."""
        if self.size == 1:
            return y
        if self.sequence_parallel:
            return _ReduceScatterSequence.apply(y, self)
        return _ReduceFromGroup.apply(y, self)


# ---- the collectives, on [batch, seq, hidden] ---------------------------------------------------


def _all_reduce(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    x = x.contiguous()
    dist.all_reduce(x, group=tp.group)
    return x


def _gather_seq(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    b, s, h = x.shape
    out = torch.empty((tp.size, b, s, h), dtype=x.dtype, device=x.device)
    dist.all_gather_single(out.view(-1), x.contiguous().view(-1), group=tp.group)  # flat: gloo too
    return out.transpose(0, 1).reshape(b, tp.size * s, h)


def _reduce_scatter_seq(y: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    b, s, h = y.shape
    n = s // tp.size
    src = y.reshape(b, tp.size, n, h).transpose(0, 1).contiguous()
    out = torch.empty((b, n, h), dtype=y.dtype, device=y.device)
    dist.reduce_scatter_single(out.view(-1), src.view(-1), group=tp.group)
    return out


def _pair(forward: Any, backward: Any) -> Any:
    """An autograd function running ``forward`` on the activation and ``backward`` on its
    gradient (each the other's conjugate: all-reduce <-> identity, all-gather <-> reduce-scatter)."""

    class Collective(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
            ctx.tp = tp
            return forward(x, tp)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            return backward(grad, ctx.tp), None

    return Collective


def _identity(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    return x


def _reduced_copy(y: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    return _all_reduce(y.clone(), tp)  # never reduce in place a tensor autograd may have saved


_CopyToGroup = _pair(_identity, _all_reduce)
_ReduceFromGroup = _pair(_reduced_copy, _identity)
_GatherSequence = _pair(_gather_seq, _reduce_scatter_seq)
_ReduceScatterSequence = _pair(_reduce_scatter_seq, _gather_seq)


# ---- vocabulary-parallel cross-entropy -----------------------------------------------------------


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-row cross-entropy from logits split over the vocabulary ([rows, V/T] on each rank),
    in fp32, without gathering the logits: a max, the target's logit and the sum of exponentials
    are reduced over the group (two all-reduces of one float per row)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
        x = logits.float()
        row_max = x.max(dim=-1).values
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=tp.group)
        x = x - row_max.unsqueeze(-1)  # a new fp32 tensor: becomes the softmax below
        width = x.shape[-1]
        local = targets - tp.rank * width
        outside = (local < 0) | (local >= width)
        local = local.masked_fill(outside, 0)
        picked = x.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        x.exp_()
        sums = torch.stack([x.sum(dim=-1), picked])
        dist.all_reduce(sums, group=tp.group)
        loss = sums[0].log() - sums[1]
        x.div_(sums[0].unsqueeze(-1))
        ctx.save_for_backward(x, local, outside)
        ctx.dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        softmax, local, outside = ctx.saved_tensors
        # d loss / d logit = softmax - one_hot(target): in place on the saved softmax (used once)
        softmax.scatter_add_(-1, local.unsqueeze(-1), (outside.float() - 1.0).unsqueeze(-1))
        softmax.mul_(grad.unsqueeze(-1))
        return softmax.to(ctx.dtype), None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, tp: TensorParallel
) -> torch.Tensor:
    """Per-row losses (fp32) of logits [rows, V/T] holding vocabulary rows
    [rank*V/T, (rank+1)*V/T); every rank of the group returns the same values."""
    return _VocabParallelCrossEntropy.apply(logits, targets, tp)
