"""Real nodes (issue 48): two nodes of a topology played by the real kubelet on containerd
(``playedBy: kubelet``, hack/localkube/realnode.py), each on its own NIC fabric. The operator's
trainer pods run in containers from the trainer image in each node's containerd, get
``net1`` from their fabric's NetworkAttachmentDefinition through Multus (as the operator renders
for SR-IOV islands, as on a cluster with the NVIDIA Network Operator), resolve the rendezvous name
through CoreDNS, and the job reaches Succeeded.

Its own cluster (not the session's ``cluster``: other topology); needs root, ``make node`` and
``make images``. A new trainer image's import (once, into the seed store every node's is copied
from) dominates its time (docs/local-cluster.md gives the figures)."""

from __future__ import annotations

import json
import socket
import struct
import uuid

import pytest
import yaml
from holmes_dev.jobs import holmes_job

from localkube.operatorproc import OperatorProcess, install_crd
from localkube.realnode import NAD_NAMESPACE
from tests.helpers.cluster import real_nodes
from tests.helpers.cluster.real_nodes import REPO, TRAINER
from tests.helpers.polling import wait_for

pytestmark = [pytest.mark.timeout(1500), pytest.mark.real_nodes]
TOPOLOGY = REPO / "hack" / "topologies" / "real-nodes.yaml"
FABRICS = {"rk-east": "east-infiniband", "rk-west": "west-roce"}
KUBERNETES = "kubernetes.default.svc.cluster.local"  # the API server's Service
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"


@pytest.fixture(scope="module")
def real_cluster():
    yield from real_nodes.real_cluster(TOPOLOGY, "real")


def dns_a(server: str, name: str) -> list[str]:
    """The A records ``server`` answers for ``name`` (one UDP query, no library)."""
    query = struct.pack(">HHHHHH", 0x4C4B, 0x0100, 1, 0, 0, 0)
    query += (
        b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(query, (server, 53))
        reply = s.recv(4096)
    answers = struct.unpack(">H", reply[6:8])[0]
    at, out = len(query), []
    for _ in range(answers):
        while reply[at] and reply[at] < 0xC0:  # the answer's name: labels, then 0 or a pointer
            at += 1 + reply[at]
        at += 2 if reply[at] >= 0xC0 else 1
        rtype, _, _, length = struct.unpack(">HHIH", reply[at : at + 10])
        if rtype == 1:
            out.append(socket.inet_ntoa(reply[at + 10 : at + 10 + length]))
        at += 10 + length
    return out


def test_real_kubelet_nodes_run_a_holmesjob_from_the_trainer_image_on_their_fabrics(real_cluster, tmp_path):
    c = real_cluster
    wide = c.kubectl("get", "nodes", "-o", "wide").stdout
    print(wide)
    nodes = {n["metadata"]["name"]: n for n in c.get("nodes")["items"]}
    assert sorted(nodes) == ["rk-east", "rk-west"], wide
    for name, n in nodes.items():
        info = n["status"]["nodeInfo"]
        assert info["containerRuntimeVersion"].startswith("containerd://2."), info
        assert info["kubeletVersion"].startswith("v1.37"), info
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == "1"
        assert "containerd://" in next(line for line in wide.splitlines() if line.startswith(name))
    # CoreDNS answers cluster names on each node's address (the kubelets' clusterDNS)
    for n in nodes.values():
        ip = next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP")
        # (answered once its kubernetes plugin has synced with the API server)
        wait_for(
            f"CoreDNS on {ip} to answer", lambda ip=ip: dns_a(ip, KUBERNETES) == ["10.96.0.1"], timeout=30
        )
    nads = c.get("network-attachment-definitions", "-n", NAD_NAMESPACE)["items"]
    assert sorted(d["metadata"]["name"] for d in nads) == sorted(FABRICS.values())

    install_crd(c.kubeconfig)
    ns = f"t-{uuid.uuid4().hex[:8]}"
    c.kubectl("create", "namespace", ns)
    wait_for(
        "the default service account",
        lambda: c.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
    )
    op = OperatorProcess(
        c.kubeconfig, [ns], tmp_path / "operator.log", extra=[f"--trainer-image={TRAINER}"]
    ).start()
    try:
        islands = [
            {
                "cluster": node["cluster"],
                "nic": node["nic"],
                "sriov": {
                    "networks": [f"{NAD_NAMESPACE}/{FABRICS[node['name']]}"],
                    "resource": node["rdmaResource"],
                },
            }
            for node in yaml.safe_load(TOPOLOGY.read_text())["nodes"]
        ]
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
            "islands": islands,
            "runPolicy": {"backoffLimit": 0},
        }
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump(holmes_job("real", spec, ns)))

        def finished():
            job = c.get("holmesjob", "real", "-n", ns)
            return job if job.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        job = wait_for("HolmesJob real to finish", finished, timeout=600, every=1, detail=lambda: op.tail(40))
        pods = c.get("pods", "-n", ns, "-l", "holmes.dev/job-name=real")["items"]
        logs = {
            p["metadata"]["name"]: c.kubectl("logs", "-n", ns, p["metadata"]["name"], check=False)
            for p in pods
        }
        assert job["status"]["phase"] == "Succeeded", (
            json.dumps(job["status"], indent=1)[:3000]
            + "\n"
            + "\n".join(f"{k}: {v.stdout[-1500:]}{v.stderr}" for k, v in logs.items())
        )
    finally:
        op.stop()
        print(op.tail(40))
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["rk-east", "rk-west"]
    for p in pods:
        node = p["spec"]["nodeName"]
        (cs,) = p["status"]["containerStatuses"]
        assert cs["containerID"].startswith("containerd://"), cs
        assert cs["image"] == TRAINER and cs["state"]["terminated"]["exitCode"] == 0, cs
        # kubectl logs: the API server reached the kubelet with its client certificate
        assert logs[p["metadata"]["name"]].returncode == 0 and logs[p["metadata"]["name"]].stdout.strip()
        env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0].get("env", [])}
        assert not env["MASTER_ADDR"].replace(".", "").isdigit(), env["MASTER_ADDR"]  # a name: CoreDNS
        # net1 from the node's fabric, attached by Multus as the operator asked
        fabric = f"{NAD_NAMESPACE}/{FABRICS[node]}"
        assert p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == fabric
        status = {s["name"]: s for s in json.loads(p["metadata"]["annotations"][NETWORK_STATUS])}
        assert status[fabric]["interface"] == "net1" and status[fabric]["ips"], status
        (default,) = [s for s in status.values() if s.get("default")]
        assert default["interface"] == "eth0" and p["status"]["podIP"] in default["ips"], status
