"""Planner time from 64 to 4,096 nodes x 8 GPUs on a heterogeneous cluster, and what it picks.

Run: .venv/bin/python bench/plan_scaling.py [--max-nodes 4096] [--repeat 3]
     .venv/bin/python bench/plan_scaling.py --nodes 8192 --cluster 15360 --repeat 3 \\
         --against ../old/.venv/bin/python
The cluster is a third InfiniBand, a third RoCE and a third Ethernet nodes in three clusters; the
job is GPT-175B-like (96 layers, h=12288, 96 heads) with a global batch that grows with the
cluster. ``--nodes N``: one job size instead of 64..--max-nodes; ``--cluster M``: the cluster has
M nodes (default: as many as the job), so the planner also chooses which nodes (issue 47's case
is an 8,192-node job on 15,360 nodes). ``--gpu-types`` labels each cluster's nodes with one GPU
type (H100, A100, L40S: NVLS where it pays, stages priced per type) and ``--tensor T`` fixes the
tensor degree (the vocabulary padded to 50,304). Each time is one ``plan()`` in a fresh process,
so no cache warmed by an earlier run counts; the table shows the best of --repeat.

``--against PYTHON``: the same case under another interpreter, e.g. the venv of a checkout of an
older commit (whose editable install makes its ``holmes`` that commit's); the runs alternate
(this checkout, the other, ...) so both see the same load, and the last lines give both times,
their ratio and whether the two Layouts are identical (their whole JSON).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

KINDS = (("infiniband", 200.0), ("roce", 100.0), ("ethernet", 25.0))
# --gpu-types: GPU Feature Discovery's labels, one type per cluster (H100 nodes have NVLS)
GPU_TYPES = (("NVIDIA-H100-80GB-HBM3", "81559"), ("NVIDIA-A100-SXM4-80GB", "81920"), ("NVIDIA-L40S", "46068"))


def cluster(n: int, gpu_types: bool = False) -> list:
    from holmes.plan.discovery import NodeNic

    def labels(i: int) -> dict[str, str]:
        if not gpu_types:
            return {}
        product, mib = GPU_TYPES[i % 3]
        return {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": mib}

    return [
        NodeNic(
            name=f"gpu-{i:05d}",
            cluster=f"dc{i % 3}",
            nic=KINDS[i % 3][0],
            gbps=KINDS[i % 3][1],
            gpus=8,
            labels=labels(i),
        )
        for i in range(n)
    ]


def job(n: int, tensor: int | None = None) -> dict:
    spec: dict = {
        "model": {
            "layers": 96,
            "hiddenSize": 12288,
            "attentionHeads": 96,
            "seqLength": 2048,
            "vocabSize": 50257 if tensor is None else 50304,  # padded to split over tensor
        },
        "training": {
            "globalBatchSize": 2 * 8 * n,
            "microBatchSize": 1,
            "iterations": 1,
            "learningRate": 1e-4,
        },
        "nodes": {"count": n, "gpusPerNode": 8},
    }
    if tensor is not None:
        spec["parallelism"] = {"tensor": tensor}
    return spec


def one(n: int, cluster_nodes: int, variant: list[str]) -> dict:
    """Plan the case once in this process: seconds, the Layout's digest and what it picked."""
    from holmes.plan import plan

    tensor = int(variant[variant.index("--tensor") + 1]) if "--tensor" in variant else None
    nodes, spec = cluster(cluster_nodes, "--gpu-types" in variant), job(n, tensor)
    t0 = time.perf_counter()
    lay = plan(nodes, spec)
    seconds = time.perf_counter() - t0
    text = lay.to_json()
    return {
        "seconds": seconds,
        "layout": hashlib.sha256(text.encode()).hexdigest(),
        "shape": f"{lay.tensor}x{lay.pipeline}x{lay.data}",
        "kib": len(text.encode()) / 1024,
        "tflopsPerGpu": lay.estimate["tflopsPerGpu"],
    }


def fresh(python: str, n: int, cluster_nodes: int, variant: list[str]) -> dict:
    """:func:`one` in a new process of ``python``; ``variant``: --gpu-types, --tensor T."""
    cmd = [python, str(Path(__file__).resolve()), "--one", str(n), "--cluster", str(cluster_nodes), *variant]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        sys.exit(f"{python} failed planning {n} of {cluster_nodes} nodes:\n{p.stderr[-3000:]}")
    result: dict = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def table(sizes: list[int], cluster_of: dict[int, int], repeat: int, variant: list[str]) -> None:
    print(
        f"{'nodes':>6} {'cluster':>7} {'GPUs':>6} {'plan s':>8} {'T x P x D':>14} {'layout KiB':>10} "
        f"{'TFLOPS/GPU':>10} {'x first':>8}"
    )
    base = None
    for n in sizes:
        runs = [fresh(sys.executable, n, cluster_of[n], variant) for _ in range(repeat)]
        best = min(r["seconds"] for r in runs)
        base = base or best
        r = runs[0]
        print(
            f"{n:>6} {cluster_of[n]:>7} {8 * n:>6} {best:>8.3f} {r['shape']:>14} {r['kib']:>10.1f} "
            f"{r['tflopsPerGpu']:>10.1f} {best / base:>8.2f}"
        )


def side_by_side(n: int, cluster_nodes: int, repeat: int, other: str, variant: list[str]) -> None:
    """This checkout and ``other``'s alternately, ``repeat`` runs each."""
    ours: list[dict] = []
    theirs: list[dict] = []
    print(f"{'run':>4} {'this s':>8} {'other s':>8} {'this/other':>10}")
    for i in range(repeat):
        ours.append(fresh(sys.executable, n, cluster_nodes, variant))
        theirs.append(fresh(other, n, cluster_nodes, variant))
        a, b = ours[-1]["seconds"], theirs[-1]["seconds"]
        print(f"{i + 1:>4} {a:>8.3f} {b:>8.3f} {a / b:>10.3f}")
    a = statistics.median(r["seconds"] for r in ours)
    b = statistics.median(r["seconds"] for r in theirs)
    layouts = {r["layout"] for r in ours + theirs}
    print(
        f"{n} of {cluster_nodes} nodes{''.join(' ' + v for v in variant)}: median {a:.3f} s here, "
        f"{b:.3f} s with {other}: {a / b:.3f}x the time ({b / a:.1f}x faster); best "
        f"{min(r['seconds'] for r in ours):.3f} s vs {min(r['seconds'] for r in theirs):.3f} s"
    )
    same = len(layouts) == 1
    print(f"same layout: {'yes' if same else 'NO'} ({ours[0]['shape']}, sha256 {ours[0]['layout'][:16]})")
    if not same:
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--max-nodes", type=int, default=4096)
    ap.add_argument("--nodes", type=int, help="one job size (nodes) instead of 64..--max-nodes")
    ap.add_argument("--cluster", type=int, help="nodes in the cluster (default: the job's); at least --nodes")
    ap.add_argument("--gpu-types", action="store_true", help="GFD labels: H100, A100, L40S, one per cluster")
    ap.add_argument("--tensor", type=int, choices=(1, 2, 4, 8), help="fix the tensor degree (default: auto)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", metavar="PYTHON", help="time the same case under this interpreter too")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: plan once, print JSON
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    variant = (["--gpu-types"] if args.gpu_types else []) + (
        ["--tensor", str(args.tensor)] if args.tensor else []
    )
    if args.one is not None:
        print(json.dumps(one(args.one, args.cluster or args.one, variant)))
        return
    sizes = (
        [args.nodes]
        if args.nodes
        else [n for n in (64, 128, 256, 512, 1024, 2048, 4096) if n <= args.max_nodes]
    )
    if args.cluster is not None and args.cluster < max(sizes):
        ap.error(f"--cluster {args.cluster} has fewer nodes than the job's {max(sizes)}: raise --cluster")
    cluster_of = {n: args.cluster or n for n in sizes}
    if args.against:
        if not args.nodes:
            ap.error("--against compares one case: give --nodes (and --cluster)")
        side_by_side(args.nodes, cluster_of[args.nodes], args.repeat, args.against, variant)
        return
    table(sizes, cluster_of, args.repeat, variant)


if __name__ == "__main__":
    main()
