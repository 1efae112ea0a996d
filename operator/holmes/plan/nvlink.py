"""NVLink domains: the tier of the fabric above the node and below the NIC island.

Rack-scale NVLink (GB200/GB300 NVL72) joins the GPUs of up to 18 nodes in one NVLink domain
(GPU Feature Discovery's ``nvidia.com/gpu.clique``, discovery.py): inside it every GPU reaches
every other at its NVLink speed, a multiple of what the nodes' NICs carry. So:

- a tensor group (or an expert group) may span the nodes of one domain, never two: its
  all-reduces (all-to-alls) run every layer, and across domains they would cross the NICs. A
  tensor degree ``T`` above ``gpusPerNode`` ``G`` puts each group on ``T / G`` consecutive
  nodes (the Layout's rank order), an expert group of ``E x T`` ranks on ``E x T / G``, so
  :func:`domain_parts` orders each island's nodes domain by domain and keeps of each domain
  whole groups' worth of nodes, and :func:`group_problem` refuses an order that would still
  straddle. On nodes without domains an expert group keeps to its island as before (planner);
- data-parallel, pipeline and embedding traffic among nodes of one domain is priced on NVLink
  (:func:`node_gbps`: the node's GPUs' NVLink together), across domains on the island's NICs;
- the search weighs wider tensor groups inside a domain (less pipeline, less bubble, more
  tensor all-reduce) against deeper pipelines on node-bound groups: the degrees are tried side by
  side (planner.degree_candidates), and :func:`why_lines` says which won and by how much.

NVLink per GPU comes from the GPU table (gpus.py: GB200/GB300) or the cost model's
``nvlinkGbps``; a domain runs at its slowest member's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .costmodel import GBIT
from .discovery import NodeNic

if TYPE_CHECKING:
    from holmes.contract.layout import Layout

    from .candidate import Candidate

Parts = list[list[tuple[NodeNic, ...]]]  # per island, its nodes by GPU type (planner.island_parts)


def largest_domain(nodes: Iterable[NodeNic]) -> int:
    """Nodes of the largest NVLink domain among ``nodes`` (1 where none has a domain: a node is
    its own NVLink domain)."""
    sizes: dict[str, int] = {}
    for n in nodes:
        if n.nvlink_domain:
            sizes[n.nvlink_domain] = sizes.get(n.nvlink_domain, 0) + 1
    return max(sizes.values(), default=1)


def tensor_widths(gpus_per_node: int, domain_nodes: int) -> list[int]:
    """Tensor degrees wider than a node that a domain of ``domain_nodes`` nodes can hold."""
    return [gpus_per_node * k for k in range(2, domain_nodes + 1)]


def domain_parts(parts: Parts, per_group: int, unlabelled: bool = False) -> Parts:
    """``parts`` with each part's nodes in domain order (a domain's nodes together, by name),
    each domain cut to whole groups of ``per_group`` nodes: blocks of whole groups cut from them
    never straddle two domains. Nodes without a domain are left out, or with ``unlabelled``
    (expert groups, which may keep to an island there) kept last, cut to whole groups too."""
    out: Parts = []
    for by_type in parts:
        mine = []
        for part in by_type:
            domains: dict[str | None, list[NodeNic]] = {}
            for n in part:
                if n.nvlink_domain or unlabelled:
                    domains.setdefault(n.nvlink_domain, []).append(n)
            kept: list[NodeNic] = []
            # the largest domain first, the nodes without one last
            for d in sorted(domains, key=lambda d: (d is None, -len(domains[d]), d or "")):
                ns = domains[d]
                kept += ns[: len(ns) // per_group * per_group]
            mine.append(tuple(kept))
        out.append(mine)
    return out


def group_problem(nodes: Sequence[NodeNic], per_group: int, kind: str = "tensor") -> str:
    """Why the ``kind`` groups of ``per_group`` consecutive nodes (node rank order) do not each
    lie inside one NVLink domain; '' when they do. An expert group on nodes of no domain at all
    is no problem here (it keeps to its island: planner.expert_groups)."""
    for first in range(0, len(nodes), per_group):
        group = nodes[first : first + per_group]
        domains = {n.nvlink_domain for n in group}
        if kind == "expert" and domains == {None}:
            continue
        on = ", ".join(n.name for n in group[:4]) + (", ..." if len(group) > 4 else "")
        if None in domains:
            lone = next(n.name for n in group if n.nvlink_domain is None)
            return (
                f"the {kind} group on {on} reaches over node {lone}, which is in no NVLink domain "
                "(no nvidia.com/gpu.clique label)"
            )
        if len(domains) > 1:
            spans = ", ".join(sorted(map(str, domains)))
            return f"the {kind} group on {on} would span NVLink domains {spans}"
    return ""


def node_gbps(gpus_on_node: int, per_gpu_gbps: float) -> float:
    """What one node's GPUs of a job move over NVLink together, Gbit/s each way: the bandwidth a
    group inside an NVLink domain is priced at per node (its NICs' place)."""
    return gpus_on_node * per_gpu_gbps


def layout_domains(nodes: Sequence[NodeNic]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The Layout's ``nvlinkDomains``: each domain of ``nodes`` and its nodes, in rank order."""
    out: dict[str, list[str]] = {}
    for n in nodes:
        if n.nvlink_domain:
            out.setdefault(n.nvlink_domain, []).append(n.name)
    return tuple((d, tuple(ns)) for d, ns in out.items())


def why_lines(layout: Layout, best: Candidate, alternatives: Sequence[Candidate]) -> list[str]:
    """Where the tensor groups sit against the NVLink domains, and the plan of the other kind
    (node-bound beside domain-wide) with its estimate."""
    G = layout.gpus_per_node
    domains = {n.nvlink_domain for n in best.nodes if n.nvlink_domain}
    if not domains:
        return []
    T = best.degrees.tensor
    per_gpu = min(c.nvlink for c in best.costs) / GBIT
    out = []
    if T > G:
        sizes: dict[str, int] = {}
        for n in best.nodes:
            sizes[n.nvlink_domain or ""] = sizes.get(n.nvlink_domain or "", 0) + 1
        shown = ", ".join(f"{d}: {k} nodes" for d, k in list(sizes.items())[:3])
        out.append(
            f"tensor groups of {T} span {T // G} nodes of one NVLink domain each (never two): "
            f"all-reduces on NVLink at {per_gpu:g} Gbit/s per GPU; the job's nodes are in "
            f"{len(sizes)} domain(s) ({shown}{', ...' if len(sizes) > 3 else ''})"
        )
    inside = [s for s, st in enumerate(best.stage_sets) if st.nvlink_domain and st.count > 1]
    if inside:
        out.append(
            f"stage(s) {', '.join(map(str, inside[:8]))} lie inside one NVLink domain: their "
            "data-parallel traffic is priced on NVLink, not the island's NICs"
        )
    if layout.pipeline > 1:
        nv = [b for b in range(layout.pipeline - 1) if _one_domain(best, b)]
        if nv:
            out.append(
                f"pipeline boundary(ies) {', '.join(f'{b}|{b + 1}' for b in nv[:8])} inside one NVLink "
                "domain: activations on NVLink; the others cross domains on the island's NICs"
            )
    other = [c for c in alternatives if (c.degrees.tensor > G) != (T > G)]
    if other:
        alt = min(other, key=lambda c: c.seconds)
        kind = "node-bound" if T > G else "domain-wide"
        out.append(
            f"{kind} plan beside it: {alt.degrees.describe()} estimates {alt.seconds:.4g} s/iteration "
            f"under 1F1B, this plan {best.seconds:.4g} s ({alt.seconds / best.seconds:.3g}x the time)"
        )
    return out


def _one_domain(best: Candidate, boundary: int) -> bool:
    a, b = best.stage_sets[boundary], best.stage_sets[boundary + 1]
    return a.nvlink_domain is not None and a.nvlink_domain == b.nvlink_domain
