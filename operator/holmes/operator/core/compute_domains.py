"""ComputeDomains: what gives a job's pods in one NVLink domain their NVLink to each other, pure.

On rack-scale NVLink (GB200/GB300 NVL72) the GPUs of different nodes reach each other's memory
only through an IMEX channel (``/dev/nvidia-caps-imex-channels``), which NVIDIA's DRA driver for
GPUs hands out per workload: a ``ComputeDomain`` (``resource.nvidia.com/v1beta1``; ``spec.numNodes``
and ``spec.channel.resourceClaimTemplate.name``) makes the driver run IMEX daemons on the nodes
its pods land on and create that ResourceClaimTemplate; each pod names the template in
``spec.resourceClaims`` and its container claims it, and so gets the channel. One ComputeDomain
cannot reach over two NVLink domains, so Holmes makes one per NVLink domain (GFD's
``nvidia.com/gpu.clique``) that holds two or more of the layout's nodes: where the planner priced
traffic on NVLink between nodes (tensor groups across nodes, DP or pipeline inside a domain:
holmes.plan.nvlink). A job's domain with one node needs no channel: inside a node NVLink works
without IMEX. ``numNodes`` is the job's nodes there: what the driver waits for when its
``IMEXDaemonsWithDNSNames`` gate is off, and only the status's count when it is on. The driver
refuses any change of a ComputeDomain's spec, so each is named by its content (domain and node
count): a re-plan onto other nodes makes a new one, as the claim templates are made (routes.py).

NCCL (checked against NCCL's ``src/mnnvl.cc``, ``src/init.cc``, ``src/misc/cudawrap.cc``):

- ``NCCL_MNNVL_ENABLE`` (default 2, auto): a communicator over nodes checks the GPUs' fabric
  state and cluster UUID/clique, then exports and imports a FABRIC memory handle through IMEX;
  when that fails it stops the communicator's init with a system error ("Check the IMEX channel
  configuration... Set NCCL_MNNVL_ENABLE=0"). So a pod with the channel gets ``2`` (written, as
  NVLS's switch is), and a pod on a clique-labelled node without one gets ``0``: its groups over
  nodes then take the NICs the planner priced them on instead of failing at init;
- ``NCCL_CUMEM_ENABLE``: MNNVL needs NCCL's cuMem allocations (``ncclMnnvlCheck`` returns without
  MNNVL when they are off, silently falling back to the NICs); an image or framework that turns
  them off would lose the NVLink the plan counted on, so a pod with the channel gets ``1``.

A template's own value of either wins (render.py), as for every variable Holmes sets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from holmes.contract import JobSpec, Layout
from holmes.plan import CostModelConfig

from . import child_names

API_VERSION = "resource.nvidia.com/v1beta1"
KIND = "ComputeDomain"
PLURAL = "computedomains"  # what the operator asks the API server whether it serves
CLAIM = "nvlink-channel"  # the pod's spec.resourceClaims entry for the IMEX channel
ENV_MNNVL = "NCCL_MNNVL_ENABLE"
ENV_CUMEM = "NCCL_CUMEM_ENABLE"
# a job's stall reason when its tensor groups need IMEX channels that no ComputeDomain can give
NOT_INSTALLED = "ComputeDomainsNotInstalled"


@dataclass(frozen=True)
class JobDomain:
    """The job's ComputeDomain in one NVLink domain: its name and the nodes it spans."""

    name: str  # the ComputeDomain's (and, with -channel, its claim template's) name
    domain: str  # the NVLink domain (GFD's clique)
    nodes: tuple[str, ...]  # the layout's nodes in it, in rank order

    @property
    def channel_template(self) -> str:
        """The ResourceClaimTemplate the DRA driver creates for the ComputeDomain's channel."""
        return f"{self.name}-channel"


def job_domains(job: str, layout: Layout, domain_of: Mapping[str, str | None]) -> list[JobDomain]:
    """One ComputeDomain per NVLink domain holding two or more of the layout's nodes (in the
    order the layout first reaches each), named ``<job>-nvl-<digest of domain and count>``."""
    nodes: dict[str, list[str]] = {}
    for n in layout.nodes:
        d = domain_of.get(n)
        if d:
            nodes.setdefault(d, []).append(n)
    shared = [(d, ns) for d, ns in nodes.items() if len(ns) > 1]
    return [
        JobDomain(f"{job}-nvl-{child_names.digest({'domain': d, 'nodes': len(ns)})[:10]}", d, tuple(ns))
        for d, ns in shared
    ]


def objects(domains: Sequence[JobDomain], namespace: str, labels: Mapping[str, str]) -> list[dict]:
    """The ComputeDomain objects to create before the pods (the driver makes each channel's
    ResourceClaimTemplate from them)."""
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": d.name,
                "namespace": namespace,
                "labels": dict(labels),
            },
            "spec": {
                "numNodes": len(d.nodes),
                "channel": {"resourceClaimTemplate": {"name": d.channel_template}},
            },
        }
        for d in domains
    ]


def pod_env(channel: bool, on_clique: bool) -> dict[str, str]:
    """NCCL's multi-node NVLink switches for a pod (module docstring): with the IMEX channel,
    MNNVL on and cuMem on; on an NVLink-domain node without it, MNNVL off; else nothing."""
    if channel:
        return {ENV_MNNVL: "2", ENV_CUMEM: "1"}
    return {ENV_MNNVL: "0"} if on_clique else {}


# ---- without IMEX channels ------------------------------------------------------------------
# Where the API server does not serve ComputeDomains (NVIDIA's DRA driver is not installed, or
# installed without them), or for a job across member clusters, a pod gets no IMEX channel and
# NCCL's multi-node NVLink cannot run: its traffic between nodes takes the NICs. The planner then
# sees no NVLink domain at all (``without_domains``), so it prices that traffic on the NICs it
# will cross and keeps tensor groups inside a node, as on any other cluster: a job with
# ``tensor: auto`` runs, on a plan that is true for the pods it gets. A job that asks for tensor
# groups wider than a node is refused with the fix (``refusal``) rather than launched with its
# every-layer all-reduce on the NICs (or planned as if NVLink joined the nodes).


def without_domains(config: CostModelConfig) -> CostModelConfig:
    """``config`` with GFD's clique label read from no node: the planner sees no NVLink domain
    (discovery.classify_node reads the label named ``clique_label``; '' names none)."""
    return replace(config, nic_mapping=replace(config.nic_mapping, clique_label=""))


def refusal(spec: JobSpec, across_members: bool) -> str:
    """Why a job whose tensor groups are wider than a node cannot run without IMEX channels
    ('' when its tensor degree is auto or fits a node). ``across_members``: the channels are
    missing because the job runs across member clusters, not because the API is not served."""
    tensor, per_node = spec.parallelism.tensor, spec.nodes.gpus_per_node
    if not isinstance(tensor, int) or tensor <= per_node:
        return ""
    why = (
        "Holmes makes no ComputeDomain for a job across member clusters (a ComputeDomain and its "
        "pods live in one cluster): run the job in one cluster"
        if across_members
        else f"the API server does not serve {PLURAL}.{API_VERSION.split('/')[0]} ({KIND}, "
        f"{API_VERSION}): install NVIDIA's DRA driver for GPUs with ComputeDomains enabled, then "
        "restart the operator"
    )
    return (
        f"spec.parallelism.tensor: {tensor} is wider than a node (gpusPerNode {per_node}): each "
        "tensor group would span nodes of an NVLink domain, which needs an IMEX channel from a "
        f"{KIND} of NVIDIA's DRA driver, and {why}; or set tensor to a divisor of {per_node} "
        "(or auto: tensor groups inside a node)"
    )


def domains_left_out(layout: Layout, domain_of: Mapping[str, str | None]) -> str:
    """The note for a plan made without NVLink domains on nodes that have them ('' where none
    of the layout's nodes is in one)."""
    if not any(domain_of.get(n) for n in layout.nodes):
        return ""
    return (
        f"; NVLink domains left out (no IMEX channel without {KIND}s of NVIDIA's DRA driver): "
        "tensor groups inside a node, traffic between nodes priced on the NICs"
    )
