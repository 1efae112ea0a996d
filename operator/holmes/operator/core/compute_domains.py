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
from dataclasses import dataclass

from holmes.contract import Layout

from . import child_names

API_VERSION = "resource.nvidia.com/v1beta1"
KIND = "ComputeDomain"
PLURAL = "computedomains"  # what the operator asks the API server whether it serves
CLAIM = "nvlink-channel"  # the pod's spec.resourceClaims entry for the IMEX channel
ENV_MNNVL = "NCCL_MNNVL_ENABLE"
ENV_CUMEM = "NCCL_CUMEM_ENABLE"


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
