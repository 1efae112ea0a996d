"""Holmes' islands as a topology other schedulers read, pure (objects in, objects out).

The levels Holmes plans with, as node labels the operator publishes (topology_labels.py writes
them from its own classification of each node, discovery.classify_node):

====================================  ============================================================
``topology.holmes.dev/cluster``       the node's cluster (its ``holmes.dev/cluster`` label, or
                                      the NIC mapping's default cluster)
``topology.holmes.dev/island``        cluster x NIC kind (x GPU type, where GFD or the DRA
                                      driver names it): ``east.infiniband.H100-80GB-HBM3``
(Topograph's switch labels)           where NVIDIA Topograph labels the nodes (leaf/spine, or
                                      ``fabric.topograph.run/tier-N``): read, not written
``kubernetes.io/hostname``            the node (the kubelet's own label)
====================================  ============================================================

An island is what Holmes sizes one pipeline stage for: its nodes talk RDMA (or fast sockets) to
each other at one speed, with one GPU type. Rendered as Kueue's ``Topology`` (``kueue_topology``,
for Topology Aware Scheduling: a PodSet that requires the island level is admitted inside one
island) and as Volcano's ``HyperNode`` tiers (``volcano_hypernodes``: tier 1 an island's nodes,
tier 2 a cluster's islands).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence

from holmes.contract import names
from holmes.plan.discovery import NodeNic
from holmes.plan.gpus import short_name

LABEL_CLUSTER = "topology.holmes.dev/cluster"
LABEL_ISLAND = "topology.holmes.dev/island"
HOSTNAME = "kubernetes.io/hostname"
LABELS = (LABEL_CLUSTER, LABEL_ISLAND)  # the ones Holmes writes (the kubelet writes hostname)
TOPOLOGY = "holmes-islands"  # the Kueue Topology's name (a ResourceFlavor's spec.topologyName)

# Kueue's annotations on a pod of a PodSet it admitted by topology (apis/kueue/v1beta2
# topology_types.go, v0.17.1): the level the PodSet requires (Kueue counts such a pod as its
# Workload's, not as usage beside it: pkg/util/tas IsTAS), and the Workload and PodSet the pod
# belongs to (its TAS controllers find a Workload's pods by them).
ANN_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
ANN_WORKLOAD = "kueue.x-k8s.io/workload"
LABEL_POD_SET = "kueue.x-k8s.io/podset"

VOLCANO_TOPOLOGY_API = "topology.volcano.sh/v1alpha1"

_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(text: str) -> str:
    """``text`` as a label value (at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends); a
    longer one keeps its start and a digest of the whole, so two values stay apart."""
    out = _BAD.sub("-", text).strip("-_.")
    if len(out) > 63:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        out = out[:54].rstrip("-_.") + "-" + digest
    return out


def gpu_type(nic: NodeNic) -> str | None:
    """The node's GPU product as the planner prices it (GFD's label, else the DRA driver's
    productName; without "NVIDIA-"), None when neither names one."""
    product = (nic.labels or {}).get(names.LABEL_GPU_PRODUCT) or nic.gpu_product
    return short_name(product) if product else None


def island_of(nic: NodeNic) -> str:
    """The island label's value of a node: its cluster, NIC kind and (when known) GPU type."""
    gpu = gpu_type(nic)
    return label_value(".".join([nic.cluster, nic.nic] + ([gpu] if gpu else [])))


def node_labels(nic: NodeNic) -> dict[str, str]:
    """The topology labels Holmes publishes on a node (LABELS)."""
    return {LABEL_CLUSTER: label_value(nic.cluster), LABEL_ISLAND: island_of(nic)}


def label_patch(current: Mapping[str, str], want: Mapping[str, str]) -> dict[str, str] | None:
    """The node's metadata.labels merge patch that publishes ``want`` (None: it carries them)."""
    patch = {k: v for k, v in want.items() if current.get(k) != v}
    return patch or None


def levels(switches: Sequence[str] = ()) -> tuple[str, ...]:
    """Holmes' levels with Topograph's switch levels (plan.topology.switch_levels, widest
    first) between the island and the node: Kueue's TAS then packs a PodSet under as few
    switches of its island as fit, and the island requirement still holds."""
    return (LABEL_CLUSTER, LABEL_ISLAND, *switches, HOSTNAME)


def kueue_topology(name: str = TOPOLOGY, version: str = "v1beta2", switches: Sequence[str] = ()) -> dict:
    """Kueue's Topology of Holmes' levels (kueue.x-k8s.io, v1beta2 on Kueue 0.15+; v1beta1
    before): a ResourceFlavor names it in ``spec.topologyName``."""
    return {
        "apiVersion": f"kueue.x-k8s.io/{version}",
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": level} for level in levels(switches)]},
    }


def kai_topology(name: str = TOPOLOGY, switches: Sequence[str] = ()) -> dict:
    """NVIDIA KAI Scheduler's Topology (kai.scheduler/v1alpha1) of the same levels: a workload
    names it (annotation kai.scheduler/topology) and asks for a level
    (kai.scheduler/topology-required-placement: topology.holmes.dev/island)."""
    return {
        "apiVersion": "kai.scheduler/v1alpha1",
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": level} for level in levels(switches)]},
    }


def with_labels(node: Mapping, nic: NodeNic) -> dict:
    """``node`` carrying the topology labels Holmes would publish on it (for renders of nodes
    read before the operator labelled them)."""
    meta = dict(node.get("metadata") or {})
    meta["labels"] = {**(meta.get("labels") or {}), **node_labels(nic)}
    return {**node, "metadata": meta}


def topology_request(level: str = LABEL_ISLAND) -> dict:
    """A Workload PodSet's ``topologyRequest``: all its pods inside one domain of ``level``."""
    return {"required": level}


def queue_topology(
    local_queue: Mapping | None, cluster_queues: Mapping[str, Mapping], flavors: Mapping[str, Mapping]
) -> str | None:
    """The Topology a flavor of the LocalQueue's ClusterQueue names (``spec.topologyName``;
    None: none does, or the queue or its ClusterQueue is not known). Kueue admits a Workload of
    such a queue by topology (TAS): Holmes then requires each PodSet's island."""
    cq = cluster_queues.get(((local_queue or {}).get("spec") or {}).get("clusterQueue") or "")
    for group in ((cq or {}).get("spec") or {}).get("resourceGroups") or []:
        for f in group.get("flavors") or []:
            name = ((flavors.get(f.get("name") or "") or {}).get("spec") or {}).get("topologyName")
            if name:
                return name
    return None


def domains(assignment: Mapping | None) -> list[tuple[dict, int]]:
    """The domains of a PodSet's ``topologyAssignment`` (v1beta2: levels and slices), each as
    (its node labels, its pods), as Kueue's ``utiltas.InternalSeqFrom`` reads them: a level's
    value is the slice's universal one, or prefix + root + suffix per domain."""
    if not assignment:
        return []
    levels = list(assignment.get("levels") or [])
    out = []
    for sl in assignment.get("slices") or []:
        n = int(sl.get("domainCount") or 0)
        per_level = []
        for v in sl.get("valuesPerLevel") or []:
            if v.get("universal") is not None:
                per_level.append([v["universal"]] * n)
            else:
                ind = v.get("individual") or {}
                pre, suf = ind.get("prefix") or "", ind.get("suffix") or ""
                per_level.append([f"{pre}{r}{suf}" for r in ind.get("roots") or []])
        counts = sl.get("podCounts") or {}
        each = counts.get("individual") or [counts.get("universal") or 0] * n
        for i in range(n):
            out.append(({lv: vals[i] for lv, vals in zip(levels, per_level)}, int(each[i])))
    return out


def volcano_hypernodes(nodes: Iterable[Mapping]) -> list[dict]:
    """Volcano's HyperNodes (topology.volcano.sh/v1alpha1, Volcano 1.12+) of Holmes' levels,
    from nodes carrying Holmes' topology labels: tier 1 per island (its members the nodes, by
    the island label), tier 2 per cluster (its members its islands' HyperNodes by name)."""
    islands: dict[str, str] = {}  # island -> cluster
    for n in nodes:
        labels = (n.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_ISLAND) and labels.get(LABEL_CLUSTER):
            islands[labels[LABEL_ISLAND]] = labels[LABEL_CLUSTER]
    out = []
    for island in sorted(islands):
        out.append(
            _hypernode(
                f"island-{island}",
                1,
                [{"type": "Node", "selector": {"labelMatch": {"matchLabels": {LABEL_ISLAND: island}}}}],
            )
        )
    for cluster in sorted(set(islands.values())):
        members = [
            {"type": "HyperNode", "selector": {"exactMatch": {"name": _dns(f"island-{i}")}}}
            for i in sorted(i for i, c in islands.items() if c == cluster)
        ]
        out.append(_hypernode(f"cluster-{cluster}", 2, members))
    return out


def _dns(text: str) -> str:
    out = re.sub(r"[^a-z0-9.-]+", "-", text.lower()).strip("-.")
    return out[:253]


def _hypernode(name: str, tier: int, members: list[dict]) -> dict:
    return {
        "apiVersion": VOLCANO_TOPOLOGY_API,
        "kind": "HyperNode",
        "metadata": {"name": _dns(name), "labels": {"app.kubernetes.io/managed-by": "holmes"}},
        "spec": {"tier": tier, "members": members},
    }
