"""The labeller without a cluster: sysfs trees built as real files -> facts -> labels -> the node
patch, and what it writes classified by holmes.plan's discovery exactly as the operator would."""

from __future__ import annotations

import json

import pytest

from holmes.labeller.labels import RECORD_ANNOTATION, Keys, desired_labels, plan_patch
from holmes.labeller.sysfs import SysfsError, parse_rate, parse_state, read_sysfs
from holmes.plan import NicMapping, classify_node, nccl_env
from tests.helpers.labeller.fakesysfs import FakeSysfs, ethernet_node, infiniband_node, roce_node
from tests.helpers.labeller.labeller_helpers import apply, nfd_node


def label_node(node: dict, root) -> dict:
    desired = desired_labels(read_sysfs(root))
    return apply(node, plan_patch(node["metadata"], desired).patch)


def test_parsers():
    assert parse_rate("200 Gb/sec (4X HDR)") == 200.0
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate("fast") is None and parse_rate(None) is None
    assert parse_state("4: ACTIVE") == "ACTIVE" and parse_state("1: DOWN") == "DOWN"


def test_infiniband_hdr_200(tmp_path):
    infiniband_node(tmp_path, hcas=2)
    facts = read_sysfs(tmp_path)
    assert [(p.hca, p.port, p.link_layer, p.rate_gbps, p.state) for p in facts.ports] == [
        ("mlx5_0", 1, "InfiniBand", 200.0, "ACTIVE"),
        ("mlx5_1", 1, "InfiniBand", 200.0, "ACTIVE"),
    ]
    assert facts.ports[0].netdevs == ("ib0",)
    d = desired_labels(facts)
    assert d.labels == {
        "holmes.dev/nic": "infiniband",
        "holmes.dev/nic-gbps": "400",
        "holmes.dev/link-layer": "InfiniBand",
    }
    # IPoIB (type 32) is not a socket interface; the management NIC is the only up hardware Ethernet.
    assert d.annotations == {"holmes.dev/nic-hcas": "mlx5_0,mlx5_1", "holmes.dev/socket-ifname": "eno1"}
    assert not d.problems


def test_roce_100_is_the_ethernet_link_layer(tmp_path):
    roce_node(tmp_path, 100)
    d = desired_labels(read_sysfs(tmp_path))
    assert d.labels == {
        "holmes.dev/nic": "roce",
        "holmes.dev/nic-gbps": "100",
        "holmes.dev/link-layer": "Ethernet",
    }
    assert d.annotations == {"holmes.dev/nic-hcas": "mlx5_0", "holmes.dev/socket-ifname": "ens1f0np0"}


def test_plain_ethernet_25_ignores_lo_and_virtual_interfaces(tmp_path):
    fs = ethernet_node(tmp_path, 25)
    fs.netdev("cni0", speed_mbps=100000, virtual=True)  # faster, but virtual: never chosen
    fs.netdev("ens3f1", speed_mbps=100000, up=False)  # faster, but down
    facts = read_sysfs(tmp_path)
    assert not facts.infiniband_class and not facts.ports
    by = {n.name: n for n in facts.netdevs}
    assert not by["lo"].physical and not by["docker0"].physical and not by["veth1a2b3c"].physical
    assert by["ens3f1"].speed_mbps is None and by["ens2f0"].speed_mbps == 25000
    d = desired_labels(facts)
    assert d.labels == {"holmes.dev/nic": "ethernet", "holmes.dev/nic-gbps": "25"}
    assert d.annotations == {"holmes.dev/socket-ifname": "ens2f0"}
    assert "socket-ifname" not in json.dumps(desired_labels(facts, socket_ifname=False).annotations)


def test_a_bond_counts_and_an_unknown_speed_leaves_gbps_to_discovery(tmp_path):
    fs = FakeSysfs(tmp_path)
    fs.netdev("lo", virtual=True, link_type=772)
    fs.netdev("bond0", speed_mbps=50000, bond=True)
    assert desired_labels(read_sysfs(tmp_path)).annotations["holmes.dev/socket-ifname"] == "bond0"
    other = tmp_path / "vm"
    FakeSysfs(other).netdev("eth0")  # virtio: no speed
    d = desired_labels(read_sysfs(other))
    assert d.labels == {"holmes.dev/nic": "ethernet"} and d.annotations == {
        "holmes.dev/socket-ifname": "eth0"
    }
    assert any("left to discovery's default" in n for n in d.notes)


def test_a_down_port_is_ignored(tmp_path):
    fs = FakeSysfs(tmp_path).base_host()
    fs.hca(
        "mlx5_0",
        [
            ("InfiniBand", "200 Gb/sec (4X HDR)", "4: ACTIVE"),
            ("InfiniBand", "200 Gb/sec (4X HDR)", "1: DOWN"),
        ],
    )
    fs.hca("mlx5_1", [("Ethernet", "100 Gb/sec (4X EDR)", "1: DOWN")])  # would be "mixed" if counted
    d = desired_labels(read_sysfs(tmp_path))
    assert d.labels["holmes.dev/nic"] == "infiniband" and d.labels["holmes.dev/nic-gbps"] == "200"
    assert d.annotations["holmes.dev/nic-hcas"] == "mlx5_0" and not d.problems
    assert any("mlx5_0/2 (DOWN)" in n and "mlx5_1/1 (DOWN)" in n for n in d.notes)
    # every RDMA port down: the node talks sockets, and says so
    fs.set_port_state("mlx5_0", 1, "1: DOWN")
    d = desired_labels(read_sysfs(tmp_path))
    assert d.labels == {"holmes.dev/nic": "ethernet", "holmes.dev/nic-gbps": "1"}


def test_mixed_infiniband_and_roce_is_a_problem_not_a_guess(tmp_path):
    # Equally fast, one of each, nothing in sysfs says which are the rails: not guessed.
    fs = infiniband_node(tmp_path)
    fs.hca("mlx5_1", [("Ethernet", "200 Gb/sec (4X HDR)", "4: ACTIVE")])
    d = desired_labels(read_sysfs(tmp_path))
    assert "holmes.dev/nic" not in d.labels and "holmes.dev/nic-hcas" not in d.annotations
    assert d.problems and "InfiniBand on mlx5_0/1; Ethernet on mlx5_1/1" in d.problems[0]
    node = label_node(nfd_node(), tmp_path)
    assert node["metadata"]["annotations"]["holmes.dev/nic-problem"] == d.problems[0]
    # even where an admin's per-cluster default would otherwise have guessed
    n = classify_node(node, NicMapping(cluster_rdma_kinds=(("east", "infiniband"),)))
    assert not n.usable and any("the compute rails disagree" in p for p in n.problems)
    # an admin who names the kind has answered it
    node["metadata"]["labels"]["holmes.dev/nic"] = "infiniband"
    assert classify_node(node).usable


def test_missing_infiniband_class_and_a_root_that_is_no_sysfs(tmp_path):
    ethernet_node(tmp_path / "sys")
    facts = read_sysfs(tmp_path / "sys")
    assert not facts.infiniband_class and facts.ports == ()
    with pytest.raises(SysfsError, match="is not a sysfs tree.*--sysfs-root"):
        read_sysfs(tmp_path / "empty")


@pytest.mark.parametrize(
    "build, kind, gbps, env",
    [
        (
            lambda p: infiniband_node(p),
            "infiniband",
            200.0,
            {"NCCL_IB_DISABLE": "0"},
        ),
        (
            lambda p: roce_node(p, 100),
            "roce",
            100.0,
            {"NCCL_IB_DISABLE": "0"},
        ),
        (
            lambda p: ethernet_node(p, 25),
            "ethernet",
            25.0,
            {"NCCL_IB_DISABLE": "1"},
        ),
    ],
)
def test_what_it_writes_is_classified_by_discovery_without_a_kind_flag(tmp_path, build, kind, gbps, env):
    build(tmp_path)
    before = classify_node(nfd_node())
    assert not before.usable, "an NFD-only node needs --cluster-rdma-kind without the labeller"
    n = classify_node(label_node(nfd_node(), tmp_path))  # default NicMapping: no kind configured
    assert (n.nic, n.gbps, n.gbps_source, n.source, n.usable) == (kind, gbps, "label", "holmes-labels", True)
    assert nccl_env(n) == env  # the host's HCAs and netdev are facts for planning, not pod env


def test_admin_keys_are_never_touched_and_stale_own_keys_are_removed(tmp_path):
    roce_node(tmp_path, 100)
    desired = desired_labels(read_sysfs(tmp_path))
    admin = nfd_node(
        labels={"holmes.dev/nic-gbps": "400", "team": "a"}, annotations={"holmes.dev/socket-ifname": "bond7"}
    )
    plan = plan_patch(admin["metadata"], desired)
    meta = plan.patch["metadata"]
    assert meta["resourceVersion"] == "42"
    assert meta["labels"] == {"holmes.dev/nic": "roce", "holmes.dev/link-layer": "Ethernet"}
    assert set(meta["annotations"]) == {"holmes.dev/nic-hcas", RECORD_ANNOTATION}
    assert plan.kept == {"holmes.dev/nic-gbps": "400", "holmes.dev/socket-ifname": "bond7"}
    node = apply(admin, plan.patch)
    assert json.loads(node["metadata"]["annotations"][RECORD_ANNOTATION]) == {
        "labels": {"holmes.dev/link-layer": "Ethernet", "holmes.dev/nic": "roce"},
        "annotations": {"holmes.dev/nic-hcas": "mlx5_0"},
    }
    assert plan_patch(node["metadata"], desired).patch is None, "a second pass changes nothing"

    # The RoCE port goes down: the labeller's own RDMA keys go, the admin's stay.
    FakeSysfs(tmp_path).set_port_state("mlx5_0", 1, "1: DOWN")
    node = apply(node, plan_patch(node["metadata"], desired_labels(read_sysfs(tmp_path))).patch)
    labels, ann = node["metadata"]["labels"], node["metadata"]["annotations"]
    assert labels["holmes.dev/nic"] == "ethernet" and "holmes.dev/link-layer" not in labels
    assert labels["holmes.dev/nic-gbps"] == "400" and ann["holmes.dev/socket-ifname"] == "bond7"
    assert "holmes.dev/nic-hcas" not in ann and labels["team"] == "a"

    # An admin overrides a labeller key by writing another value: it becomes theirs for good.
    node["metadata"]["labels"]["holmes.dev/nic"] = "infiniband"
    plan = plan_patch(node["metadata"], desired)
    assert "holmes.dev/nic" not in (plan.patch or {}).get("metadata", {}).get("labels", {})
    assert plan.kept["holmes.dev/nic"] == "infiniband"
    node = apply(node, plan.patch)
    # ... and a labeller link layer that disagrees with it makes discovery say so
    node = apply(node, plan_patch(node["metadata"], desired).patch)
    assert any("contradicts" in p for p in classify_node(node).problems)


def test_admin_label_form_of_an_annotation_and_a_broken_record(tmp_path):
    infiniband_node(tmp_path)
    desired = desired_labels(read_sysfs(tmp_path))
    node = nfd_node(labels={"holmes.dev/nic-hcas": "mlx5_3"})
    plan = plan_patch(node["metadata"], desired)
    assert "holmes.dev/nic-hcas" not in plan.patch["metadata"]["annotations"]
    assert classify_node(apply(node, plan.patch)).hcas == ("mlx5_3",)
    broken = nfd_node(labels={"holmes.dev/nic": "infiniband"}, annotations={RECORD_ANNOTATION: "{oops"})
    plan = plan_patch(broken["metadata"], desired)
    assert plan.notes and "not the labeller's JSON record" in plan.notes[0]
    assert plan.kept["holmes.dev/nic"] == "infiniband"


def test_keys_follow_discovery_mapping():
    k = Keys.from_mapping(NicMapping())
    m = NicMapping()
    assert (k.nic, k.gbps, k.link_layer, k.hcas, k.problem) == (
        m.nic_label,
        m.gbps_label,
        m.link_layer_label,
        m.hcas_key,
        m.problem_key,
    )
