"""Holmes' planner: NIC discovery -> topology -> cost model -> layout search -> a Layout.
Pure Python: imports the contract (holmes.contract) and nothing of Kubernetes or torch; used by
the operator and by `holmes plan`."""

from .budget import Budget
from .costmodel import CostModelConfig
from .discovery import NicMapping, NodeNic, classify_node, classify_nodes
from .errors import InsufficientNodes, PlanError, PlanTooLarge
from .explain import explain
from .nccl import nccl_env
from .planner import compare, megatron_default, plan
from .topology import Fabric

__all__ = [
    "Budget",
    "CostModelConfig",
    "Fabric",
    "InsufficientNodes",
    "NicMapping",
    "NodeNic",
    "PlanError",
    "PlanTooLarge",
    "classify_node",
    "classify_nodes",
    "compare",
    "explain",
    "megatron_default",
    "nccl_env",
    "plan",
]
