"""The real Kueue's objects for the operator's cluster tests (tests/e2e/operator): a queue setup
with a GPU quota, a job put in its LocalQueue, the job's Workload as Kueue stores it."""

from __future__ import annotations

import json

GPU = "nvidia.com/gpu"
# the RDMA device each island's RDMA nodes offer (hack/topologies/default.yaml): east's, west's
RDMA = ("rdma/rdma_shared_device_a", "rdma/rdma_shared_device_b")


def kueue_objects(namespace: str, gpus: int) -> list[dict]:
    """A flavor, a ClusterQueue of ``gpus`` GPUs (lower priorities preempted within it), the
    test namespace's LocalQueue, and WorkloadPriorityClasses low (100) and high (10000)."""
    cq = f"cq-{namespace}"
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": f"gpu-{namespace}"},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        # every resource the pods request: their RDMA devices too
                        "coveredResources": ["cpu", "memory", GPU, *RDMA],
                        "flavors": [
                            {
                                "name": f"gpu-{namespace}",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "64"},
                                    {"name": "memory", "nominalQuota": "512Gi"},
                                    {"name": GPU, "nominalQuota": str(gpus)},
                                    *({"name": r, "nominalQuota": "64"} for r in RDMA),
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "user-queue", "namespace": namespace},
            "spec": {"clusterQueue": cq},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": "low"},
            "value": 100,
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": "high"},
            "value": 10000,
        },
    ]


def workload(cluster, ns, job) -> dict | None:
    r = cluster.kubectl(
        "get", "workloads.kueue.x-k8s.io", f"holmesjob-{job}", "-n", ns, "-o", "json", check=False
    )
    return json.loads(r.stdout) if r.returncode == 0 else None


def queued(job: dict, priority_class: str | None = None) -> dict:
    labels = {"kueue.x-k8s.io/queue-name": "user-queue"}
    if priority_class:
        labels["kueue.x-k8s.io/priority-class"] = priority_class
    job["metadata"]["labels"] = labels
    return job
