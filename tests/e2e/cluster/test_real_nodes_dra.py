"""DRA on real nodes (issue 48): two real kubelet nodes whose GPUs and NICs are DRA devices
(``dra: true``, hack/topologies/real-nodes-dra.yaml), published in ResourceSlices of
``gpu.nvidia.com`` and ``dra.net`` by each node's DRA kubelet plugin (hack/dra-plugin, started by
hack/localkube/realnode.py). A HolmesJob planned from the slices alone: the operator creates its
ResourceClaimTemplate, the real scheduler allocates each pod's claim (each GPU with the NIC on its
PCIe root: the plugin numbers the NICs against the GPUs' roots, so a pairing that ignored the
roots shows), the kubelet has the plugin prepare it (a CDI spec giving the container one
variable per device), the pods start with the devices and the job reaches Succeeded. The pods'
init container prints what it got (its log); the trainer container's own environment is read
from its containerd. A second test brings a driver of its own: the plugin registers for it when
its slice appears.

Its own cluster; needs root, ``make node`` and ``make images`` (the trainer image: every real
node's images are copies of one seed store, shared with test_real_nodes.py)."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from holmes_dev.jobs import holmes_job

from localkube.operatorproc import OperatorProcess, install_crd
from localkube.realnode import GPU_DRIVER, NIC_DRIVER, PCIE_ROOT
from tests.helpers.cluster import real_nodes
from tests.helpers.cluster.real_nodes import REPO, TRAINER, Cluster
from tests.helpers.plan.dra_helpers import device_classes
from tests.helpers.polling import wait_for

pytestmark = [pytest.mark.timeout(1500), pytest.mark.real_nodes]
TOPOLOGY = REPO / "hack" / "topologies" / "real-nodes-dra.yaml"
NODES = ["rk-east", "rk-west"]
SHOW_DEVICES = ["sh", "-c", "env | grep '^DRA_' | sort"]
DRA_ENV = re.compile(r"^(DRA_[A-Z0-9_]+)=(.*)$")


@pytest.fixture(scope="module")
def real_cluster():
    yield from real_nodes.real_cluster(TOPOLOGY, "dra")


@pytest.fixture
def ns(real_cluster):
    c = real_cluster
    name = f"t-{uuid.uuid4().hex[:8]}"
    c.kubectl("create", "namespace", name)
    wait_for(
        "the default service account",
        lambda: c.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    yield name
    c.kubectl("delete", "namespace", name, "--wait=false", check=False)


def env_name(driver: str, device: str) -> str:
    """The variable the plugin's CDI spec gives a device (hack/dra-plugin: envName)."""
    return "DRA_" + re.sub(r"[^A-Z0-9]", "_", f"{driver}_{device}".upper())


def shown(text: str) -> dict[str, dict[str, str]]:
    """``DRA_...=device=gpu-0 pool=rk-east ...`` lines (a log, an environment) as variable ->
    its fields."""
    out = {}
    for line in text.splitlines():
        if m := DRA_ENV.match(line.strip()):
            out[m.group(1)] = dict(f.split("=", 1) for f in m.group(2).split())
    return out


def slices_of(c: Cluster, node: str) -> dict[str, dict]:
    return {
        s["spec"]["driver"]: s
        for s in c.get("resourceslices", f"--field-selector=spec.nodeName={node}")["items"]
    }


def roots(slice_: dict) -> dict[str, str]:
    return {
        d["name"]: d["attributes"][PCIE_ROOT]["string"]
        for d in slice_["spec"]["devices"]
        if PCIE_ROOT in d["attributes"]
    }


def cdi_specs(c: Cluster, node: str) -> list[str]:
    return sorted(p.name for p in (c.node_dir(node) / "cdi").glob("*.json"))


def allocated_claims(c: Cluster, namespace: str) -> dict[str, dict]:
    """The allocated ResourceClaims of ``namespace`` by the pod they were made for."""
    out = {}
    for claim in c.get("resourceclaims.resource.k8s.io", "-n", namespace)["items"]:
        pods = [o["name"] for o in claim["metadata"].get("ownerReferences") or [] if o["kind"] == "Pod"]
        if pods and (claim.get("status") or {}).get("allocation"):
            out[pods[0]] = claim
    return out


def test_a_holmesjob_on_dra_real_nodes_gets_gpus_paired_with_nics_prepared_and_succeeds(
    real_cluster, ns, tmp_path
):
    c = real_cluster
    published = {}
    for node in NODES:
        n = c.get("node", node)
        assert "nvidia.com/gpu" not in n["status"]["allocatable"]  # the GPUs are DRA devices only
        assert not any(k.startswith("holmes.dev/nic") for k in n["metadata"]["labels"])
        published[node] = slices_of(c, node)
        assert sorted(published[node]) == [NIC_DRIVER, GPU_DRIVER], published[node]
        for s in published[node].values():  # published by the node's plugin (the helper owns them)
            assert s["metadata"]["ownerReferences"][0]["name"] == node, s["metadata"]
        assert not cdi_specs(c, node)
    for dc in device_classes():
        c.kubectl("apply", "-f", "-", input=json.dumps(dc))
    install_crd(c.kubeconfig)
    op = OperatorProcess(
        c.kubeconfig, [ns], tmp_path / "operator.log", extra=[f"--trainer-image={TRAINER}"]
    ).start()
    try:
        spec = {
            "model": {"layers": 2, "hiddenSize": 32, "attentionHeads": 2, "seqLength": 16, "vocabSize": 64},
            "training": {
                "globalBatchSize": 4,
                "microBatchSize": 1,
                "iterations": 3,
                "learningRate": 1e-3,
                "seed": 1,
                "data": {"synthetic": {}},
            },
            "parallelism": {"tensor": 1, "pipeline": 2, "data": 1, "partition": "uniform"},
            "nodes": {"count": 2, "gpusPerNode": 1},
            "runPolicy": {"backoffLimit": 0},
            # a container of the pod that shows what the plugin prepared for its claim
            "template": {
                "spec": {
                    "initContainers": [
                        {
                            "name": "show-devices",
                            "image": TRAINER,
                            "command": SHOW_DEVICES,
                            "resources": {"claims": [{"name": "devices"}]},
                        }
                    ]
                }
            },
        }
        c.kubectl("apply", "-f", "-", input=json.dumps(holmes_job("dra", spec, ns)))

        claims: dict[str, dict] = {}  # seen while the pods run: the claim controller frees them after

        def finished():
            claims.update(allocated_claims(c, ns))
            job = c.get("holmesjob", "dra", "-n", ns)
            return job if job.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        job = wait_for("HolmesJob dra to finish", finished, timeout=600, every=1, detail=lambda: op.tail(40))
        pods = c.get("pods", "-n", ns, "-l", "holmes.dev/job-name=dra")["items"]
        logs = {
            p["metadata"]["name"]: c.kubectl(
                "logs", "-n", ns, p["metadata"]["name"], "-c", "show-devices", check=False
            )
            for p in pods
        }
        assert job["status"]["phase"] == "Succeeded", (
            json.dumps(job["status"], indent=1)[:3000] + "\n" + op.tail(40)
        )
    finally:
        op.stop()
    assert sorted(p["spec"]["nodeName"] for p in pods) == NODES
    (tpl,) = c.get("resourceclaimtemplates.resource.k8s.io", "-n", ns)["items"]
    assert tpl["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": ["gpu-0", "nic-0"], "matchAttribute": PCIE_ROOT}
    ]
    for p in pods:
        node, name = p["spec"]["nodeName"], p["metadata"]["name"]
        assert p["spec"]["resourceClaims"] == [
            {"name": "devices", "resourceClaimTemplateName": tpl["metadata"]["name"]}
        ]
        # the real scheduler allocated the claim from the node's slices: a GPU and the NIC on its root
        claim = claims[name]
        assert claim["status"]["reservedFor"] == [
            {"resource": "pods", "name": name, "uid": p["metadata"]["uid"]}
        ]
        on_node = {"key": "metadata.name", "operator": "In", "values": [node]}  # as capacity reads it
        assert claim["status"]["allocation"]["nodeSelector"] == {
            "nodeSelectorTerms": [{"matchFields": [on_node]}]
        }
        results = {r["request"]: r for r in claim["status"]["allocation"]["devices"]["results"]}
        assert sorted(results) == ["gpu-0", "nic-0"], results
        gpu, nic = results["gpu-0"], results["nic-0"]
        assert (gpu["driver"], nic["driver"], gpu["pool"], nic["pool"]) == (
            GPU_DRIVER,
            NIC_DRIVER,
            node,
            node,
        )
        gpu_root = roots(published[node][GPU_DRIVER])[gpu["device"]]
        assert roots(published[node][NIC_DRIVER])[nic["device"]] == gpu_root, (gpu, nic)
        assert nic["device"] != gpu["device"].replace("gpu", "nic")  # the roots paired them, not the names
        # the plugin prepared both devices: the container shows them
        want = {
            env_name(GPU_DRIVER, gpu["device"]): {
                "device": gpu["device"],
                "pool": node,
                "request": "gpu-0",
                "pcieRoot": gpu_root,
            },
            env_name(NIC_DRIVER, nic["device"]): {
                "device": nic["device"],
                "pool": node,
                "request": "nic-0",
                "pcieRoot": gpu_root,
                "rdmaDevice": f"mlx5_{nic['device'].split('-')[1]}",
            },
        }
        assert logs[name].returncode == 0 and shown(logs[name].stdout) == want, (
            logs[name].stdout + logs[name].stderr
        )
        (cs,) = p["status"]["containerStatuses"]  # the trainer itself, from its containerd
        assert cs["state"]["terminated"]["exitCode"] == 0, cs
        info = json.loads(c.ctr(node, "containers", "info", cs["containerID"].removeprefix("containerd://")))
        assert shown("\n".join(info["Spec"]["process"]["env"])) == want
        env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
        assert env["HOLMES_HOST_HCAS"] == "mlx5_0,mlx5_1", env  # planned from the slices
    # the pods ended: the kubelet had the plugin unprepare their claims, the claim controller freed them
    for node in NODES:
        wait_for(f"{node}'s CDI specs removed", lambda node=node: not cdi_specs(c, node), timeout=60)
    wait_for("the claims freed", lambda: not allocated_claims(c, ns), timeout=60)


def test_the_plugin_registers_for_a_driver_a_test_brings_and_prepares_its_claim(real_cluster, ns):
    c = real_cluster
    driver, node = "example.holmes.dev", NODES[1]
    c.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceSlice",
                        "metadata": {"name": f"{node}-example"},
                        "spec": {
                            "driver": driver,
                            "nodeName": node,
                            "pool": {"name": "brought", "generation": 1, "resourceSliceCount": 1},
                            "devices": [
                                {"name": "widget-7", "attributes": {PCIE_ROOT: {"string": "pci0000:70"}}}
                            ],
                        },
                    },
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "DeviceClass",
                        "metadata": {"name": driver},
                        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
                    },
                ],
            }
        ),
    )
    # the kubelet calls a driver once it registered it (a pod it starts before waits for its next
    # sync, about a minute); a driver's own slices come after its registration, these before
    registered = f'"registered with the kubelet" driver="{driver}" node="{node}"'
    wait_for(
        f"the plugin registered for {driver}", lambda: registered in c.log(f"dra-plugin-{node}"), timeout=60
    )
    c.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceClaimTemplate",
                        "metadata": {"name": "widget", "namespace": ns},
                        "spec": {
                            "spec": {
                                "devices": {
                                    "requests": [{"name": "w", "exactly": {"deviceClassName": driver}}]
                                }
                            }
                        },
                    },
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": "widget", "namespace": ns},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "c",
                                    "image": TRAINER,
                                    "command": SHOW_DEVICES,
                                    "resources": {"claims": [{"name": "w"}]},
                                }
                            ],
                            "resourceClaims": [{"name": "w", "resourceClaimTemplateName": "widget"}],
                        },
                    },
                ],
            }
        ),
    )
    try:
        pod = wait_for(
            "the widget pod to finish",
            lambda: (lambda p: p if p["status"].get("phase") in ("Succeeded", "Failed") else None)(
                c.get("pod", "widget", "-n", ns)
            ),
            timeout=60,
        )
        assert pod["status"]["phase"] == "Succeeded", json.dumps(pod["status"], indent=1)
        assert pod["spec"]["nodeName"] == node
        log = c.kubectl("logs", "-n", ns, "widget").stdout
        assert shown(log) == {
            env_name(driver, "widget-7"): {
                "device": "widget-7",
                "pool": "brought",
                "request": "w",
                "pcieRoot": "pci0000:70",
            }
        }, log
    finally:
        c.kubectl("delete", "pod", "widget", "-n", ns, "--wait=false", check=False)
        c.kubectl("delete", f"resourceslice/{node}-example", f"deviceclass/{driver}", check=False)
