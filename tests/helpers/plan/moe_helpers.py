"""Mixture-of-experts jobs and node lists shared by the planner and framework tests: a
Mixtral-8x7B and a DeepSeek-V2-Lite shape, three islands, and the check that every expert group
lies on one island."""

from holmes.contract import Layout
from holmes.contract.jobspec import load_job
from tests.helpers.plan.plan_helpers import node

TRAINER = {"name": "trainer", "image": "i", "command": ["python", "pretrain_gpt.py"]}


def moe_job(shape, count=8, **parallelism):
    model, moe = SHAPES[shape]
    spec = {
        "framework": "megatron",
        "template": {"spec": {"containers": [TRAINER]}},
        "model": {**model, "moe": moe},
        "training": {"globalBatchSize": 256, "microBatchSize": 1, "iterations": 10, "learningRate": 1e-4},
        "nodes": {"count": count, "gpusPerNode": 8},
        "parallelism": parallelism,
    }
    return load_job(spec)


LLAMA = {"architecture": "llama", "seqLength": 4096}
SHAPES = {
    # Mixtral-8x7B: 46.7B parameters, 12.9B per token
    "mixtral": (
        {**LLAMA, "layers": 32, "hiddenSize": 4096, "attentionHeads": 32, "kvHeads": 8}
        | {"ffnHiddenSize": 14336, "vocabSize": 32000},
        {"experts": 8, "expertsPerToken": 2},
    ),
    # DeepSeek-V2-Lite: 64 routed experts of width 1408, 6 per token, 2 shared (its MLA attention
    # priced as 16-head attention, its first dense layer as an MoE one)
    "deepseek-v2-lite": (
        {**LLAMA, "layers": 27, "hiddenSize": 2048, "attentionHeads": 16, "vocabSize": 102400}
        | {"ffnHiddenSize": 10944},
        {"experts": 64, "expertsPerToken": 6, "expertHiddenSize": 1408, "sharedExperts": 2},
    ),
}


def three_islands():
    """4 InfiniBand (east), 4 RoCE (west), 4 Ethernet (lab) nodes x 8 GPUs, names interleaved."""
    kinds = [("infiniband", "east"), ("roce", "west"), ("ethernet", "lab")]
    return [node(f"n{i:02d}", *kinds[i % 3]) for i in range(12)]


def island_of(nodes):
    return {
        n["metadata"]["name"]: "/".join(
            (
                n["metadata"]["labels"].get("holmes.dev/cluster", ""),
                n["metadata"]["labels"].get("holmes.dev/nic", ""),
            )
        )
        for n in nodes
    }


def check_expert_groups(layout: Layout, nodes):
    """Every expert group on one island, inside one node when it fits in one; returns them."""
    isl = island_of(nodes)
    G = layout.gpus_per_node
    groups = list(layout.process_groups("ep"))
    assert len(groups) == layout.pipeline * layout.data // layout.expert * layout.tensor
    for g in groups:
        hosts = {layout.nodes[r // G] for r in g.ranks}
        assert len({isl[h] for h in hosts}) == 1, (g.ranks, hosts)
        if layout.expert * layout.tensor <= G:
            assert len(hosts) == 1, (g.ranks, hosts)
        assert g.net == layout.stages[g.stage].dp_net  # the stage's island's net
    return groups
