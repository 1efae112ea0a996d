"""An emulated two-island fabric in Linux network namespaces (iproute2 + tbf), for benchmarks.

    island A ("east", InfiniBand)            island B ("west", RoCE)
    node-1  node-3                           node-2  node-4          one netns per node, eth0
       \\    /                                  \\    /               shaped at --fast-mbit each way
        br-a ---- x-a ====== (trunk) ====== x-b ---- br-b           bridges + trunk in hfe-switch,
                                                                    trunk shaped at --cross-mbit
                                                                    (and delayed: cross_delay_ms)

Every node is a namespace ``hfe-<node>`` with one veth ``eth0`` (10.200.0.0/24); its peer
``p-<node>`` sits in the switch namespace on its island's bridge. The two bridges are joined by
a veth pair (the trunk): traffic inside an island never touches it, traffic between islands all
goes through it. ``tbf`` on both ends of the trunk is the slow cross-cluster link; ``tbf`` on
each node's eth0 and switch port is the node's NIC (both directions).

This kernel has no ``sch_netem``: a trunk with a one-way delay (``cross_delay_ms`` > 0) is two TAP
devices named as the veth ends are, with bench/delay_line.py between them in the switch namespace
(it holds each frame for the delay, order kept); tbf still shapes it on both TAPs. A Python
process forwards a few 10k frames/s at most, so only the slow link gets it: a fast link stays a
plain veth (``cross_delay_ms`` 0, unchanged). Node names are in
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
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
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


Wrap = Callable[[list[str]], list[str]] | None  # a command -> the command to run instead


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
    cross_delay_ms: float = 0.0  # the trunk's one-way delay; 0 = a plain veth (no delay line)

    def node(self, name: str) -> EmuNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no emulated node {name!r}; have {', '.join(n.name for n in self.nodes)}")

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (SWITCH_NS,) + tuple(n.netns for n in self.nodes)


def two_islands(
    per_island: int = 2, fast_mbit: float = 2000, cross_mbit: float = 200, cross_delay_ms: float = 0.0
) -> FabricSpec:
    """``2 * per_island`` nodes named node-1.. in purchase order: odd -> island a, even -> b."""
    if not 1 <= per_island <= 9:
        raise ValueError(f"per_island must be 1..9 (addresses .11-.19 / .21-.29), got {per_island}")
    if fast_mbit < 0 or cross_mbit < 0:
        raise ValueError("link rates must be >= 0 Mbit/s (0 = unshaped)")
    if cross_delay_ms < 0:
        raise ValueError(f"cross_delay_ms must be >= 0 (0 = no delay), got {cross_delay_ms}")
    nodes = []
    for i in range(2 * per_island):
        island = "ab"[i % 2]
        nodes.append(EmuNode(name=f"node-{i + 1}", island=island, index=i // 2 + 1))
    return FabricSpec(tuple(nodes), fast_mbit, cross_mbit, cross_delay_ms)


# ---- commands (pure) ---------------------------------------------------------------------------


def tbf_burst_bytes(mbit: float) -> int:
    """Token-bucket depth: at least 256 KiB (measured good at 200 Mbit/s), else 8 ms of line rate
    so high rates are not capped by the kernel timer."""
    return max(256 * 1024, int(mbit * 1e6 / 8 * 0.008))


def shape_cmd(
    ns: str, dev: str, mbit: float, burst_bytes: int | None = None, queue_ms: float = 50
) -> list[str]:
    """Replace dev's root qdisc by a tbf at mbit (mbit 0: back to the default qdisc), its bucket
    ``burst_bytes`` deep (None: tbf_burst_bytes) and its queue ``queue_ms`` long."""
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
        str(tbf_burst_bytes(mbit) if burst_bytes is None else burst_bytes),
        "latency",
        f"{queue_ms:g}ms",
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
    cmds += trunk_link_commands(spec.cross_delay_ms)
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


def trunk_commands(
    cross_mbit: float, burst_bytes: int | None = None, queue_ms: float = 50
) -> list[list[str]]:
    return [shape_cmd(SWITCH_NS, dev, cross_mbit, burst_bytes, queue_ms) for dev in ("x-a", "x-b")]


def trunk_link_commands(delay_ms: float) -> list[list[str]]:
    """The trunk's two ends x-a/x-b on their bridges: a veth pair, or (delay) two TAPs that the
    delay line joins (:func:`delay_line_cmd`)."""
    sw = SWITCH_NS
    if delay_ms > 0:
        cmds = [["ip", "-n", sw, "tuntap", "add", "dev", f"x-{isl}", "mode", "tap"] for isl in "ab"]
    else:
        cmds = [["ip", "-n", sw, "link", "add", "x-a", "type", "veth", "peer", "name", "x-b"]]
    for isl in ("a", "b"):
        cmds += [
            ["ip", "-n", sw, "link", "set", f"x-{isl}", "master", f"br-{isl}"],
            ["ip", "-n", sw, "link", "set", f"x-{isl}", "up"],
        ]
    return cmds


def trunk_removal_commands() -> list[list[str]]:
    """Both ends (deleting a veth end takes its peer: the second may already be gone)."""
    return [["ip", "-n", SWITCH_NS, "link", "del", f"x-{isl}"] for isl in "ab"]


def delay_line_cmd(delay_ms: float) -> list[str]:
    """The delay line between the trunk's TAPs, run in the switch namespace."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        "ip", "netns", "exec", SWITCH_NS, sys.executable, os.path.join(here, "delay_line.py"),
        "x-a", "x-b", f"{delay_ms:g}",
    ]  # fmt: skip


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
    # probe in a throwaway namespace: netns, veth, bridge, sch_tbf (TUN only where a delay is asked:
    # see delay_line_problem)
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


def delay_line_problem() -> str | None:
    """Why this machine cannot delay the trunk (no TUN), or None."""
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing: the trunk's delay line needs TUN/TAP (CONFIG_TUN / modprobe tun)"
    return None


def existing_namespaces() -> set[str]:
    out = run(["ip", "netns", "list"]).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def destroy(spec: FabricSpec) -> list[str]:
    """Remove our namespaces (their veths and qdiscs go with them) and hosts dirs, by exact name.
    Idempotent; returns what it removed."""
    removed = []
    have = existing_namespaces()
    if SWITCH_NS in have:
        removed += [f"delay line pid {pid}" for pid in stop_delay_lines()]
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


def build(spec: FabricSpec, wrap: Wrap = None) -> None:
    """Create the fabric (call destroy first to clear leftovers). Raises FabricError. ``wrap``
    (a command -> the command to run) starts the delay line, e.g. in a CPU budget of its own."""
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
    if spec.cross_delay_ms > 0:
        start_delay_line(spec.cross_delay_ms, wrap)


def set_trunk(
    cross_mbit: float,
    delay_ms: float | None = None,
    wrap: Wrap = None,
    burst_bytes: int | None = None,
    queue_ms: float = 50,
) -> None:
    """Shape the trunk at cross_mbit, or unshape it (0). ``delay_ms`` (not None): first make the
    trunk anew with that one-way delay (0: a plain veth), e.g. a fast link after a delayed one.
    ``burst_bytes``, ``queue_ms``: tbf's bucket and queue (shape_cmd)."""
    if delay_ms is not None:
        stop_delay_lines()
        for cmd in trunk_removal_commands():
            run(cmd, check=False)
        for cmd in trunk_link_commands(delay_ms):
            run(cmd)
        if delay_ms > 0:
            start_delay_line(delay_ms, wrap)
    for cmd in trunk_commands(cross_mbit, burst_bytes, queue_ms):
        p = run(cmd, check=False)
        already_unshaped = cross_mbit <= 0 and "Cannot delete qdisc with handle of zero" in p.stderr
        if p.returncode and not already_unshaped:
            raise FabricError(f"`{' '.join(cmd)}` failed: {p.stderr.strip()}")


# ---- the delay line's process ----------------------------------------------------------------------

READY_TIMEOUT = 10
_delay_lines: list[subprocess.Popen] = []  # started here: reaped when stopped


def start_delay_line(delay_ms: float, wrap: Wrap = None) -> subprocess.Popen:
    """Start the delay line on the trunk's TAPs; returns once it has attached to both."""
    problem = delay_line_problem()
    if problem:
        raise FabricError(problem)
    cmd = delay_line_cmd(delay_ms)
    p = subprocess.Popen(
        wrap(cmd) if wrap else cmd, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    _delay_lines.append(p)
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], READY_TIMEOUT)
    line = p.stdout.readline().strip() if ready else ""
    if line != "ready":
        stop_delay_lines()
        raise FabricError(
            f"the delay line `{' '.join(cmd)}` did not attach to the trunk's TAPs in {READY_TIMEOUT} s "
            f"(exit code {p.poll()}; its error is above)"
        )
    return p


def delay_line_pids() -> list[int]:
    """Processes in the switch namespace: only the delay line runs there."""
    out = run(["ip", "netns", "pids", SWITCH_NS], check=False).stdout
    return [int(x) for x in out.split()]


def delay_line_cpu_s() -> float:
    """CPU seconds (user + system) the running delay line has used."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in delay_line_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15)
    return total


def stop_delay_lines(grace_s: float = 3.0) -> list[int]:
    """End every process in the switch namespace (SIGTERM, then SIGKILL): a leftover would keep
    the namespace and its devices alive after `ip netns del`. Returns their PIDs."""
    pids = delay_line_pids()
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        for p in _delay_lines:
            p.poll()  # reap ours, or they linger as zombies in /proc
        time.sleep(0.05)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for p in _delay_lines:
        with suppress(subprocess.TimeoutExpired):
            p.wait(timeout=grace_s)
        if p.stdout:
            p.stdout.close()
    _delay_lines.clear()
    return pids


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


RTT_PORT = PROBE_PORT + 1  # nothing listens there: the answer to a SYN is the kernel's RST


def measure_rtt_ms(src: EmuNode, dst: EmuNode, samples: int = 5, timeout: float = 30) -> float:
    """Round trip src -> dst -> src, ms: the median time of TCP connects (SYN out, RST or SYN-ACK
    back: one round trip; there is no ping here). The first may also wait on ARP."""
    me = os.path.abspath(__file__)
    p = run(
        ["ip", "netns", "exec", src.netns, sys.executable, me, "rtt", dst.addr, str(RTT_PORT), str(samples)],
        timeout=timeout,
    )
    return float(p.stdout.split()[0])


def rtt_check(rtt_ms: float, delay_ms: float) -> tuple[str | None, str | None]:
    """(error, warning) for a round trip measured across a trunk of ``delay_ms`` each way: below
    twice the delay the delay line is not in the path (an error); well above it, the machine's
    load delays the delay line (a warning: the planner is told less latency than the runs see)."""
    want = 2 * delay_ms
    if rtt_ms < 0.95 * want:
        return (
            f"round trip across the trunk {rtt_ms:.1f} ms < 2 x {delay_ms:g} ms: "
            "the delay line is not in the path (is the trunk a veth? set_trunk(..., delay_ms=))",
            None,
        )
    if rtt_ms > want + max(5.0, 0.25 * want):
        return None, (
            f"round trip across the trunk {rtt_ms:.1f} ms, {rtt_ms - want:.1f} ms over 2 x {delay_ms:g} ms: "
            "the machine's load delays the delay line"
        )
    return None, None


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def _rtt(host: str, port: int, samples: int) -> None:
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        try:
            socket.create_connection((host, port), timeout=5).close()
        except ConnectionRefusedError:
            pass  # the RST came back: the round trip is done
        times.append(time.perf_counter() - t)
    print(f"{1e3 * median(times):.2f}")


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
    elif sys.argv[1:2] == ["rtt"]:
        _rtt(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(
            "usage: fabric_netns.py serve PORT | send HOST PORT MEGABYTES | rtt HOST PORT SAMPLES"
        )
