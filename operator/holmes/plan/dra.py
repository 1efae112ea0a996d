"""Devices from Dynamic Resource Allocation (``resource.k8s.io/v1`` ResourceSlices), pure.

A DRA driver publishes each device of a node in a ResourceSlice: ``spec.driver``,
``spec.nodeName``, ``spec.pool`` (name, generation, resourceSliceCount) and ``spec.devices[]``
with typed ``attributes`` (``{string|int|bool|version: value}``) and ``capacity``
(``{value: quantity}``). An attribute name without a domain belongs to the driver
(``productName`` of ``gpu.nvidia.com`` is ``gpu.nvidia.com/productName``).

Two drivers are read (their names are the cost model's ``nicMapping.draNicDriver`` and
``draGpuDriver``; an empty name turns that part off):

- DRANET (``dra.net``), one device per NIC: ``dra.net/rdma`` (an RDMA HCA behind it),
  ``dra.net/rdmaDevice`` (the HCA, ``mlx5_0``: what ``NCCL_IB_HCA`` names),
  ``dra.net/encapsulation`` (netlink's link type: ``infiniband`` for an IPoIB netdev, ``ether``
  for Ethernet, so RoCE on an RDMA NIC), ``dra.net/ifName``, ``dra.net/numaNode``,
  ``dra.net/virtual``, ``dra.net/isSriovVf`` and the standard ``resource.kubernetes.io/pcieRoot``.
  DRANET publishes no link speed, and no encapsulation for an RDMA device without a netdev
  (IB-only HCAs, EFA): the kind then comes from the same fallbacks as Node Feature Discovery's
  "RDMA, kind unknown" (discovery.py), never a guess.
- NVIDIA's GPU driver (``gpu.nvidia.com``): devices of ``type: gpu`` (MIG slices and others are
  not whole GPUs) with ``productName`` (``NVIDIA A100-SXM4-80GB``), ``architecture``, ``uuid``,
  ``resource.kubernetes.io/pcieRoot`` and the capacity ``memory``.

A pool whose slices come from several generations is being republished: only its newest
generation counts. Slices not bound to one node (``nodeSelector``, ``allNodes``, devices with
their own ``nodeName``: network-attached devices) are not a node's own and are skipped.

:func:`join` attaches each node's slices to an in-memory copy of its Node under
:data:`DEVICES_KEY` (never written to the API server), so every reader of a Node dict
(discovery, GPU types, routes) sees them without another argument.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .quantity import quantity_or_none

API_VERSION = "resource.k8s.io/v1"
SLICE_KIND = "ResourceSlice"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
# The node's slices on an in-memory Node copy (join); "without GPU types" hides their products.
DEVICES_KEY = "holmes.dev/resourceSlices"
_NO_GPU_TYPES = "holmes.dev/withoutGpuTypes"


@dataclass(frozen=True)
class DraNic:
    """One NIC as DRANET publishes it."""

    device: str  # the device's name in its slice (what an allocation names)
    rdma: bool
    hca: str | None = None  # dra.net/rdmaDevice
    encapsulation: str | None = None  # ether | infiniband | None (no netdev)
    ifname: str | None = None
    pcie_root: str | None = None
    numa: int | None = None
    virtual: bool = False
    sriov_vf: bool = False

    @property
    def link_kind(self) -> str | None:
        """infiniband | roce from the link type of an RDMA NIC; None when DRANET does not say."""
        if not self.rdma or self.encapsulation is None:
            return None
        enc = self.encapsulation.strip().lower()
        return "infiniband" if enc == "infiniband" else "roce" if enc in ("ether", "ethernet") else None


@dataclass(frozen=True)
class DraGpu:
    """One whole GPU as NVIDIA's DRA driver publishes it."""

    device: str
    product: str | None = None
    memory_gib: float | None = None
    pcie_root: str | None = None


@dataclass(frozen=True)
class NodeDevices:
    """A node's NICs and GPUs from its ResourceSlices."""

    nics: tuple[DraNic, ...] = ()
    gpus: tuple[DraGpu, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def rails(self) -> tuple[DraNic, ...]:
        """The RDMA NICs collectives run on: physical ones (not ``virtual``); VFs only where the
        node shows no RDMA PF (a VM's NICs are VFs; on a host they duplicate their PF)."""
        rdma = [n for n in self.nics if n.rdma and not n.virtual]
        pfs = [n for n in rdma if not n.sriov_vf]
        return tuple(pfs or rdma)

    def aligned_pairs(self, gpus: int) -> bool:
        """Whether each of ``gpus`` GPUs can get an RDMA NIC of its own on its PCIe root (every
        GPU and rail says its root, and no root has more GPUs than rails)."""
        if gpus < 1 or len(self.gpus) < gpus or len(self.rails) < gpus:
            return False
        roots_g = [g.pcie_root for g in self.gpus]
        roots_n = [n.pcie_root for n in self.rails]
        if None in roots_g or None in roots_n:
            return False
        # The scheduler may pick any ``gpus`` GPUs; each must find a rail on its own root.
        return all(roots_n.count(r) >= roots_g.count(r) for r in set(roots_g))


def attribute(device: Mapping[str, Any], driver: str, name: str) -> Any:
    """A device attribute's value by its name, qualified (``dra.net/rdma``) or the driver's own
    (``productName``); None when absent."""
    attrs = device.get("attributes") or {}
    short = name.split("/", 1)[1] if name.startswith(f"{driver}/") else name
    for key in (name, short, f"{driver}/{short}"):
        v = attrs.get(key)
        if isinstance(v, Mapping):
            for kind in ("string", "int", "bool", "version"):
                if kind in v:
                    return v[kind]
    return None


def _quantity_gib(q: Any) -> float | None:
    """A Kubernetes quantity ("80Gi", "40960Mi", "85899345920") in GiB; None if unreadable or not
    positive."""
    if isinstance(q, Mapping):
        q = q.get("value")
    x = quantity_or_none(q)
    return x / 2**30 if x is not None and x > 0 else None


def _nic(d: Mapping[str, Any], driver: str) -> DraNic:
    def a(name: str) -> Any:
        return attribute(d, driver, name)

    numa = a("numaNode")
    return DraNic(
        device=str(d.get("name") or ""),
        rdma=a("rdma") is True,
        hca=a("rdmaDevice") or None,
        encapsulation=a("encapsulation") or None,
        ifname=a("ifName") or None,
        pcie_root=a(PCIE_ROOT) or None,
        numa=numa if isinstance(numa, int) and not isinstance(numa, bool) else None,
        virtual=a("virtual") is True,
        sriov_vf=a("isSriovVf") is True,
    )


def _whole_gpu(d: Mapping[str, Any], driver: str) -> bool:
    kind = attribute(d, driver, "type")
    return kind is None or kind == "gpu"  # not MIG slices, VFIO passthrough...


def _gpu(d: Mapping[str, Any], driver: str, types: bool) -> DraGpu | None:
    if not _whole_gpu(d, driver):
        return None
    return DraGpu(
        device=str(d.get("name") or ""),
        product=(attribute(d, driver, "productName") or None) if types else None,
        memory_gib=_quantity_gib((d.get("capacity") or {}).get("memory")) if types else None,
        pcie_root=attribute(d, driver, PCIE_ROOT) or None,
    )


def node_devices(node: Mapping[str, Any], nic_driver: str, gpu_driver: str) -> NodeDevices | None:
    """The NICs and GPUs of the slices :func:`join` put on ``node``; None when it has none."""
    specs = node.get(DEVICES_KEY)
    if not specs:
        return None
    types = not node.get(_NO_GPU_TYPES)
    nics: list[DraNic] = []
    gpus: list[DraGpu] = []
    for spec in specs:
        driver = spec.get("driver")
        for d in spec.get("devices") or []:
            if not isinstance(d, Mapping):
                continue
            if nic_driver and driver == nic_driver:
                nics.append(_nic(d, driver))
            elif gpu_driver and driver == gpu_driver:
                g = _gpu(d, driver, types)
                if g is not None:
                    gpus.append(g)
    if not nics and not gpus:
        return None
    problems = []
    kinds = sorted({k for n in NodeDevices(tuple(nics)).rails if (k := n.link_kind)})
    if len(kinds) > 1:
        problems.append(
            f"its RDMA NICs in ResourceSlices of {nic_driver} disagree on the link layer "
            f"({' and '.join(kinds)}): label the node holmes.dev/nic with the kind its compute rails use"
        )
    return NodeDevices(tuple(nics), tuple(gpus), tuple(problems))


def whole_gpus(node: Mapping[str, Any], gpu_driver: str) -> frozenset[tuple[str, str, str]]:
    """The node's whole GPUs (what discovery counts) as an allocation names a device: (driver,
    pool, device); empty without slices of ``gpu_driver``."""
    return frozenset(
        (gpu_driver, str(spec.get("pool") or ""), str(d.get("name") or ""))
        for spec in node.get(DEVICES_KEY) or ()
        if gpu_driver and spec.get("driver") == gpu_driver
        for d in spec.get("devices") or ()
        if isinstance(d, Mapping) and _whole_gpu(d, gpu_driver)
    )


def _current(slices: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The slices of each pool's newest generation, bound to one node."""
    newest: dict[tuple[str, str], int] = {}
    kept = []
    for s in slices:
        spec = s.get("spec") or {}
        if not spec.get("nodeName") or not spec.get("driver"):
            continue  # nodeSelector / allNodes / perDeviceNodeSelection: not one node's own
        pool = spec.get("pool") or {}
        key = (str(spec["driver"]), str(pool.get("name") or spec["nodeName"]))
        gen = int(pool.get("generation") or 0)
        newest[key] = max(gen, newest.get(key, gen))
        kept.append((key, gen, s))
    return [s for key, gen, s in kept if gen == newest[key]]


def by_node(slices: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each node's slice specs (driver, pool, devices) from a list of ResourceSlices."""
    out: dict[str, list[dict[str, Any]]] = {}
    for s in _current(slices):
        spec = s["spec"]
        out.setdefault(str(spec["nodeName"]), []).append(
            {
                "driver": spec["driver"],
                "pool": (spec.get("pool") or {}).get("name"),
                "devices": spec.get("devices"),
            }
        )
    return out


def join(nodes: Sequence[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The nodes, those with ResourceSlices as copies carrying them under :data:`DEVICES_KEY`
    (what discovery reads), in the same order; nodes without slices are returned as they are."""
    per_node = by_node(slices)
    out: list[dict[str, Any]] = []
    for n in nodes:
        name = (n.get("metadata") or {}).get("name")
        specs = per_node.get(name) if isinstance(name, str) else None
        out.append({**n, DEVICES_KEY: copy.deepcopy(specs)} if specs else dict(n))
    return out


def without_gpu_types(node: Mapping[str, Any]) -> dict[str, Any]:
    """The node as if its GPU driver published no product or memory (``holmes plan``'s
    single-type comparison)."""
    return {**node, _NO_GPU_TYPES: True} if node.get(DEVICES_KEY) else dict(node)


def is_slice(obj: Any) -> bool:
    return isinstance(obj, Mapping) and obj.get("kind") == SLICE_KIND
