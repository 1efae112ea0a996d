"""How a trainer pod reaches the network on its node: the route, pure (facts in, pod parts out).

The NVIDIA Network Operator gives pods RDMA in one of three ways, and Holmes renders each:

- **shared RDMA device plugin** (``rdma/rdma_shared_device_*`` in the node's allocatable): the
  pod, in its own network namespace, requests that resource. Quantity: ``1`` (the plugin's usual
  configuration exposes all of a node's rails as one device), or with ``spec.islands[].rdmaDevices:
  perRail`` (an admin who configured one device per rail) one per rail the pod uses: the node's
  compute-rail HCAs (``holmes.dev/nic-hcas``);
- **SR-IOV + Multus** (a VF resource such as ``nvidia.com/sriov_rail`` in the node's allocatable,
  configured in the NIC mapping's ``rdmaResourceNames``): the pod gets the annotation
  ``k8s.v1.cni.cncf.io/networks`` listing ``spec.islands[].sriov.networks`` and requests one VF
  per network; a node with VFs whose island names no networks is refused (:class:`RouteError`);
- **hostNetwork** (``spec.network: hostNetwork``, allowed by the operator's policy): the pod
  shares the node's namespace (``dnsPolicy: ClusterFirstWithHostNet``) and still requests the
  RDMA resource for its devices.

Kubernetes' Dynamic Resource Allocation (``resource.k8s.io/v1``) is a fourth: a node whose RDMA
NICs (DRANET) or GPUs (NVIDIA's DRA driver) are devices in ResourceSlices (discovery.py, dra.py)
gets them through one ResourceClaim per pod, made from a ResourceClaimTemplate the operator
creates (:func:`device_claim`, :func:`claim_templates`), instead of device-plugin resources:

- GPUs and NICs both from DRA, and every GPU with an RDMA NIC on its own PCIe root
  (``resource.kubernetes.io/pcieRoot``, which both drivers publish): one request per GPU
  (``gpu-<i>``) and per NIC (``nic-<i>``), each pair under a ``matchAttribute`` constraint on
  the PCIe root, so the scheduler allocates a NIC beside each GPU (GPUDirect RDMA stays on the
  PCIe switch);
- otherwise (roots unknown, fewer rails than GPUs, only one kind from DRA): a ``gpus`` request
  of the pod's GPU count and a ``nics`` request of one rail per GPU (at most the node's rails),
  without alignment.

NIC requests select RDMA devices by CEL (``dra.net/rdma``, and the rails' HCA names when all
have one). A SR-IOV island setting (``spec.islands[].sriov``) is the admin's explicit choice and
keeps its VFs; the pod's NICs then do not come from DRA.

A node in an NVLink domain (GB200/GB300 NVL72) whose domain holds more of the job's nodes gets the
IMEX channel of the job's ComputeDomain there, and NCCL's multi-node NVLink switches
(:func:`with_compute_domains`, compute_domains.py).

Every route: the NCCL settings that are facts of the fabric (``holmes.plan.nccl``), and the hints the in-pod
resolver needs (``HOLMES_POD_NETWORK``, ``HOLMES_NIC``, ``HOLMES_HOST_HCAS``) instead of host
names that a pod's namespace does not have. :func:`job_routes` adds ``NCCL_NVLS_ENABLE``, the
node's NVLink SHARP switch (``holmes.contract.nvls.from_layout``: the decision whose memory the
planner counted; NCCL reads it once per process, so it is in the pod's environment from the
start, for Holmes' trainer and a framework's launcher alike; a template's value wins).

``IPC_LOCK`` (pinned memory for ``ibv_reg_mr`` beyond the memlock limit) only when the pod gets an
RDMA device on an island that opts in (``spec.islands[].ipcLock``): the limit comes from the
container runtime (docs/install.md), and Pod Security baseline refuses the capability, so such
an island's namespace must be privileged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from holmes.contract import JobSpec, Layout, nvls
from holmes.contract.names import (
    ENV_HOST_HCAS,
    ENV_NIC,
    ENV_POD_NETWORK,
    HOST_NETWORK,
    POD_NETWORK,
    RDMA_KINDS,
)
from holmes.contract.network import IslandNetwork, island_settings
from holmes.plan.dra import API_VERSION as DRA_API_VERSION
from holmes.plan.dra import PCIE_ROOT, NodeDevices
from holmes.plan.nccl import nccl_env

from . import child_names
from . import compute_domains as cd

MULTUS_NETWORKS = "k8s.v1.cni.cncf.io/networks"
SHARED, SRIOV = "shared", "sriov"  # how a node offers RDMA devices (NodeNetwork.rdma_route)
IPC_LOCK = "IPC_LOCK"  # the capability an island may opt in to (IslandNetwork.ipc_lock)
CLAIM = "devices"  # the name of a pod's one ResourceClaim (its spec.resourceClaims entry)


class RouteError(ValueError):
    """A node the job's network settings cannot reach; the message names the field and the fix."""


@dataclass(frozen=True)
class NodeNetwork:
    """What a node offers a pod's network (from its labels, annotations and allocatable)."""

    nic: str  # infiniband | roce | ethernet
    rdma_resource: str | None = None  # the device plugin's resource, if any
    rdma_route: str | None = None  # shared (rdma/...) | sriov (a VF pool) | None
    cluster: str = "default"  # the node's island is (cluster, nic)
    hcas: tuple[str, ...] = ()  # the host's compute-rail HCAs (a hint, never NCCL_IB_HCA)
    # (NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD) for the node's TCP link
    socket_threads: tuple[int, int] = (1, 1)
    # the NCCL environment of the node's kind alone (what a pod gets with no job settings)
    env: Mapping[str, str] = field(default_factory=dict)
    dra: DraOffer | None = None  # its devices in ResourceSlices, when NICs or GPUs come from DRA
    nvlink_domain: str | None = None  # GFD's nvidia.com/gpu.clique (rack-scale NVLink)


@dataclass(frozen=True)
class DraOffer:
    """What a node offers through DRA: its devices and the DeviceClasses to ask for them by."""

    devices: NodeDevices
    nics: bool  # its RDMA NICs come from DRA (DRANET's rails)
    gpus: bool  # its GPUs come from DRA (no device-plugin GPUs)
    nic_driver: str = "dra.net"
    nic_class: str = "dranet"
    gpu_class: str = "gpu.nvidia.com"


@dataclass(frozen=True)
class DeviceClaim:
    """A pod's DRA devices: the spec of its ResourceClaimTemplate."""

    spec: Mapping[str, Any]  # ResourceClaimTemplate.spec ({"spec": {"devices": ...}})
    gpus: bool  # the GPUs come from the claim: no nvidia.com/gpu limit
    aligned: bool  # a NIC on each GPU's PCIe root

    @property
    def template_name(self) -> str:
        """Named by its content: pods of one device shape share a template."""
        return f"{CLAIM}-{child_names.digest(self.spec)[:10]}"


@dataclass(frozen=True)
class PodRoute:
    """What build_pod adds to a pod for its network."""

    nic: str
    host_network: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, int] = field(default_factory=dict)  # limits, the template's win
    env: Mapping[str, str] = field(default_factory=dict)
    ipc_lock: bool = False
    claim: DeviceClaim | None = None  # DRA devices (spec.resourceClaims), None: device plugins
    # the IMEX channel's ResourceClaimTemplate of the job's ComputeDomain on the node's NVLink
    # domain (compute_domains.py), None: no channel
    nvlink_channel: str | None = None

    def claim_template_name(self, job: str) -> str | None:
        """The pod's ResourceClaimTemplate (the job's child), None without DRA devices."""
        return None if self.claim is None else f"{job}-{self.claim.template_name}"


def socket_nodes(layout: Layout) -> set[int]:
    """Node ranks with a rank in a group that spans nodes on NCCL's socket transport (one pass
    over the groups: O(world size x group kinds))."""
    G = layout.gpus_per_node
    if layout.world_net == "Socket" and len(layout.nodes) > 1:
        return set(range(len(layout.nodes)))
    out: set[int] = set()
    for g in layout.process_groups():
        nodes = {r // G for r in g.ranks}
        if g.net == "Socket" and len(nodes) > 1:
            out |= nodes
    return out


def pod_route(
    net: NodeNetwork,
    node: str,
    *,
    network: str = POD_NETWORK,
    islands: tuple[IslandNetwork, ...] = (),
    sockets: bool = True,
    template_annotations: Mapping[str, str] | None = None,
    gpus: int = 0,
) -> PodRoute:
    """The route of the pod on ``node``; ``sockets``: its groups use NCCL's socket transport
    (:func:`socket_nodes`); ``gpus``: the GPUs the pod uses (its DRA claim asks for them).
    Raises RouteError for a node the settings cannot serve."""
    idx, entry = island_settings(islands, net.cluster, net.nic)
    entry = entry or IslandNetwork()
    host = network == HOST_NETWORK
    annotations, resources = _devices(net, node, network, idx, entry, template_annotations)
    offer = net.dra
    if offer is not None and entry.sriov is not None:  # the VFs are the pod's NICs
        offer = DraOffer(offer.devices, False, offer.gpus, offer.nic_driver, offer.nic_class, offer.gpu_class)
    claim = device_claim(offer, gpus) if offer is not None else None
    nic_claim = claim is not None and offer is not None and offer.nics
    rdma = net.nic in RDMA_KINDS and (bool(resources) or nic_claim)
    env = {ENV_POD_NETWORK: HOST_NETWORK if host else POD_NETWORK, ENV_NIC: net.nic}
    if net.hcas:
        env[ENV_HOST_HCAS] = ",".join(net.hcas)
    # a vendor plugin owns the island's transport: no socket tuning of NCCL's own there
    socket = net.socket_threads if sockets and entry.net_plugin is None else None
    env.update(
        nccl_env(net.nic, traffic_class=entry.traffic_class, service_level=entry.service_level, socket=socket)
    )
    return PodRoute(
        nic=net.nic,
        host_network=host,
        annotations=annotations,
        resources=resources,
        env=env,
        ipc_lock=rdma and entry.ipc_lock,
        claim=claim,
    )


def _devices(
    net: NodeNetwork,
    node: str,
    network: str,
    idx: int | None,
    entry: IslandNetwork,
    template_annotations: Mapping[str, str] | None,
) -> tuple[dict[str, str], dict[str, int]]:
    """The pod's network attachments (annotations) and device-plugin RDMA resources (SR-IOV
    VFs or shared RDMA devices) on ``node``; RouteError for a node the settings cannot serve."""
    where = f"spec.islands[{idx}]" if idx is not None else "spec.islands"
    island = f"cluster={net.cluster} nic={net.nic}"
    host = network == HOST_NETWORK
    annotations: dict[str, str] = {}
    resources: dict[str, int] = {}
    if entry.sriov is not None:
        resource = entry.sriov.resource or (net.rdma_resource if net.rdma_route == SRIOV else None)
        if resource is None:
            raise RouteError(
                f"{where}.sriov.resource: node {node} ({island}) offers no SR-IOV resource Holmes "
                f"knows ({net.rdma_resource or 'no RDMA resource'}): name the VF resource, e.g. "
                "nvidia.com/sriov_rail"
            )
        if MULTUS_NETWORKS in (template_annotations or {}):
            raise RouteError(
                f"spec.template.metadata.annotations[{MULTUS_NETWORKS}] and {where}.sriov.networks both "
                "attach networks: keep one (the island setting also requests the VFs)"
            )
        annotations[MULTUS_NETWORKS] = ",".join(entry.sriov.networks)
        resources[resource] = len(entry.sriov.networks)
    elif net.rdma_route == SRIOV and not host:
        raise RouteError(
            f"spec.islands: node {node} ({island}) offers RDMA as SR-IOV VFs ({net.rdma_resource}), which a "
            f"pod gets only through a NetworkAttachmentDefinition: add an entry {{cluster: {net.cluster}, "
            f"nic: {net.nic}, sriov: {{networks: [namespace/name, ...]}}}} (one per rail)"
        )
    elif net.dra is not None and net.dra.nics:
        pass  # the NICs come with the DRA claim below
    elif net.rdma_resource is not None:
        resources[net.rdma_resource] = _shared_devices(net, entry, where, node, island)
    return annotations, resources


def rdma_requests(
    net: NodeNetwork,
    node: str,
    *,
    network: str = POD_NETWORK,
    islands: tuple[IslandNetwork, ...] = (),
    template_annotations: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """The device-plugin RDMA resources a pod of the job requests on ``node`` (capacity.py
    counts them against the node's free VFs or devices); none where the route cannot be made
    (the launch names the problem)."""
    idx, entry = island_settings(islands, net.cluster, net.nic)
    try:
        return _devices(net, node, network, idx, entry or IslandNetwork(), template_annotations)[1]
    except RouteError:
        return {}


def device_claim(offer: DraOffer, gpus: int) -> DeviceClaim | None:
    """The ResourceClaimTemplate spec of a pod using ``gpus`` GPUs on a node with this offer
    (see the module docstring); None when neither its GPUs nor its NICs come from DRA."""
    rails = offer.devices.rails if offer.nics else ()
    want_gpus = offer.gpus and gpus > 0
    if not want_gpus and not rails:
        return None
    nic_selector = f'device.attributes["{offer.nic_driver}"].rdma == true'
    hcas = [n.hca for n in rails]
    if rails and all(hcas):
        listed = ", ".join(json.dumps(h) for h in sorted(set(hcas)))  # type: ignore[type-var]
        nic_selector += f' && device.attributes["{offer.nic_driver}"].rdmaDevice in [{listed}]'

    def request(name: str, device_class: str, count: int, selector: str | None = None) -> dict:
        exactly: dict[str, Any] = {
            "deviceClassName": device_class,
            "allocationMode": "ExactCount",
            "count": count,
        }
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        return {"name": name, "exactly": exactly}

    requests: list[dict] = []
    constraints: list[dict] = []
    aligned = want_gpus and bool(rails) and offer.devices.aligned_pairs(gpus)
    if aligned:
        for i in range(gpus):
            requests += [
                request(f"gpu-{i}", offer.gpu_class, 1),
                request(f"nic-{i}", offer.nic_class, 1, nic_selector),
            ]
            constraints.append({"requests": [f"gpu-{i}", f"nic-{i}"], "matchAttribute": PCIE_ROOT})
    else:
        if want_gpus:
            requests.append(request("gpus", offer.gpu_class, gpus))
        if rails:
            requests.append(
                request("nics", offer.nic_class, min(gpus or len(rails), len(rails)), nic_selector)
            )
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return DeviceClaim(spec={"spec": {"devices": devices}}, gpus=want_gpus, aligned=aligned)


def claim_templates(
    job: str, namespace: str, routes: Iterable[PodRoute], labels: Mapping[str, str]
) -> list[dict]:
    """The ResourceClaimTemplates the job's pods name, one per distinct device shape."""
    out: dict[str, dict] = {}
    for r in routes:
        name = r.claim_template_name(job)
        if name is None or r.claim is None or name in out:
            continue
        out[name] = {
            "apiVersion": DRA_API_VERSION,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": json.loads(json.dumps(r.claim.spec)),
        }
    return [out[k] for k in sorted(out)]


def _shared_devices(net: NodeNetwork, entry: IslandNetwork, where: str, node: str, island: str) -> int:
    """Devices of the shared RDMA device plugin a pod requests: 1, or one per rail."""
    if entry.rdma_devices != "perRail":
        return 1
    if not net.hcas:
        raise RouteError(
            f"{where}.rdmaDevices: perRail needs node {node}'s rails ({island}), which no "
            "holmes.dev/nic-hcas annotation lists: run the NIC labeller or annotate the node, "
            "or use rdmaDevices: one"
        )
    return len(net.hcas)


def job_routes(
    spec: JobSpec,
    layout: Layout,
    nets: Mapping[str, NodeNetwork],
) -> dict[str, PodRoute]:
    """Every planned node's route (RouteError on the first node the job cannot serve), with the
    node's NVLS switch (module docstring)."""
    annotations = (spec.template.get("metadata") or {}).get("annotations") or {}
    on_sockets = socket_nodes(layout)
    nvls_decision = nvls.from_layout(layout, spec.model.tied_embeddings and layout.pipeline > 1)
    out = {}
    for rank, node in enumerate(layout.nodes):
        route = pod_route(
            nets[node],
            node,
            network=spec.network,
            islands=spec.islands,
            sockets=rank in on_sockets,
            template_annotations=annotations,
            gpus=layout.gpus_per_node,
        )
        out[node] = replace(route, env={**route.env, **nvls_decision.node_env(rank)})
    return out


def with_compute_domains(
    routes: Mapping[str, PodRoute], domains: Iterable[cd.JobDomain], nets: Mapping[str, NodeNetwork]
) -> dict[str, PodRoute]:
    """``routes`` with each node of a job's ComputeDomain given its IMEX channel, and every
    node's NCCL multi-node NVLink switches (compute_domains.pod_env)."""
    channel = {n: d.channel_template for d in domains for n in d.nodes}
    out = {}
    for node, route in routes.items():
        env = cd.pod_env(node in channel, bool(nets[node].nvlink_domain))
        out[node] = replace(route, env={**route.env, **env}, nvlink_channel=channel.get(node))
    return out
