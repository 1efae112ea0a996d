"""Pure summaries written into HolmesJob.status: the layout in use and the pods by phase."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timezone

from holmes.contract.layout import Layout

from . import child_names


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str | None) -> datetime | None:
    if not s:
        return None
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def layout_status(layout: Layout, nic_of: Mapping[str, str], configmap: str) -> dict:
    """Per stage island/nic/layers/nodes, the DP group families with the NIC kinds they span,
    and the planner's estimate."""
    dp_net = {g.stage: g.net for g in layout.groups if g.kind == "dp"}
    gpu = {e.get("stage"): e.get("gpu") for e in (layout.estimate or {}).get("stages", [])}
    stages, dp = [], []
    for s in layout.stages:
        nodes = list(s.nodes or layout.stage_nodes(s.index))
        stages.append(
            {"index": s.index, "island": s.island, "nic": s.nic, "layers": list(s.layers), "nodes": nodes}
            | ({"gpu": gpu[s.index]} if gpu.get(s.index) else {})  # GPU type(s), plan/gpus.py
        )
        dp.append(
            {
                "stage": s.index,
                "size": layout.data,
                "nics": sorted({nic_of.get(n, "unknown") for n in nodes}),
                "net": dp_net.get(s.index, s.dp_net),
            }
        )
    return {
        "shape": f"{layout.pipeline}x{layout.data}x{layout.tensor}",
        "pipeline": layout.pipeline,
        "data": layout.data,
        "tensor": layout.tensor,
        "worldSize": layout.world_size,
        "nodes": len(layout.nodes),
        "configMap": configmap,
        "stages": stages,
        "dpGroups": dp,
        "estimate": {k: v for k, v in (layout.estimate or {}).items() if isinstance(v, (int, float, str))},
    }


def pod_counts(pods: Iterable[Mapping]) -> dict[str, int]:
    out = {"pending": 0, "running": 0, "succeeded": 0, "failed": 0}
    for p in pods:
        phase = (p.get("status") or {}).get("phase") or "Pending"
        key = phase.lower() if phase in ("Running", "Succeeded", "Failed") else "pending"
        out[key] += 1
    return out


def pod_attempt(pod: Mapping) -> int | None:
    try:
        return int(((pod.get("metadata") or {}).get("labels") or {})[child_names.LABEL_ATTEMPT])
    except (KeyError, TypeError, ValueError):
        return None


def pod_node_rank(pod: Mapping) -> int | None:
    try:
        return int(((pod.get("metadata") or {}).get("labels") or {})[child_names.LABEL_NODE_RANK])
    except (KeyError, TypeError, ValueError):
        return None


def failure_of(pod: Mapping) -> str:
    """A one-line account of why a pod failed, from its status."""
    st = pod.get("status") or {}
    name = (pod.get("metadata") or {}).get("name", "?")
    node = (pod.get("spec") or {}).get("nodeName") or (pod.get("metadata", {}).get("annotations") or {}).get(
        child_names.ANN_NODE, "?"
    )
    for cs in st.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term:
            what = f"exit code {term.get('exitCode')}"
            if term.get("reason"):
                what += f" ({term['reason']})"
            msg = (term.get("message") or "").strip().splitlines()
            if msg:
                what += f": {msg[-1][:200]}"
            return f"pod {name} on {node} failed with {what}"
    reason = st.get("reason") or "Failed"
    return f"pod {name} on {node} failed: {reason} {st.get('message') or ''}".strip()


# pod status reasons the kubelet and the scheduler give a pod they stopped for the cluster's sake
DISRUPTION_REASONS = (
    "Evicted",
    "Preempting",
    "NodeLost",
    "NodeShutdown",
    "Shutdown",
    "Terminated",
    "NodeAffinity",
)


def container_exits(pod: Mapping) -> list[tuple[str, int]]:
    """(container name, exit code) of each terminated container of the pod."""
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term and isinstance(term.get("exitCode"), int):
            out.append((cs.get("name", ""), term["exitCode"]))
    return out


def disruption_of(pod: Mapping, preempted_exit: int) -> str:
    """Why a failed pod was stopped from outside rather than failing on its own ('' if it was
    not): the DisruptionTarget condition (Kubernetes 1.26+), an eviction or preemption reason,
    the trainer's preempted exit code, or a kill while the pod was being deleted."""
    st = pod.get("status") or {}
    for c in st.get("conditions") or []:
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            return f"DisruptionTarget: {c.get('reason') or ''} {c.get('message') or ''}".strip()
    if st.get("reason") in DISRUPTION_REASONS:
        return f"{st['reason']}: {st.get('message') or ''}".rstrip(": ")
    exits = container_exits(pod)
    if any(code == preempted_exit for _, code in exits):
        return f"the trainer stopped on SIGTERM (exit code {preempted_exit})"
    if (pod.get("metadata") or {}).get("deletionTimestamp") and any(c in (137, 143) for _, c in exits):
        return "killed while the pod was being deleted"
    return ""


def waiting_reason(pods: Iterable[Mapping]) -> str:
    """Why the first not-yet-running pod waits (unschedulable, image, ...), or ''."""
    for p in pods:
        st = p.get("status") or {}
        if st.get("phase") not in (None, "Pending"):
            continue
        name = (p.get("metadata") or {}).get("name", "?")
        for c in st.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                return f"pod {name}: {c.get('reason', 'Unschedulable')}: {c.get('message', '')}".strip()
        for cs in st.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting")
            if waiting and waiting.get("reason") not in (None, "ContainerCreating"):
                return f"pod {name}: {waiting.get('reason')}: {waiting.get('message', '')}".strip()
    return ""


def merged_progress(before: Mapping, read: Mapping | None, now: str) -> tuple[dict | None, str]:
    """status.progress with the numbers just read from the trainer (None: unchanged, no patch),
    and the FabricMismatch warning to post, once per distinct set of findings ('' if none)."""
    if not read:
        return None, ""
    merged = dict(before)
    merged.update({k: v for k, v in read.items() if v is not None})
    merged.pop("updateTime", None)
    out = None
    if {k: v for k, v in before.items() if k != "updateTime"} != merged:
        out = {**merged, "updateTime": now}
    fabric = read.get("fabricWarnings") or []
    warning = ""
    if fabric and fabric != before.get("fabricWarnings"):
        n = len(fabric) - 3
        more = f" (and {n} more in status.progress.fabricWarnings)" if n > 0 else ""
        warning = "; ".join(fabric[:3]) + more
    return out, warning
