"""spec.managedBy: a HolmesJob another controller runs is left alone, the way the Kubernetes Job
controller skips a Job whose managedBy is not its own. Kueue's MultiKueue
(``kueue.x-k8s.io/multikueue``) is the one in view: on the manager cluster it creates the job's
copy on a worker cluster (managedBy removed, so the worker's Holmes runs it) and copies that
copy's whole status back into this one (Kueue v0.17.1
pkg/controller/admissionchecks/multikueue/externalframeworks/adapter.go). A status write of this
cluster's operator would fight that copy, and a pod or ConfigMap of its own would run the job
twice; so the operator writes none, says once who runs the job (an Event: ``kubectl describe``),
and does not count the job in its own capacity queue. The one thing it makes is, for a job in a
LocalQueue that MultiKueue runs, the Kueue Workload MultiKueue dispatches (dispatching.py). Pure."""

from __future__ import annotations

from collections.abc import Mapping

from holmes.contract.jobspec import valid_managed_by
from holmes.contract.names import MANAGED_BY_HOLMES, MANAGED_BY_MULTIKUEUE

REASON = "ManagedElsewhere"


def elsewhere(job: Mapping) -> str:
    """The controller that runs ``job`` when it is not this operator; '' when it is. A malformed
    value is not another controller's name: the job is Holmes' to refuse (InvalidSpec)."""
    v = (job.get("spec") or {}).get("managedBy")
    return str(v) if v != MANAGED_BY_HOLMES and valid_managed_by(v) else ""


def left_alone(manager: str) -> tuple[str, str, str]:
    """The Event (type, reason, message) that tells ``kubectl describe`` who runs the job."""
    does = (
        "Kueue's MultiKueue runs it on a worker cluster and copies its status here"
        if manager == MANAGED_BY_MULTIKUEUE
        else "that controller runs it"
    )
    what = "no pods, ConfigMap or Kueue Workload"
    if manager == MANAGED_BY_MULTIKUEUE:
        what = "no pods or ConfigMap (only, in a LocalQueue, the Kueue Workload MultiKueue dispatches)"
    return (
        "Normal",
        REASON,
        f"spec.managedBy is {manager}: {does}; this operator creates {what} for it and writes no status",
    )
