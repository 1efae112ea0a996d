"""Node objects for the labeller tests: a Node as Node Feature Discovery leaves an RDMA node, and
the API server's side of the labeller's merge patch."""

from __future__ import annotations

import copy

NFD = {"feature.node.kubernetes.io/rdma.capable": "true", "feature.node.kubernetes.io/rdma.available": "true"}


def nfd_node(name="n1", labels=None, annotations=None):
    """A Node as NFD leaves an RDMA node: RDMA yes, kind unknown."""
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "42",
            "labels": {"kubernetes.io/hostname": name, "holmes.dev/cluster": "east", **NFD, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "rdma/hca": "1k"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def apply(node: dict, patch: dict | None) -> dict:
    """What the API server does with the labeller's merge patch of metadata."""
    out = copy.deepcopy(node)
    for part, kv in ((patch or {}).get("metadata") or {}).items():
        if part == "resourceVersion":
            continue
        target = out["metadata"].setdefault(part, {})
        for k, v in kv.items():
            if v is None:
                target.pop(k, None)
            else:
                target[k] = v
    return out
