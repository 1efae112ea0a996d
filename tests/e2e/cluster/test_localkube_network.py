"""Pods on the local cluster live in network namespaces of their own, as with a kubelet and a
CNI plugin: only their own interfaces, an address in the pod subnet that status.podIP reports,
reachable from other nodes' pods and from the host; hostNetwork pods keep the host's."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time

import pytest

from localkube import podnet
from tests.helpers.cluster.pods import apply, pod

pytestmark = pytest.mark.node_agent

# Prints the pod's interfaces and eth0's IPv4 address (SIOCGIFADDR), then waits to be deleted.
PROBE = """
    import fcntl, json, os, socket, struct, time
    names = sorted(os.listdir("/sys/class/net"))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ip = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", b"eth0"))[20:24])
    except OSError:
        ip = ""
    print("RESULT " + json.dumps({"names": names, "eth0": ip}), flush=True)
    time.sleep(1000)
"""


def result(cluster, namespace, name, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        log = cluster.pod_log(namespace, name, "main")
        lines = [ln for ln in log.splitlines() if ln.startswith("RESULT ")]
        if lines:
            return json.loads(lines[-1][len("RESULT ") :])
        time.sleep(0.2)
    raise AssertionError(f"{name} printed no RESULT: {cluster.pod_log(namespace, name, 'main')}")


def octet(cluster) -> int:
    return json.loads((cluster.state_dir / "cluster.json").read_text())["podIPOctet"]


def host_netdevs() -> set[str]:
    """The host's interfaces, without the ones pods come and go with."""
    return {n for n in os.listdir("/sys/class/net") if not n.startswith(("veth", "holmes-pods"))}


def test_a_pod_sees_only_its_own_interfaces_and_status_reports_its_address(cluster, namespace):
    multus = pod("multus", PROBE)
    multus["metadata"]["annotations"] = {podnet.MULTUS_ANNOTATION: "sriov-rail0"}
    apply(cluster, namespace, pod("plain", PROBE), multus)
    got = {n: result(cluster, namespace, n) for n in ("plain", "multus")}
    assert got["plain"]["names"] == ["eth0", "lo"]
    assert got["multus"]["names"] == ["eth0", "lo", "net1"]  # the Multus-style second interface
    assert podnet.BRIDGE in os.listdir("/sys/class/net")  # a host netdev no pod sees
    first, last = (ipaddress.IPv4Address(a) for a in podnet.agent_range(podnet.pod_subnet(), octet(cluster)))
    for name in ("plain", "multus"):
        st = cluster.get_json("pod", name, "-n", namespace)["status"]
        assert got[name]["eth0"] == st["podIP"] == st["podIPs"][0]["ip"]
        assert first <= ipaddress.IPv4Address(st["podIP"]) <= last
        assert st["hostIP"] == podnet.host_address(podnet.pod_subnet())
    uid = cluster.get_json("pod", "plain", "-n", namespace)["metadata"]["uid"]
    netns = podnet.netns_name(octet(cluster), uid)
    assert netns in podnet.namespaces()
    cluster.kubectl("delete", "pod", "plain", "-n", namespace, "--grace-period=1", "--wait=true", timeout=30)
    end = time.monotonic() + 10
    while netns in podnet.namespaces() and time.monotonic() < end:
        time.sleep(0.1)
    assert netns not in podnet.namespaces(), "a deleted pod's network namespace must go with it"


def test_pods_on_different_nodes_talk_pod_ip_to_pod_ip_and_the_host_reaches_them(cluster, namespace):
    a, b = cluster.topology.names[0], cluster.topology.names[-1]
    server = """
        import socket
        s = socket.create_server((socket.gethostbyname(socket.gethostname()), 29500))
        for _ in range(2):
            conn, peer = s.accept()
            conn.sendall(f"{socket.gethostname()} saw {peer[0]}".encode())
            conn.close()
    """
    client_src = """
        import socket, time
        ip = socket.gethostbyname("srv.job.{ns}.svc")
        deadline = time.monotonic() + 60
        while True:
            try:
                c = socket.create_connection((ip, 29500), timeout=2)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise SystemExit(f"never reached {{ip}}:29500: {{e}}")
                time.sleep(0.2)
        print("GOT", ip, c.recv(100).decode())
    """
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "job"},
        "spec": {"clusterIP": "None", "selector": {"job": "j"}, "ports": [{"port": 29500}]},
    }
    srv = pod("srv", server, node=a, hostname="srv", subdomain="job")
    srv["metadata"]["labels"]["job"] = "j"
    apply(cluster, namespace, headless, srv)
    srv_ip = cluster.wait_pod(namespace, "srv", phases=("Running",))["status"]["podIP"]
    end = time.monotonic() + 60
    while True:  # from the host's namespace, as the operator reads a trainer's metrics
        try:
            with socket.create_connection((srv_ip, 29500), timeout=2) as c:
                assert c.recv(100).decode() == f"srv saw {podnet.host_address(podnet.pod_subnet())}"
            break
        except ConnectionRefusedError:
            assert time.monotonic() < end, f"the host never reached {srv_ip}:29500"
            time.sleep(0.2)
    apply(cluster, namespace, pod("cli", client_src.format(ns=namespace), node=b))
    done = cluster.wait_pod(namespace, "cli", timeout=90)
    out = cluster.pod_log(namespace, "cli", "main")
    assert done["status"]["phase"] == "Succeeded", out
    assert f"GOT {srv_ip} srv saw {done['status']['podIP']}" in out  # no NAT on the way
    assert cluster.wait_pod(namespace, "srv")["status"]["phase"] == "Succeeded"


def test_a_host_network_pod_stays_in_the_hosts_namespace(cluster, namespace):
    apply(cluster, namespace, pod("hostnet", PROBE, hostNetwork=True))
    got = result(cluster, namespace, "hostnet")
    assert host_netdevs() <= set(got["names"]), got
    st = cluster.get_json("pod", "hostnet", "-n", namespace)["status"]
    assert st["podIP"].startswith(f"127.{octet(cluster)}.") and st["hostIP"] == "127.0.0.1"
    uid = cluster.get_json("pod", "hostnet", "-n", namespace)["metadata"]["uid"]
    assert podnet.netns_name(octet(cluster), uid) not in podnet.namespaces()
    cluster.kubectl("delete", "pod", "hostnet", "-n", namespace, "--grace-period=0", "--force", check=False)


def test_the_hosts_file_names_the_pod_before_its_command_starts(cluster, namespace):
    """A pod resolves its own name at once (torch's rendezvous does); inside its namespace a miss
    in /etc/hosts fails at once too, as there is no DNS server to wait for."""
    p = pod("early", "")
    p["spec"].update(hostname="early", subdomain="job")
    p["spec"]["containers"][0]["command"] = ["cat", "/etc/hosts"]
    apply(cluster, namespace, p)
    done = cluster.wait_pod(namespace, "early")
    assert f"{done['status']['podIP']}\tearly.job.{namespace}.svc" in cluster.pod_log(
        namespace, "early", "main"
    )
