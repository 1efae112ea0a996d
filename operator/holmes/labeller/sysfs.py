"""Read a node's NIC facts from a sysfs tree (pure reading: no Kubernetes, no decisions).

What is read, relative to the root (``/sys`` on a host, ``/host/sys`` in the labeller pod):

- ``class/infiniband/<hca>/ports/<n>/link_layer``: ``InfiniBand``, or ``Ethernet`` for RoCE;
  ``.../rate``: e.g. ``200 Gb/sec (4X HDR)``; ``.../state``: e.g. ``4: ACTIVE``;
  ``class/infiniband/<hca>/device/net/``: the netdevs of the HCA's PCI device;
  ``class/infiniband/<hca>/device``: the PCI device, whose resolved path names its upstream
  bridges (``devices/pci0000:00/<root port>/<switch ports>/<device>``), ``numa_node``, and a
  ``physfn`` link when it is an SR-IOV virtual function.
- ``bus/pci/devices/<address>/{vendor,class}``: NVIDIA GPUs (vendor ``0x10de``, class
  ``0x0302xx`` 3D controller or ``0x0300xx`` VGA), where they sit on PCIe and their NUMA node.
- ``class/net/<if>/``: ``operstate`` (``up``), ``speed`` (Mbit/s; ``-1`` or unreadable when
  unknown or down), ``type`` (1 = Ethernet, 32 = IPoIB), and whether it is backed by hardware
  (a ``device`` link) or a bond (``bonding/``) rather than virtual (lo, veth, bridges, ...).

Anything unreadable becomes ``None`` plus a line in ``SysfsFacts.errors``: a half-broken tree
still yields what can be read, and the caller decides.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# Virtual interfaces whose name gives them away even where they have a `device` link (some
# drivers' representors, tunnels); never a candidate for NCCL's socket interface.
VIRTUAL_PREFIXES = (
    "lo",
    "veth",
    "docker",
    "cni",
    "br-",
    "virbr",
    "flannel",
    "cali",
    "vxlan",
    "tunl",
    "tun",
    "tap",
    "kube-",
    "cilium",
    "weave",
    "genev",
    "dummy",
    "nodelocaldns",
)
ARPHRD_ETHER, ARPHRD_INFINIBAND = 1, 32
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0302", "0x0300")  # 3D controller (data-centre GPUs), VGA controller


@dataclass(frozen=True)
class PciDevice:
    address: str  # e.g. 0000:17:00.0
    bridges: tuple[str, ...]  # upstream PCI bridges, root port first (empty: on a root bus)
    numa_node: int | None  # None when the platform does not say (-1)
    physfn: str | None = None  # the physical function's address, for an SR-IOV virtual function


@dataclass(frozen=True)
class RdmaPort:
    hca: str  # e.g. mlx5_0
    port: int  # 1-based port number
    link_layer: str | None  # "InfiniBand" | "Ethernet" (= RoCE) | None if unreadable
    rate_gbps: float | None  # from "200 Gb/sec (4X HDR)"
    state: str | None  # "ACTIVE", "DOWN", "INIT", "ARMED", ...
    netdevs: tuple[str, ...] = ()  # netdevs of the HCA's PCI device (ib0, ens1f0np0, ...)
    pci: PciDevice | None = None  # the HCA's PCI device (None: no device link)

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def name(self) -> str:
        return f"{self.hca}/{self.port}"


@dataclass(frozen=True)
class NetDev:
    name: str
    operstate: str | None  # "up", "down", "unknown", ...
    speed_mbps: int | None  # None when the kernel does not know (down, virtio, ...)
    link_type: int | None  # ARPHRD_*: 1 Ethernet, 32 IPoIB
    physical: bool  # hardware-backed or a bond, not a virtual interface

    @property
    def up(self) -> bool:
        return self.operstate == "up"

    @property
    def ethernet(self) -> bool:
        return self.link_type == ARPHRD_ETHER


@dataclass(frozen=True)
class SysfsFacts:
    root: str
    ports: tuple[RdmaPort, ...] = ()
    netdevs: tuple[NetDev, ...] = ()
    infiniband_class: bool = False  # class/infiniband exists (rdma core loaded)
    gpus: tuple[PciDevice, ...] = ()  # NVIDIA GPUs on the PCI bus
    errors: tuple[str, ...] = field(default=(), compare=False)


class SysfsError(RuntimeError):
    """The root is not a sysfs tree at all (the message says what to mount where)."""


def natural_key(name: str) -> tuple:
    """mlx5_2 before mlx5_10."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def parse_rate(text: str | None) -> float | None:
    m = _RATE.match(text or "")
    return float(m.group(1)) if m else None


def parse_state(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE' (the number is the enum value, the word is what people read)."""
    if text is None:
        return None
    return text.split(":", 1)[-1].strip().upper() or None


def read_sysfs(root: str | os.PathLike = "/sys") -> SysfsFacts:
    base = Path(root)
    net_dir = base / "class" / "net"
    if not net_dir.is_dir():
        raise SysfsError(
            f"{net_dir} does not exist: {base} is not a sysfs tree (mount the host's /sys "
            f"there read-only, or pass --sysfs-root)"
        )
    errors: list[str] = []

    def read(p: Path) -> str | None:
        try:
            return p.read_text().strip()
        except OSError as e:  # e.g. EINVAL reading the speed of a down link
            errors.append(f"{p}: {e.strerror or e}")
            return None

    ports: list[RdmaPort] = []
    ib_dir = base / "class" / "infiniband"
    for hca_dir in sorted(_entries(ib_dir), key=lambda p: natural_key(p.name)):
        hca_netdevs = tuple(sorted((p.name for p in _entries(hca_dir / "device" / "net")), key=natural_key))
        hca_pci = _pci_device(hca_dir / "device", read) if (hca_dir / "device").exists() else None
        port_dirs = sorted(
            (p for p in _entries(hca_dir / "ports") if p.name.isdigit()), key=lambda p: int(p.name)
        )
        if not port_dirs:
            errors.append(f"{hca_dir}: no ports/")
        for pd in port_dirs:
            rate_text = read(pd / "rate")
            rate = parse_rate(rate_text)
            if rate_text is not None and rate is None:
                errors.append(f"{pd / 'rate'}: {rate_text!r} is not '<n> Gb/sec ...'")
            ports.append(
                RdmaPort(
                    hca=hca_dir.name,
                    port=int(pd.name),
                    link_layer=read(pd / "link_layer"),
                    rate_gbps=rate,
                    state=parse_state(read(pd / "state")),
                    netdevs=hca_netdevs,
                    pci=hca_pci,
                )
            )

    netdevs: list[NetDev] = []
    for nd in sorted(_entries(net_dir), key=lambda p: natural_key(p.name)):
        operstate = read(nd / "operstate")
        speed = None
        if operstate == "up":  # the kernel refuses (EINVAL) or says -1 for links that are down
            speed = _int(read(nd / "speed"))
            speed = speed if speed and speed > 0 else None
        netdevs.append(
            NetDev(
                name=nd.name,
                operstate=operstate,
                speed_mbps=speed,
                link_type=_int(read(nd / "type")),
                physical=_physical(nd),
            )
        )
    gpus = []
    for dev in sorted(_entries(base / "bus" / "pci" / "devices"), key=lambda p: p.name):
        vendor, cls = read(dev / "vendor"), read(dev / "class")
        if vendor == NVIDIA_VENDOR and (cls or "").startswith(GPU_CLASSES):
            gpus.append(_pci_device(dev, read))
    return SysfsFacts(
        root=str(base),
        ports=tuple(ports),
        netdevs=tuple(netdevs),
        infiniband_class=ib_dir.is_dir(),
        gpus=tuple(gpus),
        errors=tuple(errors),
    )


def _pci_device(link: Path, read) -> PciDevice:
    """A PCI device from a link to its sysfs directory: the resolved path lists the bridges above it."""
    chain = [part for part in Path(os.path.realpath(link)).parts if _PCI_ADDRESS.match(part)]
    address = chain[-1] if chain else Path(os.path.realpath(link)).name
    numa = _int(read(link / "numa_node")) if (link / "numa_node").exists() else None
    physfn = link / "physfn"
    return PciDevice(
        address=address,
        bridges=tuple(chain[:-1]),
        numa_node=numa if numa is not None and numa >= 0 else None,
        physfn=Path(os.path.realpath(physfn)).name if physfn.exists() else None,
    )


def _entries(d: Path) -> list[Path]:
    try:
        return [p for p in d.iterdir()]
    except OSError:
        return []


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _physical(nd: Path) -> bool:
    if nd.name.startswith(VIRTUAL_PREFIXES) or (nd / "bridge").is_dir():
        return False
    if (nd / "bonding").is_dir():  # a bond of physical NICs is a fine socket interface
        return True
    # /sys/class/net/<if> links into /sys/devices/virtual/net/ for software interfaces; hardware
    # ones have a `device` link to their bus device.
    if "/devices/virtual/" in os.path.realpath(nd):
        return False
    return (nd / "device").exists()
