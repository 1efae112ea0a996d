"""A layout as an SVG picture, hand-written text from a :class:`~.picture.Picture` (pure).

Top: one row per pipeline stage inside its island's frame: the stage's layers and GPU type,
its nodes with their GPUs (tensor-parallel groups outlined: NVLink inside a node), its
data-parallel groups' band in the colour of their network, and between rows the stage boundary
in the colour of its network (a boundary over sockets is a slow link: red, dashed). Bottom, when
the picture has the estimate's stage times: one iteration's 1F1B schedule per stage, forwards
and backwards per micro-batch, the idle gaps (the bubble and p2p waits) hatched, the exposed
data-parallel communication after the last backward."""

from __future__ import annotations

import math
from xml.sax.saxutils import escape, quoteattr

from .picture import CROSSES_ISLANDS, Picture
from .timeline import Schedule, from_estimate

WIDTH = 1100
LEFT = 250  # the stage labels' column
ISLAND_HEAD = 24  # an island frame's title row
NODE_W, NODE_H, NODE_GAP = 124, 50, 8
MAX_NODES_PER_STAGE = 64  # more are summarised in one box (the picture stays readable)
NET_COLOURS = {"IB": "#1f6fb4", "Socket": "#d62728", "NVLink": "#6b6b6b", CROSSES_ISLANDS: "#d62728"}
PLUGIN_COLOUR = "#8e44ad"  # a vendor net plugin's name
NIC_TINTS = {"infiniband": "#e7f0fa", "roce": "#e8f5e9", "ethernet": "#fbf1e3"}
FORWARD, BACKWARD, EXPOSED = "#9ecae1", "#2b73b3", "#f28e2b"
FONT = "font-family='DejaVu Sans, Arial, sans-serif'"


def net_colour(net: str) -> str:
    return NET_COLOURS.get(net, PLUGIN_COLOUR if net else "#999999")


def slow(net: str) -> bool:
    return net in ("Socket", CROSSES_ISLANDS)


def _attrs(kw: dict[str, str]) -> str:
    """Keyword arguments as SVG attributes: class_ -> class, stroke_width -> stroke-width."""
    return "".join(f" {k.rstrip('_').replace('_', '-')}={quoteattr(v)}" for k, v in kw.items())


class _Svg:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def rect(
        self, x: float, y: float, w: float, h: float, fill: str, stroke: str = "none", **kw: str
    ) -> None:
        extra = _attrs(kw)
        self.parts.append(
            f"<rect x='{x:.1f}' y='{y:.1f}' width='{max(w, 0):.1f}' height='{h:.1f}' fill='{fill}' "
            f"stroke='{stroke}'{extra}/>"
        )

    def text(self, x: float, y: float, s: str, size: int = 12, weight: str = "normal", **kw: str) -> None:
        extra = _attrs(kw)
        self.parts.append(
            f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' font-weight='{weight}'{extra}>"
            f"{escape(s)}</text>"
        )

    def line(
        self, x1: float, y1: float, x2: float, y2: float, colour: str, width: float = 1, **kw: str
    ) -> None:
        extra = _attrs(kw)
        self.parts.append(
            f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' stroke='{colour}' "
            f"stroke-width='{width}'{extra}/>"
        )

    def raw(self, s: str) -> None:
        self.parts.append(s)


def _fmt_s(x: float) -> str:
    return f"{x:.3g} s"


def _summary(p: Picture) -> str:
    est = p.estimate
    out = (
        f"pipeline {p.pipeline} x data {p.data} x tensor {p.tensor} on {len(p.nodes)} nodes x "
        f"{p.gpus_per_node} GPUs"
    )
    if isinstance(est.get("iterationSeconds"), (int, float)):
        out += f"; estimated {_fmt_s(est['iterationSeconds'])} per iteration"
    if isinstance(est.get("tflopsPerGpu"), (int, float)):
        out += f", {est['tflopsPerGpu']:.4g} TFLOP/s per GPU"
    return out


def _legend(svg: _Svg, y: float, nets: list[str], schedule: bool) -> None:
    x = 20.0
    for net in nets:
        dash = {"stroke_dasharray": "6 4"} if slow(net) else {}
        svg.line(x, y - 4, x + 26, y - 4, net_colour(net), 3, **dash)
        label = {"NVLink": "NVLink (tensor-parallel, in a node or an NVLink domain)"}.get(net, net)
        label += " (slow link)" if slow(net) else ""
        svg.text(x + 32, y, label, 11)
        x += 44 + 6.5 * len(label)
    if schedule:
        for colour, label in ((FORWARD, "forward"), (BACKWARD, "backward"), (EXPOSED, "exposed DP comm")):
            svg.rect(x, y - 10, 14, 12, colour)
            svg.text(x + 18, y, label, 11)
            x += 30 + 6.5 * len(label)
        svg.rect(x, y - 10, 14, 12, "url(#idle)", "#bbbbbb")
        svg.text(x + 18, y, "idle (bubble, p2p waits)", 11)


def _node_rows(n: int) -> int:
    per_row = (WIDTH - LEFT - 40) // (NODE_W + NODE_GAP)
    return max(1, math.ceil(min(n, MAX_NODES_PER_STAGE + 1) / per_row))


def _stage_height(p: Picture, i: int) -> float:
    return 34 + _node_rows(len(p.stages[i].nodes)) * (NODE_H + NODE_GAP)


def _node(svg: _Svg, x: float, y: float, name: str, p: Picture, stage: int) -> None:
    """A node box with its GPUs: this stage's green, another stage's (a node shared by two
    stages) grey; tensor-parallel groups outlined."""
    svg.raw(f"<g><title>{escape(name)}</title>")
    svg.rect(x, y, NODE_W, NODE_H, "white", "#555555", rx="4")
    shown = name if len(name) <= 18 else name[:8] + "…" + name[-8:]
    svg.text(x + 6, y + 15, shown, 11, "bold", class_="node", data_name=name)
    G, T = p.gpus_per_node, p.tensor
    if G > 16:
        svg.text(x + 6, y + 36, f"{G} GPUs, TP groups of {T}", 10)
        svg.raw("</g>")
        return
    W = min(T, G)  # a tensor group's GPUs on this node (all of them when it spans nodes)
    size = min(12.0, (NODE_W - 12 - 2 * (G // max(W, 1))) / G)
    gx = x + 6
    first = p.nodes.index(name) * G
    for g in range(G):
        if g % W == 0 and T > 1:
            svg.rect(gx - 1.5, y + 24.5, W * (size + 2) + 1, size + 3, "none", NET_COLOURS["NVLink"], rx="2")
        mine = (first + g) // (p.data * p.tensor) == stage
        svg.rect(gx, y + 26, size, size, "#76b900" if mine else "#d0d0d0", "#3d6000" if mine else "#999999")
        gx += size + 2
        if (g + 1) % W == 0 and T > 1:
            gx += 3
    svg.raw("</g>")


def _layout_section(svg: _Svg, p: Picture, top: float) -> float:
    ys, y = [], top
    for i in range(len(p.stages)):
        if i == 0 or p.stages[i].island != p.stages[i - 1].island:
            y += ISLAND_HEAD  # room for the island's name
        ys.append(y)
        y += _stage_height(p, i) + 30
    end = y
    # island frames around runs of consecutive stages on one island
    i = 0
    while i < len(p.stages):
        j = i
        while j + 1 < len(p.stages) and p.stages[j + 1].island == p.stages[i].island:
            j += 1
        y0, y1 = ys[i] - ISLAND_HEAD, ys[j] + _stage_height(p, j) + 4
        svg.rect(10, y0, WIDTH - 20, y1 - y0, NIC_TINTS.get(p.stages[i].nic, "#f2f2f2"), "#aaaaaa", rx="8")
        svg.text(20, y0 + 17, f"island {p.stages[i].island}", 12, "bold", fill="#555", class_="island")
        i = j + 1
    per_row = (WIDTH - LEFT - 40) // (NODE_W + NODE_GAP)
    for i, s in enumerate(p.stages):
        y = ys[i]
        svg.text(24, y + 18, f"stage {s.index}", 15, "bold", class_="stage")
        svg.text(24, y + 36, f"layers {s.layers[0]}–{s.layers[1]} ({s.layers[1] - s.layers[0]} layers)", 12)
        svg.text(24, y + 52, f"{s.nic}" + (f", GPU {s.gpu}" if s.gpu and s.gpu != "unlabelled" else ""), 12)
        band_h = _stage_height(p, i) - 8
        colour = net_colour(s.dp_net)
        svg.rect(LEFT, y, WIDTH - LEFT - 20, band_h, "none", colour, stroke_width="2.5", rx="6")
        svg.text(
            LEFT + 10, y + 16, f"data-parallel x{p.data} over {s.dp_net or '?'}", 11, "bold", fill=colour
        )
        shown = s.nodes if len(s.nodes) <= MAX_NODES_PER_STAGE + 1 else s.nodes[:MAX_NODES_PER_STAGE]
        for k, name in enumerate(shown):
            r, c = divmod(k, per_row)
            _node(svg, LEFT + 10 + c * (NODE_W + NODE_GAP), y + 24 + r * (NODE_H + NODE_GAP), name, p, i)
        if len(shown) < len(s.nodes):
            r, c = divmod(len(shown), per_row)
            svg.text(
                LEFT + 16 + c * (NODE_W + NODE_GAP),
                y + 52 + r * (NODE_H + NODE_GAP),
                f"+{len(s.nodes) - len(shown)} more nodes",
                12,
            )
        if i < len(p.links):
            net = p.links[i]
            y_from = y + band_h
            y_to = ys[i + 1] - (ISLAND_HEAD + 2 if p.stages[i + 1].island != s.island else 0)
            dash = {"stroke_dasharray": "7 4"} if slow(net) else {}
            svg.line(120, y_from + 2, 120, y_to - 4, net_colour(net), 4 if slow(net) else 2.5, **dash)
            svg.raw(
                f"<polygon points='114,{y_to - 10:.1f} 126,{y_to - 10:.1f} 120,{y_to - 2:.1f}' "
                f"fill='{net_colour(net)}'/>"
            )
            label = (
                f"activations over {net}" if net and net != CROSSES_ISLANDS else net or "inside the island"
            )
            if s.nodes[-1] == p.stages[i + 1].nodes[0]:  # the two stages share a node
                net, label = "NVLink", "activations inside a node (NVLink)"
            if slow(net):
                label = "slow link: " + label
            svg.text(
                134,
                (y_from + y_to) / 2 + 4,
                label,
                11,
                "bold" if slow(net) else "normal",
                fill=net_colour(net),
            )
    return end


def _tick(span: float) -> float:
    raw = span / 8
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _schedule_section(svg: _Svg, p: Picture, sched: Schedule, top: float) -> float:
    svg.text(
        20,
        top + 16,
        f"Estimated schedule of one iteration (1F1B, {p.micro_batches} micro-batches per data-parallel rank)",
        14,
        "bold",
    )
    x0, x1 = LEFT, WIDTH - 30
    scale = (x1 - x0) / sched.seconds
    lane, y = 26, top + 36
    for s in range(p.pipeline):
        ly = y + s * (lane + 8)
        svg.text(20, ly + 17, f"stage {s}", 12, "bold")
        dp = sum(b.end - b.start for b in sched.of(s) if b.kind == "DP")
        svg.text(84, ly + 17, f"idle {_fmt_s(sched.idle(s))}" + (f", DP {_fmt_s(dp)}" if dp else ""), 10)
        svg.rect(x0, ly, x1 - x0, lane, "url(#idle)", "#cccccc")
        for b in sched.of(s):
            colour = {"F": FORWARD, "B": BACKWARD, "DP": EXPOSED}[b.kind]
            w = (b.end - b.start) * scale
            edge = "white" if w >= 4 else "none"  # thin blocks: the edges would hide the colours
            svg.rect(x0 + b.start * scale, ly, w, lane, colour, edge, stroke_width="0.5")
            if b.kind != "DP" and w >= 14:
                fill = "white" if b.kind == "B" else "#1a1a1a"
                svg.text(
                    x0 + b.start * scale + w / 2,
                    ly + 17,
                    str(b.micro_batch),
                    10,
                    text_anchor="middle",
                    fill=fill,
                )
    axis = y + p.pipeline * (lane + 8) + 4
    svg.line(x0, axis, x1, axis, "#444444")
    step = _tick(sched.seconds)
    t = 0.0
    while t <= sched.seconds + 1e-9:
        x = x0 + t * scale
        svg.line(x, axis, x, axis + 5, "#444444")
        svg.text(x, axis + 18, f"{t:g} s", 10, text_anchor="middle")
        t += step
    est = p.estimate.get("iterationSeconds")
    note = f"this schedule: {_fmt_s(sched.seconds)}"
    if isinstance(est, (int, float)):
        note += f"; the cost model's estimate: {_fmt_s(est)}"
    svg.text(x1, axis + 36, note, 11, text_anchor="end", fill="#555")
    return axis + 46


def render(p: Picture) -> str:
    """The SVG document (text)."""
    sched = from_estimate(p.estimate, p.micro_batches) if p.micro_batches else None
    svg = _Svg()
    svg.text(20, 28, p.title or "Holmes layout", 18, "bold")
    svg.text(20, 48, _summary(p), 12)
    nets = sorted(
        {s.dp_net for s in p.stages if s.dp_net} | {n for n in p.links if n}, key=lambda n: (slow(n), n)
    )
    _legend(svg, 72, [*nets, "NVLink"] if p.tensor > 1 else nets, sched is not None)
    y = _layout_section(svg, p, 96)
    if sched is not None:
        y = _schedule_section(svg, p, sched, y + 4)
    else:
        svg.text(
            20,
            y + 14,
            "(no per-stage times: the schedule needs the Layout's estimate, e.g. layout.json)",
            11,
            fill="#777",
        )
        y += 28
    head = (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{y:.0f}' "
        f"viewBox='0 0 {WIDTH} {y:.0f}' {FONT}>"
        "<defs><pattern id='idle' width='6' height='6' patternUnits='userSpaceOnUse' "
        "patternTransform='rotate(45)'><rect width='6' height='6' fill='#f4f4f4'/>"
        "<line x1='0' y1='0' x2='0' y2='6' stroke='#c8c8c8' stroke-width='2'/></pattern></defs>"
        f"<rect width='{WIDTH}' height='{y:.0f}' fill='white'/>"
    )
    return head + "\n".join(svg.parts) + "</svg>\n"
