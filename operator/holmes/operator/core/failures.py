"""Why a launched attempt broke, as pure verdicts on its pods and nodes: a node lost (deleted,
or a Pending pod's planned node that can never run it), a disruption (evicted, preempted, the
trainer's preempted exit, a node gone NotReady under a failed pod), or what
``runPolicy.failurePolicy`` says of the exit codes. The reconciler turns a verdict into a gang
restart or a failure (core/reconcile.py); a disruption is never counted against backoffLimit."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from holmes.contract.names import EXIT_PREEMPTED

from .summary import container_exits, disruption_of, pod_node_rank

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
