"""Pod network namespaces made the CNI way (hack/localkube/podnet.py) and the API relay into them
(apiproxy.py), on this host, without a control plane: real namespaces, bridge and plugins."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from localkube import podnet
from localkube.apiproxy import ApiForwarder
from localkube.controlplane import ControlPlane

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def in_pod(net: podnet.PodNet, code: str, timeout: float = 20) -> str:
    r = subprocess.run(
        ["ip", "netns", "exec", net.netns, "python3", "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture
def network(tmp_path):
    (tmp_path / "pods").mkdir()
    net = podnet.PodNetwork(tmp_path, podnet.pick_octet())
    net.claim()
    yield net
    net.remove_leftovers()
    net.release()


def test_a_pod_sees_only_its_own_interfaces_and_its_address_is_in_its_agents_range(network):
    pod = network.add("uid-a", [])
    try:
        names = json.loads(
            in_pod(pod, "import os, json; print(json.dumps(sorted(os.listdir('/sys/class/net'))))")
        )
        assert names == ["eth0", "lo"]
        assert podnet.BRIDGE in os.listdir("/sys/class/net")  # a host netdev the pod must not see
        start, end = podnet.agent_range(network.subnet, network.octet)
        ip = ipaddress.IPv4Address(pod.ip)
        assert ipaddress.IPv4Address(start) <= ip <= ipaddress.IPv4Address(end)
        shown = in_pod(
            pod,
            "import subprocess; print(subprocess.run(['ip','-4','-o','addr','show','eth0'],"
            "capture_output=True, text=True).stdout)",
        )
        assert f"inet {pod.ip}/16" in shown
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"  # nothing routes
    finally:
        network.delete(pod, [])
    assert pod.netns not in podnet.namespaces()


def test_pods_reach_each_other_and_the_host_reaches_them(network):
    a, b = network.add("uid-a", []), network.add("uid-b", ["net1"])
    server = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            b.netns,
            "python3",
            "-c",
            f"import socket\ns = socket.create_server(('{b.ip}', 5555)); print('up', flush=True)\n"
            "for _ in range(2):\n    c, _ = s.accept(); c.sendall(b'hi'); c.close()",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == "up"
        assert (
            in_pod(a, f"import socket; print(socket.create_connection(('{b.ip}', 5555), timeout=5).recv(9))")
            == "b'hi'\n"
        )
        with socket.create_connection((b.ip, 5555), timeout=5) as c:  # from the host's namespace
            assert c.recv(9) == b"hi"
        assert server.wait(timeout=10) == 0
        assert sorted(b.extra) == ["net1"] and b.extra["net1"].startswith("10.245.")
        assert "net1" in in_pod(b, "import os; print(os.listdir('/sys/class/net'))")
    finally:
        server.kill()
        network.delete(a, [])
        network.delete(b, ["net1"])


def test_the_api_relay_reaches_a_server_that_listens_on_the_hosts_loopback_only(network):
    pod = network.add("uid-a", [])
    host = socket.create_server(("127.0.0.1", 0))
    port = host.getsockname()[1]

    def answer():
        c, _ = host.accept()
        c.sendall(c.recv(100).upper())
        c.close()

    threading.Thread(target=answer, daemon=True).start()
    relay = ApiForwarder(pod.path, port)
    try:
        code = (
            f"import socket; c = socket.create_connection(('127.0.0.1', {port}), timeout=5); "
            "c.sendall(b'ping'); print(c.recv(9))"
        )
        assert in_pod(pod, code) == "b'PING'\n"
    finally:
        relay.stop()
        host.close()
        network.delete(pod, [])
    with pytest.raises(OSError, match="cannot listen on 127.0.0.1"):
        ApiForwarder(pod.path, port)  # the namespace is gone


def test_a_crashed_agents_namespaces_are_removed_by_down(tmp_path):
    """An agent killed with SIGKILL leaves its namespaces; `localkube down` (ControlPlane.down)
    removes them once no running agent owns the octet."""
    (tmp_path / "pods").mkdir()
    octet = podnet.pick_octet()
    crashed = podnet.PodNetwork(tmp_path, octet)
    crashed.claim()
    left = [crashed.add("uid-a", []), crashed.add("uid-b", ["net1"])]
    crashed.release()  # the lock goes with the dead process; nothing was torn down
    assert {p.netns for p in left} <= set(podnet.namespaces())
    (tmp_path / "cluster.json").write_text(json.dumps({"podIPOctet": octet, "pids": {}}))
    ControlPlane(tmp_path).down(log=lambda m: None)
    assert not {p.netns for p in left} & set(podnet.namespaces())
    others = [n for n in podnet.namespaces() if podnet.OWNED.match(n)]
    assert others or not Path(f"/sys/class/net/{podnet.BRIDGE}").exists()


def test_an_octet_owned_by_a_running_agent_is_neither_picked_nor_cleaned(network):
    pod = network.add("uid-a", [])
    try:
        other = podnet.PodNetwork(Path("/nonexistent"), network.octet)
        with pytest.raises(podnet.NetworkError, match=f"octet {network.octet} is owned by another running"):
            other.claim()
        podnet.release_leftovers(Path("/nonexistent"), network.octet)  # `down` of another state dir
        assert pod.netns in podnet.namespaces()
    finally:
        network.delete(pod, [])
