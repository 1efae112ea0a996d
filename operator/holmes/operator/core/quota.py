"""ResourceQuota before creating a gang, pure: would the namespace's quotas refuse the pods still
to create? A gang created in parallel and refused part-way by the API server's quota admission
is torn down and tried again after a back-off, each try creating and deleting pods; so the gang
waits uncreated (reason ``WaitingForQuota``, naming the quota) until every quota it falls under
has room for all of it, and starts when one frees (the quota's informer wakes waiting jobs).

What a pod uses is counted as Kubernetes' pod evaluator counts it (pkg/quota/v1/evaluator/core/
pods.go): ``pods`` and ``count/pods`` one each; ``requests.<r>`` (and the bare ``cpu``, ``memory``,
``ephemeral-storage``) the pod's requests, containers summed and at least each init container's
(a limit alone is the request, as the API server defaults it); ``limits.<r>`` likewise for cpu,
memory and ephemeral-storage. What is used is the quota's ``status.used``, the API server's own
accounting, never recounted here; a quota whose status is not synced yet, or with a scope this
module does not know, is left to the API server (its refusal still ends in a back-off).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from holmes.plan.quantity import quantity_or_none as quantity

from .capacity import CPU, MEMORY, PODS, show

WAITING_FOR_QUOTA = "WaitingForQuota"  # the Reconciling reason (capacity.py reads it: no queue share)
STORAGE = "ephemeral-storage"
LIMITED = (CPU, MEMORY, STORAGE)  # the resources a quota's limits.* can name


def _sum_max(spec: Mapping, part: str) -> dict[str, float]:
    """A pod's requests or limits: its containers' summed, at least each init container's."""

    def of(c: Mapping) -> dict[str, float]:
        res = c.get("resources") or {}
        out: dict[str, float] = {}
        # requests: a limit alone is the request (the API server's defaulting); limits: their own
        for p in ("limits", "requests") if part == "requests" else ("limits",):
            for k, v in (res.get(p) or {}).items():
                q = quantity(v)
                if q is not None:
                    out[k] = q
        return out

    total: dict[str, float] = {}
    for c in spec.get("containers") or []:
        for k, v in of(c).items():
            total[k] = total.get(k, 0.0) + v
    for c in spec.get("initContainers") or []:
        for k, v in of(c).items():
            total[k] = max(total.get(k, 0.0), v)
    for k, v in (spec.get("overhead") or {}).items():  # RuntimeClass overhead, on top
        q = quantity(v)
        if q is not None and (part == "requests" or k in total):
            total[k] = total.get(k, 0.0) + q
    return total


def pod_usage(pod: Mapping) -> dict[str, float]:
    """What one pod counts against a quota, by the quota's resource names."""
    spec = pod.get("spec") or {}
    out = {PODS: 1.0, "count/pods": 1.0}
    for k, v in _sum_max(spec, "requests").items():
        out[f"requests.{k}"] = v
        if k in LIMITED:
            out[k] = v
    for k, v in _sum_max(spec, "limits").items():
        if k in LIMITED:
            out[f"limits.{k}"] = v
    return out


def _best_effort(pod: Mapping) -> bool:
    """No container requests or limits CPU or memory (QoS class BestEffort)."""
    spec = pod.get("spec") or {}
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        if any(k in (CPU, MEMORY) for p in ("requests", "limits") for k in (res.get(p) or {})):
            return False
    return True


def _scope_matches(scope: str, op: str, values: Sequence[str], pod: Mapping) -> bool | None:
    """Whether the pod is in the scope (None: a scope this module does not judge)."""
    spec = pod.get("spec") or {}
    if scope == "Terminating":
        return spec.get("activeDeadlineSeconds") is not None
    if scope == "NotTerminating":
        return spec.get("activeDeadlineSeconds") is None
    if scope == "BestEffort":
        return _best_effort(pod)
    if scope == "NotBestEffort":
        return not _best_effort(pod)
    if scope == "PriorityClass":
        name = spec.get("priorityClassName")
        return {
            "In": name in values,
            "NotIn": name not in values,
            "Exists": bool(name),
            "DoesNotExist": not name,
        }.get(op)
    return None


def applies(quota: Mapping, pod: Mapping) -> bool | None:
    """Whether the quota counts the pod: every scope of ``spec.scopes`` and of
    ``spec.scopeSelector`` matches (None: a scope this module does not judge)."""
    spec = quota.get("spec") or {}
    terms = [(s, "Exists", ()) for s in spec.get("scopes") or []]
    for e in (spec.get("scopeSelector") or {}).get("matchExpressions") or []:
        terms.append((e.get("scopeName"), e.get("operator"), tuple(e.get("values") or ())))
    result: bool | None = True
    for scope, op, values in terms:
        got = _scope_matches(scope, op, values, pod)
        if got is None:
            return None
        result = result and got
    return result


def refusal(quotas: Iterable[Mapping], pods: Sequence[Mapping]) -> str:
    """Why quota admission would refuse some of ``pods`` ('' if it would take them all): the
    first quota (by name) with too little room left for what they use together."""
    for q in sorted(quotas, key=lambda q: (q.get("metadata") or {}).get("name") or ""):
        st = q.get("status") or {}
        hard = st.get("hard") or {}
        if not hard:
            continue  # not synced by the quota controller yet: the API server's to judge
        counted = [p for p in pods if applies(q, p)]
        if not counted or any(applies(q, p) is None for p in pods):
            continue
        need: dict[str, float] = {}
        for p in counted:
            for k, v in pod_usage(p).items():
                need[k] = need.get(k, 0.0) + v
        for res in sorted(hard):
            want, limit = need.get(res, 0.0), quantity(hard[res])
            if not want or limit is None:
                continue
            used = quantity((st.get("used") or {}).get(res)) or 0.0
            if used + want <= limit + 1e-9 * max(limit, 1.0):
                continue
            name = (q.get("metadata") or {}).get("name")
            what = res.removeprefix("requests.").removeprefix("limits.")
            ever = (
                f"; {show(what, want)} is more than the quota allows at all: raise its hard limit or "
                "shrink the job"
                if want > limit
                else "; starts when the quota frees"
            )
            return (
                f"ResourceQuota {name}: the gang's {len(counted)} pod(s) need {res} {show(what, want)}, "
                f"{show(what, used)} of {show(what, limit)} used{ever}"
            )
    return ""
