"""The state machine's first step (reconcile.py): the job's name, its spec and the operator's job
policy (validation.py); a job that fails one stalls, saying what to fix, until it is edited.
Pure."""

from __future__ import annotations

from collections.abc import Mapping

from holmes.contract import JobSpec, SpecError, load_job

from . import child_names, spec_change, validation
from .state import Decision, JobState, cm_annotation, spec_changes, stall


def parse(job: Mapping) -> tuple[JobSpec | None, SpecError | None]:
    """The job's spec, or why it does not parse (a finished job needs it only for its TTL)."""
    try:
        return load_job(job), None
    except SpecError as e:
        return None, e


def validate(st: JobState, spec: JobSpec | None, invalid: SpecError | None) -> Decision | None:
    """Stalled (the Decision) when the name, the spec or the job policy refuse the job; None: go on."""
    problem = child_names.job_name_problem(st.name)
    if problem:
        return stall(st, "InvalidName", problem)
    if spec is None:
        return stall(st, "InvalidSpec", f"{invalid}{validation.FIX}")
    refused = validation.refusal(
        st.job,
        spec,
        st.settings.policy,
        st.obs.members is not None,
        _model_changed(st, spec),
        st.settings.gpu_resource,
    )
    if refused is not None:
        return stall(st, *refused)
    return None


def _model_changed(st: JobState, spec: JobSpec) -> bool:
    """spec.model differs from the launched one, defaults applied (a CRD upgrade that adds a
    defaulted model field changes its stored hash, not the model)."""
    started = cm_annotation(st, child_names.ANN_MODEL_HASH)
    if not started or started == child_names.model_hash(st.job.get("spec") or {}):
        return False
    return spec_change.model_changed(spec_changes(st, spec))
