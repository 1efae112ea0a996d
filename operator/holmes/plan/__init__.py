"""Holmes' planner: NIC discovery -> topology -> cost model -> layout search. Pure Python
(no Kubernetes or torch import), shared by the operator, the trainer and `holmes plan`."""
from .costmodel import ModelCost, PlannerConfig
from .discovery import NicMapping, NodeNic, classify_node, classify_nodes
from .explain import explain
from .jobspec import JobSpec, SpecError
from .layout import Layout, LayoutError
from .nccl import nccl_env
from .planner import InsufficientNodes, PlanError, compare, megatron_default, plan
from .topology import Fabric

__all__ = [
    "Fabric", "InsufficientNodes", "JobSpec", "Layout", "LayoutError", "ModelCost", "NicMapping", "NodeNic",
    "PlanError", "PlannerConfig", "SpecError", "classify_node", "classify_nodes", "compare", "explain",
    "megatron_default", "nccl_env", "plan",
]
