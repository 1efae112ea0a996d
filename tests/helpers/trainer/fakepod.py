"""What a pod sees of RDMA, as real files: the HCAs ``tests/helpers/labeller/fakesysfs.py`` lays out, plus
what the kernel shows beside them: each GID's type (``ports/<p>/gid_attrs/types/<i>``), each
HCA's verbs device (``class/infiniband_verbs/uverbsN/ibdev``), and the ``/dev/infiniband`` a
device plugin mounts into the pod."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.labeller.fakesysfs import FakeSysfs, infiniband_node, roce_node

V1, V2 = "IB/RoCE v1", "RoCE v2"
LINK_LOCAL = "fe80:0000:0000:0000:0000:0000:0000:0001"


def ipv4_gid(ip: str) -> str:
    """The IPv4-mapped GID sysfs shows for an address of the port's netdev."""
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def set_gid(sys_root: Path, hca: str, port: int, index: int, address: str, type_: str) -> None:
    d = sys_root / "class" / "infiniband" / hca / "ports" / str(port)
    (d / "gids").mkdir(parents=True, exist_ok=True)
    (d / "gids" / str(index)).write_text(address + "\n")
    (d / "gid_attrs" / "types").mkdir(parents=True, exist_ok=True)
    (d / "gid_attrs" / "types" / str(index)).write_text(type_ + "\n")


def roce_table(sys_root: Path, hca: str, ip: str | None, port: int = 1, v2: bool = True) -> None:
    """A RoCE port's GID table as mlx5 fills it: 0 link-local v1, 1 link-local v2, 2 the netdev's
    IPv4 address v1, 3 the same v2 (``v2=False``: a port configured for RoCE v1 only)."""
    set_gid(sys_root, hca, port, 0, LINK_LOCAL, V1)
    if v2:
        set_gid(sys_root, hca, port, 1, LINK_LOCAL, V2)
    if ip:
        set_gid(sys_root, hca, port, 2, ipv4_gid(ip), V1)
        if v2:
            set_gid(sys_root, hca, port, 3, ipv4_gid(ip), V2)


def roce_hca(fs: FakeSysfs, name: str, ip: str | None, *, state: str = "4: ACTIVE", v2: bool = True) -> None:
    fs.hca(name, [("Ethernet", "200 Gb/sec (4X HDR)", state)])
    roce_table(fs.root, name, ip, v2=v2)


def ib_hca(fs: FakeSysfs, name: str, *, state: str = "4: ACTIVE") -> None:
    fs.hca(name, [("InfiniBand", "200 Gb/sec (4X HDR)", state)])
    set_gid(fs.root, name, 1, 0, LINK_LOCAL, V1)


def verbs(pod: Path, devices: dict[str, int], mounted: list[str] | None = None) -> None:
    """Each HCA's verbs device (``devices``: hca -> N of uverbsN) under <pod>/sys, and the ones
    ``mounted`` (default all) under <pod>/dev/infiniband, as the RDMA device plugin does."""
    for hca, n in devices.items():
        d = pod / "sys" / "class" / "infiniband_verbs" / f"uverbs{n}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "ibdev").write_text(hca + "\n")
    dev = pod / "dev" / "infiniband"
    dev.mkdir(parents=True, exist_ok=True)
    for hca in devices if mounted is None else mounted:
        (dev / f"uverbs{devices[hca]}").touch()


def pod_root(tmp_path: Path, kind: str = "infiniband", uverbs: bool = True, **kw) -> Path:
    """A pod's view: <root>/sys as sysfs shows the node's HCAs, <root>/dev/infiniband if mounted."""
    sysfs = tmp_path / "sys"
    if kind == "infiniband":
        infiniband_node(sysfs, **kw)
    elif kind == "roce-gid":
        fs = FakeSysfs(sysfs).base_host()
        fs.hca("mlx5_0", [("Ethernet", "100 Gb/sec", "4: ACTIVE")])
        roce_table(sysfs, "mlx5_0", "10.0.0.5")  # RoCE v2 at index 3, as mlx5 fills the table
    else:
        roce_node(sysfs)
    if uverbs:
        (tmp_path / "dev" / "infiniband").mkdir(parents=True)
        (tmp_path / "dev" / "infiniband" / "uverbs0").touch()
    return tmp_path
