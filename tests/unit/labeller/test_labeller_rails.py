"""The labeller on GPU servers that have compute rails and other ports (issue 34, defect 3): the
rails are the HCAs near the GPUs (else the fastest ports' majority link layer, or an admin's
selector); the other ports neither set the NIC kind nor land in NCCL_IB_HCA, and the node says
why they were left out. Fake sysfs trees as real files, read by the real reader."""

from __future__ import annotations

import pytest

from holmes.labeller.__main__ import parse_args
from holmes.labeller.labels import desired_labels, plan_patch, rail_selector
from holmes.labeller.rails import RailSelector
from holmes.labeller.route_table import default_route_ifname, read_default_route
from holmes.labeller.sysfs import read_sysfs
from holmes.plan import classify_node, nccl_env
from tests.helpers.labeller.fakesysfs import NDR, FakeSysfs, gpu_server, route_table
from tests.helpers.labeller.labeller_helpers import apply, nfd_node

RAILS = ",".join(f"mlx5_{i}" for i in range(8))
HDR = "200 Gb/sec (4X HDR)"
# A DGX/HGX node's other ports, in Ethernet mode, on root ports with no GPU below them.
FRONT_END = ("mlx5_8", "Ethernet", HDR, "enp170s0f0np0", 200000, 0)
STORAGE = ("mlx5_9", "Ethernet", HDR, "enp41s0f0np0", 200000, 1)


def test_hgx_infiniband_rails_beside_ethernet_mode_front_end_and_storage_ports(tmp_path):
    gpu_server(tmp_path, others=[FRONT_END, STORAGE])
    facts = read_sysfs(tmp_path)
    assert len(facts.gpus) == 8 and all(g.bridges for g in facts.gpus)
    d = desired_labels(facts)
    assert not d.problems, d.problems
    assert d.labels == {
        "holmes.dev/nic": "infiniband",
        "holmes.dev/nic-gbps": "3200",  # 8 x 400: the Ethernet ports are not counted
        "holmes.dev/link-layer": "InfiniBand",
    }
    assert d.annotations["holmes.dev/nic-hcas"] == RAILS
    assert d.annotations["holmes.dev/nic-other"] == (
        "mlx5_8/1 (Ethernet, 200 Gb/s): shares no PCIe switch or root port with a GPU; "
        "mlx5_9/1 (Ethernet, 200 Gb/s): shares no PCIe switch or root port with a GPU"
    )
    assert "rails by PCIe locality" in d.summary
    # IPoIB is no socket interface: the fastest up Ethernet is an Ethernet-mode port, not a rail's;
    # of the two equally fast ones, the one holding the default route (else the first by name).
    assert d.annotations["holmes.dev/socket-ifname"] == "enp41s0f0np0"
    routed = desired_labels(facts, default_route="enp170s0f0np0")
    assert routed.annotations["holmes.dev/socket-ifname"] == "enp170s0f0np0"
    # What discovery and the NCCL settings make of it, as `kubectl describe node` shows it.
    node = apply(nfd_node(), plan_patch(nfd_node()["metadata"], d).patch)
    n = classify_node(node)
    assert n.usable and (n.nic, n.gbps, n.hcas) == ("infiniband", 3200.0, tuple(RAILS.split(",")))
    # the rails reach a pod only as the hostNetwork hint; the pod resolves what it sees
    assert "NCCL_IB_HCA" not in nccl_env(n)
    assert "holmes.dev/nic-problem" not in node["metadata"]["annotations"]


def test_roce_node_front_end_port_is_not_a_rail_and_the_default_route_names_the_socket(tmp_path):
    # The front-end ConnectX runs at the rails' speed and link layer: only PCIe tells them apart.
    fs = gpu_server(
        tmp_path,
        rail_links=("Ethernet",) * 8,
        others=[("mlx5_8", "Ethernet", NDR, "enp170s0f0np0", 200000, 0)],
    )
    # an SR-IOV VF of rail mlx5_0 (the host has VFs enabled): same port, never a second rail
    pf = fs.root / "class" / "infiniband" / "mlx5_0" / "device"
    fs.hca("mlx5_10", [("Ethernet", NDR, "4: ACTIVE")], parent=pf.resolve().parent, physfn=pf.resolve())
    facts = read_sysfs(tmp_path)
    ifname, note = read_default_route(None)
    d = desired_labels(facts, default_route=ifname, route_note=note)
    assert d.labels == {
        "holmes.dev/nic": "roce",
        "holmes.dev/nic-gbps": "3200",
        "holmes.dev/link-layer": "Ethernet",
    }
    assert d.annotations["holmes.dev/nic-hcas"] == RAILS
    other = d.annotations["holmes.dev/nic-other"]
    assert "mlx5_8/1 (Ethernet, 400 Gb/s): shares no PCIe switch or root port with a GPU" in other
    vf = facts.ports[-1]
    assert (
        vf.hca == "mlx5_10"
        and f"mlx5_10/1 (Ethernet, 400 Gb/s): SR-IOV virtual function of {vf.pci.physfn}" in other
    )
    # The fastest Ethernet netdev is rail mlx5_0's; with no route table it stays, and says why.
    assert d.annotations["holmes.dev/socket-ifname"] == "ens0np0"
    assert any("ens0np0 is a netdev of compute rail mlx5_0" in n and "no route table" in n for n in d.notes)
    # With the host's route table, the front-end interface holding the default route is chosen.
    table = tmp_path / "route"
    table.write_text(route_table("enp170s0f0np0"))
    d = desired_labels(facts, default_route=read_default_route(str(table))[0])
    assert d.annotations["holmes.dev/socket-ifname"] == "enp170s0f0np0"
    assert any("enp170s0f0np0: it holds the default route" in n for n in d.notes)
    # A default route through an interface this sysfs does not have (the pod's own eth0) is no answer.
    d = desired_labels(facts, default_route="eth0")
    assert d.annotations["holmes.dev/socket-ifname"] == "ens0np0"
    assert any("eth0 is not in" in n for n in d.notes)


def test_without_gpu_topology_the_fastest_ports_majority_link_layer_are_the_rails(tmp_path):
    fs = FakeSysfs(tmp_path).base_host()  # every device on the root bus, no GPU: a VM, say
    for i in range(4):
        fs.hca(f"mlx5_{i}", [("Ethernet", NDR, "4: ACTIVE")], netdevs=[(f"ens{i}np0", 400000, 1)])
    fs.hca("mlx5_4", [("Ethernet", "100 Gb/sec (4X EDR)", "4: ACTIVE")], netdevs=[("ens4np0", 100000, 1)])
    fs.hca("mlx5_5", [("InfiniBand", NDR, "4: ACTIVE")])
    d = desired_labels(read_sysfs(tmp_path))
    assert (
        not d.problems and d.labels["holmes.dev/nic"] == "roce" and d.labels["holmes.dev/nic-gbps"] == "1600"
    )
    assert d.annotations["holmes.dev/nic-hcas"] == "mlx5_0,mlx5_1,mlx5_2,mlx5_3"
    assert d.annotations["holmes.dev/nic-other"] == (
        "mlx5_4/1 (Ethernet, 100 Gb/s): slower than the fastest ports (400 Gb/s); "
        "mlx5_5/1 (InfiniBand, 400 Gb/s): link layer InfiniBand while most of the fastest ports are Ethernet"
    )


def test_numa_picks_the_rails_where_pcie_says_nothing(tmp_path):
    fs = FakeSysfs(tmp_path).base_host()  # flat PCIe, as many VMs show it; NUMA still known
    for _ in range(4):
        fs.gpu(numa=0)
    for i in range(4):
        fs.hca(f"mlx5_{i}", [("Ethernet", NDR, "4: ACTIVE")], numa=0)
    fs.hca("mlx5_4", [("Ethernet", NDR, "4: ACTIVE")], numa=1)
    d = desired_labels(read_sysfs(tmp_path))
    assert d.annotations["holmes.dev/nic-hcas"] == "mlx5_0,mlx5_1,mlx5_2,mlx5_3"
    assert (
        d.annotations["holmes.dev/nic-other"]
        == "mlx5_4/1 (Ethernet, 400 Gb/s): on NUMA node 1, which has no GPU"
    )
    assert "NUMA locality" in d.summary


def test_an_admin_selector_wins_and_the_node_annotation_beats_the_flag(tmp_path):
    gpu_server(tmp_path, others=[FRONT_END, STORAGE])
    facts = read_sysfs(tmp_path)
    flag = rail_selector({}, "mlx5_[89]")
    d = desired_labels(facts, selector=flag)
    assert not d.problems
    assert (d.labels["holmes.dev/nic"], d.labels["holmes.dev/nic-gbps"]) == ("roce", "400")
    assert d.annotations["holmes.dev/nic-hcas"] == "mlx5_8,mlx5_9"
    assert (
        "mlx5_0/1 (InfiniBand, 400 Gb/s): not named by labeller flag --rails 'mlx5_[89]'"
        in (d.annotations["holmes.dev/nic-other"])
    )
    annotated = rail_selector({"holmes.dev/nic-rails": "mlx5_0, mlx5_1"}, "mlx5_[89]")
    assert annotated == RailSelector(("mlx5_0", "mlx5_1"), "node annotation holmes.dev/nic-rails")
    d = desired_labels(facts, selector=annotated)
    assert (
        d.annotations["holmes.dev/nic-hcas"] == "mlx5_0,mlx5_1" and d.labels["holmes.dev/nic-gbps"] == "800"
    )
    # A selector that names no ACTIVE port is the admin's mistake: a problem naming it, not a guess.
    d = desired_labels(facts, selector=rail_selector({"holmes.dev/nic-rails": "mlx4_*"}, None))
    assert "holmes.dev/nic" not in d.labels and "holmes.dev/nic-hcas" not in d.annotations
    assert d.problems == (
        "node annotation holmes.dev/nic-rails 'mlx4_*' names none of the HCAs with an ACTIVE port "
        "(mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_7, mlx5_8, mlx5_9): set it to "
        "the compute rails' HCA names or globs, comma-separated",
    )
    assert not classify_node(apply(nfd_node(), plan_patch(nfd_node()["metadata"], d).patch)).usable
    assert parse_args(["--node-name", "n", "--rails", "mlx5_[0-7]"]).rails == "mlx5_[0-7]"


def test_rails_that_truly_disagree_are_still_mixed_and_say_what_to_set(tmp_path):
    gpu_server(tmp_path, rail_links=("InfiniBand",) * 4 + ("Ethernet",) * 4, others=[FRONT_END])
    d = desired_labels(read_sysfs(tmp_path))
    assert "holmes.dev/nic" not in d.labels and "holmes.dev/nic-hcas" not in d.annotations
    (problem,) = d.problems
    assert problem.startswith(
        "the compute rails disagree (InfiniBand on mlx5_0/1, mlx5_1/1, mlx5_2/1, mlx5_3/1; "
        "Ethernet on mlx5_4/1, mlx5_5/1, mlx5_6/1, mlx5_7/1; rails chosen by PCIe locality"
    ), problem
    assert "node annotation holmes.dev/nic-rails" in problem and "--rails" in problem
    assert "e.g. holmes.dev/nic-rails=mlx5_0,mlx5_1,mlx5_2,mlx5_3" in problem
    node = apply(nfd_node(), plan_patch(nfd_node()["metadata"], d).patch)
    assert node["metadata"]["annotations"]["holmes.dev/nic-problem"] == problem
    n = classify_node(node)
    assert not n.usable and any("the compute rails disagree" in p for p in n.problems)
    # ... and doing what it says answers it.
    d = desired_labels(
        read_sysfs(tmp_path), selector=rail_selector({"holmes.dev/nic-rails": "mlx5_[0-3]"}, "")
    )
    assert not d.problems and d.annotations["holmes.dev/nic-hcas"] == "mlx5_0,mlx5_1,mlx5_2,mlx5_3"


@pytest.mark.parametrize(
    "table, ifname",
    [
        (route_table("bond0"), "bond0"),  # the lowest metric of two default routes
        ("Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n", None),
        (
            "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\neno1\t00000000\t0100A8C0\t0002\t0\t0\t0\t00000000\n",
            None,
        ),
        ("garbage\n1 2 3\n", None),
    ],
)
def test_default_route_ifname(table, ifname):
    assert default_route_ifname(table) == ifname


def test_an_unreadable_route_table_says_so(tmp_path):
    assert read_default_route(str(tmp_path / "none"))[1].startswith(f"route table {tmp_path / 'none'}: ")
    assert read_default_route("") == (
        None,
        "no route table given (--route-table): the default route is unknown",
    )
