"""A HolmesJob that Kueue's MultiKueue dispatches (``spec.managedBy: kueue.x-k8s.io/multikueue``,
in a LocalQueue), on the manager cluster: the job's Workload and nothing else. Pure.

MultiKueue dispatches a *Workload* whose controller is the job (Kueue v0.17.1
pkg/controller/admissionchecks/multikueue/workload.go: the adapter is found from the Workload's
controller owner), as Kueue's built-in integrations create one even for a job MultiKueue manages;
after the manager's quota reservation it copies the Workload's spec to a worker, and the job there
(externalframeworks/adapter.go) uses it as its prebuilt Workload (queueing.prebuilt_workload).

The PodSets are one of ``nodes.count`` pods of the job's shape (kueue_pod_sets.one_pod_set), not a
plan over this cluster's nodes: the job never runs on the manager (which may have no GPU nodes at
all), a plan's per-island PodSets would name the manager's islands, and the worker cannot re-plan
them (MultiKueue deletes a worker Workload whose spec drifted from the manager's); the worker's
Kueue admits the one PodSet to its flavors and the worker's Holmes plans on their nodes. The
priority is the one Holmes gives its own Workloads (its PriorityClass, or Kueue's
WorkloadPriorityClass). No pods, ConfigMap or status write (MultiKueue copies the worker's status
here); an eviction's quota is released once that status shows no active pod, as Kueue's job
framework releases a stopped job's."""

from __future__ import annotations

from collections.abc import Collection

from holmes.contract import JobSpec
from holmes.contract.names import MANAGED_BY_MULTIKUEUE

from . import admitting, capacity, child_names, kueue_pod_sets, managed_by, queueing, validating, validation
from .state import Decision, Event, Observed, owned_by
from .summary import iso


def dispatched(job: dict) -> bool:
    """MultiKueue dispatches the job from this cluster: its managedBy, and a LocalQueue."""
    return managed_by.elsewhere(job) == MANAGED_BY_MULTIKUEUE and bool(queueing.queue_name(job))


def said(manager: str, d: Decision | None) -> list[tuple[str, str, str]]:
    """The Events (type, reason, message) for a job ``manager`` runs: who runs it, then why a
    dispatched one has no Workload (``d``: its dispatch; None: not dispatched from here)."""
    return [managed_by.left_alone(manager), *((e.type, e.reason, e.message) for e in (d.events if d else []))]


def _active(job: dict) -> bool:
    """Pods of the job's copy on the worker still run or wait (its status, copied here)."""
    pods = (job.get("status") or {}).get("pods") or {}
    return bool(pods.get("pending") or pods.get("running"))


def _accepted(job: dict, raw_priority_namespaces: Collection[str]) -> tuple[JobSpec | None, tuple[str, str]]:
    """The job's spec, or None and why this operator would refuse it (reason, message)."""
    meta = job["metadata"]
    problem = child_names.job_name_problem(meta.get("name", ""))
    if problem:
        return None, ("InvalidName", problem)
    spec, invalid = validating.parse(job)
    if spec is None:
        return None, ("InvalidSpec", f"{invalid}{validation.FIX}")
    ns = meta.get("namespace", "default")
    refused = admitting.raw_priority_problem(spec, ns, raw_priority_namespaces)
    return (None, ("PolicyViolation", refused)) if refused is not None else (spec, ("", ""))


def dispatch(obs: Observed, raw_priority_namespaces: Collection[str], gpu_resource: str) -> Decision:
    """The manager's writes for a dispatched job: its Workload (created; re-created when its spec
    changed; its quota released after an eviction) and Warning Events for what stops it (the
    status is the worker's: left as it is)."""
    job = obs.job
    meta = job["metadata"]
    d = Decision(status=dict(job.get("status") or {}))

    def refuse(reason: str, message: str) -> Decision:
        d.events.append(
            Event("Warning", reason, f"{message} (no Workload: MultiKueue cannot dispatch the job)")
        )
        return d

    spec, refused = _accepted(job, raw_priority_namespaces)
    if spec is None:
        return refuse(*refused)
    classes = obs.priority_classes
    raw = meta.get("namespace", "default") in raw_priority_namespaces
    priority, unknown = capacity.priority_of(spec, classes or {}, raw)
    if unknown and classes is not None:
        return refuse("InvalidSpec", unknown)
    rp = spec.run_policy
    from_class = rp.priority_class_name if rp.priority is None and not unknown else None
    wl, uid = obs.workload, meta.get("uid")
    if wl is not None and uid and not owned_by(wl, uid):
        wl = None  # a same-named job's leftover: garbage collected
    shape = capacity.pod_shape(spec, gpu_resource)
    count, template = spec.nodes.count, spec.template
    g = queueing.gate(
        job,
        queueing.queue_name(job) or "",
        count,
        shape,
        template,
        lambda: kueue_pod_sets.one_pod_set(count, shape, template),
        admitting.pod_sets_inputs(job),
        priority,
        from_class,
        wl,
        obs.flavors,
        requeued=False,
        active=_active(job),
        now=iso(obs.now),
        workload_priority_classes=obs.workload_priority_classes,
    )
    d.workload, d.delete_workload, d.workload_status = g.create, g.delete, g.release
    if g.release is not None and wl is not None:
        d.workload_version = (wl.get("metadata") or {}).get("resourceVersion")
    if g.stall is not None:
        return refuse(*g.stall)
    if g.hold is not None and g.hold[2]:  # a Warning (a missing WorkloadPriorityClass)
        d.events.append(Event("Warning", g.hold[0], g.hold[1]))
    return d
