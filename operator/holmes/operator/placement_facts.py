"""What placement (core/placement.py) decides on, gathered by the I/O layer before each decision:
the cost model as of this reconcile (its file re-read when it changed, the operator's NIC flags
on top) and each node's NIC facts under it (``NodeFacts``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from holmes.plan import CostModelConfig, NicMapping, classify_nodes, nccl_env
from holmes.plan.costmodel_file import CostModelFile
from holmes.plan.discovery import why_unusable
from holmes.plan.nccl import socket_threads
from holmes.plan.topology import socket_gbps

from . import metrics
from .core.capacity import Workloads
from .core.placement import PlacementFacts
from .core.routes import SHARED, SRIOV, DraOffer, NodeNetwork


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
    """Each node's network facts (NIC kind, island, RDMA resource and how it is offered, rails,
    socket threads for its link) and usability, classified with the cost model's nicMapping as
    of the latest plan (so one reconcile sees one model)."""

    def __init__(self, cost_model: CostModelFile):
        self.cost_model = cost_model

    def network(self, node: Mapping) -> NodeNetwork:
        config = self.cost_model.config
        nic = classify_nodes([node], config.nic_mapping)[0]  # remembered per node version
        m = config.nic_mapping
        route = None
        dra = None
        if nic.devices is not None:  # NICs or GPUs in ResourceSlices (holmes.plan.dra)
            nics, gpus = bool(nic.devices.rails) and nic.rdma, nic.gpu_source == "dra"
            if nics or gpus:
                dra = DraOffer(nic.devices, nics, gpus, m.dra_nic_driver, m.dra_nic_class, m.dra_gpu_class)
        if nic.rdma_resource is not None and not (dra and dra.nics):
            shared = nic.rdma_resource.startswith(m.rdma_resource_prefixes)
            route = SHARED if shared else SRIOV
        return NodeNetwork(
            nic=nic.nic,
            rdma_resource=nic.rdma_resource,
            rdma_route=route,
            cluster=nic.cluster,
            hcas=nic.hcas,
            socket_threads=socket_threads(socket_gbps(nic, config.fabric), config.fabric.socket_flow_gbps),
            env=nccl_env(nic),
            dra=dra,
            nvlink_domain=nic.nvlink_domain,
        )

    def unusable(self, node: Mapping) -> str:
        """The planner's own verdict (not Ready, cordoned, classification problems), so a node
        the planner would skip is also one a Pending pod is given up on."""
        nic = classify_nodes([node], self.cost_model.config.nic_mapping)[0]
        return "" if nic.usable else why_unusable(nic)


def builtin_cost_model(mapping: NicMapping | None = None) -> CostModelFile:
    """The built-in cost model (no file), with ``mapping`` for NIC discovery."""
    return CostModelFile(base=CostModelConfig(nic_mapping=mapping or NicMapping()), on_state=export_state)


def gather(
    cost_model: CostModelFile, workloads: Workloads | Callable[[], Workloads] = Workloads()
) -> PlacementFacts:
    """The facts of one decision: the cost model re-read if its file changed, the nodes'
    facts under it, and what the other workloads hold (``workloads``, or how to read them when
    the decision places: PlacementFacts.workloads)."""
    config = cost_model.refresh()
    nodes = NodeFacts(cost_model)
    read = workloads if callable(workloads) else lambda: workloads
    return PlacementFacts(config, nodes.network, nodes.unusable, read)
