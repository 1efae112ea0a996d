"""The DRA route on the local control plane (Kubernetes 1.20, no resource.k8s.io): ResourceSlices
served by stand-in CRDs of the same group and version (data/dra-standin-crds.yaml). Nodes
described only by slices (no Holmes label, no device-plugin resource) are planned by the running
operator, which creates the job's ResourceClaimTemplate; the pods it renders claim it. A 1.20
API server drops the pod fields it does not know (spec.resourceClaims, resources.claims): the
test records that, and checks the claims where they are rendered (`holmes plan --kubeconfig
--pods` against this control plane, the reconciler's own first decision)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from holmes_dev.jobs import tiny_job

from localkube.operatorproc import OperatorProcess, api_node, install_crd
from tests.operator.cluster_helpers import SLEEP, apply, condition, get_job, pods_of, wait_for
from tests.plan.dra_helpers import aligned_slices

pytestmark = pytest.mark.timeout(300)
STANDIN = Path(__file__).parent / "data" / "dra-standin-crds.yaml"
TAINT = {"key": "holmes.dev/dra-test", "value": "1", "effect": "NoSchedule"}


def slice_node(name: str) -> dict:
    """Ready, with 2 GPUs in slices only: no Holmes label, no nvidia.com/gpu, no rdma/*."""
    labels = {"dra-test": "1", "topology.kubernetes.io/zone": "east"}
    return api_node(name, labels, {"cpu": "16", "memory": "64Gi", "pods": "110"}, TAINT)


@pytest.fixture
def dra_nodes(cluster):
    install_crd(cluster)
    cluster.kubectl("apply", "-f", str(STANDIN))
    for crd in ("resourceslices", "resourceclaimtemplates"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.resource.k8s.io", "--timeout=60s")
    names = ["dra-node-0", "dra-node-1"]
    for n in names:
        apply(cluster, slice_node(n))
        for s in aligned_slices(n, gpus=2):
            apply(cluster, s)
    yield names
    cluster.kubectl("delete", "resourceslices", "--all", "--wait=false", check=False)
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
                condition(get_job(cluster, namespace, "dra-b") or {"status": {}}, "Reconciling")
            ),
            op=op,
        )
        assert "held by " + namespace + "/dra (2 nodes)" in waits["message"]
        assert not pods_of(cluster, namespace, "dra-b")
    finally:
        op.stop()
        cluster.kubectl(
            "delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", check=False
        )
    assert [t["metadata"]["name"] for t in made] == [tpl["metadata"]["name"]]
    assert made[0]["spec"] == tpl["spec"]
    assert made[0]["metadata"]["ownerReferences"][0]["uid"] == hj["metadata"]["uid"]
    assert {s["island"] for s in hj["status"]["layout"]["stages"]} == {"east/infiniband"}
    for p in pods:
        c = p["spec"]["containers"][0]
        assert "nvidia.com/gpu" not in (c["resources"].get("limits") or {})  # the GPUs are claimed
        assert p["metadata"]["annotations"]["holmes.dev/claim-gpus"] == "2"  # and counted as held
        assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["HOLMES_NIC"] == "infiniband" and env["HOLMES_HOST_HCAS"] == "mlx5_0,mlx5_1"
        # What 1.20 does with the fields it does not know: it drops them (recorded, not hoped for).
        assert "resourceClaims" not in p["spec"] and "claims" not in c["resources"]
