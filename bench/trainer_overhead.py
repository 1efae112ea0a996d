"""Engine on one rank vs a plain PyTorch training loop on the same model (overhead ratio).

    .venv/bin/python bench/trainer_overhead.py [--iters 30] [--threads 1]

Both run in this process, step by step in alternation (so machine noise hits both alike), with the
same GPT, micro-batching (gradient accumulation), AdamW and clipping. The engine adds its flat
buffers, grad hooks, bucketed sharded optimizer, the global norm all-reduce and its timers.
Reports median wall and CPU time per step and the ratios engine / plain.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer_common import SMOKE_HELP, free_port, layout, median, smoke_model, table, train_config  # noqa: E402

from holmes.contract import ModelCost, ModelSpec
from holmes.trainer.config import TrainConfig  # noqa: E402
from holmes.trainer.data import BatchLoader, Sharding, make_source  # noqa: E402
from holmes.trainer.engine import Trainer, learning_rate  # noqa: E402
from holmes.trainer.model import build_full, loss_fn  # noqa: E402

MODEL = ModelSpec(layers=4, hidden_size=256, attention_heads=8, seq_length=128, vocab_size=4096)
MB, M = 4, 2


class Plain:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.model = build_full(cfg.model, cfg.seed)
        params = list(self.model.parameters())  # decay on matrices only, as the engine does
        self.opt = torch.optim.AdamW(
            [
                {"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.01},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
            ],
            lr=1e-3,
            betas=(0.9, 0.95),
            foreach=True,
        )
        self.loader = BatchLoader(
            make_source(None, cfg.model.vocab_size, cfg.model.seq_length, cfg.seed),
            Sharding(cfg.global_batch_size, 1, 0),
        )
        self.i = 0

    def step(self) -> float:
        for g in self.opt.param_groups:
            g["lr"] = learning_rate(self.cfg.optimizer, self.i, self.cfg.iterations)
        x, y = self.loader.batch(self.i)
        total = 0.0
        for xm, ym in zip(x.chunk(M), y.chunk(M)):
            loss = loss_fn(self.model(xm), ym) / M
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.i += 1
        return total


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    a = ap.parse_args()
    model = smoke_model(MODEL) if a.smoke else MODEL
    if a.smoke:
        a.iters = 4  # one after the warm-up
    torch.set_num_threads(a.threads)
    dist.init_process_group(
        "gloo",
        rank=0,
        world_size=1,
        init_method=f"tcp://127.0.0.1:{free_port()}",
        timeout=timedelta(seconds=60),
    )
    cfg = train_config(model, MB * M, MB, a.iters, bucket_elements=1_000_000)
    plain = Plain(cfg)
    engine = Trainer(
        cfg, layout(1, 1, [model.layers], MB, M), rank=0, device=torch.device("cpu"), backend="gloo"
    )
    pw, pc, ew, ec, diffs = [], [], [], [], []
    for _ in range(a.iters):
        w, c, lp = timed(plain.step)
        pw.append(w), pc.append(c)
        w, c, rec = timed(engine.train_step)
        ew.append(w), ec.append(c)
        diffs.append(abs(rec["loss"] - lp))
    dist.destroy_process_group()
    skip = 3  # warm-up
    rows = [
        [
            "wall ms/step",
            median(pw[skip:]) * 1e3,
            median(ew[skip:]) * 1e3,
            median(ew[skip:]) / median(pw[skip:]),
        ],
        [
            "cpu ms/step",
            median(pc[skip:]) * 1e3,
            median(ec[skip:]) * 1e3,
            median(ec[skip:]) / median(pc[skip:]),
        ],
    ]
    print(
        f"GPT {model.layers}L h={model.hidden_size} s={model.seq_length} V={model.vocab_size} "
        f"({ModelCost.of(model).total_params / 1e6:.1f}M params), micro-batch {MB} x {M}, "
        f"{a.threads} thread(s), "
        f"CPU, {a.iters} steps each, median after {skip}"
    )
    print(table(["", "plain loop", "engine", "engine/plain"], rows))
    print(f"max |loss engine - loss plain| over the run: {max(diffs):.2e} (same init, data and optimizer)")


if __name__ == "__main__":
    main()
