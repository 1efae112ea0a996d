"""Pod network namespaces for the node agent, set up the way a kubelet's CNI plugin does.

Each pod that is not ``hostNetwork`` gets a named network namespace ``lk<octet>-<pod uid>``
(``ip netns add``) with ``lo`` up (CNI ``loopback``) and ``eth0`` attached to the shared bridge
``holmes-pods0`` (CNI ``bridge``), its address from CNI ``host-local`` IPAM. Every agent on the
machine uses one pod subnet (``HOLMES_POD_SUBNET``, default 10.244.0.0/16) on that one bridge,
each its own /24 range ``<a>.<b>.<octet>.0`` inside it: pods of different agents (the two clusters
of ``multicluster-up``) are on one L2 segment, so no IP forwarding, NAT or iptables is needed on
the host. The bridge carries the host's address in the subnet (``<a>.<b>.0.1``) so that the
operator and the tests, on the host, reach pod IPs. A pod that asks for extra networks the
Multus way (annotation ``k8s.v1.cni.cncf.io/networks``) gets ``net1``... on a second bridge
``holmes-pods1`` with the next /16 (the shape of an SR-IOV VF attached by Multus).

An agent owns its octet through a lock file in /run/localkube for as long as it runs; only the
owner creates or deletes namespaces with its prefix, so a crashed agent's leftovers are removed
by the next owner (a restarted agent, or ``localkube down``) and never another cluster's.

The plugins come from Debian's ``containernetworking-plugins`` (/usr/lib/cni), installed by
``hack/build-k8s.sh`` with the other host tools. Pure planning (ranges, netconf, names, the clash
check) is apart from the commands that apply it.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import logging
import os
import random
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("localkube.podnet")

CNI_PATH = Path(os.environ.get("LOCALKUBE_CNI_PATH", "/usr/lib/cni"))
PLUGINS = ("bridge", "host-local", "loopback")
NETNS_DIR = Path("/run/netns")  # where `ip netns add` mounts named namespaces
LOCK_DIR = Path("/run/localkube")
BRIDGE = "holmes-pods0"
EXTRA_BRIDGE = "holmes-pods1"  # Multus-style extra interfaces (net1, ...)
DEFAULT_SUBNET = "10.244.0.0/16"
OCTETS = range(16, 240)  # per-agent /24 inside the subnet; also the 127.<octet> of hostNetwork pods
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
CNI_VERSION = "0.4.0"
OWNED = re.compile(r"lk\d+-")  # the namespaces of any agent (see netns_name)
# Real nodes' bridges (realnode.py): lkn<octet> a node's pod network, lkf<octet> a NIC fabric's;
# their octets are taken as an agent's are.
NODE_BRIDGE, FABRIC_BRIDGE = "lkn", "lkf"
REAL_BRIDGE = re.compile(rf"({NODE_BRIDGE}|{FABRIC_BRIDGE})\d+$")


class NetworkError(RuntimeError):
    """The pod network could not be set up; the message says what to do."""


# ---- pure planning -------------------------------------------------------------------------------
def pod_subnet(env: dict | None = None) -> ipaddress.IPv4Network:
    raw = (env if env is not None else os.environ).get("HOLMES_POD_SUBNET") or DEFAULT_SUBNET
    try:
        net = ipaddress.IPv4Network(raw)
    except ValueError as e:
        raise NetworkError(
            f"HOLMES_POD_SUBNET={raw!r} is not an IPv4 network ({e}); use e.g. 10.244.0.0/16"
        ) from e
    if net.prefixlen != 16 or not net.is_private:
        raise NetworkError(
            f"HOLMES_POD_SUBNET={raw!r} must be a private /16 (each node agent takes a /24 of it)"
        )
    return net


def extra_subnet(subnet: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    """The subnet of Multus-style extra interfaces: the /16 after the pod subnet."""
    return ipaddress.IPv4Network((int(subnet.network_address) + (1 << 16), 16))


def host_address(subnet: ipaddress.IPv4Network) -> str:
    """The host's address on the bridge: <a>.<b>.0.1, outside every agent's range."""
    return str(subnet.network_address + 1)


def agent_range(subnet: ipaddress.IPv4Network, octet: int) -> tuple[str, str]:
    if octet not in OCTETS:
        raise NetworkError(f"pod-IP octet {octet} is outside {OCTETS.start}..{OCTETS.stop - 1}")
    base = subnet.network_address + (octet << 8)
    return str(base + 1), str(base + 254)


def netconf(name: str, bridge: str, subnet: ipaddress.IPv4Network, octet: int, data_dir: Path) -> dict:
    """A bridge + host-local network: no gateway role, no masquerade (nothing on the host
    forwards), addresses from this agent's /24."""
    start, end = agent_range(subnet, octet)
    return {
        "cniVersion": CNI_VERSION,
        "name": name,
        "type": "bridge",
        "bridge": bridge,
        "isGateway": False,
        "ipMasq": False,
        "hairpinMode": False,
        "ipam": {
            "type": "host-local",
            "dataDir": str(data_dir),
            "ranges": [[{"subnet": str(subnet), "rangeStart": start, "rangeEnd": end}]],
        },
    }


def loopback_conf() -> dict:
    return {"cniVersion": CNI_VERSION, "name": "lo", "type": "loopback"}


def netns_prefix(octet: int) -> str:
    return f"lk{octet}-"


def netns_name(octet: int, uid: str) -> str:
    return f"{netns_prefix(octet)}{uid}"


def result_address(result: dict, ifname: str) -> str:
    """The IPv4 address (no prefix length) a CNI ADD result gives interface ``ifname``."""
    ifaces = result.get("interfaces") or []
    for ip in result.get("ips") or []:
        i = ip.get("interface")
        if i is not None and 0 <= i < len(ifaces) and ifaces[i].get("name") == ifname:
            addr = ipaddress.ip_interface(ip["address"])
            if addr.version == 4:
                return str(addr.ip)
    raise NetworkError(f"the CNI result names no IPv4 address for {ifname}: {json.dumps(result)}")


def clashing_routes(routes: list[dict], subnet: ipaddress.IPv4Network, own: set[str]) -> list[str]:
    """Routes of the host (``ip -j -4 route show table all``) that overlap ``subnet`` on a device
    other than ours: the pod subnet would shadow or be shadowed by them."""
    bad = []
    for r in routes:
        dst = r.get("dst", "")
        if dst in ("", "default") or r.get("dev") in own:
            continue
        try:
            net = ipaddress.IPv4Network(dst, strict=False)
        except ValueError:
            continue
        if net.prefixlen and net.overlaps(subnet):
            bad.append(f"{dst} dev {r.get('dev', '?')}")
    return bad


def extra_interfaces(annotations: dict | None) -> list[str]:
    """Interface names for the networks a pod asks for the Multus way: the annotation is either
    a comma-separated list of ``[ns/]name[@ifname]`` or a JSON list of objects with ``name``
    and optional ``interface``. Unnamed ones get net1, net2, ... in order."""
    raw = ((annotations or {}).get(MULTUS_ANNOTATION) or "").strip()
    if not raw:
        return []
    if raw.startswith("["):
        try:
            items = json.loads(raw)
        except ValueError as e:
            raise NetworkError(f"annotation {MULTUS_ANNOTATION} is not valid JSON: {e}") from e
        names = [str(i.get("interface") or "") if isinstance(i, dict) else "" for i in items]
    else:
        names = [(n.split("@", 1)[1] if "@" in n else "") for n in raw.split(",") if n.strip()]
    return [n or f"net{i + 1}" for i, n in enumerate(names)]


# ---- applying it ---------------------------------------------------------------------------------
def _run(argv: list[str], stdin: str | None = None, env: dict | None = None) -> str:
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env)
    if r.returncode:
        raise NetworkError(f"`{' '.join(argv)}` failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
    return r.stdout


def preflight(subnet: ipaddress.IPv4Network | None = None) -> None:
    """Fail with the fix when pod networks cannot work on this host."""
    if os.geteuid() != 0:
        raise NetworkError("pod network namespaces need root (ip netns, CNI plugins): run as root")
    if not shutil.which("ip"):
        raise NetworkError("`ip` not found: apt-get install iproute2 (hack/build-k8s.sh does)")
    missing = [p for p in PLUGINS if not os.access(CNI_PATH / p, os.X_OK)]
    if missing:
        raise NetworkError(
            f"CNI plugins {missing} missing from {CNI_PATH}: apt-get install containernetworking-plugins "
            f"(`bash hack/build-k8s.sh` installs it with the other host tools)"
        )
    subnet = subnet or pod_subnet()
    routes = json.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]")
    own = {BRIDGE, EXTRA_BRIDGE} | {r.get("dev", "") for r in routes if REAL_BRIDGE.match(r.get("dev", ""))}
    for net in (subnet, extra_subnet(subnet)):
        bad = clashing_routes(routes, net, own)
        if bad:
            raise NetworkError(
                f"the pod subnet {net} is already routed on this host ({'; '.join(bad)}): "
                f"set HOLMES_POD_SUBNET to a free private /16 (the /16 after it is used too)"
            )


class _Flock:
    """An exclusive flock on a file in LOCK_DIR, held while the object is open."""

    def __init__(self, name: str, block: bool):
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(LOCK_DIR / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except OSError:
            os.close(self.fd)
            raise

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> _Flock:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _octet_lock(octet: int) -> _Flock | None:
    try:
        return _Flock(f"octet-{octet}.lock", block=False)
    except BlockingIOError:
        return None


def octet_bridged(octet: int) -> bool:
    """Whether a real node or NIC fabric of some cluster uses the octet (its bridge exists)."""
    return any(Path(f"/sys/class/net/{p}{octet}").exists() for p in (NODE_BRIDGE, FABRIC_BRIDGE))


def pick_octet() -> int:
    """A pod-IP octet no running node agent nor real node on this machine owns."""
    free = list(OCTETS)
    random.shuffle(free)
    for o in free:
        lock = _octet_lock(o)
        if lock is not None:
            lock.close()
            if not octet_bridged(o):
                return o
    raise NetworkError(f"every pod-IP octet is owned by a running node agent (see {LOCK_DIR})")


def namespaces() -> list[str]:
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except OSError:
        return []


@dataclass
class PodNet:
    """A pod's network sandbox: its namespace and the addresses of its interfaces."""

    netns: str
    ip: str
    extra: dict[str, str] = field(default_factory=dict)  # net1 -> address

    @property
    def path(self) -> str:
        return str(NETNS_DIR / self.netns)


class PodNetwork:
    """One agent's side of the pod network (it owns ``octet`` while it runs)."""

    def __init__(self, state_dir: Path, octet: int):
        self.octet = octet
        self.subnet = pod_subnet()
        self.data_dir = state_dir / "pods" / "cni"
        self.lock: _Flock | None = None

    def conf(self, extra: bool) -> dict:
        if extra:
            subnet, bridge, name = extra_subnet(self.subnet), EXTRA_BRIDGE, "localkube-extra"
        else:
            subnet, bridge, name = self.subnet, BRIDGE, "localkube"
        return netconf(f"{name}-{self.octet}", bridge, subnet, self.octet, self.data_dir / name)

    def claim(self) -> None:
        """Own the octet (or fail naming who does), then remove what a crashed owner left."""
        preflight(self.subnet)
        self.lock = _octet_lock(self.octet)
        if self.lock is None:
            raise NetworkError(
                f"pod-IP octet {self.octet} is owned by another running node agent "
                f"({LOCK_DIR}/octet-{self.octet}.lock): stop that cluster or start this one again"
            )
        self.remove_leftovers()

    def release(self) -> None:
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    def remove_leftovers(self) -> None:
        for ns in namespaces():
            if ns.startswith(netns_prefix(self.octet)):
                log.info("removing leftover pod network namespace %s", ns)
                self.delete(PodNet(ns, ""), extra=["net1"])
        shutil.rmtree(self.data_dir, ignore_errors=True)
        remove_unused_bridges()

    def _cni(self, command: str, conf: dict, pod: PodNet, ifname: str) -> dict:
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": pod.netns,
            "CNI_NETNS": pod.path,
            "CNI_IFNAME": ifname,
            "CNI_PATH": str(CNI_PATH),
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        }
        out = _run([str(CNI_PATH / conf["type"])], stdin=json.dumps(conf), env=env)
        return json.loads(out) if out.strip() else {}

    def add(self, uid: str, extra_ifnames: list[str]) -> PodNet:
        """Create the pod's namespace with lo, eth0 on the pod bridge and each extra interface
        on the extra bridge; on failure nothing is left behind."""
        pod = PodNet(netns_name(self.octet, uid), "")
        _run(["ip", "netns", "add", pod.netns])
        try:
            self._cni("ADD", loopback_conf(), pod, "lo")
            with _Flock("bridges.lock", block=True):  # not while another agent deletes them
                ensure_bridge(BRIDGE, self.subnet)
                pod.ip = result_address(self._cni("ADD", self.conf(False), pod, "eth0"), "eth0")
                if extra_ifnames:
                    ensure_bridge(EXTRA_BRIDGE, extra_subnet(self.subnet))
                for ifname in extra_ifnames:
                    res = self._cni("ADD", self.conf(True), pod, ifname)
                    pod.extra[ifname] = result_address(res, ifname)
        except BaseException:
            self.delete(pod, extra=extra_ifnames)
            raise
        return pod

    def delete(self, pod: PodNet, extra: list[str]) -> None:
        """CNI DEL (frees the addresses), then the namespace; best effort, each step logged."""
        steps = [(self.conf(False), "eth0")] + [(self.conf(True), i) for i in extra]
        for conf, ifname in steps:
            try:
                self._cni("DEL", conf, pod, ifname)
            except (NetworkError, ValueError) as e:
                log.warning("CNI DEL %s %s: %s", pod.netns, ifname, e)
        try:
            _run(["ip", "netns", "del", pod.netns])
        except NetworkError as e:
            if (NETNS_DIR / pod.netns).exists():
                log.warning("%s", e)


def ensure_bridge(name: str, subnet: ipaddress.IPv4Network) -> None:
    """The bridge with the host's address in ``subnet``, up (callers hold bridges.lock)."""
    if not Path(f"/sys/class/net/{name}").exists():
        _run(["ip", "link", "add", name, "type", "bridge"])
        _run(["ip", "addr", "add", f"{host_address(subnet)}/{subnet.prefixlen}", "dev", name])
        _run(["ip", "link", "set", name, "up"])


def remove_unused_bridges() -> None:
    """Delete the bridges once no agent's pod namespace is left on the machine."""
    with _Flock("bridges.lock", block=True):
        if any(OWNED.match(ns) for ns in namespaces()):
            return
        for b in (BRIDGE, EXTRA_BRIDGE):
            if Path(f"/sys/class/net/{b}").exists():
                try:
                    _run(["ip", "link", "del", b])
                except NetworkError as e:
                    log.warning("%s", e)


def release_leftovers(state_dir: Path, octet: int | None, also: Callable[[], object] | None = None) -> None:
    """For `localkube down`: remove the namespaces and bridges a stopped (or crashed) agent of
    this state dir left, unless another running agent now owns its octet; ``also`` removes
    the agent's other leftovers (its containers) under the same ownership."""
    if octet is None:
        return
    lock = _octet_lock(octet)
    if lock is None:
        return
    try:
        if also is not None:
            also()
        net = PodNetwork(state_dir, octet)
        net.remove_leftovers()
    finally:
        lock.close()
