"""``spec.islands``: per-island network settings of a HolmesJob (how its pods reach the fabric).

An island is what the planner calls one: the nodes of one cluster (``spec.nodes.clusterLabel``)
and one NIC kind. Each entry names an island by ``cluster`` and/or ``nic`` (an omitted key
matches any); the first entry matching a node wins. Each field is declared once below (its doc
is the CRD's, see :mod:`holmes.contract.schema`); :func:`read_islands` adds the checks that
relate one field to another (and to ``spec.network``), each naming the field and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from .names import HOST_NETWORK, NIC_KINDS, RDMA_KINDS
from .schema import ABSENT, INVALID, Field, Reader

RDMA_DEVICES = ("one", "perRail")
# namespace/name or name, each a DNS-1123 label (NetworkAttachmentDefinitions are namespaced)
_NAD = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# an extended resource name: vendor-domain/name
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Sriov:
    networks: Annotated[
        tuple[str, ...],
        Field(
            "The NetworkAttachmentDefinitions Multus attaches as SR-IOV VFs, one per rail "
            "(namespace/name, or name in the job's namespace): the pod gets the "
            "k8s.v1.cni.cncf.io/networks annotation and one VF per network.",
            min_items=1,
        ),
    ]
    resource: Annotated[
        str | None,
        Field(
            "The VF resource the pod requests (e.g. nvidia.com/sriov_rail); default: the node's own "
            "SR-IOV resource."
        ),
    ] = None


@dataclass(frozen=True)
class IslandNetwork:
    cluster: Annotated[
        str | None, Field("The island's cluster (spec.nodes.clusterLabel); omitted: every cluster.")
    ] = None
    nic: Annotated[
        str | None, Field("The island's NIC kind; omitted: every kind.", enum=NIC_KINDS, server_default=False)
    ] = None
    rdma_devices: Annotated[
        str,
        Field(
            "How many devices of the shared RDMA device plugin (rdma/...) a pod asks for: one (the "
            "plugin exposes a node's rails as one device, its usual configuration) or perRail (the "
            "admin configured one device per rail: one per compute-rail HCA of the node).",
            enum=RDMA_DEVICES,
            server_default=False,
        ),
    ] = "one"
    sriov: Annotated[
        Sriov | None, Field("SR-IOV VFs attached by Multus instead of the shared RDMA device plugin.")
    ] = None
    traffic_class: Annotated[
        int | None,
        Field(
            "The fabric's lossless traffic class for NCCL's IB transport (NCCL_IB_TC); unset: NCCL's "
            "default.",
            minimum=0,
            maximum=255,
        ),
    ] = None
    service_level: Annotated[
        int | None,
        Field("The InfiniBand service level (NCCL_IB_SL); unset: NCCL's default.", minimum=0, maximum=15),
    ] = None
    net_plugin: Annotated[
        str | None,
        Field(
            "The NCCL net name of a vendor net plugin in the island's image (e.g. AWS Libfabric for "
            "AWS OFI/EFA, GPUDirectTCPX for GCP TCPX): groups inside the island use it instead of "
            "Socket, and Holmes sets no socket tuning there."
        ),
    ] = None

    ipc_lock: Annotated[
        bool,
        Field(
            "Add the IPC_LOCK capability to the trainer on this island's RDMA nodes, for a cluster "
            "whose container runtime leaves the memlock limit too low for the verbs API "
            "(docs/install.md#rdma-and-the-memlock-limit). Pod Security baseline refuses it: the "
            "job's namespace must then be privileged.",
            server_default=False,
        ),
    ] = False

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


def read_islands(r: Reader, v: Any, path: str, siblings: Mapping[str, Any]) -> Any:
    """spec.islands (the ``read=`` of JobSpec.islands): each entry as declared, then the checks
    between its fields, spec.network (a sibling read before it) and the other entries."""
    if v is None:
        return ABSENT
    if not isinstance(v, (list, tuple)):
        r.add(path, "must be a list of {cluster, nic, ...} entries, one per island")
        return INVALID
    n = len(r.problems)
    out: list[IslandNetwork] = []
    seen: dict[tuple[str | None, str | None], int] = {}
    for i, item in enumerate(v):
        p = f"{path}[{i}]"
        entry = r.object(IslandNetwork, item, p)
        if isinstance(item, Mapping):
            _entry_problems(r, item, p, siblings.get("network"))
        if not isinstance(entry, IslandNetwork):
            continue
        key = (entry.cluster, entry.nic)
        if key in seen:
            r.add(p, f"names the same island as {path}[{seen[key]}] ({entry.describe()}): merge them")
        seen.setdefault(key, i)
        out.append(entry)
    return tuple(out) if len(r.problems) == n else INVALID


def _entry_problems(r: Reader, d: Mapping[str, Any], p: str, network: Any) -> None:
    nic, sriov = d.get("nic"), d.get("sriov")
    if nic in NIC_KINDS and nic not in RDMA_KINDS:
        for key in ("trafficClass", "serviceLevel"):
            if d.get(key) is not None:
                r.add(
                    f"{p}.{key}",
                    f"applies to NCCL's IB transport (infiniband, roce), not nic {nic}: remove it",
                )
    if d.get("rdmaDevices") == "perRail" and sriov is not None:
        r.add(
            f"{p}.rdmaDevices",
            "applies to the shared RDMA device plugin; with sriov the pod gets one VF per network: remove it",
        )
    if sriov is not None and network == HOST_NETWORK:
        r.add(
            f"{p}.sriov",
            "Multus attaches no networks to hostNetwork pods: remove it, or use spec.network: podNetwork",
        )
    if d.get("netPlugin") is not None and (
        d.get("trafficClass") is not None or d.get("serviceLevel") is not None
    ):
        r.add(
            f"{p}.netPlugin",
            "the island's traffic runs on the plugin, not NCCL's IB transport: drop "
            "trafficClass/serviceLevel or netPlugin",
        )
    if not isinstance(sriov, Mapping):
        return
    resource = sriov.get("resource")
    if isinstance(resource, str) and resource and not _RESOURCE.match(resource):
        r.add(
            f"{p}.sriov.resource",
            f"must be an extended resource name such as nvidia.com/sriov_rail, got {resource!r}",
        )
    nets = sriov.get("networks")
    if not isinstance(nets, (list, tuple)):
        return
    bad = [x for x in nets if isinstance(x, str) and x and not _NAD.match(x)]
    if bad:
        r.add(
            f"{p}.sriov.networks",
            f"{bad[0]!r} is not a NetworkAttachmentDefinition name: write namespace/name or name",
        )
    elif len(set(map(str, nets))) != len(nets):
        r.add(f"{p}.sriov.networks", "names a network twice: one entry per rail")
