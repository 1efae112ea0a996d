"""The real Kueue's objects for the operator's cluster tests (tests/e2e/operator): a queue setup
with a GPU quota, a job put in its LocalQueue, the job's Workload as Kueue stores it, a job that
trains long enough to be preempted, and a watch of the GPUs running pods hold."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from holmes_dev.jobs import holmes_job

from tests.helpers.operator.cluster_helpers import slow_trainers

GPU = "nvidia.com/gpu"
# the RDMA device each island's RDMA nodes offer (hack/topologies/default.yaml): east's, west's
RDMA = ("rdma/rdma_shared_device_a", "rdma/rdma_shared_device_b")
# a sitecustomize that slows the trainer's blocks on the nodes named in its env
NODES = ("ib-0", "ib-1", "eth-0", "roce-0", "roce-1", "eth-1")


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


class GpuWatch:
    """Polls the namespace's pods: the most GPUs ever held at once by pods that run (bound to a
    node and not ended, terminating ones included: they hold their GPUs until they are gone)."""

    def __init__(self, cluster, ns):
        self.cluster, self.ns, self.most, self.samples = cluster, ns, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def _run(self):
        while not self._stop.is_set():
            r = self.cluster.kubectl("get", "pods", "-n", self.ns, "-o", "json", check=False)
            if r.returncode == 0:
                held = 0
                for p in json.loads(r.stdout)["items"]:
                    if p["spec"].get("nodeName") and p.get("status", {}).get("phase") not in (
                        "Succeeded",
                        "Failed",
                    ):
                        for c in p["spec"]["containers"]:
                            held += int((c.get("resources") or {}).get("limits", {}).get(GPU, 0))
                self.most, self.samples = max(self.most, held), self.samples + 1
            self._stop.wait(0.3)


def training_job(namespace: str, name: str, shared: Path, iterations: int, gpus: int = 1) -> dict:
    """The tiny model trained for real on 2 nodes x 1 GPU, a little slowed (every block sleeps
    0.1 s) so that it is still training when it is preempted; it checkpoints only on its stop."""
    spec = {
        "model": {"layers": 2, "hiddenSize": 32, "attentionHeads": 4, "seqLength": 16, "vocabSize": 64},
        "training": {
            "globalBatchSize": 2 * gpus,  # one micro-batch per data-parallel rank
            "microBatchSize": 1,
            "iterations": iterations,
            "learningRate": 1.0e-3,
            "data": {"synthetic": {}},
            "checkpoint": {"path": "/ckpt", "intervalIterations": 1000},
        },
        "nodes": {"count": 2, "gpusPerNode": gpus},
        # no re-plan from the slowed stages' measured speed: the one stop here is Kueue's
        "parallelism": {"replan": {"enabled": False}},
        "runPolicy": {"backoffLimit": 0},
        "template": {
            "spec": {
                "terminationGracePeriodSeconds": 30,
                "containers": [
                    {
                        "name": "trainer",
                        "args": ["--metrics-file", f"/ckpt/{name}.jsonl"],
                        "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
                    }
                ],
                "volumes": [{"name": "ckpt", "hostPath": {"path": str(shared)}}],
            }
        },
    }
    slow_trainers(spec["template"]["spec"], list(NODES), 0.1)
    return holmes_job(name, spec, namespace)


def iterations_logged(metrics: Path, at_least: int = 2):
    """A wait_for check: the training job's iteration lines once it has logged ``at_least``."""

    def check():
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        its = [x for x in map(json.loads, lines) if x.get("holmes") == "iteration"]
        return its if len(its) >= at_least else None

    return check
