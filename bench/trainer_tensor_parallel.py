"""Tensor parallelism on CPU: TP=2 (and with sequence parallelism) against TP=1, same model, same
global batch, the same two cores (gloo on loopback; one thread per rank, two for TP=1).

    .venv/bin/python bench/trainer_tensor_parallel.py [--iters 6] [--rounds 2]

What a CPU can show: the math is the same (losses agree), each rank holds half the parameters,
and the cost of two all-reduces per layer per pass over loopback TCP. What it cannot: NVLink's
bandwidth (hundreds of GB/s between a node's GPUs) and GPU matmul efficiency, which decide
whether TP pays off; bench/gpu.py measures that on a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer_common import SMOKE_HELP, layout, median, run_ranks, smoke_model, table, train_config  # noqa: E402

from holmes.contract import ModelCost, ModelSpec  # noqa: E402
from holmes.trainer.engine import Trainer  # noqa: E402

MODEL = ModelSpec(
    layers=4,
    hidden_size=512,
    attention_heads=8,
    kv_heads=4,
    seq_length=256,
    vocab_size=8192,
    architecture="llama",
    ffn_hidden_size=1408,
    rope_theta=10000.0,
)
MB, M = 2, 4
CASES = [  # name, tensor, data, sequence parallel, threads per rank
    ("TP=1 (1 rank, 2 threads)", 1, 1, False, 2),
    ("TP=2", 2, 1, False, 1),
    ("TP=2 + sequence parallel", 2, 1, True, 1),
    ("DP=2 (for comparison)", 1, 2, False, 1),
]


def worker(rank: int, model: ModelSpec, tensor: int, data: int, sp: bool, iters: int) -> dict:
    cfg = train_config(model, MB * M * 2, MB, iters, sequence_parallel=sp)
    lay = layout(1, data, [model.layers], MB, M * 2 // data, tensor=tensor)
    t = Trainer(cfg, lay, rank=rank, device=torch.device("cpu"), backend="gloo")
    hist = t.train()
    return {
        "step": [h["iterationSeconds"] for h in hist],
        "comm": [h["time"]["exposedComm"] for h in hist],
        "loss": [h["loss"] for h in hist],
        "param_bytes": sum(p.numel() * p.element_size() for p in t.module.parameters()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    a = ap.parse_args()
    model = smoke_model(MODEL) if a.smoke else MODEL
    if a.smoke:
        a.iters, a.rounds = 3, 1
    res: dict[str, list] = {name: [] for name, *_ in CASES}
    for _ in range(a.rounds):  # interleaved: the machine's noise hits every case alike
        for name, tensor, data, sp, threads in CASES:
            threads = 1 if a.smoke else threads  # a toy model on 2 threads spins more than it computes
            res[name].append(
                run_ranks(tensor * data, worker, model, tensor, data, sp, a.iters, threads=threads)[0]
            )
    skip = 2
    base = median([s for r in res[CASES[0][0]] for s in r["step"][skip:]])
    rows = []
    for name, *_ in CASES:
        step = median([s for r in res[name] for s in r["step"][skip:]])
        first = res[name][0]
        diff = max(abs(x - y) for x, y in zip(first["loss"], res[CASES[0][0]][0]["loss"]))
        rows.append([name, step * 1e3, step / base, first["param_bytes"] / 2**20, f"{diff:.1e}"])
    print(
        f"llama {model.layers}L h={model.hidden_size} GQA {model.attention_heads}/{model.kv_heads} "
        f"V={model.vocab_size} s={model.seq_length} ({ModelCost.of(model).total_params / 1e6:.1f}M params), "
        f"global batch {MB * M * 2}, micro-batch {MB}, gloo on loopback, 2 cores"
    )
    print(table(["layout", "ms/step", "vs TP=1", "param MiB/rank", "max |loss - TP=1|"], rows))


if __name__ == "__main__":
    main()
