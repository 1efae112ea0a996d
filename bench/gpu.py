"""One GPU, bf16: tokens/s and MFU of the engine vs a plain PyTorch loop on the same model.

    python bench/gpu.py [--models 1b,7b-stage] [--iters 10] [--warmup 3] [--peak-tflops 989]
                        [--recompute] [--out results.json]
    python bench/gpu.py --device cpu --models tiny --iters 2     # the code path, on CPU (no MFU)

Models (GPT, s=2048, V=50304): ``1b`` is h=2048, 20 layers, 16 heads (1.1B parameters);
``7b-stage`` is one stage of the 7B config (h=4096, 32 heads) split in 8: 4 layers with the
embedding and the head, the work of a first-and-last stage on one GPU.

Variants, each in this process one after the other (memory freed in between):
- ``engine``: holmes.trainer's Trainer on a one-rank Layout (NCCL), bf16 parameters, fp32
  master weights in the sharded optimizer, fp32 gradient buffer;
- ``plain``: fp32 parameters under ``torch.autocast(bfloat16)``, fused AdamW, clipping, the
  same micro-batching (gradient accumulation) and data;
- ``plain+compile``: the same with ``torch.compile(model)``. The engine does not compile: its
  optimizer's forward pre-hooks (all-gather waits) and grad hooks would split the graph.

MFU = model FLOPs (72 B s l h^2 (1 + s/6h + V/12lh), no recomputation counted) / time / peak;
the peak is the GPU's dense bf16 (H100/H200 SXM 989 TFLOPS, A100 312) or --peak-tflops.
Host memory: how much the build raises the process's peak RSS (meta device, then the GPU); a
peak only rises, so read it for the first variant of a run (``--models 7b-stage --variants
engine`` gives the 7B stage's alone).
Without CUDA it stops with a message, unless --device cpu (a smoke run, used by the tests).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer_common import free_port, layout  # noqa: E402

from holmes.contract import ModelCost, ModelSpec
from holmes.trainer.config import OptimizerConfig, TrainConfig
from holmes.trainer.data import BatchLoader, Sharding, make_source
from holmes.trainer.engine import Trainer, learning_rate
from holmes.trainer.model import build_full, loss_fn

MODELS = {
    "1b": ModelSpec(layers=20, hidden_size=2048, attention_heads=16, seq_length=2048, vocab_size=50304),
    "7b-stage": ModelSpec(layers=4, hidden_size=4096, attention_heads=32, seq_length=2048, vocab_size=50304),
    "tiny": ModelSpec(layers=2, hidden_size=64, attention_heads=4, seq_length=32, vocab_size=256),
}
PEAKS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0}


def peak_tflops(name: str, given: float | None) -> float | None:
    if given:
        return given
    if "PCIe" in name and "H100" in name:
        return 756.0
    return next((v for k, v in PEAKS.items() if k in name), None)


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the benchmark's clock, outside the engine


def timed_steps(step, device: torch.device, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        step()
    sync(device)
    t = time.perf_counter()
    for _ in range(iters):
        step()
    sync(device)
    return (time.perf_counter() - t) / iters


class Plain:
    """The loop a PyTorch user writes: fp32 weights, autocast, fused AdamW, accumulation."""

    def __init__(self, cfg: TrainConfig, device: torch.device, compile_: bool):
        self.cfg, self.device, self.i = cfg, device, 0
        self.model = build_full(cfg.model, cfg.seed, device)
        params = list(self.model.parameters())
        self.opt = torch.optim.AdamW(
            [
                {"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.01},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
            ],
            lr=cfg.optimizer.learning_rate,
            betas=(0.9, 0.95),
            fused=device.type == "cuda",
        )
        self.forward = torch.compile(self.model) if compile_ else self.model
        self.loader = BatchLoader(
            make_source(None, cfg.model.vocab_size, cfg.model.seq_length, cfg.seed),
            Sharding(cfg.global_batch_size, 1, 0),
        )
        self.m = cfg.global_batch_size // cfg.micro_batch_size

    def step(self) -> None:
        for g in self.opt.param_groups:
            g["lr"] = learning_rate(self.cfg.optimizer, self.i, self.cfg.iterations)
        x, y = self.loader.batch(self.i)
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        for xm, ym in zip(x.chunk(self.m), y.chunk(self.m)):
            with torch.autocast(self.device.type, dtype=torch.bfloat16):
                logits = self.forward(xm)
            (loss_fn(logits, ym) / self.m).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.i += 1


def run_variant(name: str, cfg: TrainConfig, device: torch.device, a: argparse.Namespace) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rss0 = rss_mib()
    t0 = time.perf_counter()
    if name == "engine":
        one_rank = layout(1, 1, [cfg.model.layers], cfg.micro_batch_size, a.micro_batches)
        backend = "nccl" if device.type == "cuda" else "gloo"
        runner = Trainer(cfg, one_rank, rank=0, device=device, backend=backend)
        step = runner.train_step
    else:
        runner = Plain(cfg, device, compile_=name == "plain+compile")
        step = runner.step
    sync(device)
    build = {"buildSeconds": time.perf_counter() - t0, "buildHostPeakMiB": rss_mib() - rss0}
    seconds = timed_steps(step, device, a.warmup, a.iters)
    out = {"variant": name, "secondsPerIteration": seconds, **build}
    if device.type == "cuda":
        out["gpuPeakGiB"] = torch.cuda.max_memory_allocated(device) / 2**30
    del runner, step
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="1b,7b-stage", help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--variants", default="engine,plain,plain+compile")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--recompute", action="store_true", help="activation recomputation in the engine")
    ap.add_argument("--peak-tflops", type=float, help="dense bf16 peak of this GPU (default: by its name)")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args(argv)
    unknown = [m for m in a.models.split(",") if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(MODELS)}")
    if a.device == "cuda" and not torch.cuda.is_available():
        print(
            "bench/gpu.py needs a CUDA GPU and torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}). Run it on a GPU "
            "machine with a CUDA build of torch, or --device cpu --models tiny for a smoke run.",
            file=sys.stderr,
        )
        return 2
    device = torch.device(a.device, 0) if a.device == "cuda" else torch.device("cpu")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_tflops(gpu, a.peak_tflops)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        rank=0,
        world_size=1,
        init_method=f"tcp://127.0.0.1:{free_port()}",
        timeout=timedelta(seconds=300),
    )
    results = []
    try:
        for model_name in a.models.split(","):
            spec = MODELS[model_name]
            cfg = TrainConfig(
                model=spec,
                global_batch_size=a.micro_batch * a.micro_batches,
                micro_batch_size=a.micro_batch,
                iterations=a.warmup + a.iters,
                optimizer=OptimizerConfig(kind="adamw", learning_rate=1e-4),
                dtype="bfloat16",
                activation_recompute=a.recompute,
                fabric_check="off",
            )
            cost = ModelCost.of(spec)
            flops = cost.flops_per_iteration(cfg.global_batch_size, recompute=False)
            tokens = cfg.global_batch_size * spec.seq_length
            for variant in a.variants.split(","):
                r = run_variant(variant, cfg, device, a)
                tflops = flops / r["secondsPerIteration"] / 1e12
                r.update(
                    model=model_name,
                    parameters=cost.total_params,
                    tokensPerSecond=tokens / r["secondsPerIteration"],
                    modelTflops=tflops,
                    mfu=tflops / peak if peak else None,
                )
                results.append(r)
                print(json.dumps(r), flush=True)
    finally:
        dist.destroy_process_group()
    print(f"\n{gpu}, bf16, micro-batch {a.micro_batch} x {a.micro_batches}, peak {peak or 'unknown'} TFLOPS")
    head = ("model", "variant", "tokens/s", "TFLOPS", "MFU", "GPU GiB", "host MiB")
    print("{:<10} {:<14} {:>10} {:>8} {:>6} {:>8} {:>9}".format(*head))
    for r in results:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        print(
            f"{r['model']:<10} {r['variant']:<14} {r['tokensPerSecond']:>10.0f} {r['modelTflops']:>8.1f} "
            f"{mfu:>6} {r.get('gpuPeakGiB', 0):>8.1f} {r['buildHostPeakMiB']:>9.0f}"
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": gpu, "peakTflops": peak, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
