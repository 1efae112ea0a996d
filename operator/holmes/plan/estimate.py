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

from . import dra
from .candidate import Candidate, Degrees
from .costmodel import CostModelConfig
from .discovery import NodeNic, classify_nodes
from .errors import PlanError
from .gpus import UNLABELLED
from .measured import RunLayout
from .planner import as_job, cost_placement, for_job, to_layout


def fixed_job(job: JobSpec, run: RunLayout) -> JobSpec:
    """The job with the run's degrees and layer split fixed (placement follows the run)."""
    par = replace(
        job.parallelism,
        tensor=run.tensor,
        pipeline=run.pipeline,
        data=run.data,
        expert=run.expert if job.model.moe is not None else job.parallelism.expert,
        partition=run.layers,
        replan=replace(job.parallelism.replan, enabled=False),  # a fixed split is not re-planned
    )
    return replace(job, parallelism=par)


def evaluate_run(
    nodes: Sequence[Any], job: JobSpec | Mapping[str, Any], run: RunLayout, config: CostModelConfig
) -> Candidate:
    """The candidate for the run's layout (its nodes in its rank order, its layers) under
    ``config`` and the node facts given (GPU types, measured rates)."""
    job = as_job(job)
    cfg = for_job(config, job)
    mapping = cfg.nic_mapping.with_cluster_label(job.nodes.cluster_label)
    by_name = {n.name: n for n in classify_nodes(nodes, mapping)}
    missing = [name for name in run.nodes if name not in by_name]
    if missing:
        raise PlanError(f"the layout's node(s) {', '.join(missing[:5])} are not in the node list")
    order: list[NodeNic] = [by_name[name] for name in run.nodes]
    deg = Degrees(run.tensor, run.pipeline, run.data, run.micro_batches, run.expert)
    c = cost_placement(fixed_job(job, run), deg, order, ModelCost.of(job.model), cfg, {})
    if isinstance(c, str):
        raise PlanError(c)
    return c


def evaluate(
    nodes: Sequence[Any], job: JobSpec | Mapping[str, Any], layout: Layout, config: CostModelConfig
) -> Candidate:
    return evaluate_run(nodes, job, RunLayout.of(layout), config)


def reestimate(
    nodes: Sequence[Any], job: JobSpec | Mapping[str, Any], layout: Layout, config: CostModelConfig
) -> Layout:
    """``layout`` with its estimate recomputed under ``config`` (no explanation)."""
    job = as_job(job)
    return to_layout(evaluate(nodes, job, layout, config), fixed_job(job, RunLayout.of(layout)), config)


def without_gpu_types(nodes: Sequence[Any]) -> list[Any]:
    """The nodes as a cluster without GPU Feature Discovery (or a DRA GPU driver) would show
    them: every GPU priced with the single ``gpuPeakTflops`` (the plan Holmes made before it
    read GPU types)."""
    from holmes.contract import names

    gfd = (names.LABEL_GPU_PRODUCT, names.LABEL_GPU_MEMORY, names.LABEL_GPU_COUNT)
    out: list[Any] = []
    for n in nodes:
        if isinstance(n, NodeNic):
            labels = {k: v for k, v in n.labels.items() if k not in gfd}
            out.append(replace(n, labels=labels, gpu_product=None, gpu_memory_gib=None))
            continue
        meta = dict(n.get("metadata") or {})
        meta["labels"] = {k: v for k, v in (meta.get("labels") or {}).items() if k not in gfd}
        out.append({**dra.without_gpu_types(n), "metadata": meta})
    return out


def gpu_types(layout: Layout) -> set[str]:
    """The GPU type names a planned layout's stages hold."""
    types: set[str] = set()
    for s in (layout.estimate or {}).get("stages", []):
        types.update(str(s.get("gpu", UNLABELLED)).split("+"))
    return types
