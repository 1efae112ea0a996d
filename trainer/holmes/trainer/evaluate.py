"""Evaluation: mean next-token loss over every window of a token file, in any layout.

    torchrun ... -m holmes.trainer.evaluate --job JOB --layout LAYOUT --tokens FILE [--checkpoint DIR]

The windows are all consecutive non-overlapping runs of seqLength+1 tokens of the file, each
counted once (a shorter tail is left out); the loss is the mean over their seqLength predicted
tokens each. Rank 0 prints one JSON line ``{"loss", "perplexity", "tokens", "windows"}``.
Weights come from ``--checkpoint`` (training.checkpoint.path, i.e. its newest complete
checkpoint, or one checkpoint directory in it), written under any layout, else from
``spec.model.init`` or the seed, as training would start.

How it runs: steps of D x microBatchSize windows; DP rank d takes its microBatchSize of each
step (the last step is padded with a repeated window whose loss is masked out). Forward only:
each stage receives its input from the previous stage on their boundary's p2p group, runs its
layers, and sends on; the last stage sums the cross-entropy of its real rows (with tensor
parallelism from vocabulary-split logits, counted by tp rank 0). The sums and the token count
are all-reduced once at the end on the world group, in float64.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from holmes.contract import ModelSpec
from holmes.contract.layout import Layout

from .config import check_eval_layout
from .data import TokenWindows
from .groups import RankGroups
from .model import ce_sum
from .tensor_parallel import TensorParallel


class Evaluator:
    def __init__(
        self,
        module: nn.Module,
        model: ModelSpec,
        layout: Layout,
        rank: int,
        groups: RankGroups,
        windows: TokenWindows,
        device: torch.device,
        dtype: torch.dtype,
        limit: int | None = None,
    ):
        check_eval_layout(layout)
        self.module, self.model, self.layout, self.groups = module, model, layout, groups
        self.windows, self.device, self.dtype = windows, device, dtype
        self.tp = getattr(module, "tp", None) or TensorParallel()
        self.count = windows.count if limit is None else min(limit, windows.count)
        info = layout.rank_info(rank)
        self.stage, self.dp = info.stage, info.dp_index
        self.first, self.last = self.stage == 0, self.stage == layout.pipeline - 1
        n = layout.ranks_per_stage
        self.prev, self.next = rank - n, rank + n

    def _boundary(self, b: int) -> Any:
        return self.groups.p2p.get(b) or self.groups.pp  # a version-1 Layout: the pipeline group

    def _rows(self, step: int) -> tuple[torch.Tensor, int]:
        """This rank's windows of one step (padded with window 0) and how many lead rows are
        real: known on the host, so masking them needs no device sync."""
        mb = self.layout.micro_batch_size
        base = step * self.layout.data * mb + self.dp * mb
        ids = [base + i for i in range(mb)]
        rows = torch.stack([self.windows.window(w if w < self.count else 0) for w in ids])
        return rows.to(self.device), max(0, min(mb, self.count - base))

    @torch.no_grad()
    def run(self) -> dict[str, Any]:
        """Collective over every rank of the layout; every rank returns the same result."""
        mb, s, h = self.layout.micro_batch_size, self.model.seq_length, self.model.hidden_size
        steps = math.ceil(self.count / (self.layout.data * mb))
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        tokens = torch.zeros((), dtype=torch.float64, device=self.device)
        was_training = self.module.training
        self.module.eval()
        pending: list[Any] = []
        for step in range(steps):
            # only the ends read data: the first stage its inputs, the last its labels
            rows, real = self._rows(step) if self.first or self.last else (None, 0)
            if self.first:
                assert rows is not None
                x = rows[:, :-1]
            else:
                x = torch.empty(mb, s // self.tp.seq_split, h, dtype=self.dtype, device=self.device)
                dist.recv(x, src=self.prev, group=self._boundary(self.stage - 1))
            out = self.module(x)
            if not self.last:
                for work in pending:  # the previous step's send: its buffer may be reused now
                    work.wait()
                pending = [dist.isend(out.contiguous(), dst=self.next, group=self._boundary(self.stage))]
                continue
            if real:  # every tp rank takes part in the vocabulary-parallel loss; rank 0 counts it
                assert rows is not None
                part = ce_sum(out[:real], rows[:real, 1:], tp=self.tp).double()
                if self.tp.rank == 0:
                    loss += part
                    tokens += real * s
        for work in pending:
            work.wait()
        self.module.train(was_training)
        total = torch.stack([loss, tokens])
        dist.all_reduce(total, group=self.groups.world)
        mean = float(total[0] / total[1])
        return {
            "loss": mean,
            "perplexity": math.exp(min(mean, 700.0)),
            "tokens": int(total[1]),
            "windows": self.count,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m holmes.trainer.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--job", required=True, help="HolmesJob manifest (YAML) or its spec")
    ap.add_argument("--layout", required=True, help="Layout JSON (any layout of the job's model)")
    ap.add_argument("--tokens", required=True, help="token file to evaluate on")
    ap.add_argument("--checkpoint", help="training.checkpoint.path, or one checkpoint directory in it")
    ap.add_argument("--windows", type=int, help="the first N windows only (default: all)")
    ap.add_argument("--dtype", help="float32 | bfloat16 (default: bfloat16 on CUDA, float32 on CPU)")
    ap.add_argument("--backend", choices=["nccl", "gloo"])
    args = ap.parse_args(argv)

    from .assemble import load_start_weights, stage_model
    from .groups import build_groups, init_world
    from .startup import StartupError, report, start

    try:
        started = start(args.job, args.layout, training=False, dtype=args.dtype, backend=args.backend)
    except StartupError as e:
        report("holmes.trainer.evaluate", e)
        return 2
    cfg, layout, rank, device = started.cfg, started.layout, started.rank, started.device
    init_world(layout, started.backend, cfg.timeout_seconds)
    groups = build_groups(layout, rank, started.backend, cfg.timeout_seconds)
    try:
        module = stage_model(cfg, layout, rank, device, groups)
        load_start_weights(module, cfg, args.checkpoint, groups.world)
        windows = TokenWindows(args.tokens, cfg.model.vocab_size, cfg.model.seq_length)
        dtype = getattr(torch, cfg.dtype)
        result = Evaluator(
            module, cfg.model, layout, rank, groups, windows, device, dtype, limit=args.windows
        ).run()
    except (OSError, ValueError, RuntimeError) as e:
        print(f"holmes.trainer.evaluate: rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)  # peers may be blocked in a collective with this rank
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
