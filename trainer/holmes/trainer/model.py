"""The decoder, built one pipeline stage at a time from its architecture's parts (models/).

Parameter names are global (``layers.17.attn.qkv.weight``) and every parameter is initialised
from a generator seeded by (seed, name): a stage holding layers [a, b) gets exactly the values a
single-process model would have, whatever the split. That is what makes runs with different
layouts comparable and lets the last stage build a bit-identical copy of a tied embedding.

Activation recomputation (``recompute=True``, the job's ``training.activationRecompute``): each
transformer block runs under ``torch.utils.checkpoint`` (non-reentrant), so forward keeps only
the block's input and backward runs the block's forward again to rebuild what it needs. The
math is the same (same ops on the same values; the RNG state is replayed, so dropout would
draw the same masks); the cost is one extra forward of the blocks, the gain the activations.
The distributed optimizer's hooks see it as follows: parameter gradients still accumulate once
per micro-batch (the recomputed forward only refills saved tensors), and its forward pre-hooks
fire again during recomputation, where no all-gather is pending (they start after backward),
so they do nothing.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from holmes.contract import ModelSpec

from .models import architecture, sharding
from .tensor_parallel import TensorParallel, vocab_parallel_cross_entropy

TIED_COPY = "head.tied_embedding"  # last stage's copy of embedding.tok.weight when P > 1


class Head(nn.Module):
    """Final norm + LM head. ``tied`` None: an own matrix; else the tied embedding matrix. Under
    tensor parallelism the head's matrix holds this rank's vocabulary rows, so the logits it
    returns are [.., V/T]: loss_fn takes them without gathering."""

    def __init__(self, cfg: ModelSpec, tied: nn.Parameter | None, own_tied_copy: bool, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.norm = architecture(cfg).Norm(cfg)
        self._tied = [tied] if tied is not None else None  # a list: not registered twice
        if own_tied_copy:
            self.tied_embedding = nn.Parameter(torch.empty(tp.split(cfg.vocab_size), cfg.hidden_size))
        elif tied is None:
            self.out = nn.Linear(cfg.hidden_size, tp.split(cfg.vocab_size), bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tp.to_full(self.norm(x))
        if self._tied is not None:
            return F.linear(x, self._tied[0])
        if hasattr(self, "tied_embedding"):
            return F.linear(x, self.tied_embedding)
        return self.out(x)


def _run_blocks(blocks: nn.ModuleDict, x: torch.Tensor, recompute: bool) -> torch.Tensor:
    recompute = recompute and torch.is_grad_enabled()
    for block in blocks.values():
        x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
    return x


class StageModule(nn.Module):
    """Layers [start, end) of the model; the first stage adds the embedding, the last the head.
    ``tp``: this rank's tensor-parallel slice (the default: the whole model).

    Virtual stages (``ranges``: several layer ranges, one per chunk): the module holds all of
    them under their global names (so the optimizer, checkpoints and weight loading see one
    module), and ``chunk(c)`` is the module the pipeline runs for chunk c."""

    def __init__(
        self,
        cfg: ModelSpec,
        start: int,
        end: int,
        first: bool,
        last: bool,
        recompute: bool = False,
        tp: TensorParallel | None = None,
        ranges: tuple[tuple[int, int], ...] | None = None,
    ):
        super().__init__()
        tp = tp or TensorParallel()
        self.cfg, self.start, self.end, self.first, self.last = cfg, start, end, first, last
        self.ranges = tuple(ranges or ((start, end),))
        self.recompute, self.tp = recompute, tp
        arch = architecture(cfg)
        self.embedding = arch.Embedding(cfg, tp) if first else None
        held = sorted(i for a, b in self.ranges for i in range(a, b))
        self.layers = nn.ModuleDict({str(i): arch.Block(cfg, tp) for i in held})
        self.head: Head | None
        if last:
            emb = self.embedding  # not None where first
            tied = emb.tok.weight if (cfg.tied_embeddings and emb is not None) else None
            self.head = Head(cfg, tied, own_tied_copy=cfg.tied_embeddings and not first, tp=tp)
        else:
            self.head = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.ranges) > 1:
            raise RuntimeError("a stage of several virtual stages runs chunk by chunk: use chunk(c)")
        if self.embedding is not None:
            x = self.embedding(x)
        x = _run_blocks(self.layers, x, self.recompute)
        return self.head(x) if self.head is not None else x

    def chunk(self, c: int) -> nn.Module:
        """Chunk c (its layer range; the embedding if it starts the model, the head if it ends it)
        as a module sharing this one's parameters."""
        a, b = self.ranges[c]
        return _Chunk(self, a, b)


class _Chunk(nn.Module):
    def __init__(self, stage: StageModule, start: int, end: int):
        super().__init__()
        self.recompute = stage.recompute
        self.embedding = stage.embedding if start == 0 else None
        self.layers = nn.ModuleDict({str(i): stage.layers[str(i)] for i in range(start, end)})
        self.head = stage.head if end == stage.cfg.layers else None
        if self.head is not None and self.head._tied is not None and self.embedding is None:
            # the head uses the embedding another chunk of this rank holds: a parameter of this
            # chunk too, so a split backward computes its gradient here as well
            self.tied_embedding = self.head._tied[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        x = _run_blocks(self.layers, x, self.recompute)
        return self.head(x) if self.head is not None else x


def build_stage(
    cfg: ModelSpec,
    start: int,
    end: int,
    first: bool,
    last: bool,
    seed: int,
    device: torch.device | str = "cpu",
    recompute: bool = False,
    dtype: str = "float32",
    tp: TensorParallel | None = None,
    ranges: tuple[tuple[int, int], ...] | None = None,
) -> StageModule:
    """One stage (this rank's tensor-parallel slice of it), built on the meta device (no
    memory), allocated once on ``device`` in ``dtype`` and initialised parameter by parameter:
    the host never holds the stage (a 7B stage on a GPU needs no host copy), and the same seed
    gives the same weights whatever the split."""
    module = meta_stage(cfg, start, end, first, last, recompute, dtype, tp, ranges).to_empty(device=device)
    if module.head is not None and module.head._tied is not None:
        # leaving the meta device made new Parameter objects: point the head at the real one
        module.head._tied = [module.embedding.tok.weight]
    init_parameters(module, cfg, seed)
    return module


def meta_stage(
    cfg: ModelSpec,
    start: int,
    end: int,
    first: bool,
    last: bool,
    recompute: bool = False,
    dtype: str = "float32",
    tp: TensorParallel | None = None,
    ranges: tuple[tuple[int, int], ...] | None = None,
) -> StageModule:
    """The stage on the meta device in ``dtype``: shapes only (the dry run builds it outside
    FakeTensorMode, whose parameters could not be moved to a device afterwards)."""
    with torch.device("meta"):
        module = StageModule(cfg, start, end, first, last, recompute=recompute, tp=tp, ranges=ranges)
    return module.to(dtype=getattr(torch, dtype))


def build_full(
    cfg: ModelSpec,
    seed: int,
    device: torch.device | str = "cpu",
    recompute: bool = False,
    dtype: str = "float32",
) -> StageModule:
    return build_stage(cfg, 0, cfg.layers, True, True, seed, device, recompute, dtype)


INIT_BLOCK_ELEMENTS = 1 << 20  # values drawn per generator: 4 MiB of fp32 at a time


def global_name(name: str) -> str:
    """The global name of a parameter: the last stage's copy of a tied embedding is the embedding."""
    return "embedding.tok.weight" if name == TIED_COPY else name


@torch.no_grad()
def init_parameters(module: StageModule, cfg: ModelSpec, seed: int) -> None:
    """Each parameter's global tensor is drawn in fp32 on the CPU in blocks of rows, each block
    from a generator seeded by (seed, global name, block): the same values on any device, in
    any dtype, in any stage and any tensor-parallel slice that holds them. A rank draws only the
    blocks its slice touches, and holds at most one block (INIT_BLOCK_ELEMENTS) at a time."""
    out_std = 0.02 / math.sqrt(2 * cfg.layers)  # GPT-2's scaled init of residual outputs
    tp = module.tp
    for name, p in module.named_parameters():
        key = global_name(name)
        leaf = key.rsplit(".", 1)[-1]
        if ".ln" in key or "norm" in key:
            p.fill_(1.0 if leaf == "weight" else 0.0)
        elif leaf == "bias":
            p.zero_()
        else:
            std = out_std if key.endswith("proj.weight") else 0.02
            _draw(p, sharding.split_of(key), tp, seed * 1_000_003 + zlib.crc32(key.encode()), std)


def _draw(p: torch.Tensor, split: sharding.Split | None, tp: TensorParallel, seed: int, std: float) -> None:
    """Fill ``p`` (this rank's slice of a 2-D global tensor) from the row blocks it overlaps."""
    cols_local = p.shape[1]
    cols = cols_local * tp.size if split is not None and split.dim == 1 else cols_local
    rows = p.shape[0] * tp.size if split is not None and split.dim == 0 else p.shape[0]
    per_block = max(1, INIT_BLOCK_ELEMENTS // cols)
    in_place = cols_local == cols and p.device.type == "cpu" and p.dtype == torch.float32
    if split is None or tp.size == 1:
        row_ranges, col_ranges = [(0, rows)], [(0, cols)]
    elif split.dim == 0:
        row_ranges, col_ranges = sharding.ranges(rows, split, tp.size, tp.rank), [(0, cols)]
    else:
        row_ranges, col_ranges = [(0, rows)], sharding.ranges(cols, split, tp.size, tp.rank)
    local_row = 0
    for a, b in row_ranges:
        for blk in range(a // per_block, (b - 1) // per_block + 1):
            lo, hi = blk * per_block, min(rows, (blk + 1) * per_block)
            gen = torch.Generator().manual_seed(seed + 7919 * blk)
            r0, r1 = max(a, lo), min(b, hi)
            dst = p[local_row + r0 - a : local_row + r1 - a]
            if in_place and (r0, r1) == (lo, hi):
                dst.normal_(0.0, std, generator=gen)  # the whole block: drawn in place, no temporary
                continue
            values = torch.empty(hi - lo, cols, dtype=torch.float32).normal_(0.0, std, generator=gen)
            src = values[r0 - lo : r1 - lo]
            local_col = 0
            for c0, c1 in col_ranges:
                dst[:, local_col : local_col + c1 - c0].copy_(src[:, c0:c1])
                local_col += c1 - c0
        local_row += b - a


LOSS_CHUNK_ELEMENTS = 1 << 27  # fp32 logits alive at once in the loss: 512 MiB


def _ce_sum(logits: torch.Tensor, targets: torch.Tensor, tp: TensorParallel | None = None) -> torch.Tensor:
    if tp is not None and tp.size > 1:  # logits hold this rank's V/T vocabulary columns
        return vocab_parallel_cross_entropy(logits, targets, tp).sum()
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def ce_sum(
    logits: torch.Tensor,
    targets: torch.Tensor,
    chunk_elements: int = LOSS_CHUNK_ELEMENTS,
    tp: TensorParallel | None = None,
) -> torch.Tensor:
    """Summed next-token cross-entropy in fp32, upcasting a chunk of rows at a time (for
    evaluation, under no_grad: nothing is kept for backward)."""
    flat, flat_t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    rows = max(1, chunk_elements // flat.shape[1])
    total = torch.zeros((), dtype=torch.float32, device=logits.device)
    for i in range(0, flat.shape[0], rows):
        total += _ce_sum(flat[i : i + rows], flat_t[i : i + rows], tp)
    return total


def loss_fn(
    logits: torch.Tensor,
    targets: torch.Tensor,
    chunk_elements: int = LOSS_CHUNK_ELEMENTS,
    tp: TensorParallel | None = None,
) -> torch.Tensor:
    """Mean next-token cross-entropy of one micro-batch, computed in fp32; with tensor
    parallelism from vocabulary-split logits, never gathered (tensor_parallel.py).

    Low-precision logits are upcast a chunk of rows at a time under activation checkpointing,
    so no fp32 copy of the whole (tokens x vocab) logits is built or kept for backward: a
    4 x 2048-token micro-batch over a 50k vocabulary would otherwise add 1.6 GB of fp32 on the
    last stage. fp32 logits take the plain path (same maths)."""
    flat, flat_t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    rows = max(1, chunk_elements // flat.shape[1])
    if logits.dtype == torch.float32 or flat.shape[0] <= rows:
        if tp is not None and tp.size > 1:
            return _ce_sum(flat, flat_t, tp) / flat_t.numel()
        return F.cross_entropy(flat.float(), flat_t)
    total = sum(
        checkpoint(_ce_sum, flat[i : i + rows], flat_t[i : i + rows], tp, use_reentrant=False)
        for i in range(0, flat.shape[0], rows)
    )
    return total / flat_t.numel()
