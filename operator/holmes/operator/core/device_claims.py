"""What DRA ResourceClaims (``resource.k8s.io/v1``) hold on each node, pure: the GPUs any
workload was allocated through a claim, Holmes' own pods' included.

A claim's devices are taken once the scheduler wrote ``status.allocation``: ``devices.results[]``
(``driver``, ``pool``, ``device``, ``request``; ``adminAccess: true`` shares a device without
taking it) and ``nodeSelector``, which for a node's own devices is one term with ``matchFields``
``metadata.name In [node]``. ``status.reservedFor[]`` (``resource``, ``name``, ``uid``) names the
pods that use it: the scheduler writes both in one update, and the claim stays allocated until
the resource claim controller frees it after its last consumer ended. So the allocation, not
a pod's requests, is what the scheduler counts, and what capacity counts here:

- a device is a GPU when the node's ResourceSlices list it as a whole GPU of the cost model's
  ``draGpuDriver`` (holmes.plan.dra.whole_gpus: what discovery counts, so taken and total
  GPUs are counted alike); other drivers' devices (NICs) and MIG slices count nothing;
- a device allocated to several claims (shared devices) counts once;
- a pod a claim is reserved for has its GPUs counted by the claim: the ``holmes.dev/claim-gpus``
  note on Holmes' DRA pods counts only while their claim is not allocated yet
  (capacity.Ledger.of).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from holmes.plan import dra

CLAIMS = "resourceclaims"  # the resource, in dra.API_VERSION
NODE_NAME_FIELD = "metadata.name"

Device = tuple[str, str, str]  # driver, pool, device: how an allocation names a device


@dataclass(frozen=True)
class ClaimHold:
    """What one allocated claim holds: ``gpus`` whole GPUs on ``node`` (None: its devices are
    not one node's own), for the pods (uids) it is reserved for."""

    claim: str  # namespace/name
    node: str | None
    gpus: int
    consumers: frozenset[str]


def allocated_node(allocation: Mapping) -> str | None:
    """The one node an allocation's ``nodeSelector`` names (as the scheduler writes it for a
    node's own devices); None for devices reachable from several nodes or from any."""
    sel = allocation.get("nodeSelector")
    terms = sel.get("nodeSelectorTerms") if isinstance(sel, Mapping) else None
    if not isinstance(terms, list) or len(terms) != 1 or not isinstance(terms[0], Mapping):
        return None
    term = terms[0]
    fields = term.get("matchFields") or []
    if term.get("matchExpressions") or not isinstance(fields, list) or len(fields) != 1:
        return None
    f = fields[0] if isinstance(fields[0], Mapping) else {}
    values = f.get("values") or []
    if f.get("key") == NODE_NAME_FIELD and f.get("operator") == "In" and len(values) == 1:
        return str(values[0])
    return None


def _allocation(claim: Mapping) -> object:
    return (claim.get("status") or {}).get("allocation")


def _results(allocation: Mapping) -> list[Mapping]:
    devices = allocation.get("devices")
    results = devices.get("results") if isinstance(devices, Mapping) else None
    return [r for r in results or () if isinstance(r, Mapping)]


def holds(claims: Iterable[Mapping], nodes: Iterable[Mapping], gpu_driver: str) -> list[ClaimHold]:
    """What each allocated claim holds on ``nodes`` (with their ResourceSlices joined on:
    holmes.plan.dra.join), whose whole GPUs of ``gpu_driver`` are the devices counted. Claims
    not allocated hold nothing and are left out."""
    allocated = [(c, a) for c in claims if isinstance(a := _allocation(c), Mapping)]
    if not allocated:
        return []
    by_name = {str((n.get("metadata") or {}).get("name")): n for n in nodes}
    gpus: dict[str, frozenset[Device]] = {}  # only the nodes claims name: slices are read per node

    def whole_gpus(node: str) -> frozenset[Device]:
        if node not in gpus:
            gpus[node] = dra.whole_gpus(by_name[node], gpu_driver) if node in by_name else frozenset()
        return gpus[node]

    out = []
    counted: set[tuple[str, Device]] = set()  # a shared device counts once
    for c, allocation in sorted(allocated, key=lambda ca: _key(ca[0])):
        node = allocated_node(allocation)
        on_node = whole_gpus(node) if node else frozenset()
        n = 0
        for r in _results(allocation):
            device = (str(r.get("driver") or ""), str(r.get("pool") or ""), str(r.get("device") or ""))
            if r.get("adminAccess") is True or device not in on_node or (str(node), device) in counted:
                continue
            counted.add((str(node), device))
            n += 1
        out.append(ClaimHold("/".join(_key(c)), node, n, consumers(c)))
    return out


def consumers(claim: Mapping) -> frozenset[str]:
    """The uids of the pods the claim is reserved for."""
    reserved = (claim.get("status") or {}).get("reservedFor") or ()
    return frozenset(
        str(r["uid"])
        for r in reserved
        if isinstance(r, Mapping) and r.get("resource") == "pods" and not r.get("apiGroup") and r.get("uid")
    )


def _key(c: Mapping) -> tuple[str, str]:
    meta = c.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def slim_claim(claim: Mapping) -> dict:
    """What capacity needs of a claim (the cluster-wide claim cache keeps only this)."""
    meta, st = claim.get("metadata") or {}, claim.get("status") or {}
    allocation = st.get("allocation")
    slim: dict = {
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion")},
        "status": {
            "reservedFor": [
                {k: r.get(k) for k in ("apiGroup", "resource", "name", "uid")}
                for r in st.get("reservedFor") or ()
                if isinstance(r, Mapping)
            ]
        },
    }
    if isinstance(allocation, Mapping):
        slim["status"]["allocation"] = {
            "devices": {
                "results": [
                    {k: r.get(k) for k in ("driver", "pool", "device", "request", "adminAccess")}
                    for r in _results(allocation)
                ]
            },
            "nodeSelector": allocation.get("nodeSelector"),
        }
    return slim


def reserved_pods(held: Sequence[ClaimHold]) -> frozenset[str]:
    """The pods (uids) whose devices allocated claims count."""
    return frozenset(uid for h in held for uid in h.consumers)
