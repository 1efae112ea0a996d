"""NIC discovery: classify a Kubernetes Node (a v1 Node as a plain dict, as ``kubectl get node
-o json`` prints it) into ``infiniband``, ``roce`` or ``ethernet`` with a bandwidth.

Rules, first match wins (every name is configurable in :class:`NicMapping`):

1. ``holmes-labels``: Holmes' own labels, written by an admin or the NIC labeller:
   ``holmes.dev/nic`` (kind), ``holmes.dev/nic-gbps`` (node bandwidth), ``holmes.dev/cluster``.
2. ``nfd``: Node Feature Discovery's ``feature.node.kubernetes.io/rdma.capable`` /
   ``rdma.available`` / ``pci-15b3.present`` say "RDMA" but not which kind. The kind then comes
   from a link-layer label (``holmes.dev/link-layer``: ``InfiniBand`` or ``Ethernet`` = RoCE, as
   ``/sys/class/infiniband/*/ports/*/link_layer`` says), or from the mapping's per-cluster kinds
   (``cluster_rdma_kinds``: "east is InfiniBand") or its ``rdma_default_kind``; otherwise the
   node gets a *problem*, never a guess.
3. ``dra``: RDMA NICs in the node's ResourceSlices of DRANET (``dra.py``; joined onto the Node
   by ``dra.join``): the kind from their link type (``dra.net/encapsulation``: ``infiniband``, or
   ``ether`` = RoCE), else from a link-layer label or the mapping's kinds as in rule 2 (DRANET
   says no link type for an RDMA device without a netdev). The HCAs are their
   ``dra.net/rdmaDevice`` names; pods then ask for them with ResourceClaims (routes.py).
4. ``device-plugin``: an ``rdma/*`` resource in ``status.allocatable`` (Mellanox shared device
   plugin) or a configured SR-IOV resource: RDMA, kind as in rule 2.
5. ``no-rdma``: none of the above: plain Ethernet (sockets).

``gbps`` is the bandwidth of the node's NICs *together* for collective traffic (e.g. 8 x 200
Gb/s HDR rails = 1600); when no label says it, a per-kind default from the mapping is used and
``gbps_source`` says so (DRANET publishes no link speed, so DRA nodes too take the label or the
default). The host's compute-rail HCAs come from the annotation
``holmes.dev/nic-hcas`` (comma-separated) or the label of that name ('.'-separated, since label
values cannot hold commas). They are the host's names: the operator passes them as a hint
(``HOLMES_HOST_HCAS``) and never copies them into a pod's ``NCCL_IB_HCA``, which the pod
resolves from what it sees (``holmes.launch.podnet``), as it does ``NCCL_SOCKET_IFNAME``: the
labeller's ``holmes.dev/socket-ifname`` is for people, Holmes does not read it.
A ``holmes.dev/nic-problem`` annotation (or label), which the NIC labeller writes when a node's
sysfs contradicts itself (its compute rails disagree on InfiniBand vs RoCE), makes the node
unusable with that message, unless ``holmes.dev/nic`` says the kind: an explicit kind label is
the admin's answer to it.

GPUs: ``gpus`` is the allocatable ``nvidia.com/gpu`` of the device plugin; a node without it
counts the whole GPUs NVIDIA's DRA driver publishes in its slices (``gpu_source`` says which).
Either way, less the GPUs other pods hold when the operator's capacity view says so
(:data:`GPUS_TAKEN_KEY` on an in-memory copy of the Node, written by
``holmes.operator.core.capacity.free_view``): one count whichever route offers the GPUs.
The GPU product is GPU Feature Discovery's label when there is one, else the DRA driver's
``productName`` (``gpu_product``, priced by gpus.py).

NVLink domain: on rack-scale NVLink (GB200/GB300 NVL72) GFD labels every node of one NVLink
fabric ``nvidia.com/gpu.clique=<cluster UUID>.<clique id>`` (``nvlink_domain``): a tier above
the node and below the island (topology.py), whose nodes' GPUs reach each other over NVLink. A
value not of that form is a problem of the node, never a guess at its domain.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from holmes.contract import names
from holmes.contract.names import ETHERNET, INFINIBAND, RDMA_KINDS, ROCE

from . import dra
from .quantity import QuantityError, parse_quantity

# GPUs other pods hold on the node, on an in-memory copy (never written to the API server): the
# capacity view's way to lower a node's GPUs, whether the device plugin or DRA offers them.
GPUS_TAKEN_KEY = "holmes.dev/gpusTaken"
# Spellings an admin may write in holmes.dev/nic or a link-layer label.
_KIND_ALIASES = {
    "infiniband": INFINIBAND,
    "ib": INFINIBAND,
    "roce": ROCE,
    "rocev2": ROCE,
    "roce-v2": ROCE,
    "ethernet": ETHERNET,
    "eth": ETHERNET,
    "tcp": ETHERNET,
    "socket": ETHERNET,
}
# The link_layer file says Ethernet for RoCE ports: on an RDMA port that *is* RoCE.
_LINK_LAYER_ALIASES = {"infiniband": INFINIBAND, "ib": INFINIBAND, "ethernet": ROCE, "roce": ROCE}


@dataclass(frozen=True)
class NicMapping:
    """Where the NIC facts live on a Node, and what to assume when nothing says."""

    nic_label: str = names.LABEL_NIC
    gbps_label: str = names.LABEL_NIC_GBPS
    cluster_label: str = names.LABEL_CLUSTER
    link_layer_label: str = names.LABEL_LINK_LAYER
    hcas_key: str = names.ANN_NIC_HCAS
    problem_key: str = names.ANN_NIC_PROBLEM
    nfd_rdma_labels: tuple[str, ...] = names.NFD_RDMA_LABELS
    rdma_resource_prefixes: tuple[str, ...] = ("rdma/",)
    rdma_resource_names: tuple[str, ...] = ()  # e.g. an SR-IOV "nvidia.com/mlnx_sriov_rdma"
    gpu_resource: str = names.RESOURCE_GPU
    clique_label: str = names.LABEL_GPU_CLIQUE  # the node's NVLink domain (GFD)
    # Kind for nodes that advertise RDMA but not which kind: per cluster (an admin who knows
    # "east is InfiniBand"), else one default; neither = report a problem.
    cluster_rdma_kinds: tuple[tuple[str, str], ...] = ()
    rdma_default_kind: str | None = None
    # Node bandwidth (Gbit/s, all NICs together) when no label gives it.
    default_gbps: tuple[tuple[str, float], ...] = ((INFINIBAND, 200.0), (ROCE, 100.0), (ETHERNET, 25.0))
    default_cluster: str = "default"
    # DRA: the drivers whose ResourceSlices describe NICs and GPUs ("" turns one off), and the
    # DeviceClasses the pods' ResourceClaims name (DRANET installs none: create one, e.g. with
    # the selector device.driver == "dra.net", and name it here).
    dra_nic_driver: str = "dra.net"
    dra_gpu_driver: str = "gpu.nvidia.com"
    dra_nic_class: str = "dranet"
    dra_gpu_class: str = "gpu.nvidia.com"

    def gbps_for(self, kind: str) -> float:
        return dict(self.default_gbps)[kind]

    def with_cluster_label(self, label: str | None) -> NicMapping:
        from dataclasses import replace

        return self if not label or label == self.cluster_label else replace(self, cluster_label=label)


@dataclass(frozen=True)
class NodeNic:
    name: str
    cluster: str  # island name from the cluster label
    nic: str  # infiniband | roce | ethernet
    gbps: float  # all NICs of the node together, Gbit/s
    gpus: int  # allocatable nvidia.com/gpu, or DRA GPUs; less those taken (GPUS_TAKEN_KEY)
    rdma_resource: str | None = None  # e.g. "rdma/rdma_shared_device_a": pods request it
    hcas: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    source: str = "no-rdma"  # holmes-labels | dra | nfd | device-plugin | no-rdma
    gbps_source: str = "default"  # label | default
    gpu_source: str = "device-plugin"  # device-plugin | dra (the GPUs are DRA devices)
    gpu_product: str | None = None  # the DRA driver's productName (GFD's label wins)
    gpu_memory_gib: float | None = None  # the DRA driver's memory capacity per GPU
    devices: dra.NodeDevices | None = field(default=None, compare=False)  # from ResourceSlices
    ready: bool = True  # Ready condition not False
    schedulable: bool = True  # spec.unschedulable not set (not cordoned)
    problems: tuple[str, ...] = ()
    # What the job says of the node's island (the planner sets them from spec.islands and the
    # template's env): its vendor net plugin, and NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD
    # when the template fixes them (None: Holmes' value for the node's link speed).
    net_plugin: str | None = None
    socket_fixed: tuple[int | None, int | None] = (None, None)
    nvlink_domain: str | None = None  # GFD's nvidia.com/gpu.clique: "<cluster UUID>.<clique id>"

    @property
    def island(self) -> str:
        """Nodes that can talk RDMA (or, for Ethernet, fast sockets) to each other."""
        return f"{self.cluster}/{self.nic}"

    @property
    def rdma(self) -> bool:
        return self.nic in RDMA_KINDS

    @property
    def usable(self) -> bool:
        return self.ready and self.schedulable and not self.problems


def _quantity_int(v: Any) -> int:
    """A device count, an integer Kubernetes quantity ("8", 8, "1k"); anything else (a fraction,
    no quantity at all) counts as 0."""
    try:
        q = parse_quantity(v)
    except QuantityError:
        return 0
    return int(q) if q == q.to_integral_value() else 0


def _truthy(v: str | None) -> bool:
    return v is not None and v.strip().lower() == "true"


def classify_node(node: Mapping[str, Any], mapping: NicMapping | None = None) -> NodeNic:
    """Classify one v1 Node dict. Never raises on odd nodes: what is wrong goes to ``problems``."""
    m = mapping or NicMapping()
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    spec = node.get("spec") or {}
    name = str(meta.get("name") or "")
    labels = dict(meta.get("labels") or {})
    annotations = dict(meta.get("annotations") or {})
    allocatable = dict(status.get("allocatable") or {})
    problems: list[str] = []
    if not name:
        problems.append("node has no metadata.name")

    rdma_resource = next(
        (
            r
            for r in sorted(allocatable)
            if (r.startswith(m.rdma_resource_prefixes) or r in m.rdma_resource_names)
            and _quantity_int(allocatable[r]) > 0
        ),
        None,
    )
    nfd_hits = [lab for lab in m.nfd_rdma_labels if _truthy(labels.get(lab))]
    link_kind, link_problem = _link_layer_kind(labels.get(m.link_layer_label), m)
    if link_problem:
        problems.append(link_problem)
    devices = dra.node_devices(node, m.dra_nic_driver, m.dra_gpu_driver)
    rails = devices.rails if devices else ()
    dra_kinds = {k for n in rails if (k := n.link_kind)}
    dra_kind = next(iter(dra_kinds)) if len(dra_kinds) == 1 else None

    kind: str | None
    label_kind = labels.get(m.nic_label)
    if label_kind is not None:
        source = "holmes-labels"
        kind = _KIND_ALIASES.get(label_kind.strip().lower())
        if kind is None:
            problems.append(
                f"label {m.nic_label}={label_kind!r} is not a NIC kind: use infiniband, roce or ethernet"
            )
        elif link_kind and kind in RDMA_KINDS and link_kind != kind:
            problems.append(
                f"label {m.nic_label}={label_kind} contradicts {m.link_layer_label}="
                f"{labels[m.link_layer_label]} ({link_kind}): fix one of them"
            )
    elif devices is not None and rails:
        source = "dra"
        problems.extend(devices.problems)
        if dra_kind and link_kind and dra_kind != link_kind:
            problems.append(
                f"label {m.link_layer_label}={labels[m.link_layer_label]} contradicts the link type "
                f"of its RDMA NICs in ResourceSlices of {m.dra_nic_driver} ({dra_kind}): fix the label"
            )
        kind = dra_kind or link_kind or _rdma_fallback(labels, m)
        if kind is None and not devices.problems:
            problems.append(
                f"has RDMA NICs in ResourceSlices of {m.dra_nic_driver} "
                f"({', '.join(n.device for n in rails)}) that say no link type (no dra.net/encapsulation: "
                f"no netdev): set label {m.nic_label}=infiniband|roce (or {m.link_layer_label}, or a "
                "default kind in the NIC mapping)"
            )
    elif nfd_hits or rdma_resource:
        source = "nfd" if nfd_hits else "device-plugin"
        why = f"label {nfd_hits[0]}=true" if nfd_hits else f"resource {rdma_resource}"
        kind = link_kind or _rdma_fallback(labels, m)
        if kind is None:
            problems.append(
                f"advertises RDMA ({why}) but no InfiniBand/RoCE kind: set label "
                f"{m.nic_label}=infiniband|roce (or {m.link_layer_label}, or a default kind "
                f"in the NIC mapping)"
            )
    else:
        source, kind = "no-rdma", ETHERNET
    nic_problem = annotations.get(m.problem_key) or labels.get(m.problem_key)
    if nic_problem and label_kind is None:
        problems.append(f"{m.problem_key}: {nic_problem}")

    gbps_source = "label"
    gbps_text = labels.get(m.gbps_label)
    gbps: float | None = None
    if gbps_text is not None:
        try:
            gbps = float(gbps_text)
            if not gbps > 0:
                raise ValueError
        except ValueError:
            problems.append(f"label {m.gbps_label}={gbps_text!r} is not a positive number of Gbit/s")
            gbps = None
    if gbps is None:
        gbps_source = "default"
        gbps = m.gbps_for(kind) if kind else 0.0

    hcas_text = annotations.get(m.hcas_key)
    if hcas_text is not None:
        hcas = tuple(h.strip() for h in hcas_text.split(",") if h.strip())
    elif m.hcas_key in labels:
        hcas = tuple(h for h in (labels.get(m.hcas_key) or "").split(".") if h)
    else:  # DRANET's HCA names of the rails
        hcas = tuple(sorted({n.hca for n in rails if n.hca}))

    gpus = _quantity_int(allocatable.get(m.gpu_resource, 0))
    gpu_source = "device-plugin"
    dra_gpus = devices.gpus if devices else ()
    if not gpus and dra_gpus:
        gpus, gpu_source = len(dra_gpus), "dra"
    gpus = max(gpus - _quantity_int(node.get(GPUS_TAKEN_KEY, 0)), 0)
    products = sorted({g.product for g in dra_gpus if g.product})
    if len(products) > 1 and names.LABEL_GPU_PRODUCT not in labels:
        problems.append(
            f"its GPUs in ResourceSlices of {m.dra_gpu_driver} are of several products "
            f"({', '.join(products)}): Holmes prices a node as one type; label it "
            f"{names.LABEL_GPU_PRODUCT} with the slowest"
        )
    mems = [g.memory_gib for g in dra_gpus if g.memory_gib]

    clique = labels.get(m.clique_label)
    if clique is not None and not _CLIQUE.fullmatch(clique):
        problems.append(
            f"label {m.clique_label}={clique!r} is not <cluster UUID>.<clique id> as GPU Feature "
            "Discovery writes it: fix or remove the label"
        )

    ready = True
    for c in status.get("conditions") or []:
        if c.get("type") == "Ready":
            ready = str(c.get("status")) == "True"
    return NodeNic(
        name=name,
        cluster=labels.get(m.cluster_label) or m.default_cluster,
        nic=kind or ETHERNET,
        gbps=gbps,
        gpus=gpus,
        rdma_resource=rdma_resource,
        hcas=hcas,
        labels=labels,
        source=source,
        gbps_source=gbps_source,
        gpu_source=gpu_source,
        gpu_product=products[0] if len(products) == 1 else None,
        gpu_memory_gib=min(mems) if mems else None,
        devices=devices,
        ready=ready,
        schedulable=not bool(spec.get("unschedulable")),
        problems=tuple(problems),
        nvlink_domain=clique if clique and _CLIQUE.fullmatch(clique) else None,
    )


# GFD's clique label: the fabric's cluster UUID, a dot, the clique id (a number)
_CLIQUE = re.compile(r"[0-9A-Za-z][-0-9A-Za-z_]*\.[0-9]+")


def _rdma_fallback(labels: Mapping[str, str], m: NicMapping) -> str | None:
    """The kind of an RDMA node whose NICs do not say it: its cluster's, else the default."""
    cluster = labels.get(m.cluster_label) or m.default_cluster
    return dict(m.cluster_rdma_kinds).get(cluster) or m.rdma_default_kind


def _link_layer_kind(value: str | None, m: NicMapping) -> tuple[str | None, str | None]:
    if value is None:
        return None, None
    kind = _LINK_LAYER_ALIASES.get(value.strip().lower())
    if kind is None:
        return (
            None,
            f"label {m.link_layer_label}={value!r} is not a link layer: use InfiniBand or Ethernet (RoCE)",
        )
    return kind, None


# The node's part of the classification key (node_key), kept on the node dicts the operator's
# node cache holds (watches.slim_node): those are replaced, never changed, when a node changes, so
# each decision's classification of thousands of nodes need not rebuild it. Never sent to the API.
# It holds the metadata, status and spec it was computed from and counts only while the node still
# holds those same objects: a copy with other labels (calibrate.with_rates' measured rate) is keyed
# anew, never classified as the node it was copied from.
CLASSIFY_KEY = "holmes.dev/classifyKey"


def fixed_key(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """The value to keep under CLASSIFY_KEY: node_key (hashed once) and the parts it was read from."""
    return (node.get("metadata"), node.get("status"), node.get("spec"), _HashedKey(node_key(node)))


class _HashedKey(tuple[Any, ...]):
    """A node_key that hashes once: a tuple rehashes every field on every lookup, and a
    decision looks thousands of nodes up, several times."""

    _hash: int

    def __new__(cls, key: tuple[Any, ...]) -> _HashedKey:
        made = super().__new__(cls, key)
        made._hash = tuple.__hash__(made)
        return made

    def __hash__(self) -> int:
        return self._hash


def kept_key(node: Mapping[str, Any]) -> tuple[Any, ...] | None:
    fixed = node.get(CLASSIFY_KEY)
    if (
        fixed is None
        or fixed[0] is not node.get("metadata")
        or fixed[1] is not node.get("status")
        or fixed[2] is not node.get("spec")
    ):
        return None
    key: tuple[Any, ...] = fixed[3]
    return key


def node_key(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """What classify_node reads of a node (but GPUS_TAKEN_KEY, which a decision's copy adds), and
    its taints, which the operator's placement reads (``kept_key`` keys its answers too)."""
    meta, status, spec = node.get("metadata") or {}, node.get("status") or {}, node.get("spec") or {}
    return (
        meta.get("name"),
        tuple((meta.get("labels") or {}).items()),
        tuple((meta.get("annotations") or {}).items()),
        tuple((status.get("allocatable") or {}).items()),
        tuple((c.get("type"), str(c.get("status"))) for c in status.get("conditions") or ()),
        bool(spec.get("unschedulable")),
        tuple((t.get("key"), t.get("value"), t.get("effect")) for t in spec.get("taints") or ()),
    )


def classify_nodes(
    nodes: Iterable[Mapping[str, Any] | NodeNic], mapping: NicMapping | None = None
) -> list[NodeNic]:
    """Classify many nodes; NodeNic entries pass through unchanged. A node seen before with the
    same fields is not classified again (see ``_Classified``)."""
    return _CLASSIFIED.get_all(nodes, mapping or NicMapping())


class _Classified:
    """classify_node's answers by what it reads of a node. The operator plans every waiting
    job (and each job ahead of it in the queue) on every node: at 2,000 nodes classifying them
    anew on each search was most of a placement. Nodes with DRA devices joined on are not kept
    (their slices are read too). Bounded: emptied when it holds ``KEPT`` answers."""

    KEPT = 50_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[NicMapping, dict[tuple[Any, ...], NodeNic]] = {}
        self._size = 0

    @staticmethod
    def key(node: Mapping[str, Any]) -> tuple[Any, ...] | None:
        if dra.DEVICES_KEY in node:
            return None
        fixed = kept_key(node)  # what the operator's node cache computed once
        return (fixed if fixed is not None else node_key(node), node.get(GPUS_TAKEN_KEY))

    def get_all(self, nodes: Iterable[Mapping[str, Any] | NodeNic], m: NicMapping) -> list[NodeNic]:
        """The answers of one mapping (hashed once per call, not per node: it has 20 fields)."""
        with self._lock:
            answers = self._answers.get(m)
            if answers is None:
                answers = self._answers[m] = {}
        out: list[NodeNic] = []
        for node in nodes:
            if isinstance(node, NodeNic):
                out.append(node)
                continue
            try:
                key = self.key(node)
                hit = None if key is None else answers.get(key)
            except TypeError:  # a value that is no string (an odd node): classified as it is
                key = hit = None
            if hit is None:
                hit = classify_node(node, m)
                if key is not None:
                    with self._lock:
                        if self._size >= self.KEPT:  # bounded: start again (node versions pass)
                            self._answers, self._size = {m: answers}, 0
                            answers.clear()
                        answers[key] = hit
                        self._size += 1
            out.append(hit)
        return out


_CLASSIFIED = _Classified()


def why_unusable(n: NodeNic) -> str:
    reasons = list(n.problems)
    if not n.ready:
        reasons.append("not Ready")
    if not n.schedulable:
        reasons.append("cordoned (spec.unschedulable)")
    return "; ".join(reasons)
