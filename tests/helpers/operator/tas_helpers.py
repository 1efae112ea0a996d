"""Holmes' islands under the real Kueue's Topology Aware Scheduling, as the TAS cluster tests
share them (tests/e2e/operator/test_kueue_topology_cluster.py, test_jobset_cluster.py): the
islands of hack/topologies/default.yaml, Holmes' Topology with a flavor per cluster, a
ClusterQueue and the namespace's LocalQueue ``tas``."""

from __future__ import annotations

from holmes.operator.core import island_topology as topo

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


def west_flavor_queue(ns: str) -> list[dict]:
    """A flavor of west's nodes and a ClusterQueue of CPU and memory (holmes-torchrun's init
    container asks for memory) for the namespace (the LocalQueue is applied by the test)."""
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": f"west-{ns}"},
            "spec": {"nodeLabels": {"holmes.dev/cluster": "west"}},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": f"cq-{ns}"},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": f"west-{ns}",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "4"},
                                    {"name": "memory", "nominalQuota": "8Gi"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    ]


def assert_pinned_inside_west(pods: list[dict], doc: dict) -> None:
    """Each pod Succeeded on the node its plan entry names: Holmes' pin inside the node selector
    Kueue's west flavor (west_flavor_queue) wrote, on west's RoCE island."""
    for p in pods:
        entry = doc["pods"][p["spec"]["hostname"]]
        sel = p["spec"]["nodeSelector"]
        assert sel["holmes.dev/cluster"] == "west" and sel["kubernetes.io/hostname"] == entry["node"], sel
        assert p["spec"]["nodeName"] == entry["node"] and ISLANDS[entry["node"]] == "west.roce", entry
        assert p["status"]["phase"] == "Succeeded", p["status"]


def delete_kueue_objects(cluster, namespace: str, objs: list[dict]) -> None:
    """Take away what :func:`kueue_objects` made (the queues first)."""
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


def assigned_hosts(psa: dict) -> list[str]:
    """The hostnames of a PodSet's topology assignment (Holmes' reader: island_topology.domains)."""
    return sorted(d["kubernetes.io/hostname"] for d, _ in topo.domains(psa["topologyAssignment"]))
