"""Holmes' islands as the topology of the real Kueue's Topology Aware Scheduling (TAS; Kueue
v0.17.1, the ``real_kueue`` fixture, TopologyAwareScheduling on). Nothing here plays Kueue's part:

- the operator publishes its levels on the nodes (topology.holmes.dev/cluster, /island: cluster
  x NIC kind, as it classifies each node, whatever label scheme the node advertises its NIC by);
- Holmes' Topology (core/island_topology.kueue_topology) is accepted by Kueue's CRD (its CEL
  rules) and a flavor per cluster names it; Kueue admits a HolmesJob of that ClusterQueue with
  each PodSet inside one island (a topology assignment per PodSet), and its pods run on the
  nodes Kueue picked;
- a plain batch/v1 Job that asks for Holmes' island level (kueue.x-k8s.io/podset-required-topology)
  lands inside one island, and one no island can hold is not admitted though the quota fits.
"""

from __future__ import annotations

import json

import pytest
from holmes_dev.jobs import tiny_job

from holmes.operator.core import island_topology as topo
from tests.helpers.operator.cluster_helpers import apply, pods_of, running_operator, wait_for, wait_phase

pytestmark = pytest.mark.timeout(420)

GPU = "nvidia.com/gpu"
RDMA = ("rdma/rdma_shared_device_a", "rdma/rdma_shared_device_b")
# hack/topologies/default.yaml as the operator classifies it: each node's island (the NIC kinds
# advertised by Holmes' labels, by NFD, or not at all)
ISLANDS = {
    "ib-0": "east.infiniband",
    "ib-1": "east.infiniband",
    "eth-0": "east.ethernet",
    "roce-0": "west.roce",
    "roce-1": "west.roce",
    "eth-1": "west.ethernet",
}
ISLAND = topo.LABEL_ISLAND


def kueue_objects(namespace: str) -> list[dict]:
    """Holmes' Topology, a TAS flavor per cluster (its nodes by Holmes' cluster level), a
    ClusterQueue over both with room for 12 GPUs (more than any island holds), the namespace's
    LocalQueue ``tas``."""
    flavors = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": f"{c}-{namespace}"},
            "spec": {"nodeLabels": {topo.LABEL_CLUSTER: c}, "topologyName": f"holmes-{namespace}"},
        }
        for c in ("east", "west")
    ]
    quota = [
        {
            "name": f["metadata"]["name"],
            "resources": [
                {"name": r, "nominalQuota": q}
                for r, q in (("cpu", "64"), ("memory", "512Gi"), (GPU, "6"), (RDMA[0], "64"), (RDMA[1], "64"))
            ],
        }
        for f in flavors
    ]
    return [
        topo.kueue_topology(f"holmes-{namespace}"),
        *flavors,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": f"tas-{namespace}"},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU, *RDMA], "flavors": quota}],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "tas", "namespace": namespace},
            "spec": {"clusterQueue": f"tas-{namespace}"},
        },
    ]


@pytest.fixture
def operator(cluster, real_kueue, namespace, tmp_path):
    from localkube.operatorproc import install_crd

    install_crd(cluster)
    yield from running_operator(cluster, namespace, tmp_path, extra=["--progress-interval=1"], tail=120)


@pytest.fixture
def tas(cluster, real_kueue, namespace):
    objs = kueue_objects(namespace)
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    yield objs
    cluster.kubectl(
        "delete", "holmesjob", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
    )
    cluster.kubectl(
        "delete", "jobs.batch", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
    )
    for o in reversed(objs):
        plural = "topologies" if o["kind"] == "Topology" else o["kind"].lower() + "s"
        kind = f"{plural}.kueue.x-k8s.io"
        args = ["-n", namespace] if o["kind"] == "LocalQueue" else []
        cluster.kubectl("delete", kind, o["metadata"]["name"], *args, "--wait=false", check=False)


def node_islands(cluster) -> dict[str, str]:
    return {
        n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(ISLAND, "")
        for n in cluster.get_json("nodes")["items"]
    }


def published(cluster) -> dict[str, str] | None:
    got = node_islands(cluster)
    return got if all(got.get(n) == i for n, i in ISLANDS.items()) else None


def workload(cluster, ns, name) -> dict | None:
    r = cluster.kubectl("get", "workloads.kueue.x-k8s.io", name, "-n", ns, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def assigned_hosts(psa: dict) -> list[str]:
    """The hostnames of a PodSet's topology assignment (Holmes' reader: island_topology.domains)."""
    return sorted(d["kubernetes.io/hostname"] for d, _ in topo.domains(psa["topologyAssignment"]))


def test_a_holmesjob_is_admitted_by_topology_each_pod_set_inside_one_island(
    cluster, tas, operator, namespace
):
    """The operator labels every node with its island (before: none had one). A job of 4 pods
    x 2 GPUs (more than any island's 4 GPUs) in the TAS ClusterQueue: its Workload has a PodSet
    per island Holmes planned, each selecting that island and requiring the island level; Kueue
    admits each with a topology assignment inside it, and each pod runs on a node Kueue
    assigned to its PodSet, selected by hostname as Kueue's TAS gives it (no node affinity of
    Holmes' own), annotated as the Workload's TAS pod."""
    got = wait_for(
        "the operator's island labels on every node", lambda: published(cluster), timeout=60, op=operator
    )
    assert {n: got[n] for n in ISLANDS} == ISLANDS
    clusters = {
        n["metadata"]["name"]: n["metadata"]["labels"].get(topo.LABEL_CLUSTER)
        for n in cluster.get_json("nodes")["items"]
    }
    assert {clusters[n] for n in ISLANDS} == {"east", "west"}

    job = tiny_job("wide", namespace, count=4, gpus=2, command=["sleep", "2"])
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "tas"}
    apply(cluster, job)
    wait_phase(cluster, namespace, "wide", "Succeeded", timeout=180, op=operator)

    wl = workload(cluster, namespace, "holmesjob-wide")
    sets = {p["name"]: p for p in wl["spec"]["podSets"]}
    assert len(sets) >= 2, sets  # no island holds the job: a PodSet per island
    for p in sets.values():
        assert p["topologyRequest"]["required"] == ISLAND, p
        assert p["template"]["spec"]["nodeSelector"][ISLAND] in set(ISLANDS.values())
    psas = {a["name"]: a for a in wl["status"]["admission"]["podSetAssignments"]}
    assert set(psas) == set(sets)
    by_pod_set: dict[str, list[str]] = {}
    for name, a in psas.items():
        island = sets[name]["template"]["spec"]["nodeSelector"][ISLAND]
        hosts = assigned_hosts(a)
        assert len(hosts) == sets[name]["count"] and {ISLANDS[h] for h in hosts} == {island}, (name, a)
        by_pod_set[name] = hosts
    pods = pods_of(cluster, namespace, "wide")
    assert len(pods) == 4
    ran = sorted(p["spec"]["nodeName"] for p in pods)
    assert ran == sorted(h for hs in by_pod_set.values() for h in hs), (ran, by_pod_set)
    for p in pods:
        sel, node = p["spec"]["nodeSelector"], p["spec"]["nodeName"]
        assert sel["kubernetes.io/hostname"] == node and sel[ISLAND] == ISLANDS[node], sel
        assert "nodeAffinity" not in (p["spec"].get("affinity") or {}), p["spec"]["affinity"]
        ann = p["metadata"]["annotations"]
        assert ann[topo.ANN_REQUIRED_TOPOLOGY] == ISLAND and ann[topo.ANN_WORKLOAD] == "holmesjob-wide"


def batch_job(namespace: str, name: str, pods: int) -> dict:
    """A plain Job of ``pods`` pods x 2 GPUs in the TAS LocalQueue, asking Kueue for one domain
    of Holmes' island level, as any workload may."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {"kueue.x-k8s.io/queue-name": "tas"}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "suspend": True,
            "template": {
                "metadata": {"annotations": {topo.ANN_REQUIRED_TOPOLOGY: ISLAND}},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "c",
                            "image": "x",
                            "command": ["sleep", "2"],
                            "resources": {"requests": {"cpu": "1", GPU: "2"}, "limits": {GPU: "2"}},
                        }
                    ],
                },
            },
        },
    }


def job_workload(cluster, ns, job) -> dict | None:
    for w in cluster.get_json("workloads.kueue.x-k8s.io", "-n", ns)["items"]:
        if any(
            o.get("name") == job and o.get("kind") == "Job"
            for o in w["metadata"].get("ownerReferences") or []
        ):
            return w
    return None


def test_a_plain_job_asking_for_holmes_island_level_lands_inside_one_island(
    cluster, tas, operator, namespace
):
    """A batch/v1 Job of 2 pods x 2 GPUs requiring Holmes' island level: Kueue admits it inside
    one island (east's or west's RDMA nodes: no Ethernet island holds 4 GPUs) and both pods run
    there. One of 3 pods x 2 GPUs fits the ClusterQueue's quota (12 GPUs) but no island (4 GPUs
    each): Kueue does not admit it, saying so."""
    wait_for(
        "the operator's island labels on every node", lambda: published(cluster), timeout=60, op=operator
    )
    apply(cluster, batch_job(namespace, "pair", 2))

    def done():
        j = cluster.get_json("jobs.batch", "pair", "-n", namespace)
        return j if (j.get("status") or {}).get("succeeded") == 2 else None

    wait_for("the Job's 2 pods succeeded", done, timeout=150, op=operator)
    wl = job_workload(cluster, namespace, "pair")
    (ps,) = wl["spec"]["podSets"]
    assert ps["topologyRequest"]["required"] == ISLAND, ps
    (psa,) = wl["status"]["admission"]["podSetAssignments"]
    hosts = assigned_hosts(psa)
    pods = cluster.get_json("pods", "-n", namespace, "-l", "job-name=pair")["items"]
    nodes = sorted(p["spec"]["nodeName"] for p in pods)
    assert nodes == hosts, (nodes, hosts)
    assert len({ISLANDS[n] for n in nodes}) == 1 and ISLANDS[nodes[0]] in ("east.infiniband", "west.roce"), (
        nodes
    )

    apply(cluster, batch_job(namespace, "three", 3))

    def refused():
        w = job_workload(cluster, namespace, "three")
        c = next(
            (
                c
                for c in ((w or {}).get("status") or {}).get("conditions") or []
                if c["type"] == "QuotaReserved"
            ),
            {},
        )
        return c if c.get("status") == "False" and c.get("message") else None

    c = wait_for("Kueue's word on the 3-pod Job", refused, timeout=60, op=operator)
    assert "topology" in c["message"].lower() or "domain" in c["message"].lower(), c
    assert not [
        p
        for p in cluster.get_json("pods", "-n", namespace, "-l", "job-name=three")["items"]
        if p["spec"].get("nodeName")
    ]
