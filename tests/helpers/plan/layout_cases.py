"""Planning cases whose layouts must not change when the search gets faster (issue 47): each is
planned and reduced to a digest of the whole Layout JSON (nodes in rank order, stages, groups,
estimate, explanation) or of the PlanError it raises. ``data/layouts_4c2f746.json`` holds what
commit 4c2f746 (before the search was sped up) planned; regenerate it only from that commit:

    git worktree add /tmp/old 4c2f746 --detach   # and a venv whose editable holmes is /tmp/old
    /tmp/old/.venv/bin/python -m tests.helpers.plan.layout_cases > tests/unit/plan/data/layouts_4c2f746.json
                                                  # run from this checkout's root

The cases cover what the search weighs: islands of three NIC kinds over three clusters with a
node count that leaves mixed stages, GPU types (H100 stages where NVLS pays, mixed types inside
an island, slower NICs inside an island), links between clusters with latency, a template that
fixes socket flows, a vendor net plugin, a mixture of experts, Megatron's order, stages that mix
NIC kinds (their Socket groups bound by the slowest TCP link, or by the fewest flows), stages
sharing a node, and a job no layout fits; ``large`` is the issue's 8,192-node job on 15,360
nodes (bench/plan_scaling.py's cluster). Each summary the search keeps is exercised where it
binds: making any of NodeSet's minima a maximum fails a case.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from typing import Any

from holmes.contract import names
from holmes.contract.layout import layout_signature
from holmes.plan import CostModelConfig, PlanError, plan
from holmes.plan.discovery import NodeNic
from holmes.plan.topology import ClusterLink, Fabric

KINDS = (("infiniband", 200.0), ("roce", 100.0), ("ethernet", 25.0))
GPUS = (
    ("NVIDIA-H100-80GB-HBM3", "81559"),
    ("NVIDIA-A100-SXM4-80GB", "81920"),
    ("NVIDIA-L40S", "46068"),
)


def scaling_cluster(n: int) -> list[NodeNic]:
    """bench/plan_scaling.py's cluster: a third InfiniBand, RoCE and Ethernet, in three clusters."""
    return [
        NodeNic(name=f"gpu-{i:05d}", cluster=f"dc{i % 3}", nic=KINDS[i % 3][0], gbps=KINDS[i % 3][1], gpus=8)
        for i in range(n)
    ]


def gpt175b(count: int, vocab: int = 50257, **parallelism: Any) -> dict[str, Any]:
    """bench/plan_scaling.py's job: GPT-175B-like, two micro-batches of one per GPU."""
    spec: dict[str, Any] = {
        "model": {
            "layers": 96,
            "hiddenSize": 12288,
            "attentionHeads": 96,
            "seqLength": 2048,
            "vocabSize": vocab,
        },
        "training": {
            "globalBatchSize": 16 * count,
            "microBatchSize": 1,
            "iterations": 1,
            "learningRate": 1e-4,
        },
        "nodes": {"count": count, "gpusPerNode": 8},
    }
    if parallelism:
        spec["parallelism"] = parallelism
    return spec


def typed_cluster(n: int) -> list[NodeNic]:
    """Five islands (hollow_nodes' kinds and speeds), each of one GPU type but every seventh
    node of the next type: H100 stages (NVLS), A100 and L40S, and mixed stages inside an island;
    every eleventh node's NICs run at half the island's speed (a group runs at its slowest)."""
    kinds = (
        ("infiniband", 400.0),
        ("roce", 200.0),
        ("infiniband", 200.0),
        ("roce", 100.0),
        ("ethernet", 100.0),
    )
    out = []
    for i in range(n):
        isl = i % 5
        product, mem = GPUS[(isl + (i % 7 == 0)) % 3]
        labels = {names.LABEL_GPU_PRODUCT: product, names.LABEL_GPU_MEMORY: mem}
        out.append(
            NodeNic(
                name=f"h-{isl}-{i:05d}",
                cluster=f"island-{isl}",
                nic=kinds[isl][0],
                gbps=kinds[isl][1] / (2 if i % 11 == 0 else 1),
                gpus=8,
                labels=labels,
            )
        )
    return out


def llama70b(count: int, batch: int, **parallelism: Any) -> dict[str, Any]:
    model = {"architecture": "llama", "layers": 80, "hiddenSize": 8192, "attentionHeads": 64, "kvHeads": 8}
    model |= {"ffnHiddenSize": 28672, "seqLength": 4096, "vocabSize": 128256}
    spec: dict[str, Any] = {
        "model": model,
        "training": {"globalBatchSize": batch, "microBatchSize": 1, "iterations": 1, "learningRate": 1e-4},
        "nodes": {"count": count, "gpusPerNode": 8},
    }
    if parallelism:
        spec["parallelism"] = parallelism
    return spec


def small_model(count: int, batch: int, **spec: Any) -> dict[str, Any]:
    """A 1.3B-like model: stages can be a fraction of a node."""
    return {
        "model": {
            "layers": 24,
            "hiddenSize": 2048,
            "attentionHeads": 16,
            "seqLength": 2048,
            "vocabSize": 50257,
        },
        "training": {"globalBatchSize": batch, "microBatchSize": 2, "iterations": 1, "learningRate": 1e-4},
        "nodes": {"count": count, "gpusPerNode": 8},
        **spec,
    }


def linked() -> tuple[list[NodeNic], dict[str, Any], CostModelConfig]:
    """Three sites joined by listed links (one slow and far), a template that fixes two socket
    threads of two sockets, and one island on a vendor net plugin."""
    nodes = scaling_cluster(60)
    env = [{"name": "NCCL_SOCKET_NTHREADS", "value": "2"}, {"name": "NCCL_NSOCKS_PERTHREAD", "value": "2"}]
    spec = small_model(
        48,
        768,
        template={"spec": {"containers": [{"name": "trainer", "image": "i", "env": env}]}},
        islands=[{"cluster": "dc2", "nic": "ethernet", "netPlugin": "AWS Libfabric"}],
    )
    links = (ClusterLink(("dc0", "dc1"), 100.0, 1.0), ClusterLink(("dc1", "dc2"), 10.0, 20.0))
    return nodes, spec, CostModelConfig(fabric=Fabric(links=links, cross_cluster_latency_ms=5.0))


def mixed_stages(one_socket: bool) -> tuple[list[NodeNic], dict[str, Any], CostModelConfig]:
    """InfiniBand (200 Gbit/s, a 25 Gbit/s host network) and 100 Gbit/s Ethernet nodes whose names
    alternate: in Megatron's name order each stage mixes the two, and its Socket DP group is bound
    by its slowest TCP link; with ``one_socket`` the template fixes one socket per thread, so
    Holmes' thread count sets the flows (4 on Ethernet, 1 on InfiniBand) and the fewest bind."""
    nodes = [
        NodeNic(
            name=f"n{i:02d}",
            cluster="east",
            nic=("infiniband", "ethernet")[i % 2],
            gbps=(200.0, 100.0)[i % 2],
            gpus=8,
        )
        for i in range(24)
    ]
    env = [{"name": "NCCL_NSOCKS_PERTHREAD", "value": "1"}] if one_socket else []
    spec = small_model(
        16,
        512,
        template={"spec": {"containers": [{"name": "trainer", "image": "i", "env": env}]}},
        parallelism={"pipeline": 2, "nicSelection": "off"},
    )
    return nodes, spec, CostModelConfig()


def moe() -> tuple[list[NodeNic], dict[str, Any], CostModelConfig]:
    model = {"architecture": "llama", "layers": 32, "hiddenSize": 4096, "attentionHeads": 32, "kvHeads": 8}
    model |= {"ffnHiddenSize": 14336, "vocabSize": 32000, "seqLength": 4096}
    model["moe"] = {"experts": 8, "expertsPerToken": 2}
    spec = {
        "framework": "megatron",
        "template": {
            "spec": {
                "containers": [{"name": "trainer", "image": "i", "command": ["python", "pretrain_gpt.py"]}]
            }
        },
        "model": model,
        "training": {"globalBatchSize": 512, "microBatchSize": 1, "iterations": 1, "learningRate": 1e-4},
        "nodes": {"count": 32, "gpusPerNode": 8},
        "parallelism": {"sequenceParallel": True},
    }
    return scaling_cluster(40), spec, CostModelConfig()


Case = Callable[[], tuple[list[NodeNic], dict[str, Any], CostModelConfig]]
CASES: dict[str, Case] = {
    "scaling-1024-of-1920": lambda: (scaling_cluster(1920), gpt175b(1024), CostModelConfig()),
    "scaling-fixed-tp8-pp8": lambda: (
        scaling_cluster(700),
        gpt175b(512, vocab=50304, tensor=8, pipeline=8),
        CostModelConfig(),
    ),
    "gpu-types-llama70b": lambda: (typed_cluster(300), llama70b(128, 1024, tensor=8), CostModelConfig()),
    "gpu-types-stages-share-nodes": lambda: (
        typed_cluster(50),
        small_model(4, 256, parallelism={"pipeline": 8, "tensor": 1}),
        CostModelConfig(),
    ),
    "links-sockets-plugin": linked,
    "mixed-stages-socket-link": lambda: mixed_stages(one_socket=False),
    "mixed-stages-socket-flows": lambda: mixed_stages(one_socket=True),
    "moe-expert-groups": moe,
    "megatron-order": lambda: (
        scaling_cluster(200),
        gpt175b(128, nicSelection="off", partition="uniform"),
        CostModelConfig(),
    ),
    "no-layout-fits": lambda: (scaling_cluster(64), gpt175b(16), CostModelConfig()),
    "large": lambda: (scaling_cluster(15_360), gpt175b(8192), CostModelConfig()),
}


def outcome(name: str) -> dict[str, Any]:
    """The case's layout as a digest of its JSON plus its readable shape, or the error it raises."""
    nodes, spec, cfg = CASES[name]()
    try:
        layout = plan(nodes, spec, cfg)
    except PlanError as e:
        return {
            "error": hashlib.sha256(f"{type(e).__name__}: {e}".encode()).hexdigest(),
            "message": str(e)[:200],
        }
    return {
        "json": hashlib.sha256(layout.to_json().encode()).hexdigest(),
        "signature": layout_signature(layout),
        "nodes": hashlib.sha256("\n".join(layout.nodes).encode()).hexdigest(),
        "iterationSeconds": layout.estimate["iterationSeconds"],
    }


if __name__ == "__main__":
    json.dump({name: outcome(name) for name in CASES}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
