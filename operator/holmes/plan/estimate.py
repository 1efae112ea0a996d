"""The cost model's estimate of a layout that is already chosen (its degrees, node order and
layers), under another cost model or on other node facts: what the single-type plan costs on the
real GPUs, or what the running layout costs under a model calibrated from measurements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from holmes.contract.flops import ModelCost
from holmes.contract.jobspec import JobSpec
from holmes.contract.layout import Layout

from .costmodel import CostModelConfig
from .discovery import NodeNic, classify_nodes
from .gpus import UNLABELLED
from .planner import Candidate, Degrees, PlanError, _evaluate, as_job, for_job, to_layout


def fixed_job(job: JobSpec, layout: Layout) -> JobSpec:
    """The job with the layout's degrees and layer split fixed (placement follows the layout)."""
    par = replace(
        job.parallelism,
        tensor=layout.tensor,
        pipeline=layout.pipeline,
        data=layout.data,
        partition=tuple(s.num_layers for s in layout.stages),
    )
    return replace(job, parallelism=par)


def evaluate(
    nodes: Sequence[Any], job: JobSpec | Mapping[str, Any], layout: Layout, config: CostModelConfig
) -> Candidate:
    """The candidate for ``layout`` (its nodes in its rank order, its layers) under ``config``."""
    job = as_job(job)
    cfg = for_job(config, job)
    mapping = cfg.nic_mapping.with_cluster_label(job.nodes.cluster_label)
    by_name = {n.name: n for n in classify_nodes(nodes, mapping)}
    missing = [name for name in layout.nodes if name not in by_name]
    if missing:
        raise PlanError(f"the layout's node(s) {', '.join(missing[:5])} are not in the node list")
    order: list[NodeNic] = [by_name[name] for name in layout.nodes]
    fixed = fixed_job(job, layout)
    deg = Degrees(layout.tensor, layout.pipeline, layout.data, layout.micro_batches)
    c = _evaluate(fixed, deg, order, ModelCost.of(job.model), cfg, {})
    if isinstance(c, str):
        raise PlanError(c)
    return c


def reestimate(
    nodes: Sequence[Any], job: JobSpec | Mapping[str, Any], layout: Layout, config: CostModelConfig
) -> Layout:
    """``layout`` with its estimate recomputed under ``config`` (no explanation)."""
    job = as_job(job)
    return to_layout(evaluate(nodes, job, layout, config), fixed_job(job, layout), config)


def without_gpu_types(nodes: Sequence[Any]) -> list[Any]:
    """The nodes as a cluster without GPU Feature Discovery would show them: every GPU priced
    with the single ``gpuPeakTflops`` (the plan Holmes made before it read GPU types)."""
    from holmes.contract import names

    gfd = (names.LABEL_GPU_PRODUCT, names.LABEL_GPU_MEMORY, names.LABEL_GPU_COUNT)
    out: list[Any] = []
    for n in nodes:
        if isinstance(n, NodeNic):
            out.append(replace(n, labels={k: v for k, v in n.labels.items() if k not in gfd}))
            continue
        meta = dict(n.get("metadata") or {})
        meta["labels"] = {k: v for k, v in (meta.get("labels") or {}).items() if k not in gfd}
        out.append({**n, "metadata": meta})
    return out


def gpu_types(layout: Layout) -> set[str]:
    """The GPU type names a planned layout's stages hold."""
    types: set[str] = set()
    for s in (layout.estimate or {}).get("stages", []):
        types.update(str(s.get("gpu", UNLABELLED)).split("+"))
    return types
