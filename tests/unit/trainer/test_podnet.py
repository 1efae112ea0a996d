"""The pod's network names, resolved inside the pod (holmes.launch.podnet): the socket interface
from the route to the rendezvous, the HCAs from what the pod sees (fake sysfs/dev trees), the
RoCE GID left to NCCL but checked, template values that win or stop the pod with a message, and
the same names on both sides of the operator/pod contract."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from holmes_dev.ports import free_port

from holmes.contract import jobspec
from holmes.contract import names as contract
from holmes.launch import netenv, podnet
from holmes.launch.podnet import Iface, NetError, PodView, Reach, resolve
from holmes.trainer.fabric import rdma_problems
from tests.helpers.labeller.fakesysfs import FakeSysfs
from tests.helpers.trainer.fakepod import V1, V2, ib_hca, ipv4_gid, roce_hca, roce_table, set_gid, verbs

HOST_NAME = "eno12399np0"  # what the labeller annotates on a real host: absent in a pod's namespace


def ifaces(**addrs: str) -> tuple[Iface, ...]:
    """lo plus the named interfaces, each with one address (``eth0="10.244.1.5/24"``)."""
    out = [Iface("lo", (ipaddress.ip_interface("127.0.0.1/8"),))]
    out += [Iface(name, (ipaddress.ip_interface(a),)) for name, a in addrs.items()]
    return tuple(out)


POD = ifaces(eth0="10.244.1.5/24", net1="192.168.10.4/24")  # Multus: eth0 + a secondary network
TO_MASTER = Reach("job-0-0.job.ns.svc", 29500, "10.244.0.7", "10.244.1.5")


def pod_view(pod: Path, interfaces: tuple[Iface, ...] = POD) -> PodView:
    return PodView(interfaces, podnet.read_hcas(pod / "sys"), podnet.read_devices(pod / "dev"))


# ---- the socket interface ----------------------------------------------------------------------


def test_a_pod_uses_the_interface_that_reaches_the_rendezvous_not_the_hosts_name():
    env = {"HOLMES_NIC": "ethernet", "HOLMES_POD_NETWORK": "podNetwork"}
    out = resolve(PodView(POD), env, TO_MASTER)
    assert out.env == {"NCCL_SOCKET_IFNAME": "=eth0", "GLOO_SOCKET_IFNAME": "eth0"}
    assert "10.244.1.5" in out.report["socket"]["why"] and "job-0-0.job.ns.svc" in out.report["socket"]["why"]
    # the route decides, not the interface order: a peer on the secondary network is reached on net1
    other = Reach("10.0.0.1", 1, "192.168.10.9", "192.168.10.4")
    assert resolve(PodView(POD), env, other).env["GLOO_SOCKET_IFNAME"] == "net1"


def test_rank_0_reaches_its_own_name_through_the_interface_holding_its_ip():
    own = Reach("job-0-0.job.ns.svc", 29500, "10.244.1.5", "10.244.1.5")
    assert resolve(PodView(POD), {}, own).env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_a_pod_ip_served_by_the_loopback_route_resolves_to_lo():
    """The local node agent's pods share the host's namespace with 127.x addresses no interface holds."""
    local = Reach("job-0-0", 29500, "127.16.0.3", "127.0.0.1")
    assert resolve(PodView(ifaces()), {}, local).env["GLOO_SOCKET_IFNAME"] == "lo"
    assert podnet.interface_of(PodView(ifaces()), "127.16.0.9").name == "lo"


def test_a_host_interface_name_in_the_template_stops_the_pod_naming_it():
    env = {"NCCL_SOCKET_IFNAME": HOST_NAME}
    with pytest.raises(NetError) as e:
        resolve(PodView(POD), env, TO_MASTER)
    msg = str(e.value)
    assert f"NCCL_SOCKET_IFNAME={HOST_NAME}" in msg and "eth0 (10.244.1.5), net1 (192.168.10.4)" in msg
    assert "reaches MASTER_ADDR=job-0-0.job.ns.svc" in msg and "remove it from the pod template" in msg
    with pytest.raises(NetError, match=f"GLOO_SOCKET_IFNAME={HOST_NAME} .* names {HOST_NAME}"):
        resolve(PodView(POD), {"GLOO_SOCKET_IFNAME": HOST_NAME}, TO_MASTER)


def test_a_template_value_the_pod_has_wins():
    out = resolve(PodView(POD), {"NCCL_SOCKET_IFNAME": "net"}, TO_MASTER)  # NCCL's prefix match
    assert "NCCL_SOCKET_IFNAME" not in out.env and out.env["GLOO_SOCKET_IFNAME"] == "net1"
    assert out.report["socket"]["note"] == "the rendezvous is reached through eth0, not through these"
    out = resolve(PodView(POD), {"NCCL_SOCKET_IFNAME": "^lo,net", "GLOO_SOCKET_IFNAME": "eth0"}, TO_MASTER)
    assert out.env == {}


def test_nccl_interface_list_syntax():
    names = ["lo", "eth0", "eth01", "net1"]
    assert podnet.select_ifaces(names, "eth0") == ["eth0", "eth01"]
    assert podnet.select_ifaces(names, "=eth0") == ["eth0"]
    assert podnet.select_ifaces(names, "^lo,eth") == ["net1"]


def test_the_rendezvous_is_retried_for_a_bounded_time_then_named(tmp_path):
    now, slept = [0.0], []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    with pytest.raises(NetError, match=r"MASTER_ADDR=no-such-pod\.invalid \(port 29500\) cannot be reached"):
        podnet.reach("no-such-pod.invalid", 29500, timeout_s=3, clock=lambda: now[0], sleep=sleep)
    assert len(slept) == 3  # it kept asking until the deadline
    found = podnet.reach("localhost", 29500)
    assert found.local_ip in ("127.0.0.1", "::1") and found.master_ip == found.local_ip


def test_interfaces_come_from_the_kernel_with_every_address():
    """rtnetlink's dump agrees with iproute2's, secondary addresses included."""
    ip = shutil.which("ip")
    if ip is None:
        pytest.skip("iproute2 is not installed")
    listed = json.loads(subprocess.run([ip, "-j", "addr"], capture_output=True, text=True, check=True).stdout)
    want = {
        (link["ifname"], f"{a['local']}/{a['prefixlen']}")
        for link in listed
        for a in link.get("addr_info", [])
    }
    got = {(i.name, str(a)) for i in podnet.interfaces() for a in i.addrs}
    assert got == want and ("lo", "127.0.0.1/8") in got


# ---- HCAs ------------------------------------------------------------------------------------


def test_a_pod_with_an_sriov_vf_uses_the_vfs_name(tmp_path):
    """Under SR-IOV the pod sees its VF (mlx5_12 here), not the host's rails the operator names."""
    fs = FakeSysfs(tmp_path / "sys")
    roce_hca(fs, "mlx5_12", "192.168.10.4")
    verbs(tmp_path, {"mlx5_12": 12})
    env = {"HOLMES_NIC": "roce", "HOLMES_POD_NETWORK": "podNetwork", "HOLMES_HOST_HCAS": "mlx5_0,mlx5_1"}
    out = resolve(pod_view(tmp_path), env, TO_MASTER)
    assert out.env["NCCL_IB_HCA"] == "=mlx5_12:1" and not out.problems
    assert "SR-IOV" in out.report["hca"]["why"][0]
    assert "NCCL_IB_GID_INDEX" not in out.env and out.report["gid"]["roceV2"] == {"mlx5_12:1": [3]}
    with pytest.raises(NetError) as e:  # the host's name, set by hand in the template
        resolve(pod_view(tmp_path), {**env, "NCCL_IB_HCA": "=mlx5_0"}, TO_MASTER)
    msg = str(e.value)
    assert "NCCL_IB_HCA==mlx5_0" in msg and "the pod has mlx5_12" in msg and "remove it" in msg


def test_shared_rdma_devices_keep_the_rails_the_pod_can_open(tmp_path):
    """The shared device plugin leaves every HCA in the pod's sysfs but mounts only its
    resource's verbs devices; the front-end port (mlx5_2) is not a rail."""
    fs = FakeSysfs(tmp_path / "sys")
    for i, hca in enumerate(["mlx5_0", "mlx5_1", "mlx5_2"]):
        roce_hca(fs, hca, f"10.0.{i}.5")
    verbs(tmp_path, {"mlx5_0": 0, "mlx5_1": 1, "mlx5_2": 2}, mounted=["mlx5_0", "mlx5_1", "mlx5_2"])
    env = {"HOLMES_NIC": "roce", "HOLMES_HOST_HCAS": "mlx5_0,mlx5_1"}
    assert resolve(pod_view(tmp_path), env, TO_MASTER).env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    (tmp_path / "dev" / "infiniband" / "uverbs1").unlink()  # not this pod's resource
    out = resolve(pod_view(tmp_path), env, TO_MASTER)
    assert out.env["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert any("mlx5_1: no verbs device" in w for w in out.report["hca"]["why"])


def test_host_network_uses_only_the_nodes_rails(tmp_path):
    """A DGX-like host: four IB rails, a storage port in Ethernet mode, and an IB port that is not
    a compute rail; under hostNetwork the host's names are the pod's."""
    fs = FakeSysfs(tmp_path / "sys")
    for i in range(4):
        ib_hca(fs, f"mlx5_{i}")
    roce_hca(fs, "mlx5_4", "10.1.0.5")
    ib_hca(fs, "mlx5_5")
    ib_hca(fs, "mlx5_6", state="1: DOWN")
    rails = "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_6"
    env = {"HOLMES_NIC": "infiniband", "HOLMES_POD_NETWORK": "hostNetwork", "HOLMES_HOST_HCAS": rails}
    out = resolve(pod_view(tmp_path), env, TO_MASTER)
    assert out.env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert "hostNetwork" in out.report["hca"]["why"][0] and "mlx5_6:1" in out.report["hca"]["why"][1]
    out = resolve(pod_view(tmp_path), {**env, "HOLMES_HOST_HCAS": "mlx5_0,mlx5_9"}, TO_MASTER)
    assert out.env["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert out.problems == ["HOLMES_HOST_HCAS names mlx5_9, not under /sys/class/infiniband on this host"]
    # without the hint, every ACTIVE port of the node's link layer (the storage port is RoCE)
    out = resolve(pod_view(tmp_path), {"HOLMES_NIC": "infiniband"}, TO_MASTER)
    assert out.env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_5:1"


def test_no_usable_port_is_reported_and_nccl_ib_hca_left_unset(tmp_path):
    out = resolve(pod_view(tmp_path), {"HOLMES_NIC": "infiniband"}, TO_MASTER)
    assert "NCCL_IB_HCA" not in out.env
    assert out.problems == [
        "no usable InfiniBand port among the RDMA devices this pod sees "
        "(none under /sys/class/infiniband): NCCL_IB_HCA left unset"
    ]
    assert resolve(pod_view(tmp_path), {"HOLMES_NIC": "ethernet"}, TO_MASTER).env.keys() == {
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
    }


# ---- RoCE GIDs ---------------------------------------------------------------------------------


def test_a_roce_v1_only_port_is_refused(tmp_path):
    fs = FakeSysfs(tmp_path / "sys")
    roce_hca(fs, "mlx5_0", "10.0.0.5", v2=False)
    roce_hca(fs, "mlx5_1", "10.0.1.5")
    verbs(tmp_path, {"mlx5_0": 0, "mlx5_1": 1})
    env = {"HOLMES_NIC": "roce"}
    out = resolve(pod_view(tmp_path), env, TO_MASTER)
    assert out.env["NCCL_IB_HCA"] == "=mlx5_1:1"
    assert out.problems == [
        "no RoCE v2 GID on RoCE port mlx5_0:1 (NCCL would fall back to index 0, not routable; "
        "give the port's netdev an IP address in the pod's network)"
    ]
    # the device preflight refuses it too, with NCCL's own choice or any index set by hand
    assert rdma_problems(tmp_path / "sys", tmp_path / "dev", {"NCCL_IB_HCA": "mlx5_0"}) == out.problems
    (p,) = rdma_problems(
        tmp_path / "sys", tmp_path / "dev", {"NCCL_IB_HCA": "mlx5_0", "NCCL_IB_GID_INDEX": "2"}
    )
    assert p.startswith("NCCL_IB_GID_INDEX=2 is not RoCE v2 on RoCE port mlx5_0:1 (IB/RoCE v1, 10.0.0.5)")


def test_an_explicit_gid_index_must_be_routable_roce_v2(tmp_path):
    fs = FakeSysfs(tmp_path / "sys")
    roce_hca(fs, "mlx5_0", "10.0.0.5")
    verbs(tmp_path, {"mlx5_0": 0})
    env = {"HOLMES_NIC": "roce"}
    out = resolve(pod_view(tmp_path), {**env, "NCCL_IB_GID_INDEX": "3"}, TO_MASTER)
    assert "NCCL_IB_GID_INDEX" not in out.env and out.report["gid"]["index"] == "3"
    for index, why in [("2", "is not RoCE v2"), ("1", "is link-local"), ("5", "is empty")]:
        with pytest.raises(NetError) as e:
            resolve(pod_view(tmp_path), {**env, "NCCL_IB_GID_INDEX": index}, TO_MASTER)
        msg = str(e.value)
        assert f"NCCL_IB_GID_INDEX={index} {why} on RoCE port mlx5_0:1" in msg
        assert "RoCE v2 on mlx5_0:1: 3 (RoCE v2, 10.0.0.5)" in msg and "set in the pod template" in msg
    # NCCL before 2.21 does not pick RoCE v2 itself: the index to set is named
    old = resolve(pod_view(tmp_path), env, TO_MASTER, nccl=(2, 20, 5))
    assert (
        "NCCL 2.20.5 does not pick a RoCE v2 GID itself" in old.problems[0]
        and ": 3 (RoCE v2" in old.problems[0]
    )


def test_ipv6_roce_follows_nccls_address_family(tmp_path):
    fs = FakeSysfs(tmp_path / "sys")
    fs.hca("mlx5_0", [("Ethernet", "100 Gb/sec", "4: ACTIVE")])
    set_gid(tmp_path / "sys", "mlx5_0", 1, 3, ipv4_gid("10.0.0.5"), V2)
    set_gid(tmp_path / "sys", "mlx5_0", 1, 4, "fd00:0000:0000:0000:0000:0000:0000:0005", V2)
    set_gid(tmp_path / "sys", "mlx5_0", 1, 5, "fd00:0000:0000:0000:0000:0000:0000:0006", V1)
    (port,) = podnet.read_hcas(tmp_path / "sys")[0].ports
    assert [g.index for g in podnet.nccl_gids(port, {})] == [3]
    assert [g.index for g in podnet.nccl_gids(port, {"NCCL_IB_ADDR_FAMILY": "AF_INET6"})] == [4]


# ---- the contract ---------------------------------------------------------------------------------


def test_the_pod_and_the_operator_agree_on_the_names():
    assert (netenv.ENV_POD_NETWORK, netenv.ENV_NIC, netenv.ENV_HOST_HCAS) == (
        contract.ENV_POD_NETWORK,
        contract.ENV_NIC,
        contract.ENV_HOST_HCAS,
    )
    assert (netenv.POD_NETWORK, netenv.HOST_NETWORK) == contract.NETWORKS == jobspec.NETWORKS
    assert (netenv.INFINIBAND, netenv.ROCE, netenv.ETHERNET) == contract.NIC_KINDS
    assert netenv.RESOLVED == contract.POD_RESOLVED_ENV


def test_the_engines_start_up_resolves_before_torchrun():
    from torch.distributed import run as torchrun

    from holmes.trainer import run

    argv = ["--nnodes=2", "--nproc-per-node=1", "--node-rank=1", "--rdzv-backend=static"]
    argv += ["--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", "holmes.trainer"]
    env = {**os.environ, "NCCL_SOCKET_IFNAME": HOST_NAME}
    # a process of its own: a start-up that let it through would wait in torchrun for rank 0
    r = subprocess.run(
        [sys.executable, "-m", "holmes.trainer.run", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"holmes.trainer.run: NCCL_SOCKET_IFNAME={HOST_NAME} (set in the pod template)" in r.stderr
    assert run.rendezvous(torchrun.parse_args(argv))[0] == "127.0.0.1"
    assert run.rendezvous(torchrun.parse_args(["--rdzv-endpoint=[::1]:7", "x.py"])) == ("::1", 7)
    assert run.rendezvous(torchrun.parse_args(["--standalone", "x.py"])) == ("localhost", 0)


# ---- the Socket transport's interfaces ---------------------------------------------------------


def _roce_pod(tmp_path: Path, netdevs: dict[str, str]) -> None:
    """RoCE HCAs (hca -> its netdev in the pod, with the netdev's address as the GID)."""
    fs = FakeSysfs(tmp_path / "sys")
    for i, (hca, nd) in enumerate(netdevs.items()):
        fs.hca(hca, [("Ethernet", "200 Gb/sec (4X HDR)", "4: ACTIVE")], netdevs=[(nd, 200000, 1)])
        roce_table(fs.root, hca, f"192.168.{10 + i}.4")
    verbs(tmp_path, {hca: i for i, hca in enumerate(netdevs)})


def test_socket_groups_get_the_rdma_ports_netdevs_after_the_rendezvous_interface(tmp_path):
    """Before: NCCL_SOCKET_IFNAME named only the rendezvous interface; NCCL reads it once per
    process for its bootstrap and its Socket transport, so every Socket group ran over eth0."""
    _roce_pod(tmp_path, {"mlx5_12": "net1", "mlx5_13": "net2"})
    pod = ifaces(eth0="10.244.1.5/24", net1="192.168.10.4/24", net2="192.168.11.4/24")
    env = {"HOLMES_NIC": "roce", "HOLMES_POD_NETWORK": "podNetwork"}
    # by default the rails are named, not listed: nothing in the pod tells whether they are
    # routed between the islands the Socket groups cross
    plain = resolve(pod_view(tmp_path, pod), env, TO_MASTER)
    assert plain.env["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert "set HOLMES_SOCKET_RAILS=routed" in plain.report["socket"]["rails"]
    env["HOLMES_SOCKET_RAILS"] = "routed"  # the admin's word
    out = resolve(pod_view(tmp_path, pod), env, TO_MASTER)
    assert out.env["NCCL_SOCKET_IFNAME"] == "=eth0,net1,net2"
    assert out.env["GLOO_SOCKET_IFNAME"] == "eth0"  # gloo's host groups: the rendezvous interface
    assert podnet.select_ifaces(["lo", "eth0", "net1", "net2"], out.env["NCCL_SOCKET_IFNAME"]) == [
        "eth0",
        "net1",
        "net2",
    ]
    assert "net1, net2: the RDMA ports' netdevs" in out.report["socket"]["why"]


def test_a_netdev_before_the_rendezvous_interface_is_left_out_for_nccls_bootstrap(tmp_path):
    """NCCL's bootstrap takes the first listed interface in getifaddrs' order (IPv4 first): a
    rail netdev with a lower index would move it off the interface that reaches the rendezvous."""
    _roce_pod(tmp_path, {"mlx5_0": "ens1", "mlx5_1": "ens9"})
    host = (
        Iface("lo", (ipaddress.ip_interface("127.0.0.1/8"),)),
        Iface("ens1", (ipaddress.ip_interface("192.168.10.4/24"),)),
        Iface("eth0", (ipaddress.ip_interface("10.244.1.5/24"),)),
        Iface("ens9", (ipaddress.ip_interface("192.168.11.4/24"),)),
    )
    out = resolve(
        pod_view(tmp_path, host), {"HOLMES_NIC": "roce", "HOLMES_SOCKET_RAILS": "routed"}, TO_MASTER
    )
    assert out.env["NCCL_SOCKET_IFNAME"] == "=eth0,ens9"
    assert "ens1: NCCL's bootstrap would take it" in out.report["socket"]["leftOut"]
    assert podnet.bootstrap_interface(PodView(host), ["eth0", "ens9"]) == "eth0"
    v6 = Iface("ens1", (ipaddress.ip_interface("fd00::4/64"),))  # IPv6 only: after every IPv4 address
    assert podnet.bootstrap_interface(PodView((v6, host[2])), ["ens1", "eth0"]) == "eth0"


def test_ipoib_and_template_values_are_not_extended(tmp_path):
    fs = FakeSysfs(tmp_path / "sys")
    fs.hca("mlx5_0", [("InfiniBand", "200 Gb/sec (4X HDR)", "4: ACTIVE")], netdevs=[("ib0", 200000, 32)])
    verbs(tmp_path, {"mlx5_0": 0})
    pod = ifaces(eth0="10.244.1.5/24", ib0="192.168.10.4/24")
    ib = {"HOLMES_NIC": "infiniband", "HOLMES_SOCKET_RAILS": "routed"}
    assert (
        resolve(pod_view(tmp_path, pod), ib, TO_MASTER).env["NCCL_SOCKET_IFNAME"] == "=eth0"
    )  # IB: its fabric's
    _roce_pod(tmp_path / "r", {"mlx5_12": "net1"})
    roce = ifaces(eth0="10.244.1.5/24", net1="192.168.10.4/24")
    mine = {"HOLMES_NIC": "roce", "NCCL_SOCKET_IFNAME": "=eth0", "HOLMES_SOCKET_RAILS": "routed"}
    assert "NCCL_SOCKET_IFNAME" not in resolve(pod_view(tmp_path / "r", roce), mine, TO_MASTER).env
