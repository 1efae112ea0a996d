"""Queue fairness between namespaces on the real local control plane: where capacity runs one job
at a time, one namespace's five jobs do not go before another namespace's one (it arrives while
the first runs and runs second). Two hollow nodes played by the cluster's kwok; the test tells each
pod to end (exit 0) as a finished trainer would."""

from __future__ import annotations

import json

import pytest
from holmes_dev.jobs import holmes_job, tiny_training
from kubernetes import client
from kubernetes.client.rest import ApiException

from holmes.contract.names import GROUP, PLURAL, VERSION
from localkube import hollow
from localkube import hollow_nodes as hn
from localkube.operatorproc import OperatorProcess, fake_gpu_node, install_crd
from tests.helpers.operator.cluster_helpers import register_hollow, wait_for

pytestmark = pytest.mark.timeout(400)
POOL = "holmes.dev/pool"
FIRST = 7400  # fake-7400, fake-7401: apart from other tests' bench nodes


def job(name: str, ns: str) -> dict:
    return holmes_job(
        name,
        {
            "model": {"layers": 4, "hiddenSize": 64, "attentionHeads": 4, "seqLength": 32, "vocabSize": 128},
            "training": tiny_training(globalBatchSize=16),
            "nodes": {"count": 2, "gpusPerNode": 8},
            "template": {
                "spec": {
                    "nodeSelector": {POOL: "fair"},
                    "tolerations": [{"key": "holmes.dev/fake", "operator": "Exists"}],
                    "containers": [{"name": "trainer", "command": ["sleep", "3600"]}],
                }
            },
            "runPolicy": {"backoffLimit": 0},
        },
        ns,
    )


def live_jobs(core, ns: str) -> list[str]:
    """The jobs of ``ns`` with a pod not ended yet."""
    items = json.loads(core.list_namespaced_pod(ns, _preload_content=False).data)["items"]
    return sorted(
        {
            p["metadata"]["labels"]["holmes.dev/job-name"]
            for p in items
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        }
    )


def succeed_pods(core, ns: str) -> list[str]:
    """Every pod of ``ns`` not ended nor told to yet ends with exit 0 (kwok plays it: the
    annotation its Stages read); the jobs they belong to."""
    jobs = set()
    for p in json.loads(core.list_namespaced_pod(ns, _preload_content=False).data)["items"]:
        told = hn.FINISH in (p["metadata"].get("annotations") or {})
        if told or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        jobs.add(p["metadata"]["labels"]["holmes.dev/job-name"])
        hollow.finish_pod(core, ns, p["metadata"]["name"])
    return sorted(jobs)


def test_one_namespaces_five_jobs_do_not_starve_anothers_one(cluster, namespace, tmp_path):
    install_crd(cluster.kubeconfig)
    api = cluster.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    other = f"{namespace}-b"
    cluster.kubectl("create", "namespace", other)
    wait_for(
        f"{other}'s default service account",
        lambda: cluster.kubectl(
            "get", "sa", "default", "-n", other, "-o", "jsonpath={.metadata.name}", check=False
        ).stdout.strip(),
        timeout=30,
    )
    names = []
    op = None
    try:
        nodes = [fake_gpu_node(i) for i in (FIRST, FIRST + 1)]
        for node in nodes:
            node["metadata"]["labels"][POOL] = "fair"
            names.append(node["metadata"]["name"])
        register_hollow(cluster, nodes)
        for i in range(5):  # the crowded namespace first: its jobs are all older
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job(f"a{i}", namespace))
        op = OperatorProcess(cluster.kubeconfig, [namespace, other], tmp_path / "operator.log").start()
        # a0 (the oldest) runs; the other namespace's one job arrives meanwhile and is queued
        wait_for("a0's pods", lambda: live_jobs(core, namespace) == ["a0"], timeout=90, op=op)
        custom.create_namespaced_custom_object(GROUP, VERSION, other, PLURAL, job("b0", other))
        wait_for(
            "b0 queued",
            lambda: (
                custom.get_namespaced_custom_object(GROUP, VERSION, other, PLURAL, "b0").get("status") or {}
            ).get("phase"),
            timeout=60,
            op=op,
        )
        order: list[str] = []
        for _ in range(3):  # a0, then b0, then a1
            ran = wait_for(
                "the next job's pods",
                lambda: [f"{ns}/{j}" for ns in (namespace, other) for j in succeed_pods(core, ns)],
                timeout=90,
                op=op,
            )
            assert len(ran) == 1, ran
            order += ran
        assert order == [f"{namespace}/a0", f"{other}/b0", f"{namespace}/a1"], order
    finally:
        if op is not None:
            op.stop()
        for ns in (namespace, other):
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0, _preload_content=False)
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
        for n in names:
            try:
                core.delete_node(n, _preload_content=False)
            except ApiException as e:
                if e.status != 404:
                    raise
