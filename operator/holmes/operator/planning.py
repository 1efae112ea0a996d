"""The planner as the reconciler sees it (:class:`core.state.Planner`): holmes.plan does the
thinking with the cost model current at each plan; this module only binds the two and times it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from holmes.contract import JobSpec, Layout
from holmes.plan import CostModelConfig, NicMapping, classify_node, nccl_env, plan
from holmes.plan.calibrate import assess
from holmes.plan.costmodel_file import CostModelFile
from holmes.plan.discovery import why_unusable
from holmes.plan.measured import Measured

from . import metrics
from .core.render import NodeNetwork


def with_nic_flags(
    config: CostModelConfig, cluster_kinds: Mapping[str, str] | None = None, default_kind: str | None = None
) -> CostModelConfig:
    """The operator's --cluster-rdma-kind / --rdma-default-kind on top of the cost model's
    nicMapping: flags win per cluster; the file's other entries stay."""
    m = config.nic_mapping
    kinds = {**dict(m.cluster_rdma_kinds), **(cluster_kinds or {})}
    return replace(
        config,
        nic_mapping=replace(
            m,
            cluster_rdma_kinds=tuple(sorted(kinds.items())),
            rdma_default_kind=default_kind or m.rdma_default_kind,
        ),
    )


def export_state(valid: bool, reloaded: bool) -> None:
    """CostModelFile's state as the operator's metrics."""
    metrics.COST_MODEL_VALID.set(1 if valid else 0)
    if reloaded:
        metrics.COST_MODEL_RELOADS.inc()


class NodeFacts:
    """Each node's NIC kind, NCCL environment and usability, classified with the cost model's
    nicMapping as of the latest plan (so one reconcile sees one model)."""

    def __init__(self, cost_model: CostModelFile):
        self.cost_model = cost_model

    def network(self, node: Mapping) -> NodeNetwork:
        nic = classify_node(node, self.cost_model.config.nic_mapping)
        return NodeNetwork(nic=nic.nic, rdma_resource=nic.rdma_resource, env=dict(nccl_env(nic)))

    def unusable(self, node: Mapping) -> str:
        """The planner's own verdict (not Ready, cordoned, classification problems), so a node
        the planner would skip is also one a Pending pod is given up on."""
        nic = classify_node(node, self.cost_model.config.nic_mapping)
        return "" if nic.usable else why_unusable(nic)


class ClusterPlanner:
    """Plans with the cost model current at each plan (re-read from its file, if any)."""

    def __init__(self, cost_model: CostModelFile | None = None):
        self.cost_model = cost_model or CostModelFile(on_state=export_state)
        self.facts = NodeFacts(self.cost_model)

    @classmethod
    def with_mapping(cls, mapping: NicMapping | None = None) -> ClusterPlanner:
        """The built-in cost model (no file), with ``mapping`` for NIC discovery."""
        return cls(
            CostModelFile(base=CostModelConfig(nic_mapping=mapping or NicMapping()), on_state=export_state)
        )

    def plan(self, nodes: list, job: JobSpec) -> Layout:
        with metrics.PLANNING_SECONDS.time():
            return plan(nodes, job, config=self.cost_model.refresh())

    def calibrated(self, nodes: list, job: JobSpec, layout: Layout, measured: Measured):
        """The job's calibration from its measurements, and its running layout's seconds under it."""
        return assess(nodes, job, layout, measured, self.cost_model.refresh())
