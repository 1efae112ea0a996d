"""Taints and tolerations as the scheduler and Kueue read them, pure: whether a pod's
tolerations keep it off a node, and which of Kueue's admitted flavors (their node labels and
``tolerations``, which Kueue's job framework appends to its pods') lets a pod onto a node."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

# Taints the node lifecycle controller keeps in step with what the planner reads itself (the
# Ready condition, cordon): judged there, so a cluster without that controller (the local one)
# is not blocked by a stale one.
CONDITION_TAINTS = (
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/unschedulable",
)


def tolerates(tolerations: Iterable[Mapping], taint: Mapping) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def untolerated(node: Mapping, tolerations: Iterable[Mapping]) -> dict:
    """The node's first taint that keeps pods of these tolerations off it ({}: none)."""
    tolerations = tuple(tolerations)
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") in CONDITION_TAINTS:
            continue  # the planner judges these by the Ready condition and spec.unschedulable
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return dict(taint)
    return {}


def flavor_choice(
    node: Mapping,
    tolerations: Sequence[Mapping],
    flavor_labels: Sequence[Mapping[str, str]],
    flavor_tolerations: Sequence[Sequence[Mapping]],
) -> int | None:
    """Which of Kueue's admitted flavor choices (``flavor_labels``, each with its
    ``flavor_tolerations``: queueing.flavor_choices) a pod of ``tolerations`` gets on this
    node: the first whose labels the node carries and whose tolerations, with the pod's own,
    tolerate its taints (-1: no flavors, the pod's own tolerate them; None: none does)."""
    if not flavor_labels:
        return None if untolerated(node, tolerations) else -1
    labels = (node.get("metadata") or {}).get("labels") or {}
    for i, c in enumerate(flavor_labels):
        if not all(labels.get(k) == v for k, v in c.items()):
            continue
        extra = flavor_tolerations[i] if i < len(flavor_tolerations) else ()
        if not untolerated(node, (*tolerations, *extra)):
            return i
    return None
