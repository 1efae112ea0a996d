"""The node agent's pod-network planning (hack/localkube/podnet.py): pure, no namespaces made."""

from __future__ import annotations

import ipaddress

import pytest

from localkube import podnet

SUBNET = ipaddress.IPv4Network("10.244.0.0/16")


def test_each_agent_gets_its_own_slash24_and_the_host_keeps_dot_0_1():
    a, b = podnet.agent_range(SUBNET, 16), podnet.agent_range(SUBNET, 239)
    assert a == ("10.244.16.1", "10.244.16.254")
    assert b == ("10.244.239.1", "10.244.239.254")
    assert podnet.host_address(SUBNET) == "10.244.0.1"
    assert podnet.extra_subnet(SUBNET) == ipaddress.IPv4Network("10.245.0.0/16")
    with pytest.raises(podnet.NetworkError, match="octet 0 is outside 16..239"):
        podnet.agent_range(SUBNET, 0)


def test_netconf_is_a_plain_bridge_that_neither_routes_nor_masquerades(tmp_path):
    c = podnet.netconf("localkube-40", "holmes-pods0", SUBNET, 40, tmp_path)
    assert (c["type"], c["bridge"], c["isGateway"], c["ipMasq"]) == ("bridge", "holmes-pods0", False, False)
    assert c["ipam"] == {
        "type": "host-local",
        "dataDir": str(tmp_path),
        "ranges": [[{"subnet": "10.244.0.0/16", "rangeStart": "10.244.40.1", "rangeEnd": "10.244.40.254"}]],
    }


def test_the_subnet_setting_is_checked():
    assert podnet.pod_subnet({}) == SUBNET
    assert podnet.pod_subnet({"HOLMES_POD_SUBNET": "10.77.0.0/16"}) == ipaddress.IPv4Network("10.77.0.0/16")
    with pytest.raises(podnet.NetworkError, match="HOLMES_POD_SUBNET='10.77.0.0/24' must be a private /16"):
        podnet.pod_subnet({"HOLMES_POD_SUBNET": "10.77.0.0/24"})
    with pytest.raises(podnet.NetworkError, match="HOLMES_POD_SUBNET='ten' is not an IPv4 network"):
        podnet.pod_subnet({"HOLMES_POD_SUBNET": "ten"})


def test_routes_overlapping_the_pod_subnet_on_other_devices_clash():
    routes = [
        {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
        {"dst": "192.0.2.0/24", "dev": "eth0"},
        {"dst": "10.244.0.0/16", "dev": "holmes-pods0"},  # ours: fine
        {"type": "local", "dst": "10.244.0.1", "dev": "holmes-pods0", "table": "local"},
    ]
    assert podnet.clashing_routes(routes, SUBNET, {"holmes-pods0"}) == []
    flannel = routes + [{"dst": "10.244.3.0/24", "dev": "flannel.1"}, {"dst": "10.0.0.0/8", "dev": "wg0"}]
    assert podnet.clashing_routes(flannel, SUBNET, {"holmes-pods0"}) == [
        "10.244.3.0/24 dev flannel.1",
        "10.0.0.0/8 dev wg0",
    ]


def test_the_pod_address_is_read_from_the_cni_result_of_its_interface():
    result = {
        "interfaces": [
            {"name": "holmes-pods0"},
            {"name": "veth1"},
            {"name": "eth0", "sandbox": "/run/netns/x"},
        ],
        "ips": [
            {"version": "6", "interface": 2, "address": "fd00::5/64"},
            {"interface": 2, "address": "10.244.40.7/16"},
        ],
    }
    assert podnet.result_address(result, "eth0") == "10.244.40.7"
    with pytest.raises(podnet.NetworkError, match="no IPv4 address for net1"):
        podnet.result_address(result, "net1")


def test_multus_networks_become_net1_net2_or_the_interface_asked_for():
    key = podnet.MULTUS_ANNOTATION
    assert podnet.extra_interfaces(None) == []
    assert podnet.extra_interfaces({key: "sriov-a, sriov-b@rail1"}) == ["net1", "rail1"]
    assert podnet.extra_interfaces({key: '[{"name": "a"}, {"name": "b", "interface": "ib1"}]'}) == [
        "net1",
        "ib1",
    ]
    with pytest.raises(podnet.NetworkError, match="k8s.v1.cni.cncf.io/networks is not valid JSON"):
        podnet.extra_interfaces({key: "[{"})


def test_namespace_names_carry_the_agent_octet_so_leftovers_are_found():
    name = podnet.netns_name(40, "0b1c-uid")
    assert name == "lk40-0b1c-uid" and name.startswith(podnet.netns_prefix(40))
    assert podnet.OWNED.match(name) and not podnet.OWNED.match("cni-1234")
