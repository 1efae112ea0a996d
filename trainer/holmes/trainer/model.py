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

from .models import architecture

TIED_COPY = "head.tied_embedding"  # last stage's copy of embedding.tok.weight when P > 1


class Head(nn.Module):
    """Final norm + LM head. ``weight`` None: an own Linear; else the tied embedding matrix."""

    def __init__(self, cfg: ModelSpec, tied: nn.Parameter | None, own_tied_copy: bool):
        super().__init__()
        self.norm = architecture(cfg).Norm(cfg)
        self._tied = [tied] if tied is not None else None  # a list: not registered twice
        if own_tied_copy:
            self.tied_embedding = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        elif tied is None:
            self.out = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        if self._tied is not None:
            return F.linear(x, self._tied[0])
        if hasattr(self, "tied_embedding"):
            return F.linear(x, self.tied_embedding)
        return self.out(x)


class StageModule(nn.Module):
    """Layers [start, end) of the model; the first stage adds the embedding, the last the head."""

    def __init__(
        self, cfg: ModelSpec, start: int, end: int, first: bool, last: bool, recompute: bool = False
    ):
        super().__init__()
        self.cfg, self.start, self.end, self.first, self.last = cfg, start, end, first, last
        self.recompute = recompute
        arch = architecture(cfg)
        self.embedding = arch.Embedding(cfg) if first else None
        self.layers = nn.ModuleDict({str(i): arch.Block(cfg) for i in range(start, end)})
        if last:
            tied = self.embedding.tok.weight if (cfg.tied_embeddings and first) else None
            self.head = Head(cfg, tied, own_tied_copy=cfg.tied_embeddings and not first)
        else:
            self.head = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        recompute = self.recompute and torch.is_grad_enabled()
        for block in self.layers.values():
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
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
) -> StageModule:
    """One stage, built on the meta device (no memory), allocated once on ``device`` in ``dtype``
    and initialised parameter by parameter: the host never holds the stage (a 7B stage on a GPU
    needs no host copy), and the same seed gives the same weights whatever the split."""
    with torch.device("meta"):
        module = StageModule(cfg, start, end, first, last, recompute=recompute)
    module = module.to(dtype=getattr(torch, dtype)).to_empty(device=device)
    if module.head is not None and module.head._tied is not None:
        # leaving the meta device made new Parameter objects: point the head at the real one
        module.head._tied = [module.embedding.tok.weight]
    init_parameters(module, cfg, seed)
    return module


def build_full(
    cfg: ModelSpec,
    seed: int,
    device: torch.device | str = "cpu",
    recompute: bool = False,
    dtype: str = "float32",
) -> StageModule:
    return build_stage(cfg, 0, cfg.layers, True, True, seed, device, recompute, dtype)


@torch.no_grad()
def init_parameters(module: nn.Module, cfg: ModelSpec, seed: int) -> None:
    """Each parameter from a CPU generator seeded by (seed, its global name), drawn in fp32: the
    same values on any device, in any dtype, in any stage that holds it. An fp32 parameter on
    the CPU is filled in place; any other gets one fp32 temporary of its own size."""
    out_std = 0.02 / math.sqrt(2 * cfg.layers)  # GPT-2's scaled init of residual outputs
    for name, p in module.named_parameters():
        key = "embedding.tok.weight" if name == TIED_COPY else name
        leaf = key.rsplit(".", 1)[-1]
        if ".ln" in key or "norm" in key:
            p.fill_(1.0 if leaf == "weight" else 0.0)
        elif leaf == "bias":
            p.zero_()
        else:
            std = out_std if key.endswith("proj.weight") else 0.02
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
            if p.device.type == "cpu" and p.dtype == torch.float32:
                p.normal_(0.0, std, generator=gen)
            else:
                p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, std, generator=gen))


LOSS_CHUNK_ELEMENTS = 1 << 27  # fp32 logits alive at once in the loss: 512 MiB


def _ce_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def ce_sum(
    logits: torch.Tensor, targets: torch.Tensor, chunk_elements: int = LOSS_CHUNK_ELEMENTS
) -> torch.Tensor:
    """Summed next-token cross-entropy in fp32, upcasting a chunk of rows at a time (for
    evaluation, under no_grad: nothing is kept for backward)."""
    flat, flat_t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    rows = max(1, chunk_elements // flat.shape[1])
    total = torch.zeros((), dtype=torch.float32, device=logits.device)
    for i in range(0, flat.shape[0], rows):
        total += _ce_sum(flat[i : i + rows], flat_t[i : i + rows])
    return total


def loss_fn(
    logits: torch.Tensor, targets: torch.Tensor, chunk_elements: int = LOSS_CHUNK_ELEMENTS
) -> torch.Tensor:
    """Mean next-token cross-entropy of one micro-batch, computed in fp32.

    Low-precision logits are upcast a chunk of rows at a time under activation checkpointing,
    so no fp32 copy of the whole (tokens x vocab) logits is built or kept for backward: a
    4 x 2048-token micro-batch over a 50k vocabulary would otherwise add 1.6 GB of fp32 on the
    last stage. fp32 logits take the plain path (same maths)."""
    flat, flat_t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    rows = max(1, chunk_elements // flat.shape[1])
    if logits.dtype == torch.float32 or flat.shape[0] <= rows:
        return F.cross_entropy(flat.float(), flat_t)
    total = sum(
        checkpoint(_ce_sum, flat[i : i + rows], flat_t[i : i + rows], use_reentrant=False)
        for i in range(0, flat.shape[0], rows)
    )
    return total / flat_t.numel()
