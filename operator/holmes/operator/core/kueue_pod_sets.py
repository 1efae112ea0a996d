"""A HolmesJob's pods as Kueue's Workload asks for them (``spec.podSets``), pure: grouped by
island and requests (``PodGroup``, ``group_pods``: at most Kueue's 8), named as Kueue accepts
(DNS labels), each PodSet with its pods' full requests and placement rules. queueing.py builds
the Workload around them; placement.queued_pods says which pods the job would create."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import child_names, island_topology
from .capacity import CPU, MEMORY, PodShape, show

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
