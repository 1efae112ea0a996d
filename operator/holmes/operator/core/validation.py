"""What stops a job before anything is planned: a spec Holmes cannot run as written, or one the
operator's job policy refuses. Each refusal is (condition reason, message naming the field and
the fix); the reconciler stalls the job with it until the spec changes."""

from __future__ import annotations

from collections.abc import Mapping

from holmes.contract import JobSpec

from . import queueing
from .template import TemplatePolicy, policy_violations

FIX = " -- fix the spec with kubectl edit or apply"


def refusal(
    job: Mapping, spec: JobSpec, policy: TemplatePolicy, across_members: bool, model_changed: bool
) -> tuple[str, str] | None:
    """The first reason the job cannot go on (None: it may). ``model_changed``: spec.model differs
    from the one the job's checkpoints were written with (the launched ConfigMap's)."""
    denied = policy_violations(spec.template, policy)
    if spec.network == "hostNetwork" and not policy.allow_host_namespaces:
        denied.append(
            "spec.network: hostNetwork is not allowed by the operator's job policy (allowed by the "
            "operator flag --allow-host-namespaces, chart value jobPolicy.allowHostNamespaces: true)"
        )
    if denied:
        return "PolicyViolation", "; ".join(denied)
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
