"""A HolmesJob's pods as Kueue's Workload asks for them (``spec.podSets``), pure: grouped by
island and requests (``PodGroup``, ``group_pods``: at most Kueue's 8), named as Kueue accepts
(DNS labels), each PodSet with its pods' full requests and placement rules. queueing.py builds
the Workload around them; placement.queued_pods says which pods the job would create."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import child_names, island_topology
from .capacity import CPU, MEMORY, PodShape, pod_requests, show

POD_SET = "workers"  # the PodSet of a job whose pods are one group


def quantity_text(resource: str, amount: float) -> str:
    if resource in (CPU, MEMORY):
        return show(resource, amount) if resource == CPU else str(int(amount))
    return str(int(amount)) if amount == int(amount) else str(amount)


# Kueue's limit on a Workload's spec.podSets (apis/kueue/v1beta2 workload_types.go, MaxItems=8)
MAX_POD_SETS = 8
ANN_POD_SETS = "holmes.dev/pod-sets-of"  # the digest of what the Workload's pod sets were built from


@dataclass(frozen=True)
class PodGroup:
    """Pods of the job alike for Kueue: on nodes of one cluster (``island``, the value of the
    job's island label: "" unknown) asking for the same ``requests`` (one pod's, every resource:
    the template's, the GPUs, its route's RDMA devices or VFs). Under Kueue's TAS ``island`` is
    the value of Holmes' island level and ``cluster`` of its cluster level (island_topology)."""

    island: str
    requests: Mapping[str, float]
    count: int = 1
    cluster: str = ""

    @property
    def key(self) -> tuple:
        return (self.island, tuple(sorted((k, v) for k, v in self.requests.items() if v)))


def _merged(groups: Iterable[PodGroup], key: Callable[[PodGroup], Any]) -> list[PodGroup]:
    """Groups of one ``key`` as one, each resource at the most any of its pods asks (the quota
    is never under-asked)."""
    out: dict[Any, PodGroup] = {}
    for g in groups:
        have = out.get(key(g))
        if have is None:
            out[key(g)] = g
            continue
        reqs = {
            r: max(have.requests.get(r, 0.0), g.requests.get(r, 0.0)) for r in {*have.requests, *g.requests}
        }
        island = have.island if have.island == g.island else ""
        cluster = have.cluster if have.cluster == g.cluster else ""
        out[key(g)] = PodGroup(island, reqs, have.count + g.count, cluster)
    return sorted(out.values(), key=lambda g: g.key)


def group_pods(pods: Iterable[PodGroup]) -> list[PodGroup]:
    """The job's pods (a PodGroup each) as at most MAX_POD_SETS groups: pods of one island and
    the same requests together; more groups than Kueue takes: each island's merged (each
    resource at the most one of them asks); more islands than that: each cluster's (under TAS,
    where a group knows its cluster: the PodSet then requires one cluster); still more: one
    group of every pod, with no island."""
    pods = list(pods)
    groups: list[PodGroup] = []
    for key in (lambda g: g.key, lambda g: g.island, lambda g: g.cluster, lambda g: ""):
        groups = _merged(pods, key)
        if len(groups) <= MAX_POD_SETS:
            break
    return groups


def _dns_label(text: str) -> str:
    out = "".join(c if c.isalnum() and c.isascii() else "-" for c in text.lower()).strip("-")
    while "--" in out:
        out = out.replace("--", "-")
    return out[:50].strip("-")


def pod_set_names(groups: list[PodGroup]) -> list[str]:
    """Each group's PodSet name (a DNS label, as Kueue's PodSetReference): ``workers`` for a job
    of one group, else its island's name, numbered when the island has several groups."""
    if len(groups) == 1:
        return [POD_SET]
    names: list[str] = []
    for g in groups:
        base = _dns_label(g.island) or _dns_label(g.cluster) or POD_SET
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}-{n}"
        names.append(name)
    return names


def pod_sets(
    groups: list[PodGroup], template: Mapping | None, island_label: str, topology: bool = False
) -> list[dict]:
    """The Workload's pod sets, one per group (group_pods): ``count`` pods asking for its
    requests, with the template's placement rules. With several groups each PodSet selects its
    island's nodes (``island_label``), so the flavor Kueue assigns it is one its pods can use.
    ``topology``: the job's flavor has a Topology (Kueue's TAS) and each group's island is the
    value of Holmes' island level (island_topology.LABEL_ISLAND = ``island_label``): every
    PodSet with an island selects it and requires one domain of that level (one merged across
    a cluster's islands requires the cluster level), so Kueue admits it
    on nodes it picks inside the island Holmes sized the stage for; and selects its cluster
    (island_topology.LABEL_CLUSTER), the flavors' node label: Kueue matches a PodSet to a
    flavor by the flavors' label keys only, and checks the topology after it chose one."""
    tspec = (template or {}).get("spec")
    if not isinstance(tspec, Mapping):
        tspec = {}
    out = []
    for g, name in zip(groups, pod_set_names(groups)):
        requests = {k: quantity_text(k, v) for k, v in sorted(g.requests.items()) if v}
        pod_spec: dict[str, Any] = {
            "containers": [{"name": child_names.TRAINER_CONTAINER, "resources": {"requests": requests}}],
            "restartPolicy": "Never",
        }
        for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
            if tspec.get(key):
                pod_spec[key] = tspec[key]
        if (len(groups) > 1 or topology) and g.island:
            pod_spec["nodeSelector"] = {**(tspec.get("nodeSelector") or {}), island_label: g.island}
        if topology and g.cluster:
            pod_spec["nodeSelector"] = {
                **(pod_spec.get("nodeSelector") or {}),
                island_topology.LABEL_CLUSTER: g.cluster,
            }
        ps: dict[str, Any] = {"name": name, "count": g.count, "template": {"spec": pod_spec}}
        if topology and (g.island or g.cluster):
            # a group merged across islands (more than Kueue's 8 PodSets) stays in one cluster
            ps["topologyRequest"] = {"required": island_label if g.island else island_topology.LABEL_CLUSTER}
        out.append(ps)
    return out


def one_pod_set(count: int, shape: PodShape, template: Mapping | None) -> list[dict]:
    """The pod sets of a job whose pods are not planned yet (nor can be): one shape, ``count``
    pods (and what Workloads written before the pod sets per group ask for)."""
    return pod_sets([PodGroup("", dict(shape.requests), count)], template, "")


def outside_admission(
    workload: Mapping,
    flavors: Mapping[str, Mapping],
    pods: Iterable[tuple[str, Mapping, Mapping[str, float]]],
) -> str:
    """Why launching ``pods`` (each: its node's name and labels, what one pod asks there) would
    use quota Kueue did not reserve ('' when it would not). Kueue admitted the Workload per
    PodSet: ``count`` pods asking the PodSet's requests on the flavors it assigned, and counts
    its quota so. A pod is within the admission when a PodSet with room left has the node (the
    PodSet's node selector and its flavors' node labels) and asks at least what the pod asks
    of each resource the PodSet names; a plan at launch that splits the pods across islands
    otherwise than the pod sets were built from (free capacity differs from the nodes the pod
    sets were planned on) is not. Fewer pods than admitted (an elastic job's smaller size) are
    within it. A device resource the PodSet does not name (a one-PodSet job, whose flavor Kueue
    chose, on nodes of another NIC than planned) is not held against it: the pod sets were
    planned before the flavor was known, and planning them again would give the same."""
    adm = (workload.get("status") or {}).get("admission") or {}
    count_of = {a.get("name"): a.get("count") for a in adm.get("podSetAssignments") or []}
    flavors_of = {
        a.get("name"): set((a.get("flavors") or {}).values()) for a in adm.get("podSetAssignments") or []
    }
    rooms: list[list] = []  # [name, labels, requests, room left, count admitted]
    for ps in (workload.get("spec") or {}).get("podSets") or []:
        name, spec = ps.get("name"), (ps.get("template") or {}).get("spec") or {}
        labels = dict(spec.get("nodeSelector") or {})
        for f in sorted(flavors_of.get(name) or ()):
            labels.update(((flavors.get(f) or {}).get("spec") or {}).get("nodeLabels") or {})
        count = count_of.get(name)
        n = int(ps.get("count") or 0 if count is None else count)
        rooms.append([name, labels, pod_requests(spec), n, n])
    # the tightest PodSet first (fewest resources), so a plain pod leaves a richer PodSet to a
    # pod that needs it
    rooms.sort(key=lambda r: (len([v for v in r[2].values() if v]), r[0] or ""))
    outside: list[str] = []
    for node, on, asks in sorted(pods, key=lambda p: -len([v for v in p[2].values() if v])):
        for room in rooms:
            if (
                room[3] > 0
                and all(on.get(k) == v for k, v in room[1].items())
                and all(room[2][k] >= v for k, v in asks.items() if v and k in room[2])
            ):
                room[3] -= 1
                break
        else:
            outside.append(node)
    if not outside:
        return ""
    admitted = "; ".join(
        f"{r[0]}: {r[4]} pod(s)"
        + (f" on {','.join(f'{k}={v}' for k, v in sorted(r[1].items()))}" if r[1] else "")
        for r in sorted(rooms, key=lambda r: r[0] or "")
    )
    shown = ", ".join(sorted(set(outside))[:5])
    return (
        f"the plan on free capacity puts {len(outside)} pod(s) (on node(s) {shown}) outside the pod "
        f"sets Kueue admitted ({admitted}): Kueue reserved quota per PodSet and flavor, and "
        "launching them would use quota it did not reserve"
    )
