"""The planner's functions bound together for the reconciler (holmes.plan does the thinking;
this module only adapts its API to :class:`reconcile.Planner`)."""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from holmes.plan import InsufficientNodes, JobSpec, NicMapping, PlanError, PlannerConfig, SpecError
from holmes.plan import classify_node, nccl_env, plan
from holmes.plan.discovery import why_unusable

from .cost_model import CostModel
from .reconcile import NodeNetwork, Planner


def node_network(node: Mapping, mapping: NicMapping | None = None) -> NodeNetwork:
    nic = classify_node(node, mapping)
    return NodeNetwork(nic=nic.nic, rdma_resource=nic.rdma_resource, env=dict(nccl_env(nic)))


def nic_mapping(cluster_kinds: Mapping[str, str] | None = None, default_kind: str | None = None) -> NicMapping:
    """What the admin knows about RDMA nodes whose labels do not say InfiniBand or RoCE
    (Node Feature Discovery alone cannot tell): per cluster, else one default."""
    return NicMapping(cluster_rdma_kinds=tuple(sorted((cluster_kinds or {}).items())), rdma_default_kind=default_kind)


def with_nic_flags(config: PlannerConfig, cluster_kinds: Mapping[str, str] | None = None,
                   default_kind: str | None = None) -> PlannerConfig:
    """The operator's --cluster-rdma-kind / --rdma-default-kind on top of the cost model's
    nicMapping: flags win per cluster; the file's other entries stay."""
    m = config.nic_mapping
    kinds = {**dict(m.cluster_rdma_kinds), **(cluster_kinds or {})}
    return replace(config, nic_mapping=replace(m, cluster_rdma_kinds=tuple(sorted(kinds.items())),
                                               rdma_default_kind=default_kind or m.rdma_default_kind))


def planner_for(model: CostModel) -> Planner:
    """Plans with the cost model current at each plan (re-read from its file, if any); node
    networks use the model of the latest plan, so one reconcile sees one model."""
    def plan_now(nodes: list, job: JobSpec):
        return plan(nodes, job, config=model.refresh())

    def network_now(node: Mapping) -> NodeNetwork:
        return node_network(node, model.config.nic_mapping)

    def unusable_now(node: Mapping) -> str:
        """The planner's own verdict (not Ready, cordoned, classification problems), so a
        node the planner would skip is also one a Pending pod is given up on."""
        nic = classify_node(node, model.config.nic_mapping)
        return "" if nic.usable else why_unusable(nic)

    return Planner(parse=JobSpec.from_manifest, plan=plan_now, network=network_now,
                   spec_error=SpecError, insufficient=InsufficientNodes, plan_error=PlanError,
                   unusable=unusable_now)


def default_planner(mapping: NicMapping | None = None) -> Planner:
    """The built-in cost model (no file), with ``mapping`` for NIC discovery."""
    return planner_for(CostModel(base=PlannerConfig(nic_mapping=mapping or NicMapping())))
