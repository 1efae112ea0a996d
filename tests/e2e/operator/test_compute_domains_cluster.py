"""NVLink domains on the local control plane's real 1.37 API server (core/compute_domains.py):
the operator asks API discovery whether ComputeDomains (NVIDIA's DRA driver,
``resource.nvidia.com/v1beta1``) are served; where they are, a job whose tensor groups span two
nodes of an NVLink domain gets one ComputeDomain per domain, created before its pods, owned by the
job (the garbage collector deletes them with it), and its pods claim the channel's
ResourceClaimTemplate; where they are not, that job is refused with the fix.

What stays a stand-in: the ComputeDomain CRD (hack/thirdparty-crds/nvidia-computedomain-v1beta1.yaml,
written from the driver's API types: its module cannot be fetched here), and no driver runs
behind it, so nothing makes the channel's ResourceClaimTemplate: the test records what the real
kube-controller-manager and scheduler do with a pod whose template is missing. The nodes are
hollow, played by the cluster's kwok (GPU Feature Discovery's clique label written by the test)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from holmes_dev.jobs import TINY_MODEL, tiny_job

from localkube.operatorproc import OperatorProcess, api_node
from tests.helpers.operator.cluster_helpers import (
    SLEEP,
    apply,
    condition,
    get_job,
    pods_of,
    register_hollow,
    wait_for,
)

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[3]
STAND_IN = REPO / "hack/thirdparty-crds/nvidia-computedomain-v1beta1.yaml"
CRD = "computedomains.resource.nvidia.com"
TAINT = {"key": "holmes.dev/nvl-test", "value": "1", "effect": "NoSchedule"}
CLIQUES = ("7c1e4b0a-2f5d-4e8a-9b61-0d3c5e7f9a21.1", "7c1e4b0a-2f5d-4e8a-9b61-0d3c5e7f9a21.2")
CLAIM = "nvlink-channel"


def nvl_node(name: str, clique: str) -> dict:
    """A 4-GPU GB200 tray of an NVLink domain, as GPU Feature Discovery labels it."""
    labels = {
        "nvl-test": "1",
        "holmes.dev/cluster": "nvl",
        "holmes.dev/nic": "infiniband",
        "holmes.dev/nic-gbps": "1600",
        "nvidia.com/gpu.product": "NVIDIA-GB200",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.clique": clique,
    }
    alloc = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "4", "rdma/nvl_ib": "1k"}
    return api_node(name, labels, alloc, TAINT)


@pytest.fixture
def nvl_nodes(cluster):
    """Two NVLink domains of two trays each."""
    names = [f"nvl-{d}-{i}" for d in range(2) for i in range(2)]
    # registered for kwok, their not-ready taint lifted as a kubelet's first Ready status would
    register_hollow(cluster, [nvl_node(n, CLIQUES[int(n.split("-")[1])]) for n in names])
    yield names
    for n in names:
        cluster.kubectl("delete", "node", n, "--wait=false", check=False)


def install_stand_in(cluster) -> None:
    cluster.kubectl("apply", "-f", str(STAND_IN))
    wait_for(
        f"{CRD} served",
        lambda: cluster.kubectl("get", "computedomains", "-A", check=False).returncode == 0,
    )


def remove_stand_in(cluster) -> None:
    cluster.kubectl("delete", "crd", CRD, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)


def job(namespace: str, name: str = "nvl", tensor: int | str = 8) -> dict:
    """4 trays, tensor groups of 8 GPUs: each group on two trays of one domain."""
    j = tiny_job(
        name,
        namespace,
        count=4,
        gpus=4,
        command=SLEEP,
        parallelism={"tensor": tensor},
        model={**TINY_MODEL, "attentionHeads": 8},
    )
    j["spec"]["nodes"]["selector"] = {"matchLabels": {"nvl-test": "1"}}
    j["spec"]["template"]["spec"]["tolerations"] = [{"key": TAINT["key"], "operator": "Exists"}]
    return j


def channel_template(namespace: str, name: str) -> dict:
    """The channel's ResourceClaimTemplate as NVIDIA's driver makes it for a ComputeDomain: one
    request of its channel DeviceClass (the driver's own config left out: nothing reads it here)."""
    request = {"name": "channel", "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def compute_domains(cluster, namespace: str) -> list[dict]:
    return cluster.get_json("computedomains", "-n", namespace)["items"]


def test_served_a_compute_domain_per_nvlink_domain_owned_by_the_job_and_the_pods_claim_its_channel(
    cluster, crd, nvl_nodes, namespace, tmp_path
):
    install_stand_in(cluster)
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "op.log").start()
    try:
        apply(cluster, job(namespace))
        pods = wait_for(
            "the job's 4 pods",
            lambda: (lambda ps: ps if len(ps) == 4 else None)(pods_of(cluster, namespace, "nvl")),
            op=op,
        )
        hj = get_job(cluster, namespace, "nvl")
        made = compute_domains(cluster, namespace)
        assert "ComputeDomains (resource.nvidia.com/v1beta1) served" in op.tail(400)
        # one per NVLink domain, numNodes its trays of the job, owned by the job
        assert sorted(o["spec"]["numNodes"] for o in made) == [2, 2]
        for o in made:
            (owner,) = o["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["uid"]) == ("HolmesJob", hj["metadata"]["uid"])
            assert o["spec"]["channel"]["resourceClaimTemplate"]["name"] == o["metadata"]["name"] + "-channel"
            assert o["spec"]["channel"]["allocationMode"] == "Single"  # the CRD's default
        channel_of = {
            cd["metadata"]["name"] + "-channel": cd["metadata"]["name"] for cd in made
        }  # template -> its ComputeDomain
        clique_of = {n: CLIQUES[int(n.split("-")[1])] for n in nvl_nodes}
        templates_by_clique: dict[str, set[str]] = {}
        for p in pods:
            (claim,) = [c for c in p["spec"]["resourceClaims"] if c["name"] == CLAIM]
            assert claim["resourceClaimTemplateName"] in channel_of
            node = p["metadata"]["annotations"]["holmes.dev/node"]
            templates_by_clique.setdefault(clique_of[node], set()).add(claim["resourceClaimTemplateName"])
            c = p["spec"]["containers"][0]
            assert {"name": CLAIM} in c["resources"]["claims"]
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["NCCL_MNNVL_ENABLE"] == "2" and env["NCCL_CUMEM_ENABLE"] == "1"
        assert all(len(t) == 1 for t in templates_by_clique.values()) and len(templates_by_clique) == 2

        # No driver made the channel's ResourceClaimTemplate: what kube-controller-manager's
        # resourceclaim controller and the scheduler do with such a pod (docs/topology.md)
        first = pods[0]["metadata"]["name"]
        said = wait_for(
            f"{first}: the claim controller's word on the missing template",
            lambda: [
                e
                for e in cluster.get_json(
                    "events", "-n", namespace, "--field-selector", f"involvedObject.name={first}"
                )["items"]
                if "resourceclaimtemplate" in e["message"].lower()
            ],
            op=op,
        )
        # the resourceclaim controller cannot make the pod's claim and says so on the pod; the
        # scheduler's DRA plugin keeps a pod whose claim does not exist out of scheduling
        # (PreEnqueue): Pending, no node, no PodScheduled condition, no claim
        assert {e["reason"] for e in said} == {"FailedResourceClaimCreation"}
        template = next(c for c in pods[0]["spec"]["resourceClaims"] if c["name"] == CLAIM)
        assert all(
            f'resourceclaimtemplate.resource.k8s.io "{template["resourceClaimTemplateName"]}" not found'
            in e["message"]
            for e in said
        )
        pod = cluster.get_json("pod", first, "-n", namespace)
        assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
        assert not [c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
        assert not cluster.get_json("resourceclaims", "-n", namespace)["items"]
        # the driver's template appears (written here as its controller would, with its channel
        # DeviceClass): the claim controller, retrying, makes each pod's claim, and the pod goes on
        # to the scheduler (which, with no driver publishing channel devices here, cannot place it)
        started = time.monotonic()
        for cd in made:
            apply(cluster, channel_template(namespace, cd["metadata"]["name"] + "-channel"))
        wait_for(
            "every pod's channel claim made",
            lambda: len(cluster.get_json("resourceclaims", "-n", namespace)["items"]) == 4,
            op=op,
        )
        print(f"claims made {time.monotonic() - started:.1f}s after the templates")
        scheduled = wait_for(
            f"{first}: the scheduler's verdict",
            lambda: next(
                (
                    c
                    for c in cluster.get_json("pod", first, "-n", namespace)["status"].get("conditions") or []
                    if c["type"] == "PodScheduled"
                ),
                None,
            ),
            op=op,
        )
        print("scheduler:", json.dumps(scheduled))
        assert scheduled["status"] == "False" and scheduled["reason"] == "Unschedulable"
    finally:
        op.stop()
    # deleting the job: the garbage collector takes its ComputeDomains with it
    cluster.kubectl("delete", "holmesjob", "nvl", "-n", namespace, "--wait=false")
    try:
        wait_for(
            "the job's ComputeDomains garbage-collected", lambda: not compute_domains(cluster, namespace)
        )
    finally:
        cluster.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", check=False
        )
        remove_stand_in(cluster)


def test_not_served_a_tensor_group_over_two_nodes_is_refused_naming_the_driver(
    cluster, crd, nvl_nodes, namespace, tmp_path
):
    remove_stand_in(cluster)
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "op.log").start()
    try:
        apply(cluster, job(namespace))
        stalled = wait_for(
            "nvl stalled",
            lambda: (lambda c: c if c.get("status") == "True" else None)(
                condition(get_job(cluster, namespace, "nvl") or {}, "Stalled")
            ),
            op=op,
        )
        assert stalled["reason"] == "ComputeDomainsNotInstalled"
        assert CRD in stalled["message"] and "install NVIDIA's DRA driver" in stalled["message"]
        assert not pods_of(cluster, namespace, "nvl")
        # tensor auto: planned without the domains (groups inside a tray), and runs
        apply(cluster, job(namespace, "nvl-auto", tensor="auto"))
        pods = wait_for(
            "nvl-auto's 4 pods",
            lambda: (lambda ps: ps if len(ps) == 4 else None)(pods_of(cluster, namespace, "nvl-auto")),
            op=op,
        )
        hj = get_job(cluster, namespace, "nvl-auto")
        assert int(hj["status"]["layout"]["shape"].split("x")[2]) <= 4
        for p in pods:
            assert not p["spec"].get("resourceClaims")
            env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
            assert env["NCCL_MNNVL_ENABLE"] == "0"
    finally:
        op.stop()
        cluster.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", check=False
        )
