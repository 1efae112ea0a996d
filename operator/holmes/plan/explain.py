"""Human explanation of a layout: a table per stage and a few lines on why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from holmes.contract.layout import Layout
from holmes.contract.names import ETHERNET

from . import nvlink
from .partition_why import partition_lines
from .topology import boundary_crossings

if TYPE_CHECKING:
    from holmes.contract.jobspec import JobSpec

    from .candidate import Candidate


def _nodes_cell(nodes: Sequence[str]) -> str:
    if len(nodes) <= 2:
        return ",".join(nodes)
    return f"{nodes[0]}..{nodes[-1]} ({len(nodes)})"


def _fmt_s(x: float) -> str:
    return f"{x:.3g}s"


def table(layout: Layout) -> list[str]:
    """The per-stage table, from the layout alone (works on a layout read back from JSON)."""
    est = layout.estimate or {}
    per_stage = {s["stage"]: s for s in est.get("stages", [])}
    head = (
        f"{len(layout.nodes)} nodes x {layout.gpus_per_node} GPUs = {layout.world_size} ranks: "
        f"tensor {layout.tensor} x pipeline {layout.pipeline} x data {layout.data}"
        + (f" x expert {layout.expert}" if layout.expert > 1 else "")
        + f", {layout.micro_batches} micro-batches of {layout.micro_batch_size} per DP rank"
    )
    cols = [
        "stage",
        "layers",
        "n",
        "island",
        "nic",
        "dpNet",
        "gpu",
        "nodes",
        "compute",
        "bubble",
        "p2p",
        "dp comm",
        "exposed",
        "finish",
    ]
    rows = []
    for s in layout.stages:
        e = per_stage.get(s.index, {})
        nodes = s.nodes or layout.stage_nodes(s.index)
        rows.append(
            [
                str(s.index),
                f"[{s.layers[0]},{s.layers[1]})",
                str(s.num_layers),
                s.island,
                s.nic,
                s.dp_net,
                str(e.get("gpu", "-")),
                _nodes_cell(nodes),
            ]
            + [
                _fmt_s(e[k]) if k in e else "-"
                for k in (
                    "computeSeconds",
                    "bubbleSeconds",
                    "p2pSeconds",
                    "dpCommSeconds",
                    "dpExposedSeconds",
                    "finishSeconds",
                )
            ]
        )
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [head, line(cols)] + [line(r) for r in rows]
    nets = {g.kind: g.net for g in layout.groups if g.kind in ("pp", "embedding")}
    tail = f"pp net {nets.get('pp', '-')}"
    if "embedding" in nets:
        tail += f", embedding net {nets['embedding']}"
    if "iterationSeconds" in est:
        tail += (
            f"; estimate {est['iterationSeconds']:.4g} s/iteration, {est['tokensPerSecond']:.4g} tokens/s, "
            f"{est['tflopsPerGpu']:.4g} TFLOPS/GPU, {est.get('memoryPerGpuGiB', 0):.3g} GiB/GPU"
        )
        if "activationRecompute" in est:
            tail += f" (activation recompute {'on' if est['activationRecompute'] else 'off'})"
    out.append(tail)
    return out


def why_lines(layout: Layout, best: Candidate, alternatives: Sequence[Candidate], job: JobSpec) -> list[str]:
    out = []
    kinds = {s.nic for s in layout.stages}
    mixed = [s.index for s in layout.stages if s.dp_net == "Socket" and s.nic != ETHERNET]
    if job.parallelism.nic_selection == "off":
        out.append(
            "nicSelection off: nodes in name order (Megatron default); "
            "DP groups take whatever NICs that gives"
        )
    elif not mixed and len(kinds) > 1:
        out.append(
            "automatic NIC selection: every stage's DP groups stay on one NIC kind ("
            + ", ".join(f"stage {s.index} on {s.island}" for s in layout.stages[:6])
            + (", ..." if len(layout.stages) > 6 else "")
            + ")"
        )
    if mixed:
        cause = (
            "name order puts different islands in one stage"
            if job.parallelism.nic_selection == "off"
            else "the islands' sizes do not split into whole stages"
        )
        out.append(
            f"stage(s) {', '.join(map(str, mixed[:8]))} mix NIC kinds or clusters, so their DP groups use "
            f"sockets: {cause}"
        )
    if layout.pipeline > 1:
        pp = next(g.net for g in layout.groups if g.kind == "pp")
        out.append(
            f"pipeline p2p uses {pp}: "
            + (
                "all stages on one RDMA island"
                if pp == "IB"
                else "stages span islands, so only activations cross the slow link"
            )
        )
        crossings = boundary_crossings([s.clusters for s in best.stage_sets], best.costs[0].cfg.fabric)
        if crossings:
            out.append("pipeline across clusters: " + "; ".join(crossings))
    out.extend(expert_lines(layout, best, alternatives))
    out.extend(gpu_lines(best))
    out.extend(nvlink.why_lines(layout, best, alternatives))
    out.extend(
        partition_lines(
            best.costs,
            best.layers,
            [s.island for s in layout.stages],
            str((layout.estimate or {}).get("partition", "adaptive")),
        )
    )
    if len(alternatives) > 1:
        nxt = alternatives[1]
        out.append(
            f"chose {best.degrees.describe()} over {len(alternatives) - 1} other degree choice(s); next best "
            f"{nxt.degrees.describe()} is {nxt.seconds / best.seconds:.3g}x slower"
        )
    return ["why:"] + [x if x.startswith(" ") else f"- {x}" for x in out]


def expert_lines(layout: Layout, best: Candidate, alternatives: Sequence[Candidate]) -> list[str]:
    """Where a mixture of experts' groups sit, what their all-to-all costs, and why this degree."""
    model = best.costs[0].model
    if not model.moe:
        return []
    E, T = best.degrees.expert, best.degrees.tensor
    est = layout.estimate or {}
    head = (
        f"mixture of experts: {model.experts} experts, {model.experts_per_token} per token"
        + (f" + {model.shared_experts} shared" if model.shared_experts else "")
        + f" ({est.get('activeParameters', 0) / 1e9:.3g}B of {model.total_params / 1e9:.3g}B "
        "parameters per token)"
    )
    if E == 1:
        return [head + ": expert parallel 1, every GPU of a stage holds all of its layers' experts"]
    inside = [c.place.ep_gbps is None for c in best.costs]
    where = (
        "inside one node (NVLink)" if all(inside) else f"{E * T // layout.gpus_per_node} nodes of one island"
    )
    stages = ", ".join(
        f"stage {s.index} on {s.island} ({_nodes_cell(s.nodes or layout.stage_nodes(s.index))})"
        for s in layout.stages[:4]
    ) + (", ..." if layout.pipeline > 4 else "")
    out = [
        f"{head}: expert parallel {E}, each layer's experts split over {E} data-parallel ranks of its "
        f"stage ({model.experts // E} experts each"
        + (f", each expert over the tensor group of {T}" if T > 1 else "")
        + f"); every expert group is {E * T} GPUs {where}: {stages}"
    ]
    worst = max(range(len(best.stages)), key=lambda s: best.stages[s].all_to_all)
    a2a = best.stages[worst].all_to_all
    fabric = "NVLink" if inside[worst] else f"{layout.stages[worst].island}'s {layout.stages[worst].dp_net}"
    mem = best.costs[worst].expert_memory(best.layers[worst]) / 2**30
    out.append(
        f"  all-to-all: {a2a:.3g} s/iteration on stage {worst} ({a2a / best.seconds:.1%} of the iteration), "
        f"priced on {fabric}: dispatch and combine per MoE layer and micro-batch, forward and backward; "
        f"its experts' weights, gradients and optimizer state take {mem:.3g} GiB/GPU"
    )
    same = [
        c
        for c in alternatives
        if c is not best
        and (c.degrees.tensor, c.degrees.pipeline, c.degrees.data)
        == (T, best.degrees.pipeline, best.degrees.data)
    ]
    for c in sorted(same, key=lambda c: c.seconds)[:2]:
        d = c.degrees
        alt_a2a = max(x.all_to_all for x in c.stages)
        out.append(
            f"  expert {d.expert} instead: {c.seconds / best.seconds:.3g}x the time (all-to-all "
            f"{alt_a2a:.3g} s, {max(x.memory_gib for x in c.stages):.3g} GiB/GPU)"
        )
    return out


def gpu_lines(best: Candidate) -> list[str]:
    """What the stages' GPU types did to the plan (plan/gpus.py): nothing to say on one type."""
    gpus = best.gpus
    if not gpus:
        return []
    out = [note for g in gpus for note in g.notes]
    out = list(dict.fromkeys(out))
    kinds = {n for g in gpus for n in g.names}
    if len(kinds) < 2:
        return out
    mixed = [s for s, g in enumerate(gpus) if g.mixed]
    if mixed:
        out.append(
            f"stage(s) {', '.join(map(str, mixed[:8]))} mix GPU types ("
            + "; ".join(f"stage {s}: {gpus[s].name}" for s in mixed[:3])
            + "): a DP group steps together, so each runs at its slowest GPU "
            f"({', '.join(f'{gpus[s].peak_tflops:g}' for s in mixed[:3])} TFLOPS peak) and its "
            "smallest memory; the node counts per type do not split into whole stages"
        )
    else:
        out.append(
            "GPU types kept apart: every stage's DP groups hold one GPU type, since a DP group "
            "runs at its slowest member"
        )
    out.append(
        "each stage is priced by its own GPUs: "
        + ", ".join(f"stage {s} {g.name} {g.peak_tflops:g} TFLOPS" for s, g in enumerate(gpus[:6]))
        + (", ..." if len(gpus) > 6 else "")
        + " (dense bf16 peak x computeEfficiency), so faster GPUs take more layers"
    )
    return out


def explanation_lines(
    layout: Layout, best: Candidate, alternatives: Sequence[Candidate], job: JobSpec
) -> list[str]:
    return table(layout) + why_lines(layout, best, alternatives, job)


def explain(layout: Layout) -> str:
    """The stored explanation (table + why), or the table alone for a layout without one."""
    return "\n".join(layout.explanation) if layout.explanation else "\n".join(table(layout))
