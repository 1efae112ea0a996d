"""Member clusters: one HolmesJob across several Kubernetes control planes. Pure (no I/O): the
runtime (member_clusters.py, handlers.py) gathers each member's nodes and children from its own
informers; this module merges them into the one view the reconciler decides on, and splits the
decision back into the writes for each member.

- Members are registered in the hub (the cluster the operator runs in) as Secrets labelled
  ``holmes.dev/member-cluster: NAME`` holding a kubeconfig (docs/multicluster.md). While at
  least one is registered, every job the operator serves plans over the union of the members'
  nodes; with none, nothing here is used and a job is a single-cluster job.
- The union view (``union_nodes``): every member's nodes, each tagged with its member (the
  annotation ``holmes.dev/member`` in the view only) and with ``holmes.dev/cluster`` defaulting
  to the member's name. A node name found in two members is left out (names must be unique
  across members: the layout names nodes).
- Islands never span members (``island_labels``, ``within_members``: steps of placement.py): an
  island label value found in two members is qualified with the member's name, and a plan whose
  stage (so its data-parallel groups) spans members is refused; only pipeline point-to-point
  traffic crosses members.
- Children live in the member of their node: the pods of its ranks, and in each member hosting a
  rank the layout ConfigMap and the headless Service (``route``). No ownerReference crosses
  clusters: member children carry the hub job's uid (``holmes.dev/job-uid``) and member
  (``holmes.dev/member``) as annotations, and a finalizer on the hub's job (``cleanup``) deletes
  them in every member before the job goes.
- An unreachable member: its nodes leave the view; pods of the current attempt there count as
  lost (a disruption: the gang restarts on the capacity left, as the failure policy allows);
  writes to it are skipped and redone once it is back (stale pods are deleted then).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from holmes.contract import Layout, LayoutError
from holmes.contract.names import LABEL_CLUSTER
from holmes.plan import PlanError

from . import child_names
from .summary import pod_node_rank

LABEL_MEMBER_CLUSTER = "holmes.dev/member-cluster"  # on the hub's Secrets that register members
KUBECONFIG_KEY = "kubeconfig"  # the Secret's key holding the member's kubeconfig
ANN_MEMBER = "holmes.dev/member"  # on member children (and member nodes in the hub's view)
ANN_JOB_UID = "holmes.dev/job-uid"  # on member children: the hub job that owns them
FINALIZER = "holmes.dev/member-children"  # on a hub job while it may have children in members


@dataclass(frozen=True)
class MemberState:
    """What the hub knows of one registered member."""

    name: str
    reachable: bool
    message: str = ""  # why it is not reachable (the last error)


def member_of(obj: Mapping) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(ANN_MEMBER)


def tag(obj: Mapping, member: str, job_uid: str | None = None) -> dict:
    """A copy of ``obj`` annotated with its member (and the owning hub job's uid)."""
    out = copy.deepcopy(dict(obj))
    meta = out.setdefault("metadata", {})
    ann = dict(meta.get("annotations") or {})
    ann[ANN_MEMBER] = member
    if job_uid:
        ann[ANN_JOB_UID] = job_uid
    meta["annotations"] = ann
    return out


# ---- the union of the members' nodes ----------------------------------------------------------


def union_nodes(
    per_member: Mapping[str, Iterable[Mapping]], usable: Iterable[str]
) -> tuple[list[dict], list[str]]:
    """The nodes of the ``usable`` members (reachable, synced) as one list, tagged with their
    member, ``holmes.dev/cluster`` defaulting to the member's name; and the problems found (a
    node name in more than one member: left out everywhere)."""
    usable = set(usable)
    seen: dict[str, list[str]] = {}
    for m in sorted(per_member):
        for n in per_member[m]:
            seen.setdefault((n.get("metadata") or {}).get("name") or "", []).append(m)
    dup = {n: ms for n, ms in seen.items() if len(ms) > 1}
    problems = [
        f"node {n} is in members {', '.join(ms)}: left out (node names must be unique across members)"
        for n, ms in sorted(dup.items())
    ]
    out = []
    for m in sorted(per_member):
        if m not in usable:
            continue
        for n in per_member[m]:
            name = (n.get("metadata") or {}).get("name") or ""
            if name in dup:
                continue
            node = tag(n, m)
            labels = node["metadata"].setdefault("labels", {})
            labels.setdefault(LABEL_CLUSTER, m)
            out.append(node)
    return out, problems


def island_labels(nodes: Iterable[Mapping], cluster_label: str) -> list[Mapping]:
    """The nodes with ``cluster_label`` (the job's island label) made member-local: missing, it
    is the member's name; a value found in more than one member becomes ``<member>-<value>``."""
    nodes = list(nodes)
    members_of: dict[str, set[str]] = {}
    for n in nodes:
        v = ((n.get("metadata") or {}).get("labels") or {}).get(cluster_label)
        if v is not None:
            members_of.setdefault(v, set()).add(member_of(n) or "")
    out: list[Mapping] = []
    for n in nodes:
        m = member_of(n)
        labels = (n.get("metadata") or {}).get("labels") or {}
        v = labels.get(cluster_label)
        want = m if v is None else (f"{m}-{v}" if len(members_of.get(v, ())) > 1 else v)
        if m is None or want == v:
            out.append(n)
            continue
        n = copy.deepcopy(dict(n))
        n["metadata"].setdefault("labels", {})[cluster_label] = want
        out.append(n)
    return out


def spanning_stages(layout: Layout, node_member: Mapping[str, str]) -> list[str]:
    """Stages whose nodes are in more than one member, described ('' list when none)."""
    out = []
    for s in layout.stages:
        nodes = list(s.nodes or layout.stage_nodes(s.index))
        ms = sorted({node_member.get(n, "?") for n in nodes})
        if len(ms) > 1:
            out.append(f"stage {s.index} on {', '.join(nodes)} spans members {', '.join(ms)}")
    return out


def within_members(layout: Layout, nodes: Iterable[Mapping]) -> Layout:
    """``layout`` if each of its stages (so its data-parallel groups) stays in one member of
    ``nodes`` (the union view); else PlanError saying how to fix the spec."""
    where = {
        name: member_of(n) or "" for n in nodes if (name := (n.get("metadata") or {}).get("name")) is not None
    }
    bad = spanning_stages(layout, where)
    if bad:
        raise PlanError(
            "the best layout puts a data-parallel group across member clusters ("
            + "; ".join(bad)
            + "): only pipeline stages may cross members; choose nodes.count (or "
            "parallelism.pipeline) so that each stage fits in one member"
        )
    return layout


# ---- rendezvous -------------------------------------------------------------------------------


def pod_ip(pod: Mapping | None) -> str:
    return ((pod or {}).get("status") or {}).get("podIP") or ""


def rendezvous(
    states: Mapping[str, MemberState] | None, current_pods: Iterable[Mapping], nodes: int
) -> tuple[range | tuple[int, ...], str | None]:
    """The ranks to create now and the rendezvous address they get. One cluster (``states``
    None): all ranks, rank 0's DNS name. Across members (no shared DNS): rank 0 first, the
    others once rank 0's pod has an IP, which they get as MASTER_ADDR."""
    if states is None:
        return range(nodes), None
    rank0 = next((p for p in current_pods if pod_node_rank(p) == 0), None)
    if rank0 is None:
        return (0,), None
    ip = pod_ip(rank0)
    return (range(nodes), ip) if ip else ((), None)


def lost_with_unreachable(
    states: Mapping[str, MemberState] | None, current_pods: Iterable[Mapping], attempt: int
) -> str:
    """Why pods of the current attempt are lost with an unreachable member ('' if none are)."""
    if states is None:
        return ""
    down = {m: st for m, st in states.items() if not st.reachable}
    lost: dict[str, int] = {}
    for p in current_pods:
        m = member_of(p)
        if m in down or (m is not None and m not in states):
            lost[m] = lost.get(m, 0) + 1
    if not lost:
        return ""
    parts = []
    for m, k in sorted(lost.items()):
        why = down[m].message if m in down else "no longer registered"
        parts.append(
            f"member cluster {m} is unreachable ({why or 'no answer'}): {k} pod(s) of attempt "
            f"{attempt} there are lost"
        )
    return "; ".join(parts) + "; planning again on the members left"


# ---- routing a decision to the members --------------------------------------------------------


@dataclass
class MemberWrites:
    """What one reconcile writes in one member."""

    delete_pods: list[str] = field(default_factory=list)
    configmap: dict | None = None
    service: dict | None = None
    create_pods: list[dict] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.delete_pods or self.configmap or self.service or self.create_pods)


def layout_members(configmap: Mapping | None, node_member: Mapping[str, str]) -> list[str]:
    """Members hosting a node of the ConfigMap's layout."""
    if configmap is None:
        return []
    try:
        nodes = Layout.from_json(configmap["data"][child_names.LAYOUT_FILE]).nodes
    except (KeyError, TypeError, LayoutError, json.JSONDecodeError):
        return []
    return sorted({node_member[n] for n in nodes if n in node_member})


def route(
    decision: Any,
    job_uid: str,
    pod_member: Mapping[str, str],
    node_member: Mapping[str, str],
    current_members: Iterable[str] = (),
) -> dict[str, MemberWrites]:
    """Split a Decision's child writes by member: a pod goes to its node's member, deletes to
    where the pod is, the ConfigMap to every member hosting a rank of its layout, the Service to
    those and to ``current_members`` (members with pods of the attempt)."""
    out: dict[str, MemberWrites] = {}

    def of(m: str) -> MemberWrites:
        return out.setdefault(m, MemberWrites())

    for name in decision.delete_pods:
        m = pod_member.get(name)
        if m:
            of(m).delete_pods.append(name)
    hosts = set(current_members)
    if decision.configmap is not None:
        ms = layout_members(decision.configmap, node_member)
        hosts |= set(ms)
        for m in ms:
            of(m).configmap = tag(decision.configmap, m, job_uid)
    for pod in decision.create_pods:
        node = ((pod.get("metadata") or {}).get("annotations") or {}).get(child_names.ANN_NODE)
        m = node_member.get(node or "")
        if m:
            hosts.add(m)
            of(m).create_pods.append(tag(pod, m, job_uid))
    if decision.service is not None:
        for m in sorted(hosts):
            of(m).service = tag(decision.service, m, job_uid)
    return out


# ---- status -----------------------------------------------------------------------------------


def members_status(
    states: Mapping[str, MemberState], pods: Iterable[Mapping], nodes_of_attempt: Iterable[str] = ()
) -> dict[str, dict]:
    """status.members: per registered member, reachability and the attempt's pods by phase."""
    out: dict[str, dict] = {}
    for name, st in sorted(states.items()):
        entry: dict[str, Any] = {
            "reachable": st.reachable,
            "nodes": 0,
            "pending": 0,
            "running": 0,
            "succeeded": 0,
            "failed": 0,
        }
        if not st.reachable and st.message:
            entry["message"] = st.message[:300]
        out[name] = entry
    for p in pods:
        m = member_of(p)
        if m not in out:
            continue
        phase = (p.get("status") or {}).get("phase") or "Pending"
        key = phase.lower() if phase in ("Running", "Succeeded", "Failed") else "pending"
        out[m][key] += 1
        out[m]["nodes"] += 1
    return out


def job_status(
    states: Mapping[str, MemberState],
    nodes: Iterable[Mapping],
    pods: Iterable[Mapping],
    before: Mapping[str, Mapping],
) -> tuple[dict[str, dict], list[tuple[str, str, str]], tuple[bool, str, str]]:
    """A job's status.members, its Events (type, reason, message) when a member it uses becomes
    unreachable or comes back, and its MembersReachable condition (status, reason, message).
    ``pods``: the attempt's pods, those just decided included (placed by their node)."""
    by_node = {n["metadata"]["name"]: member_of(n) for n in nodes}
    tagged = []
    for p in pods:
        m = member_of(p) or by_node.get(
            ((p.get("metadata") or {}).get("annotations") or {}).get(child_names.ANN_NODE) or ""
        )
        tagged.append(tag(p, m) if m else p)
    st = members_status(states, tagged)
    events = []
    for m, entry in st.items():
        was = (before.get(m) or {}).get("reachable")
        if was is not False and not entry["reachable"] and (was is True or entry["nodes"]):
            events.append(
                (
                    "Warning",
                    "MemberUnreachable",
                    f"member cluster {m} is unreachable: {entry.get('message') or 'no answer'}",
                )
            )
        elif was is False and entry["reachable"]:
            events.append(("Normal", "MemberReachable", f"member cluster {m} is reachable again"))
    down = [m for m, e in st.items() if not e["reachable"]]
    if down:
        msg = "; ".join(f"{m}: {st[m].get('message') or 'no answer'}" for m in down)
        value = (False, "MemberUnreachable", f"unreachable member cluster(s): {msg}")
    elif st:
        value = (True, "AllMembersReachable", f"{len(st)} member cluster(s): {', '.join(st)}")
    else:
        value = (False, "NoMembers", "no member cluster is registered")
    return st, events, value


# ---- deleting a job: its children in every member ---------------------------------------------


@dataclass
class Cleanup:
    """What deleting a hub job still needs: per member, the children to delete (kind, name)."""

    deletes: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)  # why the finalizer stays, per member
    done: bool = False  # every registered member is clean: remove the finalizer

    def message(self) -> str:
        return "; ".join(self.waiting)


def owned_children(objs: Iterable[Mapping], job_uid: str) -> list[Mapping]:
    return [
        o for o in objs if ((o.get("metadata") or {}).get("annotations") or {}).get(ANN_JOB_UID) == job_uid
    ]


def cleanup(
    job_uid: str,
    states: Mapping[str, MemberState],
    children: Mapping[str, Iterable[tuple[str, Mapping]]],
) -> Cleanup:
    """The hub job ``job_uid`` is being deleted. ``children``: per member, (kind, object) of the
    job's children its caches hold. Children not already being deleted are deleted; the job
    waits while any remain, and for every unreachable member (its children are not known).
    Members no longer registered are not waited for: deleting a member's Secret is how a job
    whose member is gone for good is let go."""
    out = Cleanup()
    for m in sorted(states):
        st = states[m]
        mine = [(k, o) for k, o in children.get(m, ()) if o in owned_children([o], job_uid)]
        if not st.reachable:
            out.waiting.append(
                f"member {m} is unreachable ({st.message or 'no answer'}): its children cannot be "
                f"deleted; when it is gone for good, delete its Secret (label {LABEL_MEMBER_CLUSTER}={m})"
            )
            continue
        todo = [(k, o["metadata"]["name"]) for k, o in mine if not o["metadata"].get("deletionTimestamp")]
        if todo:
            out.deletes[m] = todo
        if mine:
            out.waiting.append(f"member {m}: {len(mine)} child object(s) still there")
    out.done = not out.waiting
    return out
