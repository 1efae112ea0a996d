"""Step time vs micro-batch count under 1F1B with PP=2 (2 uneven stages), gloo on CPU.

    .venv/bin/python bench/trainer_microbatches.py [--iters 6]

With a fixed micro-batch size, a step should cost about (M + P - 1) micro-batch slots: the bubble
share falls as (P-1)/(M+P-1). Prints step time, time per micro-batch and the bubble share measured
on stage 0 next to that ideal.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer_common import SMOKE_HELP, layout, median, run_ranks, smoke_model, table, train_config  # noqa: E402

from holmes.contract import ModelSpec
from holmes.trainer.engine import Trainer  # noqa: E402

MODEL = ModelSpec(layers=6, hidden_size=256, attention_heads=8, seq_length=128, vocab_size=2048)
MB, P, SPLIT = 2, 2, [3, 3]


def worker(rank: int, model: ModelSpec, m: int, iters: int) -> dict:
    cfg = train_config(model, MB * m, MB, iters)
    hist = Trainer(
        cfg, layout(P, 1, SPLIT, MB, m), rank=rank, device=torch.device("cpu"), backend="gloo"
    ).train()
    return {"step": [h["iterationSeconds"] for h in hist], "bubble": [h["time"]["bubble"] for h in hist]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--micro-batches", default="2,4,8,16")
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    a = ap.parse_args()
    model = smoke_model(MODEL) if a.smoke else MODEL
    if a.smoke:
        a.iters, a.micro_batches = 3, "2,4"
    rows, base = [], None
    for m in [int(x) for x in a.micro_batches.split(",")]:
        r = run_ranks(P, worker, model, m, a.iters)[0]
        step = median(r["step"][2:])
        bubble = median([b / s for b, s in zip(r["bubble"][2:], r["step"][2:])])
        per_mb = step / m
        base = base or per_mb
        rows.append([m, step * 1e3, per_mb * 1e3, per_mb / base, bubble, (P - 1) / (m + P - 1)])
    print(
        f"PP={P} stages {SPLIT} layers, GPT h={model.hidden_size} s={model.seq_length}, micro-batch {MB}, "
        "1F1B, gloo, 1 thread/rank"
    )
    print(
        table(
            [
                "micro-batches",
                "ms/step",
                "ms/micro-batch",
                "vs M=first",
                "bubble share (stage 0)",
                "ideal (P-1)/(M+P-1)",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
