"""The planner's functions bound together for the reconciler (holmes.plan does the thinking;
this module only adapts its API to :class:`reconcile.Planner`)."""
from __future__ import annotations

from typing import Mapping

from .reconcile import NodeNetwork, Planner


def node_network(node: Mapping) -> NodeNetwork:
    from holmes.plan.discovery import classify_node
    from holmes.plan.nccl import nccl_env

    nic = classify_node(node)
    return NodeNetwork(nic=nic.nic, rdma_resource=nic.rdma_resource, env=dict(nccl_env(nic)))


def default_planner() -> Planner:
    import holmes.plan as hp
    from holmes.plan.jobspec import JobSpec, SpecError

    return Planner(parse=JobSpec.from_manifest, plan=hp.plan, network=node_network,
                   spec_error=SpecError, insufficient=hp.InsufficientNodes, plan_error=hp.PlanError)
