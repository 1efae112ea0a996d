"""MultiKueue's worker side: a HolmesJob labelled ``kueue.x-k8s.io/prebuilt-workload-name`` (the
copy MultiKueue creates on a worker cluster) uses that Workload, MultiKueue's copy of the
manager's, instead of one of its own. The job takes ownership of it as Kueue's
``jobframework.EnsurePrebuiltWorkloadOwnership`` does (adopt_patch) and never rewrites its PodSets
(queueing.gate): MultiKueue deletes a worker Workload whose spec drifted from the manager's
(Kueue v0.17.1 pkg/controller/admissionchecks/multikueue/workload.go, isRemoteSpecOutOfSync).
Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from holmes.contract.names import API_VERSION, KIND, LABEL_KUEUE_PREBUILT_WORKLOAD


def prebuilt_workload(job: Mapping) -> str | None:
    """The Workload MultiKueue made for this job's copy on a worker cluster (its label
    kueue.x-k8s.io/prebuilt-workload-name); None: the job has a Workload of its own."""
    return ((job.get("metadata") or {}).get("labels") or {}).get(LABEL_KUEUE_PREBUILT_WORKLOAD) or None


def workload_name(job: str) -> str:
    """The name of the Workload Holmes makes for the job ``job``."""
    return f"holmesjob-{job}"


def job_workload_name(job: Mapping) -> str:
    """The name of the Workload that admits ``job``: the prebuilt one, else its own."""
    return prebuilt_workload(job) or workload_name((job.get("metadata") or {}).get("name", ""))


LABEL_JOB_UID = "kueue.x-k8s.io/job-uid"  # Kueue's constants.JobUIDLabel


def controller_uid(obj: Mapping) -> str | None:
    """The uid of ``obj``'s controller (the ownerReference with controller: true)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("controller")), None)


def adopt_patch(workload: Mapping, job: Mapping) -> dict:
    """The merge patch that makes ``job`` the controller of its prebuilt ``workload``, as Kueue's
    ``EnsurePrebuiltWorkloadOwnership`` does (ctrl.SetControllerReference, the job-uid label):
    the Workload is then garbage collected with the job, and Kueue's MultiKueue on the manager
    reads the worker's Workload only (its spec is left as it is)."""
    meta, jmeta = workload.get("metadata") or {}, job.get("metadata") or {}
    ref = {
        "apiVersion": job.get("apiVersion", API_VERSION),
        "kind": job.get("kind", KIND),
        "name": jmeta.get("name"),
        "uid": jmeta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }
    refs = [r for r in meta.get("ownerReferences") or [] if r.get("uid") != ref["uid"]]
    patch: dict[str, Any] = {"ownerReferences": [*refs, ref], "labels": {LABEL_JOB_UID: jmeta.get("uid")}}
    if meta.get("resourceVersion"):  # the list is replaced whole: not over a newer write
        patch["resourceVersion"] = meta["resourceVersion"]
    return {"metadata": patch}
