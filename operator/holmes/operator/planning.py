"""The planner's functions bound together for the reconciler (holmes.plan does the thinking;
this module only adapts its API to :class:`reconcile.Planner`)."""
from __future__ import annotations

from functools import partial
from typing import Mapping

from holmes.plan import InsufficientNodes, JobSpec, NicMapping, PlanError, PlannerConfig, SpecError
from holmes.plan import classify_node, nccl_env, plan

from .reconcile import NodeNetwork, Planner


def node_network(node: Mapping, mapping: NicMapping | None = None) -> NodeNetwork:
    nic = classify_node(node, mapping)
    return NodeNetwork(nic=nic.nic, rdma_resource=nic.rdma_resource, env=dict(nccl_env(nic)))


def nic_mapping(cluster_kinds: Mapping[str, str] | None = None, default_kind: str | None = None) -> NicMapping:
    """What the admin knows about RDMA nodes whose labels do not say InfiniBand or RoCE
    (Node Feature Discovery alone cannot tell): per cluster, else one default."""
    return NicMapping(cluster_rdma_kinds=tuple(sorted((cluster_kinds or {}).items())), rdma_default_kind=default_kind)


def default_planner(mapping: NicMapping | None = None) -> Planner:
    mapping = mapping or NicMapping()
    config = PlannerConfig(nic_mapping=mapping)
    return Planner(parse=JobSpec.from_manifest, plan=partial(plan, config=config),
                   network=partial(node_network, mapping=mapping),
                   spec_error=SpecError, insufficient=InsufficientNodes, plan_error=PlanError)
