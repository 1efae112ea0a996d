import copy

import pytest

from holmes.plan import NicMapping, classify_node, discovery, nccl_env
from holmes.plan.discovery import NodeNic, classify_nodes
from tests.helpers.plan.plan_helpers import node


def test_holmes_labels_win_with_speed_cluster_and_hcas():
    n = classify_node(
        node(
            "a",
            "InfiniBand",
            "east",
            gbps=400,
            labels={"holmes.dev/nic-hcas": "mlx5_0.mlx5_1"},
            allocatable={"rdma/rdma_shared_device_a": "1k"},
        )
    )
    assert (n.nic, n.gbps, n.cluster, n.gpus, n.source) == ("infiniband", 400.0, "east", 8, "holmes-labels")
    assert n.hcas == ("mlx5_0", "mlx5_1") and n.rdma_resource == "rdma/rdma_shared_device_a"
    assert n.island == "east/infiniband" and n.usable and n.gbps_source == "label"


def test_nfd_needs_a_kind_and_says_so():
    nfd = {"feature.node.kubernetes.io/rdma.capable": "true"}
    n = classify_node(node("b", labels=nfd))
    assert n.source == "nfd" and not n.usable
    assert (
        "advertises RDMA (label feature.node.kubernetes.io/rdma.capable=true) but no InfiniBand/RoCE kind"
        in n.problems[0]
    )
    assert "holmes.dev/nic" in n.problems[0]
    roce = classify_node(node("b", labels={**nfd, "holmes.dev/link-layer": "Ethernet"}))
    assert roce.nic == "roce" and roce.usable and roce.gbps == NicMapping().gbps_for("roce")
    ib = classify_node(node("b", labels=nfd), NicMapping(rdma_default_kind="infiniband"))
    assert ib.nic == "infiniband" and ib.usable
    per_cluster = NicMapping(cluster_rdma_kinds=(("east", "infiniband"), ("west", "roce")))
    assert classify_node(node("b", cluster="west", labels=nfd), per_cluster).nic == "roce"
    assert classify_node(node("b", cluster="north", labels=nfd), per_cluster).problems


def test_device_plugin_resource_alone_is_rdma_without_kind():
    n = classify_node(node("c", allocatable={"rdma/hca": "1"}))
    assert n.source == "device-plugin" and n.rdma_resource == "rdma/hca" and n.problems
    zero = classify_node(node("c", allocatable={"rdma/hca": "0"}))
    assert zero.source == "no-rdma" and zero.nic == "ethernet" and zero.rdma_resource is None
    sriov = classify_node(
        node("c", allocatable={"nvidia.com/sriov_rdma": "4"}),
        NicMapping(rdma_resource_names=("nvidia.com/sriov_rdma",), rdma_default_kind="roce"),
    )
    assert sriov.nic == "roce" and sriov.rdma_resource == "nvidia.com/sriov_rdma"


def test_plain_node_is_ethernet_and_contradictions_are_reported():
    n = classify_node(node("d", annotations={"holmes.dev/socket-ifname": "eth1"}))
    assert (n.nic, n.source, n.gbps) == ("ethernet", "no-rdma", 25.0)
    bad = classify_node(node("e", "infiniband", labels={"holmes.dev/link-layer": "Ethernet"}))
    assert any("contradicts" in p for p in bad.problems)
    assert any("not a NIC kind" in p for p in classify_node(node("f", "myrinet")).problems)
    assert any("Gbit/s" in p for p in classify_node(node("g", "roce", gbps="fast")).problems)


def test_readiness_cordon_and_custom_cluster_label():
    assert not classify_node(node("h", "roce", ready=False)).usable
    assert not classify_node(node("h", "roce", unschedulable=True)).usable
    n = classify_node(
        node("i", "roce", labels={"topology/zone": "z1"}), NicMapping(cluster_label="topology/zone")
    )
    assert n.cluster == "z1"
    assert classify_node(node("j", "roce")).cluster == "default"


def test_nccl_env_per_kind_never_sets_nccl_net():
    for kind in ("infiniband", "roce", "ethernet"):
        assert "NCCL_NET" not in nccl_env(kind)
    with pytest.raises(ValueError, match="NCCL_NET"):
        nccl_env("roce", extra={"NCCL_NET": "IB"})
    with pytest.raises(ValueError, match="unknown NIC kind"):
        nccl_env("myrinet")


def test_nccl_env_holds_facts_of_the_fabric_never_names_of_the_host():
    """Issue 34, defects 1 and 2: a pod's namespace has eth0 (net1... under Multus) and its own
    VFs, not the host's bond0 or mlx5_3; NCCL >= 2.21 picks a RoCE v2 GID itself when unset."""
    ib = classify_node(
        node(
            "a",
            "infiniband",
            annotations={"holmes.dev/nic-hcas": "mlx5_0,mlx5_3", "holmes.dev/socket-ifname": "bond0"},
        )
    )
    assert ib.hcas == ("mlx5_0", "mlx5_3")  # a fact the pods get as a hint (HOLMES_HOST_HCAS)
    assert nccl_env(ib) == {"NCCL_IB_DISABLE": "0"}
    for kind in ("infiniband", "roce", "ethernet"):
        env = nccl_env(kind, traffic_class=106, service_level=3, socket=(4, 4))
        assert not {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX"} & set(env)
        assert (env["NCCL_SOCKET_NTHREADS"], env["NCCL_NSOCKS_PERTHREAD"]) == ("4", "4")
    assert nccl_env("roce", traffic_class=106, service_level=3) == {
        "NCCL_IB_DISABLE": "0",
        "NCCL_IB_TC": "106",
        "NCCL_IB_SL": "3",
    }
    assert nccl_env("roce") == {"NCCL_IB_DISABLE": "0"}  # no class named: NCCL's defaults
    assert nccl_env("ethernet", traffic_class=106) == {"NCCL_IB_DISABLE": "1"}  # no IB transport there
    assert isinstance(ib, NodeNic)


def test_nic_problem_from_the_labeller_makes_a_node_unusable_unless_the_kind_is_labelled():
    nfd = {"feature.node.kubernetes.io/rdma.capable": "true"}
    msg = "InfiniBand and RoCE ports are both ACTIVE"
    n = classify_node(
        node("m", labels=nfd, annotations={"holmes.dev/nic-problem": msg}),
        NicMapping(rdma_default_kind="infiniband"),
    )
    assert not n.usable and n.problems == (f"holmes.dev/nic-problem: {msg}",)
    fixed = classify_node(node("m", "roce", labels=nfd, annotations={"holmes.dev/nic-problem": msg}))
    assert fixed.usable and fixed.nic == "roce"
    assert classify_node(node("m", labels={"holmes.dev/nic-problem": "x"})).problems  # label form too


def test_a_node_seen_before_is_not_classified_again(monkeypatch):
    # seen at scale (bench/operator_scale.py, 500 nodes): every search of every waiting job
    # classified every node anew, a quarter of each placement
    calls = []
    real = discovery.classify_node
    monkeypatch.setattr(discovery, "classify_node", lambda n, m=None: calls.append(1) or real(n, m))
    many = [node(f"scale-{i}", "infiniband", "east") for i in range(200)]
    first = classify_nodes(many)
    again = classify_nodes(copy.deepcopy(many))  # equal nodes (the caches hand out copies)
    assert again == first and len(calls) == 200
    # what classification reads changed: classified anew
    many[0]["metadata"]["labels"]["holmes.dev/nic"] = "roce"
    many[1]["status"]["allocatable"]["nvidia.com/gpu"] = "4"
    changed = classify_nodes(many[:2])
    assert (changed[0].nic, changed[1].gpus) == ("roce", 4) and len(calls) == 202
