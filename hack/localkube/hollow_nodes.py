"""Hollow nodes, the pure part: which Nodes a hollow cluster registers and what its hollow
kubelets report for a pod (no Kubernetes I/O here; hollow.py does that).

N nodes are spread over K islands (``island-0`` ... ``island-K-1``: the cluster label, one NIC
kind per island), with the vocabulary of topology.py (SimNode): the NIC kind and speed
advertised the way the labeller (``holmes``) or Node Feature Discovery (``nfd``: RDMA but not
which kind; the operator needs ``--cluster-rdma-kind``, see ``rdma_kinds``) publishes it, an
RDMA device-plugin resource on RDMA nodes, and GPU Feature Discovery's GPU labels
(``nvidia.com/gpu.product``/``.count``/``.memory``). Every hollow node carries the label and
NoSchedule taint ``HOLLOW`` so that only pods tolerating it (the bench's jobs) land there.

A pod's schedule comes from its annotations (a HolmesJob's ``spec.template.metadata``):
``RUN_SECONDS`` (how long it "runs"; absent: until deleted) or ``END_AT`` (a Unix time: a job's
pods end then whichever attempt they belong to, so restarts do not stretch a bench), and
``EXIT_CODE`` (how it ends).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from . import podspec as ps
from .topology import SimNode

HOLLOW = "localkube.holmes.dev/hollow"  # label and taint key of every hollow node
RUN_SECONDS = "hollow.holmes.dev/run-seconds"
END_AT = "hollow.holmes.dev/end-at"  # Unix time: every attempt's pods end then (at least 1 s on)
EXIT_CODE = "hollow.holmes.dev/exit-code"
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
                extra_labels={
                    HOLLOW: "true",
                    "nvidia.com/gpu.product": i.gpu_product,
                    "nvidia.com/gpu.count": str(gpus),
                    "nvidia.com/gpu.memory": str(i.gpu_memory_mib),
                },
            )
        )
    return out


def node_body(n: SimNode, now: str) -> dict:
    """The Node a hollow kubelet registers: Ready, tainted HOLLOW, no kubelet endpoint (logs
    of hollow pods are not served), not the local agent's loopback address."""
    body = n.node_object()
    body["spec"] = {"taints": [{"key": HOLLOW, "value": "true", "effect": "NoSchedule"}]}
    st = body["status"]
    st["addresses"] = [{"type": "Hostname", "address": n.name}]
    st["nodeInfo"].update(containerRuntimeVersion="hollow://none", osImage="localkube hollow node")
    st["conditions"] = node_conditions(True, now)
    return body


def node_conditions(ready: bool, now: str) -> list[dict]:
    """What a kubelet reports: pressure conditions False, Ready True (or False: runtime down)."""
    rows = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady") if ready else ("Ready", "False", "KubeletNotReady"),
    ]
    return [
        {
            "type": t,
            "status": s,
            "reason": r,
            "message": "hollow kubelet" if ready or t != "Ready" else "container runtime is down",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for t, s, r in rows
    ]


def lease_body(node: str, now_micro: str, duration: int) -> dict:
    """The node's Lease in kube-node-lease, as the kubelet keeps it."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": duration, "renewTime": now_micro},
    }


@dataclass(frozen=True)
class Schedule:
    """When a pod's containers end after it starts running (None: not before it is deleted)."""

    run_seconds: float | None
    exit_code: int


def schedule(pod: dict, default_run: float | None, now: float) -> Schedule:
    """The pod's schedule from its annotations, for a pod starting at Unix time ``now``; a bad
    value is the pod's failure (exit 2), as a container that cannot start."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    run, end_at = ann.get(RUN_SECONDS), ann.get(END_AT)
    try:
        seconds = default_run if run is None else float(run)
        if end_at is not None:
            seconds = max(1.0, float(end_at) - now)
        code = int(ann.get(EXIT_CODE, 0))
    except ValueError:
        return Schedule(0.0, 2)
    if seconds is not None and (not math.isfinite(seconds) or seconds < 0):
        return Schedule(0.0, 2)
    return Schedule(seconds, code)


def _containers(pod: dict) -> tuple[list[dict], list[dict]]:
    spec = pod.get("spec") or {}
    return list(spec.get("initContainers") or []), list((spec.get("containers") or [])[:1])


def running_status(pod: dict, started: str, pod_ip: str = "") -> dict:
    """Running: init containers completed, the app container running and ready; ``pod_ip``:
    none by default (hollow pods have no network)."""
    inits, apps = _containers(pod)
    done = ps.terminated_state(0, started, started, "hollow://init")
    st = {
        "phase": "Running",
        "startTime": started,
        "conditions": ps.pod_conditions(True, True, started),
        "containerStatuses": [
            ps.container_status(c, {"running": {"startedAt": started}}, 0, None, True, "hollow://app")
            for c in apps
        ],
    }
    if pod_ip:
        st.update(podIP=pod_ip, podIPs=[{"ip": pod_ip}])
    if inits:
        st["initContainerStatuses"] = [ps.container_status(c, done, 0, None, False) for c in inits]
    return st


def finished_status(pod: dict, started: str, ended: str, exit_code: int, pod_ip: str = "") -> dict:
    """Succeeded (exit 0) or Failed; the termination message is the trainer's last metric line,
    as a real trainer writes it (the operator's final progress comes from it, no log read)."""
    inits, apps = _containers(pod)
    line = json.dumps({"holmes": "done" if exit_code == 0 else "error", "iteration": 1})
    term = ps.terminated_state(exit_code, started, ended, "hollow://app", line)
    st = running_status(pod, started, pod_ip)
    st.update(
        phase="Succeeded" if exit_code == 0 else "Failed",
        conditions=ps.pod_conditions(True, False, ended),
        containerStatuses=[ps.container_status(c, term, 0, None, False, "hollow://app") for c in apps],
    )
    return st
