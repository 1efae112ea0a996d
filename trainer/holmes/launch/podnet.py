"""The network names a pod uses, resolved inside the pod before any worker starts.

The host's netdev and HCA names (what the labeller sees) exist only in the node's network
namespace: a pod in its own has ``eth0`` (``net1``... under Multus) and, under SR-IOV, a VF named
otherwise. Copied into a pod they stop gloo at start-up (``Unable to find address for:
eno12399np0``) and NCCL's bootstrap. So both launchers (``holmes.trainer.run`` for the Holmes
engine, ``holmes.launch`` for other frameworks) call :func:`setup`, which sets:

- ``GLOO_SOCKET_IFNAME``: the interface holding the local address that reaches
  ``MASTER_ADDR:MASTER_PORT`` (the route the kernel picks for the rendezvous, which the peers
  reach this pod through);
- ``NCCL_SOCKET_IFNAME``: that interface, and with ``HOLMES_SOCKET_RAILS=routed`` on RoCE
  nodes the netdevs of the RDMA ports ``NCCL_IB_HCA`` selects (:func:`socket_ifnames`). NCCL
  reads the variable once per process for both its bootstrap and its Socket transport
  (``misc/socket.cc``: ``ncclFindInterfaces``): the transport makes one device of every interface
  listed and a GPU sends through the one nearest it, so with the rendezvous interface alone every
  Socket group (the cross-island pipeline, the world group, the outer group) runs over the pod's
  primary interface. Listing the rails is right only where their addresses are routed between
  the Socket groups' peers, which cross islands, and nothing in the pod can tell (a backend rail
  is often not routed between clusters: a peer would fail to connect), so the admin says so; by
  default they are named in the report, not listed. The bootstrap takes the first listed
  interface in the kernel's order (``bootstrap.cc``: ``bootstrapNetInit`` asks for one), so a
  netdev that would come before the rendezvous interface is left out. IPoIB netdevs are never
  listed (an IB subnet ends at its fabric);
- on RDMA nodes, ``NCCL_IB_HCA``: the ports of the node's link layer that are ACTIVE on HCAs the
  pod can open (its ``/dev/infiniband``), restricted to the rails ``HOLMES_HOST_HCAS`` names
  where the pod sees the host's names (hostNetwork, or the shared RDMA device plugin); on RoCE
  only ports with a RoCE v2 GID, since NCCL (>= 2.21, ``NCCL_IB_GID_INDEX`` unset) picks one
  itself and otherwise falls back to index 0 (RoCE v1, link-local, not routable).

A value the pod's template sets wins; one naming what the pod does not have (an interface, an
HCA, a GID index that is empty or not RoCE v2) stops the pod with a message naming the variable,
what the pod has, and the fix. One JSON line ``{"holmesNet": ...}`` says what was chosen and why.

Standard library only (this package is copied into users' images). The snapshot of what the pod
sees (:class:`PodView`) is gathered by the I/O functions at the end; the decisions are pure.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .netenv import (
    ENV_HOST_HCAS,
    ENV_NIC,
    ENV_POD_NETWORK,
    ENV_SOCKET_RAILS,
    GLOO_IFNAME,
    HOST_NETWORK,
    IB_GID_INDEX,
    IB_HCA,
    INFINIBAND,
    POD_NETWORK,
    RAILS_ROUTED,
    ROCE,
    SOCKET_IFNAME,
)

RESOLVE_SECONDS = 120.0  # a headless Service's record can appear after the pod starts
ROCE_V2 = "RoCE v2"  # gid_attrs/types as the kernel writes it ("IB/RoCE v1" otherwise)
LINK_LAYER = {INFINIBAND: "InfiniBand", ROCE: "Ethernet"}
NCCL_AUTO_GID = (2, 21)  # the first NCCL that picks a RoCE v2 GID when NCCL_IB_GID_INDEX is unset

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


class NetError(ValueError):
    """The pod cannot start on the network it was given: the message names the variable and the fix."""


# ---- what the pod sees -----------------------------------------------------------------------


@dataclass(frozen=True)
class Iface:
    name: str
    addrs: tuple[IPInterface, ...] = ()  # address with prefix length, as the kernel holds them

    def usable(self) -> list[IPInterface]:
        """Addresses a socket can bind and a peer can reach (IPv6 link-local needs a scope)."""
        return [a for a in self.addrs if not (a.version == 6 and a.ip.is_link_local)]

    def describe(self) -> str:
        shown = ", ".join(str(a.ip) for a in self.usable()) or "no address"
        return f"{self.name} ({shown})"


@dataclass(frozen=True)
class Gid:
    index: int
    address: str  # as sysfs writes it: eight groups of four hex digits
    type: str = ""  # gid_attrs/types: "RoCE v2" | "IB/RoCE v1"; "" when the kernel shows none

    @property
    def ip(self) -> ipaddress.IPv6Address:
        return ipaddress.IPv6Address(int(self.address.replace(":", ""), 16))

    def kind(self) -> str:
        """In words, for messages: 'RoCE v2, 10.0.0.5', 'IB/RoCE v1, link-local'."""
        ip = self.ip
        where = "link-local" if ip.is_link_local else str(ip.ipv4_mapped or ip)
        return f"{self.type or 'type unknown'}, {where}"


@dataclass(frozen=True)
class Port:
    hca: str
    port: int
    state: str  # "4: ACTIVE"
    link_layer: str  # InfiniBand | Ethernet
    gids: tuple[Gid, ...] = ()  # the populated entries of the GID table

    @property
    def name(self) -> str:
        return f"{self.hca}:{self.port}"

    @property
    def active(self) -> bool:
        return "ACTIVE" in self.state

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"

    def gid(self, index: int) -> Gid | None:
        return next((g for g in self.gids if g.index == index), None)


@dataclass(frozen=True)
class Hca:
    name: str
    ports: tuple[Port, ...]
    uverbs: str | None = None  # its verbs device (uverbs3) when sysfs says
    netdevs: tuple[str, ...] = ()  # its network interfaces (device/net), as the pod names them


@dataclass(frozen=True)
class PodView:
    interfaces: tuple[Iface, ...]  # in the kernel's order (interface index), as getifaddrs walks them
    hcas: tuple[Hca, ...] = ()
    devices: frozenset[str] | None = None  # names under /dev/infiniband; None: not mounted

    def describe_ifaces(self) -> str:
        return (
            ", ".join(i.describe() for i in self.interfaces if i.usable()) or "no interface with an address"
        )


@dataclass(frozen=True)
class Reach:
    """How this pod reaches the rendezvous: MASTER_ADDR resolved, and the local address the
    kernel's route to it starts from."""

    master: str
    port: int
    master_ip: str
    local_ip: str


@dataclass
class Resolution:
    env: dict[str, str] = field(default_factory=dict)  # what to set in the workers' environment
    report: dict[str, Any] = field(default_factory=dict)  # the holmesNet log line
    problems: list[str] = field(default_factory=list)  # what NCCL's IB transport will miss


# ---- NCCL's list syntax and GIDs (pure) -------------------------------------------------------


def select_hcas(present: list[str], spec: str | None) -> tuple[list[tuple[str, int | None]], list[str]]:
    """The (hca, port) pairs NCCL_IB_HCA selects among ``present``, and the names it asks for
    that are missing. The syntax is NCCL's: ``mlx5_0:1,mlx5_1`` matches by prefix, a leading
    ``=`` by exact name, a leading ``^`` excludes; unset selects every HCA."""
    if not spec:
        return [(h, None) for h in present], []
    text = spec.strip()
    exclude = text.startswith("^")
    text = text.lstrip("^")
    exact = text.startswith("=")
    text = text.lstrip("=")
    wanted: list[tuple[str, int | None]] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, number = item.partition(":")
        wanted.append((name, int(number) if number.isdigit() else None))

    def hits(name: str) -> list[str]:
        return [h for h in present if (h == name if exact else h.startswith(name))]

    if exclude:
        gone = {h for name, _ in wanted for h in hits(name)}
        return [(h, None) for h in present if h not in gone], []
    chosen: list[tuple[str, int | None]] = []
    missing: list[str] = []
    for name, port in wanted:
        found = hits(name)
        if not found:
            missing.append(name if port is None else f"{name}:{port}")
        chosen += [(h, port) for h in found]
    return chosen, missing


def select_ifaces(names: list[str], spec: str) -> list[str]:
    """The interfaces NCCL_SOCKET_IFNAME selects among ``names`` (NCCL's syntax: prefixes,
    ``=`` exact names, ``^`` excludes)."""
    text = spec.strip()
    exclude = text.startswith("^")
    text = text.lstrip("^")
    exact = text.startswith("=")
    items = [s.strip() for s in text.lstrip("=").split(",") if s.strip()]

    def hit(name: str) -> bool:
        return any(name == i if exact else name.startswith(i) for i in items)

    return [n for n in names if hit(n) != exclude]


def nccl_gids(port: Port, env: Mapping[str, str]) -> list[Gid]:
    """The GIDs NCCL's own choice (NCCL_IB_GID_INDEX unset, NCCL >= 2.21) takes on a RoCE port:
    RoCE v2, not link-local, of NCCL_IB_ADDR_FAMILY (AF_INET by default: IPv4-mapped)."""
    ipv6 = env.get("NCCL_IB_ADDR_FAMILY", "AF_INET").strip() == "AF_INET6"
    return [
        g
        for g in port.gids
        if g.type == ROCE_V2 and not g.ip.is_link_local and (g.ip.ipv4_mapped is None) == ipv6
    ]


def gid_index_problem(port: Port, index: int) -> str | None:
    """Why an explicit GID index does not carry RoCE v2 traffic between nodes on ``port``."""
    gid = port.gid(index)
    if gid is None:
        return f"is empty on RoCE port {port.name}"
    if gid.type != ROCE_V2:
        return f"is not RoCE v2 on RoCE port {port.name} ({gid.kind()})"
    if gid.ip.is_link_local:
        return f"is link-local on RoCE port {port.name} (not routable between nodes)"
    return None


def gid_problems(ports: list[Port], env: Mapping[str, str]) -> list[str]:
    """What keeps NCCL from addressing RoCE ports: an explicit NCCL_IB_GID_INDEX that is not a
    RoCE v2 GID, or (index unset or -1, NCCL's own choice) a port without one."""
    roce = [p for p in ports if p.roce]
    raw = env.get(IB_GID_INDEX, "").strip()
    if raw and raw != "-1":
        if not raw.isdigit():
            return [f"{IB_GID_INDEX}={raw} is not a number (unset it: NCCL >= 2.21 picks a RoCE v2 GID)"]
        out = []
        for p in roce:
            why = gid_index_problem(p, int(raw))
            if why:
                out.append(f"{IB_GID_INDEX}={raw} {why}; {_v2_indices(p, env)}")
        return out
    return [
        f"no RoCE v2 GID on RoCE port {p.name} (NCCL would fall back to index 0, not routable; "
        "give the port's netdev an IP address in the pod's network)"
        for p in roce
        if not nccl_gids(p, env)
    ]


def _v2_indices(port: Port, env: Mapping[str, str]) -> str:
    found = nccl_gids(port, env)
    if not found:
        return f"{port.name} has no RoCE v2 GID"
    shown = ", ".join(f"{g.index} ({g.kind()})" for g in found)
    return f"RoCE v2 on {port.name}: {shown} (unset it and NCCL >= 2.21 picks one, as show_gids lists)"


# ---- the decisions (pure) ---------------------------------------------------------------------


def interface_of(view: PodView, local_ip: str) -> Iface | None:
    """The interface holding ``local_ip``; else the one whose network contains it (a pod IP that
    only the loopback route serves, 127.x on one host)."""
    ip = ipaddress.ip_address(local_ip)
    for i in view.interfaces:
        if any(a.ip == ip for a in i.addrs):
            return i
    inside = [
        (a.network.prefixlen, i)
        for i in view.interfaces
        for a in i.addrs
        if a.version == ip.version and ip in a.network
    ]
    return max(inside, key=lambda x: x[0])[1] if inside else None


def bootstrap_interface(view: PodView, names: list[str]) -> str | None:
    """The interface NCCL's bootstrap takes among ``names`` (NCCL_SOCKET_IFNAME): the first
    address getifaddrs returns that belongs to one, IPv4 addresses of every interface before
    IPv6 ones (the kernel's address dump), interfaces in index order; IPv6 loopback skipped."""
    for version in (4, 6):
        for i in view.interfaces:
            if i.name in names and any(a.version == version and not a.ip.is_loopback for a in i.addrs):
                return i.name
    return None


def socket_ifnames(view: PodView, route: Iface, fast: list[str]) -> tuple[list[str], list[str]]:
    """NCCL_SOCKET_IFNAME's interfaces: ``route`` (the rendezvous's) and each of ``fast`` with a
    usable address that leaves NCCL's bootstrap on ``route``; and the fast ones left out."""
    by_name = {i.name: i for i in view.interfaces}
    listed, left = [route.name], []
    for name in fast:
        iface = by_name.get(name)
        if name in listed or iface is None or not iface.usable():
            continue
        if bootstrap_interface(view, [*listed, name]) == route.name:
            listed.append(name)
        else:
            left.append(name)
    return listed, left


def resolve_socket(
    view: PodView, env: Mapping[str, str], reach: Reach, out: Resolution, fast: list[str] | None = None
) -> None:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME: the template's when set (checked against the
    pod's interfaces), else the interface the rendezvous is reached through (gloo) and with it
    the ``fast`` netdevs (NCCL: :func:`socket_ifnames`)."""
    route = interface_of(view, reach.local_ip)
    target = f"MASTER_ADDR={reach.master} ({reach.master_ip}) port {reach.port}"
    if route is None:
        raise NetError(
            f"no interface in this pod holds {reach.local_ip}, the address its route to {target} "
            f"starts from (the pod has {view.describe_ifaces()}): set {SOCKET_IFNAME} in the pod template"
        )
    usable = [i.name for i in view.interfaces if i.usable()]
    nccl, gloo = env.get(SOCKET_IFNAME, "").strip(), env.get(GLOO_IFNAME, "").strip()
    fix = (
        f"remove it from the pod template (Holmes resolves {route.name} here) or name an interface "
        "the pod has"
    )
    if nccl:
        matched = select_ifaces(usable, nccl)
        if not matched:
            raise NetError(
                f"{SOCKET_IFNAME}={nccl} (set in the pod template) matches no interface with an address "
                f"in this pod; the pod has {view.describe_ifaces()} and reaches {target} through "
                f"{route.name}: {fix}"
            )
        out.report["socket"] = {"ifname": nccl, "why": "set in the pod template", "matches": matched}
        if route.name not in matched:
            out.report["socket"]["note"] = (
                f"the rendezvous is reached through {route.name}, not through these"
            )
    else:
        listed, left = socket_ifnames(view, route, fast or [])
        out.env[SOCKET_IFNAME] = "=" + ",".join(listed)
        out.report["socket"] = {
            "ifname": ",".join(listed),
            "why": f"{route.name} holds {reach.local_ip}, the local address of the route to {target}"
            + (
                f"; {', '.join(listed[1:])}: the RDMA ports' netdevs, for the Socket transport"
                if listed[1:]
                else ""
            ),
        }
        if left:
            out.report["socket"]["leftOut"] = (
                f"{', '.join(left)}: NCCL's bootstrap would take it instead of {route.name} (the first "
                "listed interface in the kernel's order)"
            )
    if gloo:
        missing = [n for n in (s.strip() for s in gloo.split(",")) if n and n not in usable]
        if missing:
            raise NetError(
                f"{GLOO_IFNAME}={gloo} (set in the pod template) names {', '.join(missing)}, not an "
                f"interface with an address in this pod; the pod has {view.describe_ifaces()}: {fix}"
            )
        out.report["gloo"] = {"ifname": gloo, "why": "set in the pod template"}
    else:
        # gloo's host groups on the interface NCCL's bootstrap uses
        chosen = route.name if not nccl or route.name in select_ifaces(usable, nccl) else None
        chosen = chosen or select_ifaces(usable, nccl)[0]
        out.env[GLOO_IFNAME] = chosen
        out.report["gloo"] = {"ifname": chosen, "why": f"the interface of {SOCKET_IFNAME}"}


def resolve_hcas(view: PodView, env: Mapping[str, str], out: Resolution) -> list[Port]:
    """NCCL_IB_HCA on an RDMA node; returns the ports NCCL will use (for the GID check)."""
    kind = env.get(ENV_NIC, "")
    wanted = LINK_LAYER[kind]
    by_name = {h.name: h for h in view.hcas}
    present = list(by_name)
    explicit = env.get(IB_HCA, "").strip()
    if explicit:
        chosen, missing = select_hcas(present, explicit)
        if missing:
            raise NetError(
                f"{IB_HCA}={explicit} (set in the pod template) names {', '.join(missing)}, not under "
                f"/sys/class/infiniband in this pod (the pod has {', '.join(present) or 'no RDMA device'}; "
                "under SR-IOV a pod sees only its VFs, named otherwise than the host's HCAs): remove it "
                "from the pod template (Holmes picks the pod's own ACTIVE ports) or name a device listed"
            )
        ports = [p for h, n in chosen for p in by_name[h].ports if (n is None or p.port == n) and p.active]
        out.report["hca"] = {
            "value": explicit,
            "why": "set in the pod template",
            "ports": [p.name for p in ports],
        }
        return ports

    why: list[str] = []
    hcas = list(view.hcas)
    if view.devices is not None:  # a device plugin mounts only the devices of the pod's resource
        openable = [h for h in hcas if h.uverbs is None or h.uverbs in view.devices]
        if len(openable) < len(hcas):
            why.append(
                f"{', '.join(h.name for h in hcas if h not in openable)}: no verbs device in "
                "/dev/infiniband (not this pod's RDMA resource)"
            )
        hcas = openable
    hint = [h for h in (s.strip() for s in env.get(ENV_HOST_HCAS, "").split(",")) if h]
    if hint:
        rails = [h for h in hcas if h.name in hint]
        if env.get(ENV_POD_NETWORK) == HOST_NETWORK:
            gone = [h for h in hint if h not in by_name]
            if gone:
                out.problems.append(
                    f"{ENV_HOST_HCAS} names {', '.join(gone)}, not under /sys/class/infiniband on this host"
                )
            why.append(f"hostNetwork: the node's rails ({ENV_HOST_HCAS})")
            hcas = rails
        elif rails:
            why.append(f"the pod sees the host's HCA names (shared RDMA devices): {ENV_HOST_HCAS}")
            hcas = rails
        else:
            why.append(f"the pod's own devices (none is named as in {ENV_HOST_HCAS}: SR-IOV VFs)")
    ports = [p for h in hcas for p in h.ports if p.active and p.link_layer == wanted]
    skipped = [p.name for h in hcas for p in h.ports if p not in ports]
    if skipped:
        why.append(f"not ACTIVE or not {wanted}: {', '.join(skipped)}")
    if kind == ROCE:
        without = [p for p in ports if not nccl_gids(p, env)]
        if without:
            why.append(f"no RoCE v2 GID: {', '.join(p.name for p in without)}")
            out.problems += gid_problems(without, env)
            ports = [p for p in ports if p not in without]
    if ports:
        out.env[IB_HCA] = "=" + ",".join(p.name for p in ports)
    else:
        out.problems.append(
            f"no usable {wanted} port among the RDMA devices this pod sees "
            f"({', '.join(present) or 'none under /sys/class/infiniband'}): {IB_HCA} left unset"
        )
    out.report["hca"] = {"value": out.env.get(IB_HCA), "why": why or ["every ACTIVE port the pod sees"]}
    return ports


def resolve_gid(
    ports: list[Port], env: Mapping[str, str], nccl: tuple[int, ...] | None, out: Resolution
) -> None:
    """NCCL_IB_GID_INDEX: never set by Holmes; checked when the template sets it."""
    raw = env.get(IB_GID_INDEX, "").strip()
    if raw and raw != "-1":
        bad = gid_problems(ports, env)
        if bad:
            raise NetError(
                "; ".join(bad)
                + f" ({IB_GID_INDEX} is set in the pod template: remove it or name a RoCE v2 index)"
            )
        out.report["gid"] = {"index": raw, "why": "set in the pod template; RoCE v2 on every port"}
        return
    out.problems += gid_problems(ports, env)  # template HCAs: not filtered by their GIDs above
    if nccl is not None and nccl < NCCL_AUTO_GID:
        have = "; ".join(_v2_indices(p, env) for p in ports)
        out.problems.append(
            f"NCCL {'.'.join(map(str, nccl))} does not pick a RoCE v2 GID itself (2.21 does): set "
            f"{IB_GID_INDEX} in the pod template ({have})"
        )
    chosen = {p.name: [g.index for g in nccl_gids(p, env)] for p in ports}
    out.report["gid"] = {"index": None, "why": "left to NCCL (RoCE v2, NCCL >= 2.21)", "roceV2": chosen}


def rail_netdevs(view: PodView, ports: list[Port]) -> list[str]:
    """The netdevs of the HCAs whose ``ports`` NCCL uses, in the kernel's interface order."""
    hcas = {p.hca for p in ports}
    names = {n for h in view.hcas if h.name in hcas for n in h.netdevs}
    return [i.name for i in view.interfaces if i.name in names]


def resolve(
    view: PodView, env: Mapping[str, str], reach: Reach, nccl: tuple[int, ...] | None = None
) -> Resolution:
    """What to set in the workers' environment, and why. Raises NetError for a template value
    that names what the pod does not have."""
    out = Resolution()
    kind = env.get(ENV_NIC, "")
    out.report.update(
        {
            "podNetwork": env.get(ENV_POD_NETWORK) or POD_NETWORK,
            "nic": kind or "unknown",
            "rendezvous": f"{reach.master}:{reach.port} -> {reach.master_ip} from {reach.local_ip}",
        }
    )
    fast: list[str] = []
    if kind in LINK_LAYER and env.get("NCCL_IB_DISABLE", "0").strip() in ("", "0"):
        ports = resolve_hcas(view, env, out)
        if kind == ROCE:
            resolve_gid(ports, env, nccl, out)
            fast = rail_netdevs(view, ports)
    routed = env.get(ENV_SOCKET_RAILS, "").strip() == RAILS_ROUTED
    resolve_socket(view, env, reach, out, fast if routed else [])
    if fast and not routed and SOCKET_IFNAME in out.env:
        out.report["socket"]["rails"] = (
            f"{', '.join(fast)} (the RDMA ports' netdevs) not listed for NCCL's Socket transport: set "
            f"{ENV_SOCKET_RAILS}={RAILS_ROUTED} in the pod template where their addresses are routed "
            "between all the job's pods"
        )
    out.report["set"] = dict(out.env)
    out.report["problems"] = list(out.problems)
    return out


# ---- gathering the snapshot (I/O) ---------------------------------------------------------------


def reach(
    master: str,
    port: int,
    timeout_s: float = RESOLVE_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Reach:
    """Resolve MASTER_ADDR and ask the kernel which local address its route starts from (a UDP
    connect sends nothing). Retried until ``timeout_s``: a headless Service's DNS record, or a
    route, can appear after the pod starts."""
    deadline = clock() + timeout_s
    last: Exception | None = None
    while True:
        try:
            infos = socket.getaddrinfo(master, port, type=socket.SOCK_DGRAM)
            for family, _, _, _, addr in infos:
                try:
                    with socket.socket(family, socket.SOCK_DGRAM) as s:
                        s.connect(addr)
                        return Reach(master, port, str(addr[0]), str(s.getsockname()[0]).split("%")[0])
                except OSError as e:  # no route for this family: try the next address
                    last = e
        except OSError as e:  # gaierror: no record yet
            last = e
        if clock() >= deadline:
            raise NetError(
                f"MASTER_ADDR={master} (port {port}) cannot be reached from this pod after {timeout_s:g} s "
                f"({last}): check that rank 0's pod and the job's headless Service exist, and the pod's DNS"
            )
        sleep(1.0)


RTM_GETADDR, RTM_NEWADDR, NLMSG_DONE, NLMSG_ERROR = 22, 20, 3, 2
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFA_ADDRESS, IFA_LOCAL = 1, 2


def parse_addresses(data: bytes) -> tuple[list[tuple[int, IPInterface]], bool]:
    """(interface index, address) of each RTM_NEWADDR message in a netlink dump chunk, and
    whether the dump is done. IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer's
    on point-to-point links)."""
    out: list[tuple[int, IPInterface]] = []
    off = 0
    while off + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, off)
        if length < 16:
            break
        if kind == NLMSG_DONE:
            return out, True
        if kind == NLMSG_ERROR:
            (errno,) = struct.unpack_from("=i", data, off + 16)
            raise OSError(-errno, f"netlink RTM_GETADDR: {os.strerror(-errno)}")
        if kind == RTM_NEWADDR:
            _family, prefix, _flags, _scope, index = struct.unpack_from("=BBBBI", data, off + 16)
            attrs: dict[int, bytes] = {}
            at = off + 24
            while at + 4 <= off + length:
                alen, atype = struct.unpack_from("=HH", data, at)
                if alen < 4:
                    break
                attrs[atype] = data[at + 4 : at + alen]
                at += (alen + 3) & ~3
            raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
            if raw and len(raw) in (4, 16):
                out.append((index, ipaddress.ip_interface(f"{ipaddress.ip_address(raw)}/{prefix}")))
        off += (length + 3) & ~3
    return out, False


def interfaces() -> tuple[Iface, ...]:
    """Every interface of this network namespace with all its addresses (secondary ones too,
    which SIOCGIFADDR would miss), from one rtnetlink dump."""
    found: dict[int, list[IPInterface]] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.bind((0, 0))
        header = struct.pack("=IHHII", 24, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
        s.send(header + struct.pack("=BBBBI", socket.AF_UNSPEC, 0, 0, 0, 0))
        done = False
        while not done:
            chunk, done = parse_addresses(s.recv(1 << 16))
            for index, addr in chunk:
                found.setdefault(index, []).append(addr)
    return tuple(Iface(name, tuple(found.get(index, ()))) for index, name in socket.if_nameindex())


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:  # absent, or an empty GID entry (the kernel answers EINVAL)
        return ""


def _numbered(d: Path) -> list[Path]:
    try:
        return sorted((p for p in d.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    except OSError:
        return []


def read_hcas(sys_root: Path) -> tuple[Hca, ...]:
    """The RDMA devices under ``sys_root``/class/infiniband, with ports, states and GID tables."""
    cls = sys_root / "class" / "infiniband"
    verbs = {_read(d / "ibdev"): d.name for d in sorted((sys_root / "class" / "infiniband_verbs").glob("*"))}
    out = []
    for hca in sorted(cls.iterdir()) if cls.is_dir() else []:
        ports = []
        for p in _numbered(hca / "ports"):
            gids = []
            for g in _numbered(p / "gids"):
                value = _read(g)
                if value and set(value.replace(":", "")) - {"0"}:
                    gids.append(Gid(int(g.name), value, _read(p / "gid_attrs" / "types" / g.name)))
            ports.append(
                Port(hca.name, int(p.name), _read(p / "state"), _read(p / "link_layer"), tuple(gids))
            )
        netdevs = tuple(sorted(p.name for p in (hca / "device" / "net").glob("*")))
        out.append(Hca(hca.name, tuple(ports), verbs.get(hca.name), netdevs))
    return tuple(out)


def read_devices(dev_root: Path) -> frozenset[str] | None:
    d = dev_root / "infiniband"
    return frozenset(p.name for p in d.iterdir()) if d.is_dir() else None


def look(root: Path) -> PodView:
    """What this pod sees: its namespace's interfaces, and ``root``/sys and ``root``/dev."""
    try:
        found = interfaces()
    except OSError as e:  # a sandbox without rtnetlink
        raise NetError(
            f"cannot list this pod's network interfaces ({e}): the pod's {SOCKET_IFNAME} and "
            f"{GLOO_IFNAME} cannot be resolved here"
        ) from None
    return PodView(found, read_hcas(root / "sys"), read_devices(root / "dev"))


def nccl_version() -> tuple[int, ...] | None:
    """The NCCL torch was built with, None when torch or its NCCL is absent (a CPU build)."""
    try:
        import torch

        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return tuple(v) if isinstance(v, tuple) else None


def setup(
    env: MutableMapping[str, str],
    master: str,
    port: int,
    *,
    root: Path | None = None,
    timeout_s: float = RESOLVE_SECONDS,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> Resolution:
    """Resolve this pod's names into ``env`` (what torchrun and its workers inherit) and log
    one ``{"holmesNet": ...}`` line. Raises NetError when a template value is wrong or the
    rendezvous cannot be reached. ``root``: where sys/ and dev/ are (HOLMES_FABRIC_ROOT, else /)."""
    base = root or Path(env.get("HOLMES_FABRIC_ROOT") or "/")
    found = reach(master, port, timeout_s)
    view = look(base)
    nccl = nccl_version() if env.get(ENV_NIC) == ROCE and not env.get(IB_GID_INDEX) else None
    out = resolve(view, env, found, nccl)
    env.update(out.env)
    log(json.dumps({"holmesNet": out.report}))
    return out
