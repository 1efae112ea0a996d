"""Sysfs facts -> the Holmes labels/annotations a node should carry, and the node patch that gets
it there without touching what an admin set (pure: no I/O).

What the labeller writes (the keys :mod:`holmes.plan.discovery` reads, named by ``NicMapping``):

===============================  ======  ==================================================
``holmes.dev/nic``               label   ``infiniband`` | ``roce`` | ``ethernet``
``holmes.dev/nic-gbps``          label   the compute rails' rates summed; else the fastest up
                                         Ethernet netdev's speed
``holmes.dev/link-layer``        label   ``InfiniBand`` | ``Ethernet`` (RDMA nodes): lets
                                         discovery flag an admin's contradicting kind label
``holmes.dev/nic-hcas``          annot.  the compute rails' HCAs, comma-separated (the pods'
                                         HOLMES_HOST_HCAS hint)
``holmes.dev/nic-other``         annot.  the RDMA ports that are not rails, each with why
``holmes.dev/socket-ifname``     annot.  fastest up hardware Ethernet netdev (a host fact: pods
                                         resolve their own interface);
                                         the default route's interface instead where the
                                         fastest is a compute rail's netdev
``holmes.dev/nic-problem``       annot.  why no kind was written (the rails disagree on the
                                         link layer, or the admin's selector names no
                                         ACTIVE port): discovery reports the node unusable
===============================  ======  ==================================================

The rails are chosen by :func:`.rails.choose_rails` (an admin's selector, else the HCAs near the
GPUs on PCIe or NUMA, else the fastest ports' majority link layer); the NIC kind is the rails'
link layer, and the other ports neither set it nor count in the speed. The selector is the node
annotation ``holmes.dev/nic-rails`` (set by an admin, never written by the labeller), else the
labeller's ``--rails``.

Ownership: the annotation ``holmes.dev/nic-labeller`` records, as JSON, the keys and values the
labeller wrote last. A Holmes key counts as the labeller's while its value is still what it
recorded (or it was deleted); a key present with any other value, or present without a record,
was set by someone else and is never changed or removed. So an admin overrides a labeller key
by setting a different value; to hand a key back, delete it (and its entry in the record, or
the whole record to reset). An admin who writes exactly the labeller's value cannot be told
apart and is treated as the labeller. The label form of ``nic-hcas`` (which discovery also
reads) or of ``socket-ifname`` counts as the admin's choice of that key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from holmes.contract.names import ANN_SOCKET_IFNAME, ETHERNET, INFINIBAND, ROCE
from holmes.plan.discovery import NicMapping

from .rails import RailSelector, choose_rails, link_of
from .sysfs import NetDev, RdmaPort, SysfsFacts, natural_key

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
    problem: str
    # for people (kubectl describe node): Holmes does not read it, pods resolve their own interface
    socket_ifname: str = ANN_SOCKET_IFNAME
    other: str = "holmes.dev/nic-other"  # written: ports that are not rails, and why
    rails: str = "holmes.dev/nic-rails"  # read only: an admin's rail selector for this node

    @classmethod
    def from_mapping(cls, m: NicMapping | None = None) -> Keys:
        m = m or NicMapping()
        return cls(m.nic_label, m.gbps_label, m.link_layer_label, m.hcas_key, m.problem_key)

    @property
    def labels(self) -> tuple[str, ...]:
        return (self.nic, self.gbps, self.link_layer)

    @property
    def annotations(self) -> tuple[str, ...]:
        return (self.hcas, self.socket_ifname, self.problem, self.other)


def rail_selector(
    node_annotations: Mapping[str, str], flag: str | None, keys: Keys | None = None
) -> RailSelector | None:
    """The admin's rail selector for this node: its annotation, else the labeller's ``--rails``."""
    k = keys or Keys.from_mapping()
    return RailSelector.parse(node_annotations.get(k.rails), f"node annotation {k.rails}") or (
        RailSelector.parse(flag, "labeller flag --rails")
    )


@dataclass(frozen=True)
class Desired:
    labels: dict[str, str]
    annotations: dict[str, str]
    problems: tuple[str, ...] = ()  # also written to the problem annotation
    notes: tuple[str, ...] = ()  # worth a log line, not a problem
    summary: str = ""


def _gbps_text(v: float) -> str:
    return f"{v:g}"


def _port_text(p: RdmaPort) -> str:
    rate = f"{p.rate_gbps:g} Gb/s" if p.rate_gbps is not None else "rate unknown"
    return f"{p.name} ({p.link_layer or 'link layer unknown'}, {rate})"


def desired_labels(
    facts: SysfsFacts,
    keys: Keys | None = None,
    *,
    socket_ifname: bool = True,
    selector: RailSelector | None = None,
    default_route: str | None = None,
    route_note: str | None = None,
) -> Desired:
    """What this node's Holmes keys should say. Only ACTIVE RDMA ports count, and of those only
    the compute rails (:func:`.rails.choose_rails`); rails that disagree on the link layer are a
    problem, not a guess; no ACTIVE RDMA port means Ethernet. ``default_route``: the host's
    default-route interface (``route_note``: why it is unknown), used for the socket interface
    where the fastest Ethernet netdev is a rail's."""
    k = keys or Keys.from_mapping()
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    notes: list[str] = []
    problems: list[str] = []
    other: list[tuple[RdmaPort, str]] = []

    candidates, inactive = [], []
    for p in facts.ports:
        if not p.active:
            inactive.append(f"{p.name} ({p.state or 'state unreadable'})")
            other.append((p, f"not ACTIVE ({p.state or 'state unreadable'})"))
        elif link_of(p) not in _LINK_KIND:
            notes.append(
                f"port {p.name} is ACTIVE but its link layer {p.link_layer!r} is neither "
                f"InfiniBand nor Ethernet: ignored"
            )
            other.append((p, "link layer neither InfiniBand nor Ethernet"))
        else:
            candidates.append(p)
    if inactive:
        notes.append("ports not ACTIVE, ignored: " + ", ".join(inactive))

    choice = choose_rails(candidates, facts.gpus, selector)
    other.extend(choice.left_out)
    rails = choice.rails
    by_kind: dict[str, list[RdmaPort]] = {}
    for p in rails:
        by_kind.setdefault(_LINK_KIND[link_of(p)], []).append(p)

    if choice.problem:
        problems.append(choice.problem)
        summary = f"no rails: {choice.problem}"
    elif len(by_kind) > 1:
        where = "; ".join(
            f"{_LINK_TEXT[kind]} on {', '.join(p.name for p in ps)}" for kind, ps in sorted(by_kind.items())
        )
        _, example = max(sorted(by_kind.items()), key=lambda kv: len(kv[1]))
        problems.append(
            f"the compute rails disagree ({where}; rails chosen by {choice.how}): one node must "
            f"have one NIC kind. Name the rails in the node annotation {k.rails} (or the "
            f"labeller's --rails, chart value labeller.rails), e.g. "
            f"{k.rails}={','.join(sorted({p.hca for p in example}, key=natural_key))}; or set "
            f"{k.nic} and {k.hcas} by hand"
        )
        summary = f"rails disagree: {where}"
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
        summary = (
            f"{kind}: {len(ps)} ACTIVE port(s) on {','.join(hcas)}, {labels.get(k.gbps, '?')} "
            f"Gbit/s (rails by {choice.how})"
        )
    else:
        labels[k.nic] = ETHERNET
        summary = ""
    if other:
        annotations[k.other] = "; ".join(f"{_port_text(p)}: {why}" for p, why in other)
        if rails or choice.problem:
            notes.append(f"not rails: {annotations[k.other]}")

    eth = sorted(
        (n for n in facts.netdevs if n.physical and n.up and n.ethernet),
        key=lambda n: (-(n.speed_mbps or 0), natural_key(n.name)),
    )
    if socket_ifname and eth:
        ifname, why = _socket_ifname(facts, eth, rails, default_route, route_note)
        annotations[k.socket_ifname] = ifname
        if why:
            notes.append(why)
    if labels.get(k.nic) == ETHERNET:
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


def _socket_ifname(
    facts: SysfsFacts,
    eth: Sequence[NetDev],
    rails: Sequence[RdmaPort],
    default_route: str | None,
    route_note: str | None,
) -> tuple[str, str | None]:
    """The fastest up hardware Ethernet netdev (of equally fast ones, the default route's), unless
    it is a compute rail's and the default route's interface is known: rails are usually a backend
    fabric not routed between clusters, the default route's interface is the front-end. Returns
    (ifname, a note or None)."""
    fastest = eth[0].name
    rail_of = {nd: p.hca for p in rails for nd in p.netdevs}
    tied = [n.name for n in eth if n.speed_mbps == eth[0].speed_mbps]
    if default_route in tied and default_route not in rail_of:  # equally fast: the routed one
        return default_route, (
            None
            if default_route == fastest
            else f"socket interface {default_route}: it holds the default route"
        )
    if fastest not in rail_of:
        return fastest, None
    because = f"the fastest Ethernet interface {fastest} is a netdev of compute rail {rail_of[fastest]}"
    route_dev = next((n for n in facts.netdevs if n.name == default_route), None)
    if route_dev is not None and route_dev.operstate != "down" and route_dev.name != "lo":
        return route_dev.name, f"socket interface {route_dev.name}: it holds the default route; {because}"
    if route_dev is None:
        why = route_note or f"the default route's interface {default_route} is not in {facts.root}/class/net"
    else:
        why = f"the default route's interface {default_route} is down"
    return fastest, f"socket interface {fastest} although {because}: {why}"


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
