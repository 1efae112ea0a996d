"""Why a launched attempt broke, as pure verdicts on its pods and nodes: a node lost (deleted,
or a Pending pod's planned node that can never run it), a pod the scheduler has left
unschedulable on its planned node past ``runPolicy.schedulingTimeoutSeconds`` (what capacity.py
cannot count in advance: inter-pod affinity, topology spread, volume zones, pods it cannot see),
a disruption (evicted, preempted, the trainer's preempted exit, a node gone NotReady under a
failed pod), or what ``runPolicy.failurePolicy`` says of the exit codes. The reconciler turns a
verdict into a gang restart or a failure (core/reconcile.py); a disruption is never counted
against backoffLimit."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from holmes.contract.names import EXIT_PREEMPTED

from .summary import container_exits, disruption_of, parse_time, pod_node_rank

Unusable = Callable[[Mapping], str]  # why a node cannot run pods ("" if it can)


def deleted_node(pods: Iterable[Mapping], nodes: Mapping[str, Mapping]) -> str:
    """Why a pod of this attempt lost its node (its Node object was deleted), or ''."""
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if node and node not in nodes:
            return f"pod {p['metadata']['name']} ran on node {node}, which was deleted"
    return ""


def stuck_on_lost_node(
    pods: Iterable[Mapping], planned: list[str], nodes: Mapping[str, Mapping], unusable: Unusable
) -> str:
    """Why a Pending pod of this attempt can never start on its planned node ("" if none is
    stuck). Only Pending pods: running ones on a failing node are Kubernetes' to evict."""
    for p in pods:
        if (p.get("status") or {}).get("phase", "Pending") != "Pending" or p["metadata"].get(
            "deletionTimestamp"
        ):
            continue
        rank = pod_node_rank(p)
        if rank is None or not 0 <= rank < len(planned):
            continue
        node = planned[rank]
        why = "was deleted" if node not in nodes else unusable(nodes[node])
        if why:
            why = why if node not in nodes else f"is {why}"
            return (
                f"pod {p['metadata']['name']} is Pending on its planned node {node}, which {why}; "
                "it cannot start there"
            )
    return ""


@dataclass(frozen=True)
class Unschedulable:
    """Pods the scheduler refuses on their planned nodes: ``refused``, node -> the pod and the
    scheduler's message, for those refused ``timeout`` seconds or longer; ``next_in``: seconds
    until the next of the others reaches it (None: no other is refused)."""

    refused: Mapping[str, str] = field(default_factory=dict)
    next_in: float | None = None


def unschedulable(
    pods: Iterable[Mapping], planned: list[str], now: datetime, timeout: float
) -> Unschedulable:
    """The scheduler's own verdict on each Pending pod (its PodScheduled condition False,
    reason Unschedulable), timed from that condition's lastTransitionTime. A gated pod
    (SchedulingGated) is someone else's to release, not refused."""
    refused: dict[str, str] = {}
    next_in: float | None = None
    for p in pods:
        meta, st = p.get("metadata") or {}, p.get("status") or {}
        if st.get("phase", "Pending") != "Pending" or meta.get("deletionTimestamp"):
            continue
        c: Mapping = next((c for c in st.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
        if c.get("status") != "False" or c.get("reason") != "Unschedulable":
            continue
        rank = pod_node_rank(p)
        if rank is None or not 0 <= rank < len(planned):
            continue
        try:
            since = parse_time(c.get("lastTransitionTime")) or parse_time(meta.get("creationTimestamp"))
        except ValueError:
            since = None
        waited = (now - since).total_seconds() if since else 0.0
        if waited >= timeout:
            node = planned[rank]
            refused.setdefault(node, f"pod {meta.get('name')}: {c.get('message') or 'Unschedulable'}")
        else:
            next_in = min(next_in if next_in is not None else timeout, timeout - waited)
    return Unschedulable(refused, next_in)


def disruption(
    failed: Iterable[Mapping], current: Iterable[Mapping], nodes: Mapping[str, Mapping], unusable: Unusable
) -> str:
    """Why the failed pods are a disruption, not the job's fault ("" if they are not): evicted,
    preempted, the trainer's preempted exit, or a pod of the attempt whose node is not Ready (a
    pod that died with its node did not fail on its own)."""
    found = next((d for p in failed if (d := disruption_of(p, EXIT_PREEMPTED))), "")
    if found:
        return found
    for p in current:
        node = nodes.get((p.get("spec") or {}).get("nodeName") or "")
        if node is not None and "not Ready" in unusable(node):
            return f"node {node['metadata']['name']} is not Ready"
    return ""


def exits(failed: Iterable[Mapping]) -> list:
    """Every container exit of the failed pods, for runPolicy.failurePolicy."""
    return [x for p in failed for x in container_exits(p)]
