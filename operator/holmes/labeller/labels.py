"""Sysfs facts -> the Holmes labels/annotations a node should carry, and the node patch that gets
it there without touching what an admin set (pure: no I/O).

What the labeller writes (the keys :mod:`holmes.plan.discovery` reads, named by ``NicMapping``):

===============================  ======  ==================================================
``holmes.dev/nic``               label   ``infiniband`` | ``roce`` | ``ethernet``
``holmes.dev/nic-gbps``          label   ACTIVE RDMA ports' rates summed; else the fastest up
                                         Ethernet netdev's speed
``holmes.dev/link-layer``        label   ``InfiniBand`` | ``Ethernet`` (RDMA nodes): lets
                                         discovery flag an admin's contradicting kind label
``holmes.dev/nic-hcas``          annot.  HCAs with an ACTIVE port, comma-separated (NCCL_IB_HCA)
``holmes.dev/socket-ifname``     annot.  fastest up hardware Ethernet netdev (NCCL_SOCKET_IFNAME)
``holmes.dev/nic-problem``       annot.  why no kind was written (InfiniBand and RoCE ports
                                         both ACTIVE): discovery reports the node unusable
===============================  ======  ==================================================

Ownership: the annotation ``holmes.dev/nic-labeller`` records, as JSON, the keys and values the
labeller wrote last. A Holmes key counts as the labeller's while its value is still what it
recorded (or it was deleted); a key present with any other value, or present without a record,
was set by someone else and is never changed or removed. So an admin overrides a labeller key
by setting a different value; to hand a key back, delete it (and its entry in the record, or
the whole record to reset). An admin who writes exactly the labeller's value cannot be told
apart and is treated as the labeller. The label form of ``nic-hcas``/``socket-ifname`` (which
discovery also reads) counts as the admin's choice of that key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from holmes.contract.names import ETHERNET, INFINIBAND, ROCE
from holmes.plan.discovery import NicMapping

from .sysfs import SysfsFacts, natural_key

RECORD_ANNOTATION = "holmes.dev/nic-labeller"
_LINK_KIND = {"infiniband": INFINIBAND, "ethernet": ROCE}
_LINK_TEXT = {INFINIBAND: "InfiniBand", ROCE: "Ethernet"}


@dataclass(frozen=True)
class Keys:
    """The names written, taken from discovery's mapping so both sides always agree."""

    nic: str
    gbps: str
    link_layer: str
    hcas: str
    socket_ifname: str
    problem: str

    @classmethod
    def from_mapping(cls, m: NicMapping | None = None) -> Keys:
        m = m or NicMapping()
        return cls(
            m.nic_label, m.gbps_label, m.link_layer_label, m.hcas_key, m.socket_ifname_key, m.problem_key
        )

    @property
    def labels(self) -> tuple[str, ...]:
        return (self.nic, self.gbps, self.link_layer)

    @property
    def annotations(self) -> tuple[str, ...]:
        return (self.hcas, self.socket_ifname, self.problem)


@dataclass(frozen=True)
class Desired:
    labels: dict[str, str]
    annotations: dict[str, str]
    problems: tuple[str, ...] = ()  # also written to the problem annotation
    notes: tuple[str, ...] = ()  # worth a log line, not a problem
    summary: str = ""


def _gbps_text(v: float) -> str:
    return f"{v:g}"


def desired_labels(facts: SysfsFacts, keys: Keys | None = None, *, socket_ifname: bool = True) -> Desired:
    """What this node's Holmes keys should say. Only ACTIVE RDMA ports count; InfiniBand and RoCE
    both ACTIVE is a problem, not a guess; no ACTIVE RDMA port means Ethernet."""
    k = keys or Keys.from_mapping()
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    notes: list[str] = []
    problems: list[str] = []

    active = [p for p in facts.ports if p.active]
    by_kind: dict[str, list] = {}
    for p in active:
        kind = _LINK_KIND.get((p.link_layer or "").strip().lower())
        if kind is None:
            notes.append(
                f"port {p.name} is ACTIVE but its link layer {p.link_layer!r} is neither "
                f"InfiniBand nor Ethernet: ignored"
            )
            continue
        by_kind.setdefault(kind, []).append(p)
    inactive = [p for p in facts.ports if not p.active]
    if inactive:
        notes.append(
            "ports not ACTIVE, ignored: "
            + ", ".join(f"{p.name} ({p.state or 'state unreadable'})" for p in inactive)
        )

    eth = sorted(
        (n for n in facts.netdevs if n.physical and n.up and n.ethernet),
        key=lambda n: (-(n.speed_mbps or 0), natural_key(n.name)),
    )
    if socket_ifname and eth:
        annotations[k.socket_ifname] = eth[0].name

    if len(by_kind) > 1:
        where = "; ".join(
            f"{_LINK_TEXT[kind]} on {', '.join(p.name for p in ps)}" for kind, ps in sorted(by_kind.items())
        )
        problems.append(
            f"InfiniBand and RoCE ports are both ACTIVE ({where}): one node must have one "
            f"NIC kind; set {k.nic} and {k.hcas} by hand, or disable the ports not to use"
        )
        summary = f"mixed link layers: {where}"
    elif by_kind:
        ((kind, ps),) = by_kind.items()
        labels[k.nic] = kind
        labels[k.link_layer] = _LINK_TEXT[kind]
        rates = [p.rate_gbps for p in ps if p.rate_gbps is not None]
        if len(rates) < len(ps):
            notes.append(
                "rate unreadable on "
                + ", ".join(p.name for p in ps if p.rate_gbps is None)
                + ": not counted in "
                + k.gbps
            )
        if rates:
            labels[k.gbps] = _gbps_text(sum(rates))
        hcas = sorted({p.hca for p in ps}, key=natural_key)
        annotations[k.hcas] = ",".join(hcas)
        summary = f"{kind}: {len(ps)} ACTIVE port(s) on {','.join(hcas)}, {labels.get(k.gbps, '?')} Gbit/s"
    else:
        labels[k.nic] = ETHERNET
        if eth and eth[0].speed_mbps:
            labels[k.gbps] = _gbps_text(eth[0].speed_mbps / 1000)
            summary = f"ethernet: {eth[0].name} up at {labels[k.gbps]} Gbit/s"
        else:
            notes.append(
                f"no up hardware Ethernet interface with a known speed: {k.gbps} left to discovery's default"
            )
            summary = f"ethernet: {eth[0].name if eth else 'no up hardware interface'}, speed unknown"
    if problems:
        annotations[k.problem] = "; ".join(problems)
    return Desired(labels, annotations, tuple(problems), tuple(notes), summary)


@dataclass(frozen=True)
class Plan:
    """The patch for the node (None: nothing to change) and what was kept for someone else."""

    patch: dict[str, Any] | None
    record: dict[str, dict[str, str]]
    kept: dict[str, str] = field(default_factory=dict)  # key -> the admin's value kept
    changes: dict[str, str | None] = field(default_factory=dict)  # key -> new value (None: removed)
    notes: tuple[str, ...] = ()


def read_record(annotations: Mapping[str, str]) -> tuple[dict[str, dict[str, str]], str | None]:
    text = annotations.get(RECORD_ANNOTATION)
    empty: dict[str, dict[str, str]] = {"labels": {}, "annotations": {}}
    if text is None:
        return empty, None
    try:
        rec = json.loads(text)
        out = {part: {str(a): str(b) for a, b in (rec.get(part) or {}).items()} for part in empty}
        return out, None
    except (ValueError, AttributeError, TypeError):
        return empty, (
            f"annotation {RECORD_ANNOTATION} is not the labeller's JSON record: every Holmes key "
            f"present is treated as set by hand"
        )


def plan_patch(node_metadata: Mapping[str, Any], desired: Desired, keys: Keys | None = None) -> Plan:
    """The strategic-merge patch of ``metadata`` that moves the node's Holmes keys to ``desired``,
    touching only keys the labeller owns (see the module docstring), with the node's
    ``resourceVersion`` so a concurrent edit makes the patch fail (409) instead of being undone."""
    k = keys or Keys.from_mapping()
    cur = {
        "labels": dict(node_metadata.get("labels") or {}),
        "annotations": dict(node_metadata.get("annotations") or {}),
    }
    record, bad_record = read_record(cur["annotations"])
    want = {"labels": desired.labels, "annotations": desired.annotations}
    managed = {"labels": k.labels, "annotations": k.annotations}
    # The label forms discovery also reads for these two annotations: present = an admin's choice.
    label_form = {k.hcas: cur["labels"].get(k.hcas), k.socket_ifname: cur["labels"].get(k.socket_ifname)}

    patch: dict[str, dict[str, str | None]] = {"labels": {}, "annotations": {}}
    new_record: dict[str, dict[str, str]] = {"labels": {}, "annotations": {}}
    kept: dict[str, str] = {}
    changes: dict[str, str | None] = {}
    for part in ("labels", "annotations"):
        for key in managed[part]:
            have = cur[part].get(key)
            mine = record[part].get(key)
            owned = mine is not None and (have is None or have == mine)
            if have is not None and not owned:
                kept[key] = have
                continue
            form = label_form.get(key)
            if form is not None:
                kept[f"{key} (label)"] = form
                if owned and have is not None:  # stop shadowing the admin's label with our annotation
                    patch[part][key] = None
                    changes[key] = None
                continue
            value = want[part].get(key)
            if value is not None:
                new_record[part][key] = value
                if have != value:
                    patch[part][key] = value
                    changes[key] = value
            elif have is not None:  # ours and no longer true: remove
                patch[part][key] = None
                changes[key] = None
    record_text = json.dumps(new_record, sort_keys=True, separators=(",", ":"))
    if cur["annotations"].get(RECORD_ANNOTATION) != record_text:
        patch["annotations"][RECORD_ANNOTATION] = record_text
    notes = (bad_record,) if bad_record else ()
    if not patch["labels"] and not patch["annotations"]:
        return Plan(None, new_record, kept, changes, notes)
    meta: dict[str, Any] = {part: v for part, v in patch.items() if v}
    if node_metadata.get("resourceVersion"):
        meta["resourceVersion"] = node_metadata["resourceVersion"]
    return Plan({"metadata": meta}, new_record, kept, changes, notes)
