"""What stops a job before anything is planned: a spec Holmes cannot run as written, or one the
operator's job policy refuses. Each refusal is (condition reason, message naming the field and
the fix); the reconciler stalls the job with it until the spec changes. (What the API server
checks itself, the Pod schema and Pod Security, it checks on a dry run of the rendered pods
before the gang is created: kube.py, restarting.template_rejected.)"""

from __future__ import annotations

from collections.abc import Mapping

from holmes.contract import JobSpec
from holmes.contract.names import RESOURCE_GPU
from holmes.contract.podtemplate import ROOT

from . import child_names, queueing
from .template import TemplatePolicy, policy_violations

FIX = " -- fix the spec with kubectl edit or apply"


def gpu_limit_problems(spec: JobSpec, gpu_resource: str) -> list[str]:
    """The trainer container's GPU limit or request where it is not spec.nodes.gpusPerNode: the
    layout starts one process per planned GPU, so a pod granted other than that fails or idles
    GPUs. (Holmes sets it itself when the template leaves it out.)"""
    containers = ((spec.template or {}).get("spec") or {}).get("containers") or []
    idx = next((i for i, c in enumerate(containers) if c.get("name") == child_names.TRAINER_CONTAINER), 0)
    if not containers:
        return []
    want = spec.nodes.gpus_per_node
    out = []
    resources = containers[idx].get("resources") or {}
    for part in ("limits", "requests"):
        have = (resources.get(part) or {}).get(gpu_resource)
        if have is not None and str(have) != str(want):
            out.append(
                f"{ROOT}.spec.containers[{idx}].resources.{part}[{gpu_resource}]: {have} disagrees with "
                f"spec.nodes.gpusPerNode: {want} (the layout runs one process per planned GPU): remove "
                "it (Holmes sets it) or set it to gpusPerNode"
            )
    return out


def refusal(
    job: Mapping,
    spec: JobSpec,
    policy: TemplatePolicy,
    across_members: bool,
    model_changed: bool,
    gpu_resource: str = RESOURCE_GPU,
) -> tuple[str, str] | None:
    """The first reason the job cannot go on (None: it may). ``model_changed``: spec.model differs
    from the one the job's checkpoints were written with (the launched ConfigMap's);
    ``gpu_resource``: the GPUs' resource name (the cost model's nicMapping.gpuResource)."""
    denied = policy_violations(spec.template, policy)
    if denied:
        return "PolicyViolation", "; ".join(denied)
    gpus = gpu_limit_problems(spec, gpu_resource)
    if gpus:
        return "InvalidSpec", "; ".join(gpus) + FIX
    replicas = spec.training.across_islands.mode == "replicas"  # auto runs a pipeline here
    if replicas and spec.framework != "holmes":  # the outer step is Holmes' trainer's (outer.py)
        return (
            "InvalidSpec",
            "spec.training.acrossIslands.mode: replicas runs Holmes' own trainer, not "
            f"spec.framework {spec.framework}: use framework holmes, or mode pipeline (or auto)" + FIX,
        )
    if replicas and across_members:  # each replica meets at its first pod's DNS name
        return (
            "InvalidSpec",
            "spec.training.acrossIslands.mode: replicas is not run across member clusters yet (each "
            "replica's rendezvous is its first pod's DNS name, which members do not share): use mode "
            "pipeline (or auto), or run the job on one control plane's clusters" + FIX,
        )
    if across_members and queueing.volcano_group(spec.template):
        return (
            "InvalidSpec",
            "schedulerName: volcano (a Volcano PodGroup) is not supported for a job across member "
            "clusters yet: remove spec.template.spec.schedulerName",
        )
    if model_changed:
        return (
            "ImmutableField",
            "spec.model cannot change once the job has started (its checkpoints hold this model); "
            "revert spec.model or create a new HolmesJob",
        )
    return None
