"""Shared clusters on the real local control plane: jobs placed on free capacity (disjoint GPUs,
a queue), the template's placement rules, Kueue's admit -> run -> evict -> re-admit cycle played
by the test as Kueue's controller, and Volcano's PodGroup. Kueue and Volcano are stand-in CRDs
(hack/thirdparty-crds), installed before the operator starts (it looks for Kueue's API then)."""

from __future__ import annotations

import json
import time

import pytest
from holmes_dev.jobs import tiny_job

from localkube.operatorproc import REPO, OperatorProcess, install_crd

from .test_operator_cluster import apply, condition, get_job, pods_of, wait_for, wait_phase

pytestmark = pytest.mark.timeout(300)
THIRDPARTY = REPO / "hack" / "thirdparty-crds"


@pytest.fixture(scope="module")
def crds(cluster):
    install_crd(cluster)
    for f in ("kueue-v1beta1.yaml", "volcano-v1beta1.yaml"):
        cluster.kubectl("apply", "-f", str(THIRDPARTY / f))
    for crd in (
        "workloads.kueue.x-k8s.io",
        "resourceflavors.kueue.x-k8s.io",
        "podgroups.scheduling.volcano.sh",
    ):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    return cluster


@pytest.fixture
def operator(crds, namespace, tmp_path):
    op = OperatorProcess(crds.kubeconfig, [namespace], tmp_path / "operator.log").start()
    yield op
    op.stop()
    print(op.tail(60))


def placed(pod):
    return pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"][0]["values"][0]


def reconciling(cluster, ns, name):
    job = get_job(cluster, ns, name)
    return condition(job, "Reconciling") if job and job.get("status") else {}


def test_two_half_cluster_jobs_run_together_and_a_third_waits_then_runs(crds, namespace, operator):
    sleep = ["sh", "-c", "sleep 8"]
    for name in ("half-a", "half-b"):
        apply(crds, tiny_job(name, namespace, count=3, gpus=2, command=sleep))
    time.sleep(1.0)  # created after the first two: last in the queue
    apply(crds, tiny_job("half-c", namespace, count=3, gpus=2, command=sleep))

    def both_running():
        a, b = pods_of(crds, namespace, "half-a"), pods_of(crds, namespace, "half-b")
        phases = [p.get("status", {}).get("phase") for p in a + b]
        return (a, b) if len(a) == len(b) == 3 and set(phases) == {"Running"} else None

    a, b = wait_for("both jobs' pods running at once", both_running, timeout=60, op=operator)
    nodes_a = {p["spec"]["nodeName"] for p in a}
    nodes_b = {p["spec"]["nodeName"] for p in b}
    assert len(nodes_a) == len(nodes_b) == 3 and not nodes_a & nodes_b
    assert {placed(p) for p in a} == nodes_a  # bound where the layout pinned them
    c = wait_for(
        "half-c waiting for capacity",
        lambda: (lambda r: r if r.get("reason") == "WaitingForCapacity" else None)(
            reconciling(crds, namespace, "half-c")
        ),
        op=operator,
    )
    assert "needs 3 node(s) with 2 nvidia.com/gpu free per pod; 0 node(s) have that free now" in c["message"]
    assert not pods_of(crds, namespace, "half-c")  # no part of its gang holds anything
    wait_phase(crds, namespace, "half-a", "Succeeded", op=operator)
    wait_phase(crds, namespace, "half-b", "Succeeded", op=operator)
    job = wait_phase(crds, namespace, "half-c", "Succeeded", timeout=90, op=operator)
    assert job["status"]["restarts"] == 0


def test_taints_node_selectors_and_cpu_requests_rule_nodes_out(crds, namespace, operator):
    crds.kubectl("taint", "node", "ib-0", "holmes.dev/test=shared:NoSchedule", "--overwrite")
    try:
        whole = tiny_job("tainted", namespace, count=6, gpus=1, command=["sh", "-c", "sleep 600"])
        whole["spec"]["training"]["globalBatchSize"] = 12  # 6 data-parallel ranks
        apply(crds, whole)
        sel = tiny_job("selector", namespace, count=4, gpus=1, command=["sleep", "1"])
        sel["spec"]["template"]["spec"]["nodeSelector"] = {"holmes.dev/cluster": "east"}
        apply(crds, sel)
        cpu = tiny_job("cpu", namespace, count=1, gpus=1, command=["sleep", "1"])
        cpu["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "40"}}
        apply(crds, cpu)

        def waiting(name, text):
            r = reconciling(crds, namespace, name)
            return r if r.get("reason") == "WaitingForNodes" and text in r.get("message", "") else None

        wait_for("taint", lambda: waiting("tainted", "taint holmes.dev/test=shared:NoSchedule"), op=operator)
        wait_for("selector", lambda: waiting("selector", "nodeSelector holmes.dev/cluster=east"), op=operator)
        wait_for("cpu", lambda: waiting("cpu", "allocatable cpu 32 is less than the 40"), op=operator)
        # tolerating the taint makes the whole cluster usable again
        whole["spec"]["template"]["spec"]["tolerations"] = [{"key": "holmes.dev/test", "operator": "Exists"}]
        apply(crds, whole)
        wait_for("launched", lambda: len(pods_of(crds, namespace, "tainted")) == 6 or None, op=operator)
        assert "ib-0" in {placed(p) for p in pods_of(crds, namespace, "tainted")}
    finally:
        crds.kubectl("taint", "node", "ib-0", "holmes.dev/test-", check=False)
        crds.kubectl("delete", "holmesjob", "--all", "-n", namespace, "--wait=false")


def patch_workload_status(cluster, ns, name, status):
    from kubernetes import client

    api = client.CustomObjectsApi(cluster.api_client())
    api.patch_namespaced_custom_object_status(
        "kueue.x-k8s.io", "v1beta1", ns, "workloads", name, {"status": status}
    )


def admitted(flavor):
    return {
        "admission": {
            "clusterQueue": "cluster-queue",
            "podSetAssignments": [{"name": "workers", "count": 2, "flavors": {"nvidia.com/gpu": flavor}}],
        },
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "True",
                "reason": "QuotaReserved",
                "message": "reserved",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
            {
                "type": "Admitted",
                "status": "True",
                "reason": "Admitted",
                "message": "admitted",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
            {
                "type": "Evicted",
                "status": "False",
                "reason": "QuotaReserved",
                "message": "quota reserved",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
        ],
    }


def test_kueue_admit_run_evict_readmit(crds, namespace, operator):
    flavor = f"west-{namespace}"
    crds.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor},
                "spec": {"nodeLabels": {"holmes.dev/cluster": "west"}},
            }
        ),
    )
    try:
        m = tiny_job("queued", namespace, count=2, gpus=2, command=["sh", "-c", "sleep 600"])
        m["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "user-queue"}
        apply(crds, m)
        wl = wait_for(
            "the Workload",
            lambda: (lambda r: json.loads(r.stdout) if r.returncode == 0 else None)(
                crds.kubectl(
                    "get",
                    "workloads.kueue.x-k8s.io",
                    "holmesjob-queued",
                    "-n",
                    namespace,
                    "-o",
                    "json",
                    check=False,
                )
            ),
            op=operator,
        )
        assert wl["spec"]["queueName"] == "user-queue"
        (ps,) = wl["spec"]["podSets"]
        assert ps["count"] == 2 and ps["template"]["spec"]["containers"][0]["resources"]["requests"] == {
            "nvidia.com/gpu": "2"
        }
        assert wl["metadata"]["ownerReferences"][0]["kind"] == "HolmesJob"
        job = wait_phase(crds, namespace, "queued", "Suspended", op=operator)
        assert condition(job, "Suspended")["reason"] == "WaitingForAdmission"
        time.sleep(1)
        assert not pods_of(crds, namespace, "queued")

        patch_workload_status(crds, namespace, "holmesjob-queued", admitted(flavor))  # Kueue admits
        wait_phase(crds, namespace, "queued", "Running", op=operator)
        pods = pods_of(crds, namespace, "queued")
        assert {p["spec"]["nodeName"] for p in pods} <= {"roce-0", "roce-1", "eth-1"}  # the flavor's nodes

        # Kueue evicts it: the pods go (gracefully), the job is Suspended with reason Requeued
        evicted = admitted(flavor)
        evicted["conditions"][2] = {
            "type": "Evicted",
            "status": "True",
            "reason": "Preempted",
            "message": "preempted by urgent",
            "lastTransitionTime": "2026-01-01T00:01:00Z",
        }
        patch_workload_status(crds, namespace, "holmesjob-queued", evicted)
        job = wait_phase(crds, namespace, "queued", "Suspended", op=operator)
        c = condition(job, "Suspended")
        assert c["reason"] == "Requeued" and "preempted by urgent" in c["message"]
        wait_for("pods gone", lambda: not pods_of(crds, namespace, "queued") or None, timeout=60, op=operator)

        # Kueue releases the quota, then admits it again
        patch_workload_status(
            crds,
            namespace,
            "holmesjob-queued",
            {
                "admission": None,
                "conditions": [
                    {
                        "type": "QuotaReserved",
                        "status": "False",
                        "reason": "Pending",
                        "message": "waiting",
                        "lastTransitionTime": "2026-01-01T00:02:00Z",
                    },
                ],
            },
        )
        time.sleep(1)
        assert get_job(crds, namespace, "queued")["status"]["phase"] == "Suspended"
        patch_workload_status(crds, namespace, "holmesjob-queued", admitted(flavor))
        job = wait_phase(crds, namespace, "queued", "Running", op=operator)
        assert job["status"]["restarts"] == 0 and job["status"]["attempt"] >= 2
        assert len(pods_of(crds, namespace, "queued")) == 2
    finally:
        crds.kubectl("delete", "resourceflavor.kueue.x-k8s.io", flavor, check=False)


def test_volcano_jobs_get_a_podgroup_and_annotated_pods(crds, namespace, operator):
    m = tiny_job("gang", namespace, count=3, gpus=1, command=["sleep", "1"])
    m["spec"]["template"]["spec"]["schedulerName"] = "volcano"
    apply(crds, m)
    pg = wait_for(
        "the PodGroup",
        lambda: (lambda r: json.loads(r.stdout) if r.returncode == 0 else None)(
            crds.kubectl(
                "get", "podgroups.scheduling.volcano.sh", "gang", "-n", namespace, "-o", "json", check=False
            )
        ),
        op=operator,
    )
    assert pg["spec"]["minMember"] == 3 and pg["spec"]["minResources"] == {"nvidia.com/gpu": "3"}
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "HolmesJob"
    pods = wait_for("pods", lambda: (lambda p: p if len(p) == 3 else None)(pods_of(crds, namespace, "gang")))
    for p in pods:  # no Volcano scheduler runs here: they stay Pending, in their group
        assert p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "gang"
        assert p["spec"]["schedulerName"] == "volcano"
