"""The resolver in a real pod-like network namespace: ``eth0`` on a veth with a 10.x address, a
second (Multus-like) ``net1``, a default route, the rendezvous' DNS name in the namespace's own
hosts file (``ip netns exec`` mounts /etc/netns/<ns>/hosts over /etc/hosts), and the host's
interface name nowhere. Two namespaces the test creates (pod and peer), removed at the end.
Needs root and iproute2, as bench/fabric_netns.py does; skipped otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
HOST_NAME = "eno12399np0"
MASTER = "job-0-0.job.ns.svc"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="root and iproute2: network namespaces"
)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode:
        raise AssertionError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


@pytest.fixture
def netns() -> Iterator[tuple[str, str]]:
    """(pod namespace, peer namespace): pod eth0 10.77.0.2/24 <-> peer 10.77.0.1/24, pod net1
    192.168.77.2/24 <-> peer 192.168.77.1/24, the pod's default route via 10.77.0.1."""
    tag = str(os.getpid())
    pod, peer = f"holmes-pod-{tag}", f"holmes-peer-{tag}"
    hosts = Path("/etc/netns") / pod
    try:
        if ip("netns", "add", pod, check=False).returncode:
            pytest.skip("network namespaces (ip netns add) are not permitted here")
        ip("netns", "add", peer)
        for name, pod_ip, peer_ip in (
            ("eth0", "10.77.0.2", "10.77.0.1"),
            ("net1", "192.168.77.2", "192.168.77.1"),
        ):
            # both ends are born in the namespaces: nothing is added to this machine's own network
            ip("-n", pod, "link", "add", name, "type", "veth", "peer", "name", name, "netns", peer)
            ip("-n", pod, "addr", "add", f"{pod_ip}/24", "dev", name)
            ip("-n", peer, "addr", "add", f"{peer_ip}/24", "dev", name)
            for ns in (pod, peer):
                ip("-n", ns, "link", "set", name, "up")
        for ns in (pod, peer):
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", pod, "route", "add", "default", "via", "10.77.0.1")
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "hosts").write_text(f"127.0.0.1 localhost\n10.77.0.1 {MASTER}\n")
        yield pod, peer
    finally:
        shutil.rmtree(hosts, ignore_errors=True)
        for ns in (pod, peer):
            ip("netns", "del", ns, check=False)  # takes its veth ends with it
        assert not {pod, peer} & set(ip("netns", "list").stdout.split())


RESOLVE = """
import json, sys
from holmes.launch import podnet
env = json.loads(sys.argv[1])
try:
    podnet.setup(env, sys.argv[2], 29500, timeout_s=5, log=lambda line: None)
except podnet.NetError as e:
    print(e)
    sys.exit(2)
print(json.dumps({k: env.get(k) for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")}))
"""


def resolve_in(ns: str, master: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", RESOLVE, json.dumps(env), master],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_the_resolver_picks_eth0_inside_a_pod_namespace(netns):
    pod, _ = netns
    for master in (MASTER, "10.77.0.2"):  # a peer's DNS name; rank 0's own address
        r = resolve_in(pod, master, HOLMES_NIC="ethernet", HOLMES_POD_NETWORK="podNetwork")
        assert r.returncode == 0, r.stderr + r.stdout
        assert json.loads(r.stdout) == {"NCCL_SOCKET_IFNAME": "=eth0", "GLOO_SOCKET_IFNAME": "eth0"}
    r = resolve_in(pod, "192.168.77.1")  # a rendezvous on the secondary network is reached on net1
    assert json.loads(r.stdout)["GLOO_SOCKET_IFNAME"] == "net1"
    r = resolve_in(pod, MASTER, NCCL_SOCKET_IFNAME=HOST_NAME)
    assert r.returncode == 2
    assert (
        f"NCCL_SOCKET_IFNAME={HOST_NAME}" in r.stdout and "eth0 (10.77.0.2), net1 (192.168.77.2)" in r.stdout
    )


GLOO = """
import json, os, sys
import torch, torch.distributed as dist
from holmes.launch import podnet
rank, master, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if rank == 1:  # what gloo does with the host's name the operator used to copy into pods
    try:
        dist.ProcessGroupGloo.create_device(interface="eno12399np0")
    except RuntimeError as e:
        print(json.dumps({"host_name": str(e)}), flush=True)
podnet.setup(os.environ, master, port, timeout_s=10, log=lambda line: None)
dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=2)
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(json.dumps({"rank": rank, "sum": t.item(), "gloo": os.environ["GLOO_SOCKET_IFNAME"]}), flush=True)
dist.destroy_process_group()
"""


def test_gloo_runs_on_the_resolved_interfaces_across_two_namespaces(netns):
    """Rank 0 in the peer namespace (MASTER_ADDR is its own address), rank 1 in the pod one (a
    DNS name): each resolves its interface, and gloo's all-reduce crosses the veth."""
    pod, peer = netns
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "GLOO_", "HOLMES_", "MASTER_"))}
    port = "29517"
    procs = [
        subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", GLOO, str(rank), master, port],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for rank, ns, master in ((0, peer, "10.77.0.1"), (1, pod, MASTER))
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    lines = [json.loads(line) for out, _ in outs for line in out.splitlines()]
    assert "Unable to find address for: eno12399np0" in lines[1]["host_name"]
    assert lines[0] == {"rank": 0, "sum": 3.0, "gloo": "eth0"}
    assert lines[2] == {"rank": 1, "sum": 3.0, "gloo": "eth0"}
