"""Activation recomputation on vs off: step time and peak memory of the engine, side by side.

    .venv/bin/python bench/trainer_recompute.py [--iters 6] [--repeats 2] [--seq 256] [--mb 8]

Every (layout, setting, repeat) runs in a fresh Python process (forked gloo ranks inside it), so
no allocator cache carries over. Each rank resets its peak-RSS mark (/proc/self/clear_refs) after
the model and optimizer are built and reads VmHWM after the last step: "peak MiB" is what
training added on top (activations, gradients, temporaries), the largest over the ranks.
MALLOC_MMAP_THRESHOLD_ is fixed so big tensors are mmapped and freed to the OS (glibc would
otherwise raise the threshold and keep freed activations in its heap, hiding the difference).
Settings alternate (off, on, off, on, ...); the step time is the best repeat's median step after
the first. Also printed: the model-FLOPs ratio of the two formulas (holmes.contract.flops), i.e. the
time ratio if the step were pure compute, and TFLOPS/GPU as the trainer reports them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def child(spec: dict) -> None:
    import time

    import torch

    sys.path.insert(0, HERE)
    from trainer_common import layout, median, run_ranks, train_config

    from holmes.contract import ModelSpec
    from holmes.trainer.engine import Trainer

    def status_kib(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise RuntimeError(f"{field} not in /proc/self/status")

    def worker(rank: int, spec: dict) -> dict:
        model = ModelSpec(**spec["model"])
        cfg = train_config(
            model, spec["mb"] * spec["m"], spec["mb"], spec["iters"], activation_recompute=spec["recompute"]
        )
        lay = layout(spec["pipeline"], 1, spec["split"], spec["mb"], spec["m"])
        trainer = Trainer(cfg, lay, rank=rank, device=torch.device("cpu"), backend="gloo")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak-RSS mark to the current RSS
        base = status_kib("VmRSS")
        t0 = time.perf_counter()
        hist = trainer.train()
        total = time.perf_counter() - t0
        return {
            "base_kib": base,
            "peak_kib": status_kib("VmHWM"),
            "total": total,
            "steps": [h["iterationSeconds"] for h in hist],
            "tflops": [h["tflopsPerGpu"] for h in hist],
            "loss": hist[-1]["loss"],
        }

    out = run_ranks(spec["pipeline"], worker, spec, threads=spec["threads"])
    steps = out[0]["steps"][1:]
    print(
        json.dumps(
            {
                "step": median(steps),
                "peak_mib": max((o["peak_kib"] - o["base_kib"]) / 1024 for o in out.values()),
                "rss_mib": max(o["peak_kib"] / 1024 for o in out.values()),
                "tflops": median(out[0]["tflops"][1:]),
                "loss": out[0]["loss"],
            }
        )
    )


def run_child(spec: dict) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": str(spec["threads"])}
    p = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if p.returncode:
        raise RuntimeError(f"child failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--mb", type=int, default=8)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the small mode `make test` runs: a toy model, PP=2 only",
    )
    a = ap.parse_args()
    if a.child:
        child(json.loads(a.child))
        return
    if a.smoke:
        a.iters, a.repeats, a.layers, a.hidden, a.seq, a.mb = 3, 1, 2, 64, 32, 2

    sys.path.insert(0, HERE)
    from trainer_common import table

    from holmes.contract import flops

    model = {
        "layers": a.layers,
        "hidden_size": a.hidden,
        "attention_heads": 8,
        "seq_length": a.seq,
        "vocab_size": 4096,
    }
    half = a.layers // 2
    layouts = [("1 rank", 1, [a.layers]), (f"PP=2 [{half},{a.layers - half}]", 2, [half, a.layers - half])]
    layouts = layouts[1:] if a.smoke else layouts
    rows = []
    for name, P, split in layouts:
        best: dict[bool, dict] = {}
        for _ in range(a.repeats):
            for rec in (False, True):
                spec = {
                    "model": model,
                    "mb": a.mb,
                    "m": max(a.micro_batches, P),
                    "iters": a.iters,
                    "pipeline": P,
                    "split": split,
                    "recompute": rec,
                    "threads": a.threads,
                }
                r = run_child(spec)
                if rec not in best or r["step"] < best[rec]["step"]:
                    best[rec] = {**r, "peak_mib": max(r["peak_mib"], best.get(rec, {}).get("peak_mib", 0))}
        off, on = best[False], best[True]
        assert abs(off["loss"] - on["loss"]) < 1e-5, (off["loss"], on["loss"])
        rows.append(
            [
                name,
                off["step"] * 1e3,
                on["step"] * 1e3,
                on["step"] / off["step"],
                off["peak_mib"],
                on["peak_mib"],
                on["peak_mib"] / off["peak_mib"],
                off["tflops"],
                on["tflops"],
            ]
        )
    fl = dict(global_batch=1, seq=a.seq, layers=a.layers, hidden=a.hidden, vocab=4096)
    ratio = flops.flops_per_iteration(recompute=True, **fl) / flops.flops_per_iteration(recompute=False, **fl)
    print(
        f"GPT {a.layers}L h={a.hidden} s={a.seq} V=4096, micro-batch {a.mb} x {a.micro_batches} "
        f"(x2 for PP=2: 1F1B needs >= P), AdamW, fp32, CPU gloo, {a.threads} thread(s)/rank, "
        f"{a.iters} steps, best of {a.repeats} fresh processes per setting"
    )
    print(
        table(
            [
                "layout",
                "off ms/step",
                "on ms/step",
                "on/off",
                "off peak MiB",
                "on peak MiB",
                "on/off",
                "off TFLOPS",
                "on TFLOPS",
            ],
            rows,
        )
    )
    print(
        f"model FLOPs on/off (96 vs 72 formula, i.e. the time ratio if pure compute): {ratio:.3f}; "
        f"same final loss on and off (checked to 1e-5)"
    )


if __name__ == "__main__":
    main()
