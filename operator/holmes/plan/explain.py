"""Human explanation of a layout: a table per stage and a few lines on why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from holmes.contract.layout import Layout
from holmes.contract.names import ETHERNET

from .partition_why import partition_lines

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
        f"tensor {layout.tensor} x pipeline {layout.pipeline} x data {layout.data}, "
        f"{layout.micro_batches} micro-batches of {layout.micro_batch_size} per DP rank"
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
    out.extend(gpu_lines(best))
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
        d = nxt.degrees
        out.append(
            f"chose tensor {layout.tensor} x pipeline {layout.pipeline} x data {layout.data} over "
            f"{len(alternatives) - 1} other degree choice(s); next best tensor {d.tensor} x pipeline "
            f"{d.pipeline} x data {d.data} is {nxt.seconds / best.seconds:.3g}x slower"
        )
    return ["why:"] + [x if x.startswith(" ") else f"- {x}" for x in out]


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
