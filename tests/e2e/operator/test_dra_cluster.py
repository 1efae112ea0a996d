"""The DRA route on the local control plane's real ``resource.k8s.io/v1`` API: nodes described
only by ResourceSlices (no Holmes label, no device-plugin resource) are planned by the running
operator, which creates the job's ResourceClaimTemplate; the pods it renders claim it, the claim
controller makes their ResourceClaims and the real scheduler allocates them, each GPU paired with
the NIC on its PCIe root. What stays a stand-in: the nodes are hollow (the cluster's kwok plays
them: Leases, Ready, pods reported Running, no process), so nothing prepares the allocated
devices (tests/e2e/cluster/test_real_nodes_dra.py has real kubelet nodes and a DRA kubelet
plugin prepare them), and another workload's allocation is written
through the status subresource, as the scheduler does."""

from __future__ import annotations

import pytest
import yaml
from holmes_dev.jobs import tiny_job

from localkube.operatorproc import OperatorProcess, api_node, install_crd
from tests.helpers.operator.cluster_helpers import (
    SLEEP,
    apply,
    condition,
    get_job,
    pods_of,
    register_hollow,
    wait_for,
)
from tests.helpers.plan.dra_helpers import aligned_slices, device_classes

pytestmark = [pytest.mark.timeout(300), pytest.mark.compat]
TAINT = {"key": "holmes.dev/dra-test", "value": "1", "effect": "NoSchedule"}


def slice_node(name: str) -> dict:
    """Ready, with 2 GPUs in slices only: no Holmes label, no nvidia.com/gpu, no rdma/*."""
    labels = {"dra-test": "1", "topology.kubernetes.io/zone": "east"}
    return api_node(name, labels, {"cpu": "16", "memory": "64Gi", "pods": "110"}, TAINT)


@pytest.fixture
def dra_nodes(cluster):
    install_crd(cluster.kubeconfig)
    for c in device_classes():
        apply(cluster, c)
    names = ["dra-node-0", "dra-node-1"]
    register_hollow(cluster, [slice_node(n) for n in names])  # not-ready taint lifted
    for n in names:
        for s in aligned_slices(n, gpus=2):
            apply(cluster, s)
    yield names
    cluster.kubectl("delete", "resourceslices", "--all", "--wait=false", check=False)
    cluster.kubectl("delete", "resourceclaims", "--all", "--all-namespaces", "--wait=false", check=False)
    for n in names:
        cluster.kubectl("delete", "node", n, "--wait=false", check=False)


def job(namespace: str, name: str = "dra") -> dict:
    j = tiny_job(name, namespace, count=2, gpus=2, command=SLEEP)
    j["spec"]["nodes"]["selector"] = {"matchLabels": {"dra-test": "1"}}
    j["spec"]["nodes"]["clusterLabel"] = "topology.kubernetes.io/zone"
    j["spec"]["template"]["spec"]["tolerations"] = [{"key": TAINT["key"], "operator": "Exists"}]
    return j


def test_nodes_described_only_by_slices_plan_and_their_pods_claim_gpus_and_nics(
    cluster, dra_nodes, namespace, tmp_path, capsys
):
    from holmes.cli import main

    # `holmes plan --kubeconfig`: the nodes and their slices read from the API, the claims rendered
    jf = tmp_path / "job.yaml"
    jf.write_text(yaml.safe_dump(job(namespace)))
    assert main(["plan", "--kubeconfig", cluster.kubeconfig, "--job", str(jf), "--pods"]) == 0
    items = yaml.safe_load(capsys.readouterr().out)["items"]
    (tpl,) = [o for o in items if o["kind"] == "ResourceClaimTemplate"]
    rendered = [o for o in items if o["kind"] == "Pod"]
    assert sorted(p["metadata"]["annotations"]["holmes.dev/node"] for p in rendered) == dra_nodes
    for p in rendered:
        assert p["spec"]["resourceClaims"] == [
            {"name": "devices", "resourceClaimTemplateName": tpl["metadata"]["name"]}
        ]
        assert p["spec"]["containers"][0]["resources"]["claims"] == [{"name": "devices"}]
    devices = tpl["spec"]["spec"]["devices"]
    assert [c["requests"] for c in devices["constraints"]] == [["gpu-0", "nic-0"], ["gpu-1", "nic-1"]]

    # the operator: plans on the slices, creates the template (owned by the job), then the pods
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "op.log").start()
    try:
        apply(cluster, job(namespace))
        pods = wait_for(
            "the job's 2 pods",
            lambda: (lambda ps: ps if len(ps) == 2 else None)(pods_of(cluster, namespace, "dra")),
            op=op,
        )
        made = cluster.get_json("resourceclaimtemplates.resource.k8s.io", "-n", namespace)["items"]
        hj = cluster.get_json("holmesjob", "dra", "-n", namespace)
        # a second job of the same shape: the first one's claims hold every GPU of both nodes
        apply(cluster, job(namespace, "dra-b"))
        waits = wait_for(
            "dra-b waiting for capacity",
            lambda: (lambda c: c if c.get("reason") == "WaitingForCapacity" else None)(
                condition(get_job(cluster, namespace, "dra-b") or {}, "Reconciling")
            ),
            op=op,
        )
        assert "held by " + namespace + "/dra (2 nodes)" in waits["message"]
        assert not pods_of(cluster, namespace, "dra-b")
        # the real scheduler allocated each pod's claim on the node Holmes chose, GPU i with NIC i
        for p in pods:
            node = p["metadata"]["annotations"]["holmes.dev/node"]
            got = wait_for(
                f"{p['metadata']['name']}'s claim allocated",
                lambda p=p: allocated_claim(cluster, namespace, p["metadata"]["name"]),
            )
            by_request = {r["request"]: r for r in got["status"]["allocation"]["devices"]["results"]}
            assert sorted(by_request) == ["gpu-0", "gpu-1", "nic-0", "nic-1"]
            assert {r["pool"] for r in by_request.values()} == {node}
            roots = pcie_roots(node)
            for i in range(2):  # the template's matchAttribute: each pair on one PCIe root
                g, n = by_request[f"gpu-{i}"], by_request[f"nic-{i}"]
                assert (g["driver"], n["driver"]) == ("gpu.nvidia.com", "dra.net")
                assert roots[g["driver"], g["device"]] == roots[n["driver"], n["device"]], (g, n)
            assert cluster.get_json("pod", p["metadata"]["name"], "-n", namespace)["spec"]["nodeName"] == node
    finally:
        op.stop()
        cluster.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", check=False
        )
    assert [t["metadata"]["name"] for t in made] == [tpl["metadata"]["name"]]
    assert {k: v for k, v in made[0]["spec"].items() if k != "metadata"} == tpl["spec"]  # the server adds {}
    assert made[0]["metadata"]["ownerReferences"][0]["uid"] == hj["metadata"]["uid"]
    assert {s["island"] for s in hj["status"]["layout"]["stages"]} == {"east/infiniband"}
    for p in pods:
        c = p["spec"]["containers"][0]
        assert "nvidia.com/gpu" not in (c["resources"].get("limits") or {})  # the GPUs are claimed
        assert p["metadata"]["annotations"]["holmes.dev/claim-gpus"] == "2"  # and counted as held
        assert "add" not in c["securityContext"]["capabilities"]  # memlock: the runtime's
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["HOLMES_NIC"] == "infiniband" and env["HOLMES_HOST_HCAS"] == "mlx5_0,mlx5_1"
        assert p["spec"]["resourceClaims"] == [
            {"name": "devices", "resourceClaimTemplateName": tpl["metadata"]["name"]}
        ]


def pcie_roots(node: str) -> dict[tuple[str, str], str]:
    """(driver, device) -> its PCIe root, as the node's slices publish them."""
    return {
        (sl["spec"]["driver"], d["name"]): d["attributes"]["resource.kubernetes.io/pcieRoot"]["string"]
        for sl in aligned_slices(node, gpus=2)
        for d in sl["spec"]["devices"]
        if "resource.kubernetes.io/pcieRoot" in d["attributes"]
    }


def allocated_claim(cluster, namespace: str, pod: str) -> dict | None:
    """The ResourceClaim the claim controller made for ``pod``, once allocated."""
    for c in cluster.get_json("resourceclaims.resource.k8s.io", "-n", namespace)["items"]:
        owners = c["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "Pod" and o.get("name") == pod for o in owners):
            return c if (c.get("status") or {}).get("allocation") else None
    return None


def their_claim(cluster, namespace: str, node: str) -> dict:
    """Another workload's pod bound to ``node`` whose ResourceClaim the scheduler allocated both
    of the node's GPUs to (the pod asks for no GPU itself: its claim holds them)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "their-trainer", "namespace": namespace},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "c", "image": "x", "command": SLEEP, "resources": {"claims": [{"name": "gpus"}]}}
            ],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": "their-gpus"}],
        },
    }
    apply(cluster, pod)
    uid = cluster.get_json("pod", "their-trainer", "-n", namespace)["metadata"]["uid"]
    request = {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "their-gpus", "namespace": namespace},
        "spec": {"devices": {"requests": [request]}},
    }
    apply(cluster, claim)
    on_node = {"key": "metadata.name", "operator": "In", "values": [node]}
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpus", "driver": "gpu.nvidia.com", "pool": node, "device": d}
                    for d in ("gpu-0", "gpu-1")
                ]
            },
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [on_node]}]},
        },
        "reservedFor": [{"resource": "pods", "name": "their-trainer", "uid": uid}],
    }
    return write_claim_status(cluster, namespace, status)


def write_claim_status(cluster, namespace: str, status: dict) -> dict:
    from kubernetes import client

    custom = client.CustomObjectsApi(cluster.api_client())
    where = ("resource.k8s.io", "v1", namespace, "resourceclaims", "their-gpus")
    body = custom.get_namespaced_custom_object(*where)
    body["status"] = status
    return custom.replace_namespaced_custom_object_status(*where, body)


def test_a_job_avoids_gpus_another_workloads_claim_holds_and_takes_them_once_freed(
    cluster, dra_nodes, namespace, tmp_path
):
    held = their_claim(cluster, namespace, dra_nodes[0])
    assert held["status"]["allocation"]["nodeSelector"]  # the status subresource kept it
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "op.log").start()
    try:
        a, b = job(namespace, "a"), job(namespace, "b")
        for j in (a, b):  # one node of 2 GPUs each
            j["spec"]["nodes"]["count"] = 1
        apply(cluster, a)
        (pa,) = wait_for(
            "a's pod",
            lambda: (lambda ps: ps if len(ps) == 1 else None)(pods_of(cluster, namespace, "a")),
            op=op,
        )
        assert pa["metadata"]["annotations"]["holmes.dev/node"] == dra_nodes[1]  # not the claimed node
        apply(cluster, b)
        waits = wait_for(
            "b waiting for capacity",
            lambda: (lambda c: c if c.get("reason") == "WaitingForCapacity" else None)(
                condition({"status": {}, **(get_job(cluster, namespace, "b") or {})}, "Reconciling")
            ),
            op=op,
        )
        assert f"held by other pods (1 node), {namespace}/a (1 node)" in waits["message"]
        assert not pods_of(cluster, namespace, "b")
        # their pod ended: the claim controller takes it out of reservedFor and frees the devices
        write_claim_status(cluster, namespace, {})
        (pb,) = wait_for(
            "b's pod once the claim is freed",
            lambda: (lambda ps: ps if len(ps) == 1 else None)(pods_of(cluster, namespace, "b")),
            op=op,
        )
        assert pb["metadata"]["annotations"]["holmes.dev/node"] == dra_nodes[0]
    finally:
        op.stop()
        cluster.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", check=False
        )
