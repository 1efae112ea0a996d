"""A HolmesJob for people, as `kubectl holmes status` and `why` print it (pure: from the job, its
events and its pods as the API returns them, and the time now).

status: phase, layout (stages with islands, GPU types, networks, nodes), progress with the
percentage and estimated remaining time, and each stage's measured speed next to the plan's.
why: what keeps the job from running or from making progress (the conditions, the newest
Warning events, the pods that do not run, a trainer that stopped reporting), with the fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

# What to do about a waiting or stalled job, by its condition's reason (the message says which
# nodes, fields or quotas; this says where to act).
FIXES = {
    "WaitingForNodes": (
        "add or repair nodes of the kinds the message names, or lower spec.nodes.count (or set "
        "spec.nodes.minCount to start smaller and grow back)"
    ),
    "WaitingForCapacity": (
        "other workloads hold the nodes it needs: wait for them, lower spec.nodes.count, or give "
        "the job a higher spec.runPolicy.priority"
    ),
    "WaitingForAdmission": (
        "Kueue has not admitted its Workload: kubectl describe workload -n NAMESPACE, and check "
        "the ClusterQueue's quota"
    ),
    "WaitingForQuota": (
        "a ResourceQuota of the namespace has no room for the whole gang: kubectl describe "
        "resourcequota QUOTA -n NAMESPACE; wait for it to free, free it, or shrink the job"
    ),
    "WaitingForPodGroup": (
        "Volcano has not admitted its PodGroup to the queue: kubectl describe podgroup NAME -n "
        "NAMESPACE, and check the Volcano queue's capacity"
    ),
    "VolcanoNotInstalled": "install Volcano, then restart the operator (or remove schedulerName)",
    "InvalidSpec": "edit the spec as the message says: kubectl edit holmesjob NAME -n NAMESPACE",
    "InvalidName": (
        "recreate the job under a shorter name (pod names carry it; the CRD's rules refuse such a "
        "name at apply time unless it was installed without them)"
    ),
    "WaitingForPodsToStop": "nothing: the previous attempt's pods are stopping",
    "WaitingForRendezvous": "nothing: rank 0's pod gets its IP, then the others start",
    "BackoffLimitExceeded": (
        "read the failed pod's log (kubectl logs POD --previous), fix the cause, then raise "
        "spec.runPolicy.backoffLimit or recreate the job"
    ),
    "TemplateRejected": (
        "the API server refused a dry run of the job's pod (an unknown or invalid field, the "
        "namespace's Pod Security level): fix spec.template as the message says"
    ),
    "ChildRejected": (
        "the API server refused a pod, ConfigMap or Service (quota, admission): fix what the message "
        "names; the operator retries"
    ),
}
STALE_AFTER_SECONDS = 300.0  # a running trainer that reported nothing new for this long: say so
STALE_ITERATIONS = 20  # ... or for this many of its own iteration times, when longer


def _parse(s: Any) -> datetime | None:
    if not isinstance(s, str):
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%fZ"):
        try:
            return datetime.strptime(s, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return None


def ago(s: Any, now: datetime) -> str:
    t = _parse(s)
    if t is None:
        return "?"
    secs = int((now - t).total_seconds())
    if secs < 120:
        return f"{secs}s ago"
    if secs < 7200:
        return f"{secs // 60}m ago"
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m ago"


def _name(job: Mapping[str, Any]) -> str:
    meta = job.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def _num(v: Any, fmt: str = ".3g") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def layout_lines(status: Mapping[str, Any]) -> list[str]:
    lay = status.get("layout") or {}
    if not lay.get("stages"):
        return ["layout: not placed yet"]
    est = lay.get("estimate") or {}
    head = (
        f"layout: pipeline x data x tensor {lay.get('shape', '?')} on {lay.get('nodes', '?')} nodes "
        f"(ConfigMap {lay.get('configMap', '?')})"
    )
    if isinstance(est.get("iterationSeconds"), (int, float)):
        head += f"; planned {_num(est['iterationSeconds'])} s/iteration"
    dp = {g.get("stage"): g for g in lay.get("dpGroups") or []}
    rows = [["stage", "layers", "island", "gpu", "dp net", "nodes"]]
    for s in lay["stages"]:
        span = s.get("layers") or ["?", "?"]
        nodes = s.get("nodes") or []
        rows.append(
            [
                str(s.get("index", "?")),
                f"[{span[0]},{span[1]})",
                str(s.get("island", "?")),
                str(s.get("gpu", "-")),
                str((dp.get(s.get("index")) or {}).get("net", "?")),
                ",".join(nodes) if len(nodes) <= 4 else f"{nodes[0]}..{nodes[-1]} ({len(nodes)})",
            ]
        )
    return [head, *_table(rows)]


def progress_lines(status: Mapping[str, Any], now: datetime) -> list[str]:
    p = status.get("progress") or {}
    if not isinstance(p.get("iteration"), int):
        return ["progress: no iteration reported yet"]
    line = f"progress: iteration {p['iteration']}"
    if isinstance(p.get("iterations"), int):
        line += f"/{p['iterations']} ({p.get('percentComplete', '?')}%)"
    if isinstance(p.get("iterationsPerSecond"), (int, float)):
        line += f", {_num(p['iterationsPerSecond'])} iterations/s"
    if p.get("estimatedRemaining") is not None:
        line += f", ETA {p['estimatedRemaining']}"
    line += f"; loss {_num(p.get('loss'), '.4g')}, {_num(p.get('tflopsPerGpu'), '.4g')} TFLOP/s per GPU"
    if p.get("updateTime"):
        line += f" (read {ago(p['updateTime'], now)})"
    out = [line]
    stages = p.get("stages") or []
    if stages:
        out.append("per stage, seconds per iteration, measured (planned):")
        rows = [["stage", "layers", "compute", "p2p wait", "DP exposed", "s/layer/micro-batch"]]
        for s in stages:
            rows.append(
                [
                    str(s.get("stage", "?")),
                    str(s.get("layers", "?")),
                    f"{_num(s.get('computeSeconds'))} ({_num(s.get('plannedComputeSeconds'))})",
                    f"{_num(s.get('p2pWaitSeconds'))} ({_num(s.get('plannedP2pSeconds'))})",
                    f"{_num(s.get('dpExposedSeconds'))} ({_num(s.get('plannedDpExposedSeconds'))})",
                    _num(s.get("layerSeconds")),
                ]
            )
        out += _table(rows)
    for w in p.get("fabricWarnings") or []:
        out.append(f"fabric warning: {w}")
    return out


def status_lines(job: Mapping[str, Any], now: datetime) -> list[str]:
    st = job.get("status") or {}
    head = f"HolmesJob {_name(job)}: {st.get('phase', 'not yet seen by the operator')}"
    if st.get("attempt"):
        head += f" (attempt {st['attempt']}, {st.get('restarts', 0)} restarts)"
    out = [head]
    ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready and ready.get("message"):
        out.append(f"  {ready.get('reason', '')}: {ready['message']}")
    return out + layout_lines(st) + progress_lines(st, now)


def list_lines(jobs: Sequence[Mapping[str, Any]], now: datetime, all_namespaces: bool) -> list[str]:
    """One row per job, as `kubectl get hj` prints them (with NAMESPACE under -A)."""
    if not jobs:
        return ["no HolmesJobs"]
    rows = [["NAMESPACE"] * all_namespaces + ["NAME", "PHASE", "DONE%", "ETA", "AGE"]]
    for job in jobs:
        meta, st = job.get("metadata") or {}, job.get("status") or {}
        p = st.get("progress") or {}
        done = p.get("percentComplete")
        age = ago(meta.get("creationTimestamp"), now).removesuffix(" ago")
        rows.append(
            [meta.get("namespace", "")] * all_namespaces
            + [
                meta.get("name", "?"),
                st.get("phase") or "-",
                _num(done, ".0f"),
                p.get("estimatedRemaining") or "-",
                age,
            ]
        )
    return _table(rows, indent="")


def _stalled_trainer(st: Mapping[str, Any], now: datetime) -> str:
    """Why a Running job's trainer looks stuck ('' when it does not)."""
    p = st.get("progress") or {}
    last = _parse(p.get("updateTime"))
    if st.get("phase") != "Running" or last is None:
        return ""
    quiet = (now - last).total_seconds()
    per = p.get("iterationSeconds")
    limit = max(STALE_AFTER_SECONDS, STALE_ITERATIONS * per if isinstance(per, (int, float)) else 0.0)
    if quiet < limit:
        return ""
    return (
        f"no new iteration reported for {int(quiet)}s (last: iteration {p.get('iteration', '?')}); the "
        "trainer may hang in a collective or on a slow link: read rank 0's log (kubectl logs "
        f"{(job_pod_prefix(st))}0) and the other ranks'"
    )


def job_pod_prefix(st: Mapping[str, Any]) -> str:
    cm = str((st.get("layout") or {}).get("configMap") or "JOB-layout")
    return f"{cm.removesuffix('-layout')}-{st.get('attempt', 'ATTEMPT')}-"


def why_lines(
    job: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    now: datetime,
) -> list[str]:
    st = job.get("status") or {}
    phase = st.get("phase")
    conds = {c.get("type"): c for c in st.get("conditions") or []}
    out = [f"HolmesJob {_name(job)} is {phase or 'not yet seen by the operator (is it running?)'}"]
    problems = 0
    for type_ in ("Stalled", "Reconciling", "Failed", "Suspended", "MembersReachable", "Replanned"):
        c = conds.get(type_)
        bad = type_ == "MembersReachable" and c is not None and c.get("status") == "False"
        if c is None or (c.get("status") != "True" and not bad) or type_ == "Replanned":
            continue
        problems += 1
        reason = str(c.get("reason", ""))
        out.append(f"{type_}: {reason} (since {ago(c.get('lastTransitionTime'), now)})")
        if c.get("message"):
            out.append(f"  {c['message']}")
        if reason in FIXES:
            out.append(f"  fix: {FIXES[reason]}")
    if st.get("waitingSince"):
        out.append(f"waiting for nodes since {ago(st['waitingSince'], now)}")
    if st.get("nextAttemptTime"):
        out.append(f"next attempt at {st['nextAttemptTime']} (restart back-off)")
    stuck = _stalled_trainer(st, now)
    if stuck:
        problems += 1
        out.append(stuck)
    waiting = [p for p in pods if (p.get("status") or {}).get("phase") in (None, "Pending")]
    for p in waiting[:5]:
        out.append(f"pod {(p.get('metadata') or {}).get('name')}: {_pod_wait(p)}")
    warnings = [e for e in events if e.get("type") == "Warning"]
    if warnings:
        out.append("recent Warning events (newest last):")
        for e in sorted(warnings, key=lambda e: str(e.get("lastTimestamp") or ""))[-5:]:
            count = f" x{e['count']}" if (e.get("count") or 1) > 1 else ""
            when = ago(e.get("lastTimestamp"), now)
            out.append(f"  {e.get('reason', '?')}{count} ({when}): {e.get('message', '')}")
    if not problems and not warnings and not waiting:
        out.append("nothing keeps it waiting: " + progress_lines(st, now)[0])
    return out


def _pod_wait(pod: Mapping[str, Any]) -> str:
    st = pod.get("status") or {}
    for c in st.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"{c.get('reason', 'Unschedulable')}: {c.get('message', '')}"
    for cs in st.get("containerStatuses") or []:
        w = (cs.get("state") or {}).get("waiting")
        if w:
            return f"{w.get('reason', 'Waiting')}: {w.get('message', '')}".rstrip(": ")
    return "Pending"
