"""Build sysfs-shaped trees as real files, laid out as the kernel does: hardware under
devices/pci0000:00/[<bridges>/]<pci>/{infiniband,net}/ (each PCI device with vendor, class and
numa_node, and linked from bus/pci/devices/), software interfaces under devices/virtual/net/, and
class/infiniband/<hca> and class/net/<if> as relative symlinks into them (so a tree still works
when bind-mounted elsewhere, as the node agent does with a hostPath)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
MELLANOX, NVIDIA, INTEL = "0x15b3", "0x10de", "0x8086"
NETWORK_CLASS, INFINIBAND_CLASS, BRIDGE_CLASS, GPU_CLASS = "0x020000", "0x020700", "0x060400", "0x030200"


class FakeSysfs:
    def __init__(self, root: Path):
        self.root = Path(root)
        (self.root / "class" / "net").mkdir(parents=True, exist_ok=True)
        self._pci = 0

    def _link(self, cls: str, name: str, target: Path) -> None:
        link = self.root / "class" / cls / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(target, link.parent))

    def _pci_dev(
        self,
        parent: Path | None = None,
        *,
        vendor: str = MELLANOX,
        cls: str = NETWORK_CLASS,
        numa: int | None = None,
        physfn: Path | None = None,
    ) -> Path:
        """A PCI device below ``parent`` (a bridge; default: the root bus), in bus/pci/devices."""
        self._pci += 1
        d = (parent or self.root / "devices" / "pci0000:00") / f"0000:{0x3A + self._pci:02x}:00.0"
        self._write(d, vendor=vendor, numa_node=str(-1 if numa is None else numa), **{"class": cls})
        if physfn is not None:
            (d / "physfn").symlink_to(os.path.relpath(physfn, d))
        link = self.root / "bus" / "pci" / "devices" / d.name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(d, link.parent))
        return d

    def bridge(self, parent: Path | None = None, numa: int | None = None) -> Path:
        """A PCIe bridge: a root port (no parent) or a switch port below ``parent``."""
        return self._pci_dev(
            parent, vendor=INTEL if parent is None else "0x1000", cls=BRIDGE_CLASS, numa=numa
        )

    def gpu(self, parent: Path | None = None, numa: int | None = None) -> Path:
        return self._pci_dev(parent, vendor=NVIDIA, cls=GPU_CLASS, numa=numa)

    @staticmethod
    def _write(d: Path, **files: str) -> None:
        d.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            if text is not None:
                (d / name).write_text(text + "\n")

    def netdev(
        self,
        name: str,
        *,
        speed_mbps: int | None = None,
        up: bool = True,
        link_type: int = 1,
        pci: Path | None = None,
        virtual: bool = False,
        bond: bool = False,
    ) -> Path:
        """A network interface. Hardware ones live under a PCI device (``pci``, or a new one)."""
        if virtual or bond:
            d = self.root / "devices" / "virtual" / "net" / name
        else:
            pci = pci or self._pci_dev(vendor=INTEL)
            d = pci / "net" / name
        speed = None if speed_mbps is None else str(speed_mbps if up else -1)
        self._write(d, operstate="up" if up else "down", type=str(link_type), speed=speed)
        if bond:
            (d / "bonding").mkdir()
        if not (virtual or bond):
            (d / "device").symlink_to(os.path.relpath(pci, d))
        self._link("net", name, d)
        return d

    def hca(
        self,
        name: str,
        ports: list[tuple[str, str, str]],
        netdevs: list[tuple[str, int, int]] = (),
        gids: dict[int, str] | None = None,
        *,
        parent: Path | None = None,
        numa: int | None = None,
        physfn: Path | None = None,
    ) -> Path:
        """An RDMA device. ``ports``: (link_layer, rate, state) for ports 1..n, e.g.
        ("InfiniBand", "200 Gb/sec (4X HDR)", "4: ACTIVE"); ``netdevs``: (name, speed Mbit/s, type);
        ``gids``: GID table entries (index -> address) of every port, the kernel writes zeros elsewhere;
        ``parent``: the PCIe bridge it sits below; ``physfn``: the PF's directory, for an SR-IOV VF."""
        cls = INFINIBAND_CLASS if ports and ports[0][0] == "InfiniBand" else NETWORK_CLASS
        pci = self._pci_dev(parent, cls=cls, numa=numa, physfn=physfn)
        d = pci / "infiniband" / name
        for i, (link_layer, rate, state) in enumerate(ports, start=1):
            self._write(
                d / "ports" / str(i),
                link_layer=link_layer,
                rate=rate,
                state=state,
                phys_state="5: LinkUp" if "ACTIVE" in state else "3: Disabled",
            )
            table = {0: "fe80:0000:0000:0000:0000:0000:0000:0001", **(gids or {})}
            self._write(d / "ports" / str(i) / "gids", **{str(k): table.get(k, ZERO_GID) for k in range(8)})
        (d / "device").symlink_to(os.path.relpath(pci, d))
        self._link("infiniband", name, d)
        for nd, speed, link_type in netdevs:
            self.netdev(nd, speed_mbps=speed, link_type=link_type, pci=pci)
        return d

    def set_port_state(self, hca: str, port: int, state: str) -> None:
        (self.root / "class" / "infiniband" / hca / "ports" / str(port) / "state").write_text(state + "\n")

    # Whole nodes, as the tests and the cluster test use them.
    def base_host(self) -> FakeSysfs:
        """What every Linux host has: lo, a docker bridge, a veth, and a 1 Gbit/s management NIC."""
        self.netdev("lo", virtual=True, link_type=772)
        self.netdev("docker0", speed_mbps=10000, virtual=True)
        (self.root / "devices" / "virtual" / "net" / "docker0" / "bridge").mkdir()
        self.netdev("veth1a2b3c", speed_mbps=10000, virtual=True)
        self.netdev("eno1", speed_mbps=1000)
        return self


NDR = "400 Gb/sec (4X NDR)"


def gpu_server(
    root: Path,
    rail_links: Sequence[str] = ("InfiniBand",) * 8,
    rate: str = NDR,
    others: Sequence[tuple[str, str, str, str, int, int]] = (),
) -> FakeSysfs:
    """An HGX-like server: 4 PCIe switches (two per NUMA node), each with 2 GPUs and 2 rail HCAs
    on switch ports of their own (mlx5_0.., one per link layer in ``rail_links``; RoCE rails have
    netdev ens<i>np0, InfiniBand ones ib<i>); ``others``: (hca, link_layer, rate, netdev, Mbit/s,
    numa) ports on root ports of their own, with no GPU (front-end, storage)."""
    fs = FakeSysfs(root).base_host()
    for sw in range(4):
        numa = sw // 2
        upstream = fs.bridge(fs.bridge(numa=numa), numa=numa)
        for _ in range(2):
            fs.gpu(fs.bridge(upstream, numa=numa), numa=numa)
        for i in (2 * sw, 2 * sw + 1):
            link = rail_links[i]
            nd = (f"ens{i}np0", 400000, 1) if link == "Ethernet" else (f"ib{i}", 400000, 32)
            fs.hca(
                f"mlx5_{i}",
                [(link, rate, "4: ACTIVE")],
                netdevs=[nd],
                parent=fs.bridge(upstream, numa=numa),
                numa=numa,
            )
    for hca, link, port_rate, netdev, mbps, numa in others:
        fs.hca(
            hca,
            [(link, port_rate, "4: ACTIVE")],
            netdevs=[(netdev, mbps, 1 if link == "Ethernet" else 32)],
            parent=fs.bridge(numa=numa),
            numa=numa,
        )
    return fs


def infiniband_node(root: Path, hcas: int = 1, rate: str = "200 Gb/sec (4X HDR)") -> FakeSysfs:
    fs = FakeSysfs(root).base_host()
    for i in range(hcas):
        fs.hca(f"mlx5_{i}", [("InfiniBand", rate, "4: ACTIVE")], netdevs=[(f"ib{i}", 200000, 32)])
    return fs


def roce_node(root: Path, gbit: int = 100) -> FakeSysfs:
    fs = FakeSysfs(root).base_host()
    fs.hca(
        "mlx5_0",
        [("Ethernet", f"{gbit} Gb/sec (4X EDR)", "4: ACTIVE")],
        netdevs=[("ens1f0np0", gbit * 1000, 1)],
    )
    return fs


def ethernet_node(root: Path, gbit: int = 25) -> FakeSysfs:
    fs = FakeSysfs(root).base_host()
    fs.netdev("ens2f0", speed_mbps=gbit * 1000)
    return fs


def node_tree(root: Path, nic: str, gbps: float) -> FakeSysfs:
    """A tree whose truth is ``nic`` at ``gbps`` (a localkube topology node's nic/gbps)."""
    if nic == "infiniband":
        return infiniband_node(root, rate=f"{gbps:g} Gb/sec (4X HDR)")
    if nic == "roce":
        return roce_node(root, int(gbps))
    return ethernet_node(root, int(gbps))


def route_table(default_ifname: str) -> str:
    """A host's /proc/net/route whose default route (of two, the lower metric) is ``default_ifname``."""
    return (
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
        f"{default_ifname}\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
        "eno1\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n"
    )
