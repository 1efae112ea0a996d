"""A huge job and a small one submitted together on the real local control plane: the small
job's launch (create -> all its pods created) is not held by the huge job's plan and launch
(commit.py: plans run outside the placement lock, and so do the pod writes). The nodes are
hollow, played by the cluster's kwok (creation is what is timed)."""

from __future__ import annotations

import json
import time

import pytest
from holmes_dev.jobs import holmes_job
from kubernetes import client
from kubernetes.client.rest import ApiException

from holmes.contract.names import GROUP, PLURAL, VERSION
from localkube.operatorproc import OperatorProcess, fake_gpu_node, install_crd
from tests.helpers.operator.cluster_helpers import register_hollow

pytestmark = pytest.mark.timeout(400)
POOL = "holmes.dev/pool"
HUGE_NODES = 256  # 1,024 layers on them: a ~2.5 s search (338,000 units on 512) and 256 pods
FIRST = 7000  # fake-7000...: apart from other tests' bench nodes


def job(name: str, ns: str, count: int, pool: str, layers: int) -> dict:
    return holmes_job(
        name,
        {
            "model": {
                "layers": layers,
                "hiddenSize": 1024,
                "attentionHeads": 16,
                "seqLength": 2048,
                "vocabSize": 50257,
            },
            "training": {
                "globalBatchSize": 16 * count,
                "microBatchSize": 1,
                "iterations": 5,
                "learningRate": 1e-4,
            },
            "nodes": {"count": count, "gpusPerNode": 8},
            "template": {
                "spec": {
                    "nodeSelector": {POOL: pool},
                    "tolerations": [{"key": "holmes.dev/fake", "operator": "Exists"}],
                    "containers": [{"name": "trainer", "command": ["sleep", "3600"]}],
                }
            },
            "runPolicy": {"backoffLimit": 0},
        },
        ns,
    )


def pods(core, ns: str, name: str) -> int:
    r = core.list_namespaced_pod(ns, label_selector=f"holmes.dev/job-name={name}", _preload_content=False)
    return len(json.loads(r.data)["items"])


def wait_pods(core, ns: str, name: str, n: int, t0: float, timeout: float = 180) -> float:
    while time.monotonic() - t0 < timeout:
        if pods(core, ns, name) >= n:
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"{name}: {n} pods not created within {timeout}s")


def test_a_huge_jobs_plan_and_launch_do_not_hold_a_small_jobs_launch(cluster, namespace, tmp_path):
    install_crd(cluster.kubeconfig)
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    names = []

    nodes = [fake_gpu_node(FIRST + i) for i in range(HUGE_NODES + 2)]
    for i, node in enumerate(nodes):
        node["metadata"]["labels"][POOL] = "a" if i < HUGE_NODES else "b"
        names.append(node["metadata"]["name"])

    op = None
    try:
        register_hollow(cluster, nodes)
        op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log").start()
        create = lambda m: custom.create_namespaced_custom_object(  # noqa: E731
            GROUP, VERSION, namespace, PLURAL, m, _preload_content=False
        )
        t_huge = time.monotonic()
        create(job("huge", namespace, HUGE_NODES, "a", 1024))
        time.sleep(0.5)  # the huge job is searching
        t_small = time.monotonic()
        create(job("small", namespace, 2, "b", 4))
        small = wait_pods(core, namespace, "small", 2, t_small)
        huge = wait_pods(core, namespace, "huge", HUGE_NODES, t_huge)
        print(f"\nsmall job launched in {small:.2f}s; huge job ({HUGE_NODES} nodes) in {huge:.2f}s")
        # before commit.py the small job waited for the huge one's search and pod writes
        assert small < 0.5 * (huge - 0.5), (small, huge, op.tail(30))
    finally:
        if op is not None:
            op.stop()
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0, _preload_content=False)
        for n in names:
            try:
                core.delete_node(n, _preload_content=False)
            except ApiException as e:
                if e.status != 404:
                    raise
