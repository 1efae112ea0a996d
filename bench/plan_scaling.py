"""Planner time from 64 to 4,096 nodes x 8 GPUs on a heterogeneous cluster, and what it picks.

Run: .venv/bin/python bench/plan_scaling.py [--max-nodes 4096] [--repeat 3]
The cluster is a third InfiniBand, a third RoCE and a third Ethernet nodes in three clusters; the
job is GPT-175B-like (96 layers, h=12288, 96 heads) with a global batch that grows with the
cluster. Prints one table; times are the best of --repeat runs, and the last column compares each
size with the 64-node time.
"""

from __future__ import annotations

import argparse
import time

from holmes.plan import plan
from holmes.plan.discovery import NodeNic

KINDS = (("infiniband", 200.0), ("roce", 100.0), ("ethernet", 25.0))


def cluster(n: int) -> list[NodeNic]:
    return [
        NodeNic(name=f"gpu-{i:05d}", cluster=f"dc{i % 3}", nic=KINDS[i % 3][0], gbps=KINDS[i % 3][1], gpus=8)
        for i in range(n)
    ]


def job(n: int) -> dict:
    return {
        "model": {
            "layers": 96,
            "hiddenSize": 12288,
            "attentionHeads": 96,
            "seqLength": 2048,
            "vocabSize": 50257,
        },
        "training": {
            "globalBatchSize": 2 * 8 * n,
            "microBatchSize": 1,
            "iterations": 1,
            "learningRate": 1e-4,
        },
        "nodes": {"count": n, "gpusPerNode": 8},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-nodes", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [n for n in (64, 128, 256, 512, 1024, 2048, 4096) if n <= args.max_nodes]
    print(
        f"{'nodes':>6} {'GPUs':>6} {'plan s':>8} {'T x P x D':>14} {'layout KiB':>10} {'TFLOPS/GPU':>10} "
        f"{'x 64 nodes':>10}"
    )
    base = None
    for n in sizes:
        nodes, spec = cluster(n), job(n)
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            lay = plan(nodes, spec)
            best = min(best, time.perf_counter() - t0)
        base = base or best
        kib = len(lay.to_json().encode()) / 1024
        print(
            f"{n:>6} {8 * n:>6} {best:>8.3f} {f'{lay.tensor}x{lay.pipeline}x{lay.data}':>14} {kib:>10.1f} "
            f"{lay.estimate['tflopsPerGpu']:>10.1f} {best / base:>10.2f}"
        )


if __name__ == "__main__":
    main()
