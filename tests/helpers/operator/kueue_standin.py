"""Kueue v0.19.2 in the few steps a HolmesJob meets, as plain functions on Workload dicts, so
the tests drive the operator with the states real Kueue produces and none it does not.

Each function follows the Kueue function it names (v0.19.2, default feature gates):

- ``reserve_quota``: ``workload.SetQuotaReservation`` (admission set, QuotaReserved=True,
  an active Evicted or Preempted condition reset to False with reason QuotaReserved) followed
  by ``SyncAdmittedCondition`` (Admitted=True: no admission checks here);
- ``evict``: ``evict.Evict``'s ``prepareForEviction`` (Evicted=True, nothing else: the quota
  stays reserved) and, for a preemption, the preemptor's ``SetPreemptedCondition``;
- ``admit_pending``: the scheduler's rule that quota is reserved only for a Workload that holds
  none, is not backing off (Requeued=False) and fits in what the Workloads holding quota leave
  of the ClusterQueue's nominal quota (one resource: GPUs).

What Kueue leaves to a job integration (stopping the job, then clearing QuotaReserved and
status.admission and setting Requeued) is not here: that is the operator's to do."""

from __future__ import annotations

from collections.abc import Iterable

from holmes.operator.core.queueing import holds_quota, set_condition

CLUSTER_QUEUE = "cluster-queue"


def conditions(wl: dict) -> list[dict]:
    return (wl.get("status") or {}).get("conditions") or []


def condition(wl: dict, type_: str) -> dict:
    return next((c for c in conditions(wl) if c["type"] == type_), {})


def _reset_active(conds: list[dict], type_: str, now: str) -> list[dict]:
    prev = next((c for c in conds if c["type"] == type_), None)
    if prev is None or prev["status"] != "True":
        return conds
    reset = {
        "type": type_,
        "status": "False",
        "reason": "QuotaReserved",
        "message": "Previously: " + prev["message"],
    }
    return set_condition(conds, reset, now)


def reserve_quota(wl: dict, flavor: str, now: str, cluster_queue: str = CLUSTER_QUEUE) -> dict:
    """SetQuotaReservation + SyncAdmittedCondition: the status Kueue writes when it admits."""
    status = dict(wl.get("status") or {})
    count = wl["spec"]["podSets"][0]["count"]
    status["admission"] = {
        "clusterQueue": cluster_queue,
        "podSetAssignments": [{"name": "workers", "count": count, "flavors": {"nvidia.com/gpu": flavor}}],
    }
    reserved = {
        "type": "QuotaReserved",
        "status": "True",
        "reason": "QuotaReserved",
        "message": f"Quota reserved in ClusterQueue {cluster_queue}",
    }
    conds = set_condition(conditions(wl), reserved, now)
    for type_ in ("Evicted", "Preempted"):
        conds = _reset_active(conds, type_, now)
    admitted = {
        "type": "Admitted",
        "status": "True",
        "reason": "Admitted",
        "message": "The workload is admitted",
    }
    status["conditions"] = set_condition(conds, admitted, now)
    return status


def evict(wl: dict, reason: str, message: str, now: str) -> dict:
    """prepareForEviction (+ the Preempted condition of a preemption): the status after it."""
    status = dict(wl.get("status") or {})
    conds = set_condition(
        conditions(wl), {"type": "Evicted", "status": "True", "reason": reason, "message": message}, now
    )
    if reason == "Preempted":
        preempted = {"type": "Preempted", "status": "True", "reason": "InClusterQueue", "message": message}
        conds = set_condition(conds, preempted, now)
    status["conditions"] = conds
    return status


def gpus(wl: dict) -> int:
    ps = wl["spec"]["podSets"][0]
    return ps["count"] * int(
        ps["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
    )


def admissible(wl: dict) -> bool:
    """Pending in the queue: no quota held, not backing off, not finished."""
    if holds_quota(wl) or condition(wl, "Finished").get("status") == "True":
        return False
    return condition(wl, "Requeued").get("status") != "False"


def admit_pending(workloads: Iterable[dict], nominal_gpus: int) -> list[str]:
    """The names of the pending Workloads that fit now, highest priority first: the ones the
    scheduler would reserve quota for (the caller writes reserve_quota's status)."""
    workloads = list(workloads)
    held = sum(
        gpus(w) for w in workloads if holds_quota(w) and condition(w, "Finished").get("status") != "True"
    )
    out = []
    for w in sorted(workloads, key=lambda w: -int(w["spec"].get("priority") or 0)):
        if admissible(w) and held + gpus(w) <= nominal_gpus:
            held += gpus(w)
            out.append(w["metadata"]["name"])
    return out
