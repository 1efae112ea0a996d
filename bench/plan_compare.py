"""Estimated speed of the Holmes layout vs the Megatron default (name order, equal layers, same
degrees) vs the same job on an all-InfiniBand cluster, for a few NIC mixes. Cost-model estimates,
not measurements: they show what the planner's choices are worth under its documented model.

Run: .venv/bin/python bench/plan_compare.py
"""

from __future__ import annotations

from holmes.plan import compare, plan
from holmes.plan.discovery import NodeNic

GBPS = {"infiniband": 200.0, "roce": 100.0, "ethernet": 25.0}
GPT_7B = {
    "model": {"layers": 36, "hiddenSize": 4096, "attentionHeads": 32, "seqLength": 2048, "vocabSize": 50257},
    "training": {"globalBatchSize": 2048, "microBatchSize": 4, "iterations": 1, "learningRate": 1e-4},
    "nodes": {"count": 8, "gpusPerNode": 8},
}


def nodes(mix: list[tuple[str, str, int]]) -> list[NodeNic]:
    """Nodes named in purchase order, so that name order interleaves the fabrics."""
    out, i = [], 0
    pools = [[(kind, cluster)] * count for kind, cluster, count in mix]
    while any(pools):
        for p in pools:
            if p:
                kind, cluster = p.pop()
                out.append(NodeNic(name=f"gpu-{i:03d}", cluster=cluster, nic=kind, gbps=GBPS[kind], gpus=8))
                i += 1
    return out


SCENARIOS = [
    ("4 IB + 4 RoCE (paper)", [("infiniband", "east", 4), ("roce", "west", 4)]),
    ("4 IB + 4 Ethernet", [("infiniband", "east", 4), ("ethernet", "west", 4)]),
    ("2 IB + 2 RoCE + 4 Ethernet", [("infiniband", "a", 2), ("roce", "b", 2), ("ethernet", "c", 4)]),
    ("6 IB + 2 RoCE", [("infiniband", "east", 6), ("roce", "west", 2)]),
]


def main() -> None:
    print(
        "GPT 7.4B (36 layers, h=4096), global batch 2048, micro-batch 4, 8 nodes x 8 GPUs; "
        "TFLOPS/GPU estimated"
    )
    print(
        f"{'cluster':28} {'Holmes':>8} {'Megatron':>9} {'all-IB':>7} {'Holmes/Megatron':>16} "
        f"{'Holmes/all-IB':>14}  Holmes layout"
    )
    ib = plan(nodes([("infiniband", "east", 8)]), GPT_7B).estimate["tflopsPerGpu"]
    for name, mix in SCENARIOS:
        h, b, ratio = compare(nodes(mix), GPT_7B)
        lay = f"{h.tensor}x{h.pipeline}x{h.data} layers {[s.num_layers for s in h.stages]}"
        ht, bt = h.estimate["tflopsPerGpu"], b.estimate["tflopsPerGpu"]
        print(f"{name:28} {ht:>8.1f} {bt:>9.1f} {ib:>7.1f} {ratio:>16.3f} {ht / ib:>14.3f}  {lay}")


if __name__ == "__main__":
    main()
