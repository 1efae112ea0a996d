"""Holmes' islands as a topology (core/topology.py): the node labels the operator publishes, the
Kueue Topology and Volcano HyperNodes rendered from them, the Workload's PodSets under Kueue's
TAS (each requiring its island) and how Holmes reads Kueue's topology assignment back."""

from __future__ import annotations

from pathlib import Path

import pytest

from holmes.operator import topology_labels
from holmes.operator.core import island_topology as topology
from holmes.operator.core import kueue_pod_sets, queueing
from holmes.operator.core.kueue_pod_sets import PodGroup
from holmes.plan import NicMapping, classify_nodes


def node(name: str, **labels: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


IB = node("ib-0", **{"holmes.dev/cluster": "east", "holmes.dev/nic": "infiniband"})
H100 = node(
    "h-0",
    **{
        "holmes.dev/cluster": "east",
        "holmes.dev/nic": "roce",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    },
)
PLAIN = node("eth-9")  # no cluster label, no NIC: the default cluster, Ethernet


def test_a_nodes_labels_name_its_cluster_and_island_of_nic_kind_and_gpu_type():
    nics = classify_nodes([IB, H100, PLAIN], NicMapping())
    assert [topology.node_labels(n) for n in nics] == [
        {topology.LABEL_CLUSTER: "east", topology.LABEL_ISLAND: "east.infiniband"},
        {topology.LABEL_CLUSTER: "east", topology.LABEL_ISLAND: "east.roce.H100-80GB-HBM3"},
        {topology.LABEL_CLUSTER: "default", topology.LABEL_ISLAND: "default.ethernet"},
    ]


def test_the_patch_writes_only_what_differs_and_none_once_the_node_says_it():
    m = NicMapping()
    assert topology_labels.wanted(IB, m) == {
        topology.LABEL_CLUSTER: "east",
        topology.LABEL_ISLAND: "east.infiniband",
    }
    done = node("ib-0", **IB["metadata"]["labels"], **topology_labels.wanted(IB, m))
    assert topology_labels.wanted(done, m) is None
    moved = node("ib-0", **{**done["metadata"]["labels"], "holmes.dev/nic": "roce"})
    assert topology_labels.wanted(moved, m) == {topology.LABEL_ISLAND: "east.roce"}
    # a node the planner reports a problem for (RDMA of no known kind) gets no island
    unsure = node("x", **{"feature.node.kubernetes.io/rdma.capable": "true"})
    assert topology_labels.wanted(unsure, m) is None


def test_label_values_stay_valid_and_distinct_when_long_or_odd():
    a = topology.label_value("a cluster/with odd*chars." + "x" * 80)
    b = topology.label_value("a cluster/with odd*chars." + "x" * 81)
    for v in (a, b):
        assert len(v) <= 63 and v[0].isalnum() and v[-1].isalnum()
        assert set(v) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
    assert a != b


def test_the_kueue_topology_lists_cluster_island_then_hostname():
    t = topology.kueue_topology()
    assert t["apiVersion"] == "kueue.x-k8s.io/v1beta2" and t["kind"] == "Topology"
    assert t["metadata"]["name"] == "holmes-islands"
    # Kueue's CRD: hostname only as the lowest level, levels unique
    assert t["spec"]["levels"] == [
        {"nodeLabel": "topology.holmes.dev/cluster"},
        {"nodeLabel": "topology.holmes.dev/island"},
        {"nodeLabel": "kubernetes.io/hostname"},
    ]


def test_under_tas_each_pod_set_selects_and_requires_its_island():
    groups = kueue_pod_sets.group_pods(
        [
            PodGroup("east.infiniband", {"nvidia.com/gpu": 2.0}, cluster="east"),
            PodGroup("east.infiniband", {"nvidia.com/gpu": 2.0}, cluster="east"),
            PodGroup("west.roce", {"nvidia.com/gpu": 2.0}, cluster="west"),
        ]
    )
    sets = kueue_pod_sets.pod_sets(groups, {"spec": {}}, topology.LABEL_ISLAND, topology=True)
    assert [(p["name"], p["count"], p["topologyRequest"]) for p in sets] == [
        ("east-infiniband", 2, {"required": topology.LABEL_ISLAND}),
        ("west-roce", 1, {"required": topology.LABEL_ISLAND}),
    ]
    # the island, and the cluster: the flavors' node label, by whose key alone Kueue picks a
    # PodSet's flavor before it looks at the topology (a west PodSet given east's flavor first
    # would find no west node there)
    assert [p["template"]["spec"]["nodeSelector"] for p in sets] == [
        {topology.LABEL_ISLAND: "east.infiniband", topology.LABEL_CLUSTER: "east"},
        {topology.LABEL_ISLAND: "west.roce", topology.LABEL_CLUSTER: "west"},
    ]
    # one island: still selected and required (Kueue must not move it to another island)
    (one,) = kueue_pod_sets.pod_sets(groups[:1], {}, topology.LABEL_ISLAND, topology=True)
    assert one["name"] == "workers" and one["topologyRequest"] == {"required": topology.LABEL_ISLAND}
    assert one["template"]["spec"]["nodeSelector"] == {
        topology.LABEL_ISLAND: "east.infiniband",
        topology.LABEL_CLUSTER: "east",
    }
    # more groups than Kueue takes, merged across islands of one cluster: the cluster is kept
    # and required (Kueue keeps the merged PodSet inside one cluster)
    merged = kueue_pod_sets._merged(groups[:1] + [PodGroup("east.roce", {}, cluster="east")], lambda g: "")
    (m,) = kueue_pod_sets.pod_sets(merged, {}, topology.LABEL_ISLAND, topology=True)
    assert m["topologyRequest"] == {"required": topology.LABEL_CLUSTER}
    assert m["template"]["spec"]["nodeSelector"] == {topology.LABEL_CLUSTER: "east"}
    # across clusters: nothing to require
    (x,) = kueue_pod_sets._merged(merged + [PodGroup("west.roce", {}, cluster="west")], lambda g: "")
    assert "topologyRequest" not in kueue_pod_sets.pod_sets([x], {}, topology.LABEL_ISLAND, topology=True)[0]
    # without TAS: as before, no topology request (a flavor without a Topology refuses one)
    plain = kueue_pod_sets.pod_sets(groups, {}, "holmes.dev/cluster")
    assert all("topologyRequest" not in p for p in plain)
    # a Workload of pod sets without the request is not the one wanted under TAS
    assert not queueing.same_pod_sets(plain, kueue_pod_sets.pod_sets(groups, {}, "holmes.dev/cluster", True))


def test_more_islands_than_kueues_eight_pod_sets_merge_per_cluster_each_inside_its_cluster():
    # 12 stages on 12 islands of two clusters: one PodSet per cluster, each requiring one
    # cluster (before: one PodSet of every pod with no topology request, free to span both)
    pods = [
        PodGroup(f"{c}.island{i}", {"nvidia.com/gpu": 8.0}, cluster=c)
        for c in ("east", "west")
        for i in range(6)
    ]
    groups = kueue_pod_sets.group_pods(pods)
    sets = kueue_pod_sets.pod_sets(groups, {}, topology.LABEL_ISLAND, topology=True)
    assert [(p["name"], p["count"], p["topologyRequest"]) for p in sets] == [
        ("east", 6, {"required": topology.LABEL_CLUSTER}),
        ("west", 6, {"required": topology.LABEL_CLUSTER}),
    ]
    assert [p["template"]["spec"]["nodeSelector"] for p in sets] == [
        {topology.LABEL_CLUSTER: "east"},
        {topology.LABEL_CLUSTER: "west"},
    ]


def test_the_queues_topology_is_the_one_its_cluster_queues_flavor_names():
    lq = {"spec": {"clusterQueue": "cq"}}
    cqs = {"cq": {"spec": {"resourceGroups": [{"flavors": [{"name": "plain"}, {"name": "tas"}]}]}}}
    flavors = {"plain": {"spec": {}}, "tas": {"spec": {"topologyName": "holmes-islands"}}}
    assert topology.queue_topology(lq, cqs, flavors) == "holmes-islands"
    assert topology.queue_topology(lq, cqs, {"plain": {"spec": {}}}) is None
    assert topology.queue_topology(None, cqs, flavors) is None
    assert topology.queue_topology({"spec": {"clusterQueue": "other"}}, cqs, flavors) is None


def test_the_topology_assignment_reads_as_its_domains_node_labels():
    levels = [topology.LABEL_ISLAND, "kubernetes.io/hostname"]
    ta = {
        "levels": levels,
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"universal": "east.infiniband"},
                    {"individual": {"prefix": "ib-", "roots": ["0", "1"]}},
                ],
                "podCounts": {"universal": 1},
            }
        ],
    }
    assert topology.domains(ta) == [
        ({topology.LABEL_ISLAND: "east.infiniband", "kubernetes.io/hostname": "ib-0"}, 1),
        ({topology.LABEL_ISLAND: "east.infiniband", "kubernetes.io/hostname": "ib-1"}, 1),
    ]
    wl = {
        "spec": {"podSets": [{"name": "workers", "template": {"spec": {"nodeSelector": {"a": "b"}}}}]},
        "status": {
            "admission": {
                "podSetAssignments": [
                    {"name": "workers", "flavors": {"nvidia.com/gpu": "f"}, "topologyAssignment": ta}
                ]
            }
        },
    }
    choices, missing = queueing.flavor_node_labels(wl, {"f": {"spec": {"nodeLabels": {"pool": "gpu"}}}})
    assert not missing
    assert choices == (
        {"a": "b", "pool": "gpu", topology.LABEL_ISLAND: "east.infiniband", "kubernetes.io/hostname": "ib-0"},
        {"a": "b", "pool": "gpu", topology.LABEL_ISLAND: "east.infiniband", "kubernetes.io/hostname": "ib-1"},
    )
    # the v1beta1 form (domains) reads the same once translated
    v1 = {"levels": levels, "domains": [{"values": ["east.infiniband", "ib-0"], "count": 1}]}
    assert topology.domains(queueing._topology_v1beta2(v1)) == [
        ({topology.LABEL_ISLAND: "east.infiniband", "kubernetes.io/hostname": "ib-0"}, 1)
    ]


def test_volcano_hypernodes_tier_one_per_island_tier_two_per_cluster():
    m = NicMapping()
    nodes = []
    for n in (IB, H100, node("roce-0", **{"holmes.dev/cluster": "west", "holmes.dev/nic": "roce"})):
        labels = {**n["metadata"]["labels"], **topology_labels.wanted(n, m)}
        nodes.append({"metadata": {"name": n["metadata"]["name"], "labels": labels}})
    nodes.append(PLAIN)  # no Holmes labels yet: left out
    hn = topology.volcano_hypernodes(nodes)
    assert [(h["metadata"]["name"], h["spec"]["tier"]) for h in hn] == [
        ("island-east.infiniband", 1),
        ("island-east.roce.h100-80gb-hbm3", 1),
        ("island-west.roce", 1),
        ("cluster-east", 2),
        ("cluster-west", 2),
    ]
    assert all(h["apiVersion"] == "topology.volcano.sh/v1alpha1" for h in hn)
    assert hn[0]["spec"]["members"] == [
        {
            "type": "Node",
            "selector": {"labelMatch": {"matchLabels": {topology.LABEL_ISLAND: "east.infiniband"}}},
        }
    ]
    assert [m["selector"]["exactMatch"]["name"] for m in hn[3]["spec"]["members"]] == [
        "island-east.infiniband",
        "island-east.roce.h100-80gb-hbm3",
    ]


def test_a_job_kueue_admits_by_topology_runs_on_the_nodes_kueue_picked_in_its_island():
    """A queued job whose ClusterQueue's flavor has a Topology: its Workload's PodSets require
    Holmes' island level, each selecting the island Holmes sized its stages for; once Kueue
    admits it with a topology assignment, its pods go to exactly the assigned nodes by the node
    selector Kueue's TAS gives (no pin of Holmes' own), marked as the Workload's TAS pods."""
    from tests.helpers.operator.opfixtures import FakeWorld, default_nodes, manifest, with_link_layers

    nodes = with_link_layers(default_nodes())
    m = NicMapping()
    for n in nodes:  # as the operator publishes them
        n["metadata"]["labels"].update(topology_labels.wanted(n, m) or {})
    job = manifest(count=2)
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    w = FakeWorld(job, nodes)
    w.flavors = {"f": {"spec": {"topologyName": "holmes-islands"}}}
    w.queue_topology = "holmes-islands"
    w.step()
    sets = w.workload["spec"]["podSets"]
    assert sets and all(p["topologyRequest"] == {"required": topology.LABEL_ISLAND} for p in sets), sets
    islands = {n["metadata"]["name"]: n["metadata"]["labels"][topology.LABEL_ISLAND] for n in nodes}
    assignments, picked = [], []
    for p in sets:
        island = p["template"]["spec"]["nodeSelector"][topology.LABEL_ISLAND]
        hosts = sorted(h for h, i in islands.items() if i == island)[-p["count"] :]  # Kueue's pick
        picked += hosts
        assignments.append(
            {
                "name": p["name"],
                "flavors": {"nvidia.com/gpu": "f"},
                "count": p["count"],
                "topologyAssignment": {
                    "levels": ["kubernetes.io/hostname"],
                    "slices": [
                        {
                            "domainCount": len(hosts),
                            "valuesPerLevel": [{"individual": {"roots": hosts}}],
                            "podCounts": {"universal": 1},
                        }
                    ],
                },
            }
        )
    w.workload["status"] = {
        "admission": {"clusterQueue": "cq", "podSetAssignments": assignments},
        "conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}],
    }
    d = w.step()
    assert len(d.create_pods) == 2
    for pod in d.create_pods:
        sel = pod["spec"]["nodeSelector"]
        assert (
            sel["kubernetes.io/hostname"] in picked
            and sel[topology.LABEL_ISLAND] == islands[sel["kubernetes.io/hostname"]]
        )
        assert "nodeAffinity" not in (pod["spec"].get("affinity") or {}), pod["spec"]["affinity"]
        ann = pod["metadata"]["annotations"]
        assert ann[topology.ANN_REQUIRED_TOPOLOGY] == topology.LABEL_ISLAND
        assert ann[topology.ANN_WORKLOAD] == "holmesjob-tiny"
    assert sorted(p["spec"]["nodeSelector"]["kubernetes.io/hostname"] for p in d.create_pods) == sorted(
        picked
    )


def test_publishing_is_on_unless_the_flag_turns_it_off():
    from holmes.operator.__main__ import parse_args

    assert parse_args([]).topology_labels == "on"
    assert parse_args(["--topology-labels=off"]).topology_labels == "off"
    with pytest.raises(SystemExit):
        parse_args(["--topology-labels=no"])


def test_holmes_topology_prints_each_schedulers_objects_for_the_nodes(capsys):
    """`holmes topology`: the Kueue and KAI Topology and the Volcano HyperNodes of the nodes as
    the operator classifies them (its --cluster-rdma-kind too); a node it cannot classify is
    named with why, and left out."""
    import yaml

    from holmes.cli import main

    nodes = str(Path(__file__).resolve().parents[3] / "examples" / "nodes" / "default.yaml")
    assert main(["topology", "--nodes", nodes, "--cluster-rdma-kind", "east=infiniband"]) == 0
    out = capsys.readouterr().out
    assert "# node roce-1: no island" in out and "# node ib-1" not in out
    items = yaml.safe_load(out)["items"]
    assert [(i["apiVersion"], i["kind"]) for i in items[:2]] == [
        ("kueue.x-k8s.io/v1beta2", "Topology"),
        ("kai.scheduler/v1alpha1", "Topology"),
    ]
    assert items[0]["spec"] == items[1]["spec"] == topology.kueue_topology()["spec"]
    tier1 = [i["metadata"]["name"] for i in items if i["kind"] == "HyperNode" and i["spec"]["tier"] == 1]
    assert tier1 == [
        "island-east.ethernet",
        "island-east.infiniband",
        "island-west.ethernet",
        "island-west.roce",
    ]


class _Core:
    """CoreV1Api's patch_node, recorded; ``status`` refuses every patch so."""

    def __init__(self, status: int | None = None):
        self.patches: list[tuple[str, dict]] = []
        self.status = status

    def patch_node(self, name, body):
        from kubernetes.client.rest import ApiException

        if self.status:
            raise ApiException(status=self.status, reason="Forbidden")
        self.patches.append((name, body))


def _drain(pub: topology_labels.TopologyLabels) -> None:
    pub.stop()
    pub._run()  # in this thread: what the writer's thread does, to its end


def test_the_writer_patches_only_nodes_that_need_it_and_stops_at_a_refusal(caplog):
    from kubernetes import client

    pub = topology_labels.TopologyLabels(client.ApiClient(), NicMapping, lambda: True)
    pub.core = _Core()
    done = node("ib-9", **IB["metadata"]["labels"], **topology_labels.wanted(IB, NicMapping()))
    for kind, n in (("LISTED", IB), ("MODIFIED", done), ("DELETED", H100)):
        pub.offer(kind, n)
    _drain(pub)
    assert pub.core.patches == [
        (
            "ib-0",
            {
                "metadata": {
                    "labels": {topology.LABEL_CLUSTER: "east", topology.LABEL_ISLAND: "east.infiniband"}
                }
            },
        )
    ]
    pub = topology_labels.TopologyLabels(client.ApiClient(), NicMapping, lambda: True)
    pub.core = _Core(status=403)
    pub.offer("LISTED", IB)
    pub.offer("LISTED", H100)
    _drain(pub)
    assert pub.forbidden
    assert [r.getMessage() for r in caplog.records].count(
        "cannot publish Holmes' topology labels (Forbidden): the operator needs RBAC nodes patch "
        "(the chart's ClusterRole grants it); not trying again"
    ) == 1
    pub.offer("MODIFIED", IB)  # nothing more is queued
    assert pub._queue.empty()


def test_publishing_the_labels_wakes_no_job():
    """The node event of Holmes' own label patch leaves the node's fingerprint (what wakes every
    job) as it was; any other label still changes it."""
    from holmes.operator.watches import node_fingerprint

    published = node("ib-0", **IB["metadata"]["labels"], **topology_labels.wanted(IB, NicMapping()))
    assert node_fingerprint(published) == node_fingerprint(IB)
    assert node_fingerprint(node("ib-0", **IB["metadata"]["labels"], team="a")) != node_fingerprint(IB)


def test_a_replica_that_does_not_lead_writes_no_labels_and_the_new_leader_writes_them_all():
    """One writer per installation: the operator's replicas share the node informer's events,
    but only the one that acts (holds the Lease: Runtime.ready) patches; when it starts to act it
    goes over every node once, as what it was offered before went unwritten."""
    import asyncio
    import queue

    from kubernetes import client

    from holmes.operator import handlers, placement_facts

    rt = handlers.Runtime(client.ApiClient(), placement_facts.builtin_cost_model())
    pub = rt.labels
    assert pub is not None and rt.watches.on_node == pub.offer
    pub.stop()  # its thread ends; _drain runs the writer here
    pub._thread.join(5)
    pub._queue = queue.Queue()
    pub.core = _Core()
    rt.watches.on_node("ADDED", IB)  # a follower: dropped
    _drain(pub)
    assert pub.core.patches == []

    async def synced() -> None:
        pass

    rt.watches.synced = synced  # the caches are filled
    rt.caches.nodes.snapshot = lambda: [IB, H100]  # what the node informer holds by now
    rt.leading = asyncio.Event()
    rt.leading.set()  # the elector won the Lease

    asyncio.run(rt.become_ready())
    _drain(pub)
    assert [name for name, _ in pub.core.patches] == ["ib-0", "h-0"]
    off = handlers.Runtime(client.ApiClient(), placement_facts.builtin_cost_model(), topology_labels=False)
    assert off.labels is None and off.watches.on_node is None
    for r in (rt, off):
        for pool in r.workers.values():
            pool.shutdown(wait=False)
