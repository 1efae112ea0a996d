"""Overlapped vs synchronous distributed optimizer, DP=2 over gloo (same math, same data).

    .venv/bin/python bench/trainer_overlap.py [--iters 8] [--rounds 2]

Overlapped: each bucket's reduce-scatter starts in backward as soon as the bucket is complete and
each all-gather is waited on only by the next forward. Synchronous: the same collectives after
backward / after the step. Prints median step time, exposed communication and the ratio.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer_common import SMOKE_HELP, layout, median, run_ranks, smoke_model, table, train_config  # noqa: E402

from holmes.contract import ModelCost, ModelSpec
from holmes.trainer.engine import Trainer  # noqa: E402

MODEL = ModelSpec(layers=4, hidden_size=384, attention_heads=6, seq_length=128, vocab_size=8192)
MB, M = 2, 2


def worker(rank: int, model: ModelSpec, overlap: bool, iters: int, bucket: int) -> dict:
    cfg = train_config(model, MB * M * 2, MB, iters, overlap=overlap, bucket_elements=bucket)
    t = Trainer(
        cfg, layout(1, 2, [model.layers], MB, M), rank=rank, device=torch.device("cpu"), backend="gloo"
    )
    hist = t.train()
    return {
        "step": [h["iterationSeconds"] for h in hist],
        "comm": [h["time"]["exposedComm"] for h in hist],
        "loss": [h["loss"] for h in hist],
        "buckets": len(t.opt.buckets),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bucket", type=int, default=2_000_000)
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    a = ap.parse_args()
    model = smoke_model(MODEL) if a.smoke else MODEL
    if a.smoke:  # still several buckets, so the overlapped path is the bucketed one
        a.iters, a.rounds, a.bucket = 3, 1, 20_000
    res: dict[bool, list] = {True: [], False: []}
    losses = {}
    for _ in range(a.rounds):
        for overlap in (False, True):
            r = run_ranks(2, worker, model, overlap, a.iters, a.bucket)[0]
            res[overlap].append(r)
            losses[overlap] = r["loss"]
    skip = 2
    rows = []
    for overlap in (False, True):
        step = median([s for r in res[overlap] for s in r["step"][skip:]])
        comm = median([c for r in res[overlap] for c in r["comm"][skip:]])
        rows.append(["overlapped" if overlap else "synchronous", step * 1e3, comm * 1e3, comm / step])
    print(
        f"DP=2 gloo on loopback, GPT {model.layers}L h={model.hidden_size} V={model.vocab_size} "
        f"({ModelCost.of(model).total_params / 1e6:.1f}M params, {res[True][0]['buckets']} buckets), "
        f"micro-batch {MB} x {M}, 1 thread/rank"
    )
    print(table(["optimizer", "ms/step", "exposed comm ms", "comm share"], rows))
    print(
        f"step time overlapped/synchronous: {rows[1][1] / rows[0][1]:.3f}   "
        f"exposed comm overlapped/synchronous: {rows[1][2] / max(rows[0][2], 1e-9):.3f}"
    )
    print(
        f"max |loss difference| overlapped vs synchronous: "
        f"{max(abs(x - y) for x, y in zip(losses[True], losses[False])):.2e}"
    )


if __name__ == "__main__":
    main()
