"""`holmes plan --pods`: the exact objects the operator would create, as a v1 List, and the
framework examples rendered through it."""

import json
from pathlib import Path

import pytest
import yaml

from holmes.cli import main
from holmes.contract import Layout

REPO = Path(__file__).resolve().parents[3]
PAPER = str(REPO / "examples" / "nodes" / "paper.yaml")
EXAMPLES = ["megatron-gpt-7b", "torchtitan-llama3-8b", "deepspeed-gpt-pipeline"]


def plan_pods(capsys, job, *extra):
    code = main(["plan", "--nodes", PAPER, "--job", str(job), "--pods", "--json", *extra])
    out = capsys.readouterr()
    return code, out


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_render_the_launcher_pods(capsys, name):
    code, out = plan_pods(capsys, REPO / "examples" / "jobs" / f"{name}.yaml")
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert doc["apiVersion"] == "v1" and doc["kind"] == "List"
    kinds = [o["kind"] for o in doc["items"]]
    assert kinds[:2] == ["ConfigMap", "Service"] and kinds.count("Pod") == 8
    layout = Layout.from_json(doc["items"][0]["data"]["layout.json"])
    for pod in doc["items"][2:]:
        c = pod["spec"]["containers"][0]
        assert c["command"][1:3] == ["/holmes-launch/launch.py", "--"]
        assert pod["spec"]["initContainers"][0]["name"] == "holmes-launch"
        assert pod["spec"]["affinity"]["nodeAffinity"]  # pinned to its planned node
    if name.startswith("megatron"):
        assert {f"megatron-nccl-stage-{s}.yaml" for s in range(layout.pipeline)} <= set(
            doc["items"][0]["data"]
        )


def test_holmes_jobs_render_too_and_the_images_flag_is_used(capsys):
    code, out = plan_pods(
        capsys, REPO / "examples" / "jobs" / "gpt-7b.yaml", "--trainer-image", "reg/holmes:9"
    )
    assert code == 0, out.err
    pods = [o for o in json.loads(out.out)["items"] if o["kind"] == "Pod"]
    assert pods and all("initContainers" not in p["spec"] for p in pods)
    assert pods[0]["spec"]["containers"][0]["command"][:3] == ["python", "-m", "holmes.trainer.run"]


def test_a_job_the_operator_would_not_launch_says_why(capsys, tmp_path):
    doc = yaml.safe_load((REPO / "examples" / "jobs" / "gpt-7b.yaml").read_text())
    doc["spec"]["template"] = {"spec": {"nodeName": "n1"}}  # the planner places pods
    job = tmp_path / "pinned.yaml"
    job.write_text(yaml.safe_dump(doc))
    code, out = plan_pods(capsys, job)
    assert code == 2 and "would create no pods" in out.err and "--allow-node-name" in out.err


def test_offline_it_says_the_template_is_checked_by_the_api_server(capsys):
    """Issue 50, item 6: offline, holmes plan --pods has no API server to dry-run the pods on; it
    says so and how to ask one, instead of letting a misspelt field pass as checked (with
    --kubeconfig it asks: tests/e2e/operator/test_pod_security_cluster.py)."""
    code, out = plan_pods(capsys, REPO / "examples" / "jobs" / "gpt-7b.yaml")
    assert code == 0 and "not checked offline" in out.err and "--dry-run=server" in out.err


ROUTES_NODES = str(REPO / "examples" / "nodes" / "network-operator.yaml")
ROUTES_JOB = REPO / "examples" / "jobs" / "gpt-network-operator.yaml"


def route_pods(capsys, job, *extra):
    code = main(["plan", "--nodes", ROUTES_NODES, "--job", str(job), "--pods", "--json", *extra])
    out = capsys.readouterr()
    assert code == 0, out.err
    pods = [o for o in json.loads(out.out)["items"] if o["kind"] == "Pod"]
    return {p["metadata"]["annotations"]["holmes.dev/node"]: p for p in pods}


def shown(pod):
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    return pod["metadata"]["annotations"], c["resources"]["limits"], env


def test_plan_pods_shows_each_network_operator_route_before_applying(capsys):
    """What docs/install.md#network-routes shows: the shared RDMA device plugin (one device per
    rail) on east, SR-IOV VFs through Multus with the lossless class on west; no host names."""
    pods = route_pods(capsys, ROUTES_JOB)
    ann, limits, env = shown(pods["east-0"])
    assert limits == {"nvidia.com/gpu": 8, "rdma/rdma_shared_device_ib": 4}
    assert "k8s.v1.cni.cncf.io/networks" not in ann and env["HOLMES_POD_NETWORK"] == "podNetwork"
    ann, limits, env = shown(pods["west-0"])
    assert ann["k8s.v1.cni.cncf.io/networks"] == "llm/rail-0,llm/rail-1,llm/rail-2,llm/rail-3"
    assert limits == {"nvidia.com/gpu": 8, "nvidia.com/sriov_rail": 4}
    assert (env["NCCL_IB_TC"], env["NCCL_IB_SL"], env["HOLMES_NIC"]) == ("106", "3", "roce")
    for pod in pods.values():
        _, _, env = shown(pod)
        assert not {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX"} & set(env)
        assert "hostNetwork" not in pod["spec"]


def test_plan_pods_shows_the_host_network_route(capsys, tmp_path):
    doc = yaml.safe_load(ROUTES_JOB.read_text())
    doc["spec"]["network"] = "hostNetwork"
    doc["spec"]["islands"] = [doc["spec"]["islands"][0]]  # Multus attaches nothing to hostNetwork pods
    job = tmp_path / "host.yaml"
    job.write_text(yaml.safe_dump(doc))
    pods = route_pods(capsys, job)
    for pod in pods.values():
        _, _, env = shown(pod)
        assert pod["spec"]["hostNetwork"] is True and pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert (
            env["HOLMES_POD_NETWORK"] == "hostNetwork"
            and env["HOLMES_HOST_HCAS"] == "mlx5_0,mlx5_1,mlx5_2,mlx5_3"
        )
    assert shown(pods["east-0"])[1]["rdma/rdma_shared_device_ib"] == 4


def test_plan_pods_names_the_missing_network_attachment(capsys, tmp_path):
    doc = yaml.safe_load(ROUTES_JOB.read_text())
    doc["spec"]["islands"] = [doc["spec"]["islands"][0]]
    job = tmp_path / "no-nad.yaml"
    job.write_text(yaml.safe_dump(doc))
    cfg = tmp_path / "cm.yaml"
    cfg.write_text("nicMapping: {rdmaResourceNames: [nvidia.com/sriov_rail]}\n")
    code = main(["plan", "--nodes", ROUTES_NODES, "--job", str(job), "--pods", "--config", str(cfg)])
    err = capsys.readouterr().err
    assert code == 2 and "spec.islands: node west-0" in err and "sriov: {networks:" in err


@pytest.mark.parametrize("level, non_root", [("restricted", True), ("baseline", None)])
def test_the_pods_are_rendered_for_the_namespaces_pod_security_level(capsys, level, non_root):
    code, out = plan_pods(capsys, REPO / "examples" / "jobs" / "gpt-7b.yaml", "--pod-security", level)
    assert code == 0, out.err
    pods = [o for o in json.loads(out.out)["items"] if o["kind"] == "Pod"]
    assert pods and {p["spec"]["securityContext"].get("runAsNonRoot") for p in pods} == {non_root}
