"""An emulated two-island fabric in Linux network namespaces (iproute2 + tbf), for benchmarks.

    island A ("east", InfiniBand)            island B ("west", RoCE)
    node-1  node-3                           node-2  node-4          one netns per node, eth0
       \\    /                                  \\    /               shaped at --fast-mbit each way
        br-a ---- x-a ====== (trunk) ====== x-b ---- br-b           bridges + trunk in hfe-switch,
                                                                    trunk shaped at --cross-mbit

Every node is a namespace ``hfe-<node>`` with one veth ``eth0`` (10.200.0.0/24); its peer
``p-<node>`` sits in the switch namespace on its island's bridge. The two bridges are joined by
a veth pair (the trunk): traffic inside an island never touches it, traffic between islands all
goes through it. ``tbf`` on both ends of the trunk is the slow cross-cluster link; ``tbf`` on
each node's eth0 and switch port is the node's NIC (both directions). Node names are in
"purchase order" (node-1 A, node-2 B, ...), so name order interleaves the islands like the
paper's Megatron baseline.

Nothing here touches the host's interfaces, routes or addresses: every ``ip``/``tc`` command
names one of *our* namespaces (``ip -n NS``, ``ip netns add/del NS``). Names resolve per node
through ``/etc/netns/<ns>/hosts`` (``ip netns exec`` bind-mounts it over /etc/hosts).

The pure part (spec, commands, hosts files) is unit-tested; :func:`build`, :func:`destroy`,
:func:`set_trunk` and :func:`measure_mbit` run them (root only).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

PREFIX = "hfe"
SWITCH_NS = f"{PREFIX}-switch"
PROBE_NS = f"{PREFIX}-probe"
SUBNET = "10.200.0"
ETC_NETNS = "/etc/netns"
LOCK_FILE = "/run/lock/holmes-fabric.lock"
ISLANDS = {"a": ("east", "infiniband"), "b": ("west", "roce")}  # island -> (cluster label, NIC kind)
IFNAMSIZ = 15  # longest Linux interface name
CMD_TIMEOUT = 15


class FabricError(RuntimeError):
    """A command that builds or probes the fabric failed; the message names it and why."""


@dataclass(frozen=True)
class EmuNode:
    name: str  # node name, as the planner and the hosts files know it
    island: str  # "a" | "b"
    index: int  # 1-based, position in name order

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def addr(self) -> str:
        # .1x in island a, .2x in island b: readable in tcpdump and `ip -n` output
        return f"{SUBNET}.{10 * (ord(self.island) - ord('a') + 1) + self.index}"

    @property
    def port(self) -> str:
        return f"p-{self.name}"  # the node's veth peer inside the switch namespace

    @property
    def cluster(self) -> str:
        return ISLANDS[self.island][0]

    @property
    def nic(self) -> str:
        return ISLANDS[self.island][1]


@dataclass(frozen=True)
class FabricSpec:
    nodes: tuple[EmuNode, ...]
    fast_mbit: float  # each node's NIC, both directions; 0 = unshaped veth
    cross_mbit: float  # the trunk between islands, both directions; 0 = unshaped

    def node(self, name: str) -> EmuNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no emulated node {name!r}; have {', '.join(n.name for n in self.nodes)}")

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (SWITCH_NS,) + tuple(n.netns for n in self.nodes)


def two_islands(per_island: int = 2, fast_mbit: float = 2000, cross_mbit: float = 200) -> FabricSpec:
    """``2 * per_island`` nodes named node-1.. in purchase order: odd -> island a, even -> b."""
    if not 1 <= per_island <= 9:
        raise ValueError(f"per_island must be 1..9 (addresses .11-.19 / .21-.29), got {per_island}")
    if fast_mbit < 0 or cross_mbit < 0:
        raise ValueError("link rates must be >= 0 Mbit/s (0 = unshaped)")
    nodes = []
    for i in range(2 * per_island):
        island = "ab"[i % 2]
        nodes.append(EmuNode(name=f"node-{i + 1}", island=island, index=i // 2 + 1))
    return FabricSpec(tuple(nodes), fast_mbit, cross_mbit)


# ---- commands (pure) ---------------------------------------------------------------------------


def tbf_burst_bytes(mbit: float) -> int:
    """Token-bucket depth: at least 256 KiB (measured good at 200 Mbit/s), else 8 ms of line rate
    so high rates are not capped by the kernel timer."""
    return max(256 * 1024, int(mbit * 1e6 / 8 * 0.008))


def shape_cmd(ns: str, dev: str, mbit: float) -> list[str]:
    """Replace dev's root qdisc by a tbf at mbit (mbit 0: back to the default qdisc)."""
    if mbit <= 0:
        return ["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"]
    return [
        "tc",
        "-n",
        ns,
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        f"{mbit:g}mbit",
        "burst",
        str(tbf_burst_bytes(mbit)),
        "latency",
        "50ms",
    ]


def setup_commands(spec: FabricSpec) -> list[list[str]]:
    sw = SWITCH_NS
    cmds = [["ip", "netns", "add", ns] for ns in spec.namespaces]
    cmds += [["ip", "-n", sw, "link", "set", "lo", "up"]]
    for isl in ("a", "b"):
        cmds += [
            ["ip", "-n", sw, "link", "add", f"br-{isl}", "type", "bridge"],
            ["ip", "-n", sw, "link", "set", f"br-{isl}", "up"],
        ]
    cmds += [["ip", "-n", sw, "link", "add", "x-a", "type", "veth", "peer", "name", "x-b"]]
    for isl in ("a", "b"):
        cmds += [
            ["ip", "-n", sw, "link", "set", f"x-{isl}", "master", f"br-{isl}"],
            ["ip", "-n", sw, "link", "set", f"x-{isl}", "up"],
        ]
    for n in spec.nodes:
        # created inside the node's namespace, peer moved straight into the switch: never in the host's
        cmds += [
            ["ip", "-n", n.netns, "link", "add", "eth0", "type", "veth", "peer", "name", n.port, "netns", sw],
            ["ip", "-n", n.netns, "addr", "add", f"{n.addr}/24", "dev", "eth0"],
            ["ip", "-n", n.netns, "link", "set", "eth0", "up"],
            ["ip", "-n", n.netns, "link", "set", "lo", "up"],
            ["ip", "-n", sw, "link", "set", n.port, "master", f"br-{n.island}"],
            ["ip", "-n", sw, "link", "set", n.port, "up"],
        ]
        if spec.fast_mbit > 0:
            cmds += [shape_cmd(n.netns, "eth0", spec.fast_mbit), shape_cmd(sw, n.port, spec.fast_mbit)]
    if spec.cross_mbit > 0:
        cmds += trunk_commands(spec.cross_mbit)
    return cmds


def trunk_commands(cross_mbit: float) -> list[list[str]]:
    return [shape_cmd(SWITCH_NS, "x-a", cross_mbit), shape_cmd(SWITCH_NS, "x-b", cross_mbit)]


def hosts_file(spec: FabricSpec, me: EmuNode, host_names: tuple[str, ...] = ()) -> str:
    """/etc/hosts as node ``me`` sees it: every node by name, and this machine's own host name(s)
    as ``me`` (so anything that resolves the local host name gets the node's address, not DNS)."""
    lines = ["127.0.0.1 localhost"]
    lines += [
        f"{n.addr} {n.name}" + (" " + " ".join(host_names) if n is me and host_names else "")
        for n in spec.nodes
    ]
    return "\n".join(lines) + "\n"


# ---- I/O (root) --------------------------------------------------------------------------------


def run(cmd: list[str], timeout: float = CMD_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FabricError(f"`{' '.join(cmd)}` did not finish in {timeout:g} s") from None
    if check and p.returncode:
        raise FabricError(
            f"`{' '.join(cmd)}` failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}"
        )
    return p


def missing_prerequisites() -> list[str]:
    """What this machine lacks to emulate the fabric, as lines that say what to do; [] = ok."""
    problems = []
    if os.geteuid() != 0:
        problems.append("root: network namespaces and tc need root (run with sudo)")
    for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            problems.append(f"`{tool}` not found: install {pkg} (apt-get install {pkg})")
    if problems:
        return problems
    # probe in a throwaway namespace: netns, veth, bridge, sch_tbf
    run(["ip", "netns", "del", PROBE_NS], check=False)
    try:
        steps = [
            (["ip", "netns", "add", PROBE_NS], "network namespaces (ip netns add) are not permitted here"),
            (
                ["ip", "-n", PROBE_NS, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                "the kernel has no veth support (CONFIG_VETH / modprobe veth)",
            ),
            (
                ["ip", "-n", PROBE_NS, "link", "add", "b0", "type", "bridge"],
                "the kernel has no bridge support (CONFIG_BRIDGE / modprobe bridge)",
            ),
            (
                shape_cmd(PROBE_NS, "v0", 200),
                "the tbf qdisc is missing (CONFIG_NET_SCH_TBF / modprobe sch_tbf)",
            ),
        ]
        for cmd, why in steps:
            p = run(cmd, check=False)
            if p.returncode:
                problems.append(f"{why}: `{' '.join(cmd)}` said: {p.stderr.strip()}")
                break
    finally:
        run(["ip", "netns", "del", PROBE_NS], check=False)
    return problems


@contextmanager
def exclusive(log=lambda m: print(m, file=sys.stderr)) -> Iterator[None]:
    """Hold the machine's one emulated fabric: its namespace names are fixed, so a second run
    (a test beside a measurement) would find them taken, or remove them as leftovers. Without
    root there is no fabric to protect (and no writing another user's lock file)."""
    if os.geteuid() != 0:
        yield
        return
    with open(LOCK_FILE, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another emulated fabric is running (lock {LOCK_FILE}): waiting for it to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield  # the lock goes with the file


def existing_namespaces() -> set[str]:
    out = run(["ip", "netns", "list"]).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def destroy(spec: FabricSpec) -> list[str]:
    """Remove our namespaces (their veths and qdiscs go with them) and hosts dirs, by exact name.
    Idempotent; returns what it removed."""
    removed = []
    have = existing_namespaces()
    for ns in spec.namespaces + (PROBE_NS,):
        if ns in have:
            run(["ip", "netns", "del", ns], check=False)
            removed.append(f"netns {ns}")
        d = os.path.join(ETC_NETNS, ns)
        if os.path.isdir(d):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    try:
        os.rmdir(ETC_NETNS)  # only if empty: someone else's entries stay
    except OSError:
        pass
    return removed


def build(spec: FabricSpec) -> None:
    """Create the fabric (call destroy first to clear leftovers). Raises FabricError."""
    taken = existing_namespaces() & set(spec.namespaces)
    if taken:
        raise FabricError(
            f"namespaces already exist: {', '.join(sorted(taken))} "
            "(leftovers of an earlier run? remove them with --cleanup)"
        )
    names = (socket.gethostname(),)
    for n in spec.nodes:
        d = os.path.join(ETC_NETNS, n.netns)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write(hosts_file(spec, n, names))
    for cmd in setup_commands(spec):
        run(cmd)


def set_trunk(cross_mbit: float) -> None:
    """Shape the trunk at cross_mbit, or unshape it (0)."""
    for cmd in trunk_commands(cross_mbit):
        p = run(cmd, check=False)
        already_unshaped = cross_mbit <= 0 and "Cannot delete qdisc with handle of zero" in p.stderr
        if p.returncode and not already_unshaped:
            raise FabricError(f"`{' '.join(cmd)}` failed: {p.stderr.strip()}")


# ---- link check: a TCP stream from one namespace to another ---------------------------------------

PROBE_PORT = 5999


def measure_mbit(src: EmuNode, dst: EmuNode, megabytes: int, timeout: float = 60) -> float:
    """Goodput of one TCP stream src -> dst, Mbit/s (this file's __main__ is both ends)."""
    me = os.path.abspath(__file__)
    server = subprocess.Popen(
        ["ip", "netns", "exec", dst.netns, sys.executable, me, "serve", str(PROBE_PORT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        time.sleep(0.3)  # the listener binds before the sender dials; retried below anyway
        p = run(
            [
                "ip",
                "netns",
                "exec",
                src.netns,
                sys.executable,
                me,
                "send",
                dst.addr,
                str(PROBE_PORT),
                str(megabytes),
            ],
            timeout=timeout,
        )
        return float(p.stdout.split()[0])
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(timeout=5)


def _serve(port: int) -> None:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    s.settimeout(30)
    c, _ = s.accept()
    while c.recv(1 << 20):
        pass
    c.sendall(b"k")
    c.close()


def _send(host: str, port: int, megabytes: int) -> None:
    for _ in range(50):
        try:
            c = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise SystemExit(f"cannot connect to {host}:{port}")
    c.settimeout(60)
    buf = b"\0" * (1 << 20)
    t = time.perf_counter()
    for _ in range(megabytes):
        c.sendall(buf)
    c.shutdown(socket.SHUT_WR)
    c.recv(1)  # the receiver has everything
    print(f"{megabytes * 8 * 1.048576 / (time.perf_counter() - t):.1f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        _serve(int(sys.argv[2]))
    elif sys.argv[1:2] == ["send"]:
        _send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit("usage: fabric_netns.py serve PORT | send HOST PORT MEGABYTES")
