"""``spec.islands``: per-island network settings of a HolmesJob (how its pods reach the fabric).

An island is what the planner calls one: the nodes of one cluster (``spec.nodes.clusterLabel``)
and one NIC kind. Each entry names an island by ``cluster`` and/or ``nic`` (an omitted key
matches any) and says, for that island's pods:

- ``rdmaDevices``: how many devices of the shared RDMA device plugin (``rdma/...``) a pod asks
  for: ``one`` (the plugin exposes all of a node's rails as one device, its usual
  configuration) or ``perRail`` (the admin configured one device per rail: one per rail the pod
  uses, the node's compute-rail HCAs);
- ``sriov``: the NetworkAttachmentDefinitions (``namespace/name``, or ``name`` in the job's
  namespace; one per rail) Multus attaches as SR-IOV VFs, and optionally the VF ``resource``
  (default: the node's own SR-IOV resource): the pod gets the Multus annotation and that many VFs;
- ``trafficClass`` / ``serviceLevel``: the fabric's lossless class for NCCL's IB transport
  (``NCCL_IB_TC``, ``NCCL_IB_SL``); unset, NCCL's defaults (TC 0, SL 0) apply;
- ``netPlugin``: the NCCL network name of a vendor net plugin in the island's image (e.g. ``AWS
  Libfabric`` for AWS OFI/EFA, ``GPUDirectTCPX`` for GCP TCPX): groups inside the island use it
  instead of ``Socket``, and Holmes sets no socket tuning there.

The first entry matching a node wins. Pure Python; the reader reports every problem with its
field path, like the rest of the spec (jobspec.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .names import HOST_NETWORK, NIC_KINDS, RDMA_KINDS

RDMA_DEVICES = ("one", "perRail")
# namespace/name or name, each a DNS-1123 label (NetworkAttachmentDefinitions are namespaced)
_NAD = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# an extended resource name: vendor-domain/name
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_FIELDS = ("cluster", "nic", "rdmaDevices", "sriov", "trafficClass", "serviceLevel", "netPlugin")


@dataclass(frozen=True)
class Sriov:
    networks: tuple[str, ...]  # NetworkAttachmentDefinitions, one per rail
    resource: str | None = None  # the VF resource; None: the node's SR-IOV resource


@dataclass(frozen=True)
class IslandNetwork:
    cluster: str | None = None  # None: every cluster
    nic: str | None = None  # None: every NIC kind
    rdma_devices: str = "one"  # one | perRail (shared RDMA device plugin)
    sriov: Sriov | None = None
    traffic_class: int | None = None  # NCCL_IB_TC, 0..255
    service_level: int | None = None  # NCCL_IB_SL, 0..15
    net_plugin: str | None = None  # a vendor net plugin's NCCL net name

    def matches(self, cluster: str, nic: str) -> bool:
        return self.cluster in (None, cluster) and self.nic in (None, nic)

    def describe(self) -> str:
        return (
            " ".join(f"{k}={v}" for k, v in (("cluster", self.cluster), ("nic", self.nic)) if v)
            or "every island"
        )


def island_settings(
    islands: Sequence[IslandNetwork], cluster: str, nic: str
) -> tuple[int, IslandNetwork] | tuple[None, None]:
    """The first entry for the island (cluster, nic) and its index in spec.islands."""
    for i, entry in enumerate(islands):
        if entry.matches(cluster, nic):
            return i, entry
    return None, None


def read_islands(r: Any, v: Any, path: str, network: str | None) -> tuple[IslandNetwork, ...]:
    """spec.islands with ``r`` (jobspec's problem-collecting reader); ``network``: spec.network."""
    if v is None:
        return ()
    if not isinstance(v, (list, tuple)):
        r.add(path, "must be a list of {cluster, nic, ...} entries, one per island")
        return ()
    out: list[IslandNetwork] = []
    seen: dict[tuple[str | None, str | None], int] = {}
    for i, item in enumerate(v):
        p = f"{path}[{i}]"
        d = r.mapping(item, p, optional=_FIELDS)
        if d is None:
            continue
        entry = _entry(r, d, p, network)
        if entry is None:
            continue
        key = (entry.cluster, entry.nic)
        if key in seen:
            r.add(p, f"names the same island as {path}[{seen[key]}] ({entry.describe()}): merge them")
            continue
        seen[key] = i
        out.append(entry)
    return tuple(out)


def _entry(r: Any, d: Mapping[str, Any], p: str, network: str | None) -> IslandNetwork | None:
    n = len(r.problems)
    cluster = r.string(d, "cluster", p, default=None)
    nic = r.choice(d, "nic", p, NIC_KINDS) if d.get("nic") is not None else None
    devices = r.choice(d, "rdmaDevices", p, RDMA_DEVICES, default=IslandNetwork.rdma_devices)
    tc = _bounded(r, d, "trafficClass", p, 255)
    sl = _bounded(r, d, "serviceLevel", p, 15)
    plugin = r.string(d, "netPlugin", p, default=None)
    sriov = _sriov(r, d.get("sriov"), f"{p}.sriov")
    if nic is not None and nic not in RDMA_KINDS:
        for key in ("trafficClass", "serviceLevel"):
            if d.get(key) is not None:
                r.add(
                    f"{p}.{key}",
                    f"applies to NCCL's IB transport (infiniband, roce), not nic {nic}: remove it",
                )
    if devices == "perRail" and sriov is not None:
        r.add(
            f"{p}.rdmaDevices",
            "applies to the shared RDMA device plugin; with sriov the pod gets one VF per network: remove it",
        )
    if sriov is not None and network == HOST_NETWORK:
        r.add(
            f"{p}.sriov",
            "Multus attaches no networks to hostNetwork pods: remove it, or use spec.network: podNetwork",
        )
    if plugin is not None and (tc is not None or sl is not None):
        r.add(
            f"{p}.netPlugin",
            "the island's traffic runs on the plugin, not NCCL's IB transport: drop "
            "trafficClass/serviceLevel or netPlugin",
        )
    if len(r.problems) != n:
        return None
    return IslandNetwork(cluster, nic, devices, sriov, tc, sl, plugin)


def _bounded(r: Any, d: Mapping[str, Any], key: str, p: str, top: int) -> int | None:
    v: int | None = r.integer(d, key, p, default=None, minimum=0)
    if v is not None and v > top:
        r.add(f"{p}.{key}", f"must be 0..{top}, got {v}")
        return None
    return v


def _sriov(r: Any, v: Any, p: str) -> Sriov | None:
    if v is None:
        return None
    d = r.mapping(v, p, required=("networks",), optional=("resource",))
    if d is None:
        return None
    resource = r.string(d, "resource", p, default=None)
    if resource is not None and not _RESOURCE.match(resource):
        r.add(
            f"{p}.resource",
            f"must be an extended resource name such as nvidia.com/sriov_rail, got {resource!r}",
        )
    nets = d.get("networks")
    if nets is None:
        return None  # reported by mapping()
    if not isinstance(nets, (list, tuple)) or not nets:
        r.add(
            f"{p}.networks",
            "must be a non-empty list of NetworkAttachmentDefinitions (namespace/name), one per rail",
        )
        return None
    bad = [x for x in nets if not isinstance(x, str) or not _NAD.match(x)]
    if bad:
        r.add(
            f"{p}.networks",
            f"{bad[0]!r} is not a NetworkAttachmentDefinition name: write namespace/name or name",
        )
        return None
    if len(set(nets)) != len(nets):
        r.add(f"{p}.networks", "names a network twice: one entry per rail")
        return None
    return Sriov(tuple(nets), resource)
