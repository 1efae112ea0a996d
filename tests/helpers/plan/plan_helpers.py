"""Builders for v1 Node dicts and small jobs used by the planner tests."""


def node(
    name,
    nic=None,
    cluster=None,
    gpus=8,
    gbps=None,
    labels=None,
    allocatable=None,
    ready=True,
    unschedulable=False,
    annotations=None,
):
    lab = {"kubernetes.io/hostname": name}
    if nic:
        lab["holmes.dev/nic"] = nic
    if cluster:
        lab["holmes.dev/cluster"] = cluster
    if gbps:
        lab["holmes.dev/nic-gbps"] = str(gbps)
    lab.update(labels or {})
    alloc = {"cpu": "64", "nvidia.com/gpu": str(gpus)}
    alloc.update(allocatable or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": lab, "annotations": annotations or {}},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {
            "allocatable": alloc,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def paper_nodes():
    """4 InfiniBand (east) + 4 RoCE (west) nodes whose names interleave the two fabrics."""
    return [
        node(
            f"gpu-node-{i}",
            "infiniband" if i in (1, 2, 5, 6) else "roce",
            "east" if i in (1, 2, 5, 6) else "west",
        )
        for i in range(1, 9)
    ]


def job_spec(layers=36, hidden=4096, heads=32, seq=2048, vocab=50257, B=2048, mb=4, count=8, gpus=8, **par):
    spec = {
        "model": {
            "layers": layers,
            "hiddenSize": hidden,
            "attentionHeads": heads,
            "seqLength": seq,
            "vocabSize": vocab,
        },
        "training": {"globalBatchSize": B, "microBatchSize": mb, "iterations": 10, "learningRate": 1.0e-4},
        "nodes": {"count": count, "gpusPerNode": gpus},
    }
    if par:
        spec["parallelism"] = par
    return spec
