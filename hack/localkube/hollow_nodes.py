"""Hollow nodes, the pure part: which Nodes a hollow cluster registers and the kwok
configuration that plays their kubelets (no Kubernetes I/O here; hollow.py does that).

N nodes are spread over K islands (``island-0`` ... ``island-K-1``: the cluster label, one NIC
kind per island), with the vocabulary of topology.py (SimNode): the NIC kind and speed
advertised the way the labeller (``holmes``) or Node Feature Discovery (``nfd``: RDMA but not
which kind; the operator needs ``--cluster-rdma-kind``, see ``rdma_kinds``) publishes it, an
RDMA device-plugin resource on RDMA nodes, and GPU Feature Discovery's GPU labels
(``nvidia.com/gpu.product``/``.count``/``.memory``). Every hollow node carries the label and
NoSchedule taint ``HOLLOW`` so that only pods tolerating it (the bench's jobs) land there.

Node heartbeats (Leases) and pod lifecycles are kwok's (``sigs.k8s.io/kwok``, built by
hack/build-k8s.sh), driven by Holmes' own Stages (``kwok-stages.yaml``, next to this file). A
pod's schedule comes from its annotations (a HolmesJob's ``spec.template.metadata``):
``RUN_SECONDS`` (how long it "runs"; absent: until deleted) or ``END_AT`` (a Unix time: a job's
pods end then whichever attempt they belong to, so restarts do not stretch a bench),
``EXIT_CODE`` (how it ends; a value that is no number fails the pod with exit 2) and ``POD_IP``
(the address it reports; default none). Churn from outside is an annotation too: ``FAIL`` and
``FINISH`` on a pod (it fails, or ends with exit 0, as soon as it runs), ``NOT_READY`` on a node
(Ready=False) and on its pods (nothing happens to them, as under a kubelet that is down).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import yaml

from .topology import KWOK, SimNode

HOLLOW = "localkube.holmes.dev/hollow"  # label and taint key of every hollow node
HOLLOW_TAINT = {"key": HOLLOW, "value": "true", "effect": "NoSchedule"}
RUN_SECONDS = "hollow.holmes.dev/run-seconds"
END_AT = "hollow.holmes.dev/end-at"  # Unix time: every attempt's pods end then (at least 1 s on)
EXIT_CODE = "hollow.holmes.dev/exit-code"
POD_IP = "hollow.holmes.dev/pod-ip"  # the pod's IP (default none: hollow pods have no network)
FAIL = "hollow.holmes.dev/fail"  # set on a pod: it fails (exit 1) once running
FINISH = "hollow.holmes.dev/finish"  # set on a pod: it ends (exit 0) once running
NOT_READY = "hollow.holmes.dev/not-ready"  # set on a node (Ready=False) and its pods (left alone)
KWOK_NODE = "kwok.x-k8s.io/node"  # the annotation (value KWOK_MANAGED) kwok manages nodes by
KWOK_MANAGED = "fake"
STAGES = Path(__file__).with_name("kwok-stages.yaml")
NODE_PREFIX = "hollow-"
# (NIC kind, Gbit/s, how it is advertised, RDMA device-plugin resource), one per island in turn
ISLAND_KINDS = (
    ("infiniband", 400, "holmes", "rdma/hca_shared_ib"),
    ("roce", 200, "holmes", "rdma/hca_shared_roce"),
    ("infiniband", 200, "nfd", "rdma/hca_shared_ib"),
    ("roce", 100, "nfd", "rdma/hca_shared_roce"),
    ("ethernet", 100, "holmes", None),
)
# GFD products (holmes.plan.gpus knows them) and their memory in MiB, one per island in turn
GPU_TYPES = (("NVIDIA-H100-80GB-HBM3", 81559), ("NVIDIA-A100-SXM4-80GB", 81920), ("NVIDIA-L40S", 46068))


class HollowError(ValueError):
    """Hollow nodes that cannot be made; the message says which argument to change."""


@dataclass(frozen=True)
class Island:
    name: str
    nic: str
    gbps: int
    advertise: str
    rdma_resource: str | None
    gpu_product: str
    gpu_memory_mib: int


def islands(count: int) -> list[Island]:
    if count < 1:
        raise HollowError(f"islands: {count}; expected at least 1")
    out = []
    for i in range(count):
        nic, gbps, advertise, rdma = ISLAND_KINDS[i % len(ISLAND_KINDS)]
        product, mem = GPU_TYPES[i % len(GPU_TYPES)]
        out.append(Island(f"island-{i}", nic, gbps, advertise, rdma, product, mem))
    return out


def rdma_kinds(count: int) -> dict[str, str]:
    """CLUSTER -> NIC kind of the islands advertised by NFD only (the operator's
    ``--cluster-rdma-kind``: NFD cannot tell InfiniBand from RoCE)."""
    return {i.name: i.nic for i in islands(count) if i.advertise == "nfd" and i.nic != "ethernet"}


def hollow_nodes(nodes: int, island_count: int, gpus: int = 8) -> list[SimNode]:
    """``nodes`` nodes named hollow-<island>-<index>, dealt round-robin over the islands."""
    if nodes < 1:
        raise HollowError(f"nodes: {nodes}; expected at least 1")
    isl = islands(island_count)
    if island_count > nodes:
        raise HollowError(f"islands: {island_count} > nodes: {nodes}; every island needs a node")
    out = []
    for k in range(nodes):
        i = isl[k % island_count]
        out.append(
            SimNode(
                name=f"{NODE_PREFIX}{k % island_count}-{k // island_count:04d}",
                cluster=i.name,
                nic=i.nic,
                gbps=float(i.gbps),
                gpus=gpus,
                cpu="192",
                memory="2Ti",
                pods="110",
                advertise=i.advertise,
                rdma_resource=i.rdma_resource,
                played_by=KWOK,
                taints=(HOLLOW_TAINT,),
                extra_labels={
                    HOLLOW: "true",
                    "nvidia.com/gpu.product": i.gpu_product,
                    "nvidia.com/gpu.count": str(gpus),
                    "nvidia.com/gpu.memory": str(i.gpu_memory_mib),
                },
            )
        )
    return out


def topology_doc(nodes: list[SimNode], **kwok: float) -> dict:
    """A topology document (topology.py's format) of these nodes, each ``playedBy: kwok``, for
    ``make cluster-up TOPOLOGY=...`` or ControlPlane.up; ``kwok``: its top-level kwok mapping
    (leaseSeconds, statusSeconds, startSeconds, parallelism)."""
    out = []
    for n in nodes:
        d: dict = {"name": n.name, "cluster": n.cluster, "nic": n.nic, "gbps": n.gbps, "gpus": n.gpus,
                   "cpu": n.cpu, "memory": n.memory, "pods": n.pods, "advertise": n.advertise,
                   "playedBy": KWOK}  # fmt: skip
        if n.rdma_resource:
            d["rdmaResource"] = n.rdma_resource
        if n.extra_labels:
            d["labels"] = dict(n.extra_labels)
        if n.extra_annotations:
            d["annotations"] = dict(n.extra_annotations)
        if n.taints:
            d["taints"] = [dict(t) for t in n.taints]
        out.append(d)
    return {"kwok": kwok, "nodes": out} if kwok else {"nodes": out}


def node_body(n: SimNode) -> dict:
    """The Node registered for kwok (a topology's ``playedBy: kwok`` node): annotated for it,
    its own taints, no conditions (kwok's Stages report them), no kubelet endpoint (logs of
    hollow pods are not served), not the local agent's loopback address."""
    body = n.node_object()
    body["metadata"]["annotations"] = {**(body["metadata"].get("annotations") or {}), KWOK_NODE: KWOK_MANAGED}
    st = body["status"]
    st["addresses"] = [{"type": "Hostname", "address": n.name}]
    st["nodeInfo"].update(
        kubeletVersion="kwok", containerRuntimeVersion="kwok://none", osImage="localkube hollow node (kwok)"
    )
    return body


def kwok_config(
    start_seconds: float = 1.0, status_seconds: float = 300.0, parallelism: int = 8, stages: Path = STAGES
) -> str:
    """kwok's ``--config``: its options and Holmes' Stages, with the delays the topology's ``kwok``
    mapping sets (a pod runs ``start_seconds`` after it is bound; a node's status is rewritten
    every ``status_seconds``, its Lease being the heartbeat)."""
    if start_seconds < 0 or status_seconds <= 0:
        raise HollowError(
            f"start seconds {start_seconds} must be >= 0 and status seconds {status_seconds} > 0"
        )
    if parallelism < 1:
        raise HollowError(f"parallelism: {parallelism}; expected at least 1")
    docs = [d for d in yaml.safe_load_all(stages.read_text()) if d]
    names = {d["metadata"]["name"] for d in docs}
    for want in ("holmes-pod-running", "holmes-node-heartbeat"):
        if want not in names:
            raise HollowError(f"{stages}: no Stage {want}")
    out = [
        {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokConfiguration",
            "options": {
                "podPlayStageParallelism": parallelism,
                "nodePlayStageParallelism": parallelism,
                "nodeLeaseParallelism": parallelism,
                # kwok's own pod IP pool (unused: the Stages give a pod the IP its annotation
                # names, or none); without one kwok logs an error for every deleted pod
                "cidr": "10.0.0.0/16",
            },
        }
    ]
    for d in docs:
        d = copy.deepcopy(d)
        if d["metadata"]["name"] == "holmes-pod-running":
            d["spec"]["delay"] = {"durationMilliseconds": round(start_seconds * 1000)}
        elif d["metadata"]["name"] == "holmes-node-heartbeat":
            ms = round(status_seconds * 1000)
            d["spec"]["delay"] = {"durationMilliseconds": ms, "jitterDurationMilliseconds": round(ms * 1.1)}
        out.append(d)
    return yaml.safe_dump_all(out, sort_keys=False)
