"""Pipeline across a link, or replicas that meet over it (DiLoCo): which reaches a loss sooner.

Pure. Two islands joined by one link (``Link``: per-node bandwidth and one-way latency, per pair
of islands), the same total batch either way:

- **pipeline**: one model cut at the link into ``stages`` stages (half on each island); every
  micro-batch's activations cross forward and its gradients backward. Priced by simulating the
  schedule's per-rank order (holmes.plan.pipeline_simulation: torch's 1F1B or GPipe) with
  each stage's forward and backward of one micro-batch, the messages across the link serialized
  at its bandwidth in each direction, their latencies overlapping, each sent once its receiver
  asked (torch posts a receive when its action is next; gloo sends the bytes after the
  receiver's notice, which queues behind the data on its way back), those inside an island
  free. A closed form, ``max(M c, M x) + (P - 1)(c + 2x)`` with ``x`` = latency + bytes /
  bandwidth per crossing, over-predicted the emulated link's pipeline by 30% (its shaper's
  bucket hid the latency) and under-predicts a plain line's by 40% (the directions take turns).
- **replicas**: every island trains the whole model on its share of the batch; every
  ``inner_steps`` steps the replicas all-reduce the change of their weights over the link
  (a ring: each sends ``2 (R - 1) / R`` of the bytes, ``2 (R - 1)`` latencies), of which
  ``overlap`` is hidden behind compute (the trainer overlaps each fragment's exchange with
  ``acrossIslands.overlapSteps`` inner steps; holmes.plan.across_plan.hidden_fraction gives the
  share, 0 without overlapSteps).
- **convergence**: replicas need ``tokens_ratio`` times the tokens synchronous training needs
  to reach the same loss. Not derivable from first principles: it is measured
  (bench/across_sites.py) and passed in, and the verdict says which value it used.

The verdict compares seconds per synchronous-equivalent token: each mode's seconds per token
times the tokens it needs relative to synchronous training.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import pipeline_simulation as sim

# Tokens to the same loss relative to synchronous training, by inner steps H, as
# bench/across_sites.py measured them: 2 replicas of a 0.87M-parameter GPT against the synchronous
# pipeline on the same global batch (each replica trains on half of it), each mode at the inner
# AdamW learning rate that reached the loss in the fewest tokens in a sweep, to a loss past the
# early descent (docs/benchmarks.md#across-sites-pipeline-or-replicas-diloco). Early in training
# replicas keep up (about 1.0x at H=5 to a higher loss); it is the loss one trains to that costs.
MEASURED_TOKENS_RATIO = ((5, 1.59), (20, 1.59))


def assumed_tokens_ratio(inner_steps: int) -> tuple[float, str]:
    """The convergence assumption for ``inner_steps`` and where it comes from (one line): the
    ratio measured at the nearest H, as measured (no floor: below 1 would be a measurement too)."""
    near_h, ratio = min(MEASURED_TOKENS_RATIO, key=lambda hr: abs(hr[0] - inner_steps))
    basis = f"bench/across_sites.py measured {ratio:.2f}x at H={near_h}, each mode at its best learning rate"
    if inner_steps > max(h for h, _ in MEASURED_TOKENS_RATIO):
        basis += f"; H={inner_steps} is beyond what was measured and usually needs more"
    return ratio, f"replicas need {ratio:.2f}x the synchronous tokens ({basis})"


@dataclass(frozen=True)
class Link:
    """The network between two islands, per node and per direction. ``burst_bytes``: a shaper's
    token bucket (what an emulated link's tbf holds: bytes sent at once after the link idled;
    0 for a line, which never sends faster than ``gbps``)."""

    gbps: float
    latency_s: float = 0.0
    burst_bytes: float = 0.0

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes * 8 / (self.gbps * 1e9)


@dataclass(frozen=True)
class AcrossWork:
    """One iteration of the job, in the terms both modes are priced in."""

    compute_s: (
        float  # forward + backward of the whole model on the whole batch, on one island's share of GPUs
    )
    micro_batches: int  # per pipeline, per iteration
    activation_bytes: float  # one micro-batch's activations at a stage boundary
    model_bytes: float  # the weights one rank of a replica exchanges per outer step, on the link's dtype
    tokens_per_iteration: int
    replicas: int = 2
    stages: int = 2
    schedule: str = "1F1B"  # the pipeline's order: 1F1B or GPipe (the orders simulated without torch)


@dataclass(frozen=True)
class AcrossChoice:
    pipeline_s: float  # seconds per iteration
    replicas_s: float
    pipeline_s_per_token: float  # per synchronous-equivalent token
    replicas_s_per_token: float
    pick: str  # "pipeline" | "replicas"
    why: str


PIPELINE_ORDERS = {"1F1B": sim.one_f_one_b, "GPipe": sim.gpipe}


def pipeline_iteration_s(w: AcrossWork, link: Link) -> float:
    """Seconds per iteration with the model cut at the link into ``w.stages`` stages (the batch's
    compute spread over the stages, the link between stage P/2 - 1 and P/2), in steady state:
    the simulated schedule, iteration after iteration, the link's bucket carried over. Sends
    rendezvous with their receives, as torch's p2p over gloo does (measured on an emulated line:
    bench/across_sites.py --link-check); NCCL's own handshake is not measured here."""
    if w.schedule not in PIPELINE_ORDERS:
        raise ValueError(
            f"AcrossWork.schedule {w.schedule!r}: the pipeline across a link is simulated for "
            f"{' and '.join(PIPELINE_ORDERS)} (their orders need no torch); price one of those"
        )
    if w.stages < 2:
        raise ValueError(f"AcrossWork.stages {w.stages} must be >= 2: at least one on each island")
    M, P = w.micro_batches, w.stages
    c = w.compute_s * w.replicas / P / M  # a stage of 1/P of the model on the whole batch, per micro-batch
    durations = {op: share * c for op, share in sim.UNIT_SHARES.items()}
    cut = P // 2  # stages 0 .. cut-1 on one island, the rest on the other
    boundary = sim.Link(link.gbps * 1e9 / 8, link.latency_s, burst_bytes=link.burst_bytes)

    def on(src: int, dst: int) -> sim.Link:
        return boundary if {src, dst} == {cut - 1, cut} else sim.FREE  # inside an island: free here

    messages = sim.Messages(w.activation_bytes, on, rendezvous=True)
    return sim.steady_iteration_s(PIPELINE_ORDERS[w.schedule](P, M), durations, messages)


def exchange_s(w: AcrossWork, link: Link, fragments: int = 1) -> float:
    """One outer step's all-reduce over the link (all fragments together)."""
    R = w.replicas
    return 2 * (R - 1) / R * w.model_bytes * 8 / (link.gbps * 1e9) + 2 * (R - 1) * fragments * link.latency_s


def replicas_iteration_s(
    w: AcrossWork, link: Link, inner_steps: int, overlap: float = 0.0, fragments: int = 1
) -> float:
    """Seconds per iteration of every replica training its share of the batch, the exchange
    amortised over ``inner_steps`` and ``overlap`` of it hidden behind compute."""
    return w.compute_s + (1 - overlap) * exchange_s(w, link, fragments) / inner_steps


def choose(
    w: AcrossWork, link: Link, inner_steps: int, tokens_ratio: float, overlap: float = 0.0, fragments: int = 1
) -> AcrossChoice:
    """Which mode reaches a loss sooner over ``link``, with replicas needing ``tokens_ratio``
    times the synchronous tokens (measured)."""
    if tokens_ratio <= 0 or inner_steps < 1 or not 0 <= overlap <= 1:
        raise ValueError(
            f"tokens_ratio {tokens_ratio} must be > 0, inner_steps {inner_steps} >= 1, "
            f"overlap {overlap} in [0, 1]"
        )
    p = pipeline_iteration_s(w, link)
    r = replicas_iteration_s(w, link, inner_steps, overlap, fragments)
    p_tok, r_tok = p / w.tokens_per_iteration, r * tokens_ratio / w.tokens_per_iteration
    pick = "replicas" if r_tok < p_tok else "pipeline"
    x = link.seconds(w.activation_bytes)
    why = (
        f"pipeline {p * 1e3:.0f} ms/iteration ({w.schedule} simulated: each of {w.micro_batches} "
        "micro-batches crosses the "
        f"{link.gbps:g} Gbit/s, {link.latency_s * 1e3:g} ms link in {x * 1e3:.1f} ms each way); replicas "
        f"{r * 1e3:.0f} ms/iteration (the {w.model_bytes / 1e6:.1f} MB exchange every {inner_steps} steps) "
        f"but {tokens_ratio:.2f}x the tokens to the same loss (measured): "
        f"{pick} is {max(p_tok, r_tok) / min(p_tok, r_tok):.2f}x faster per token"
    )
    return AcrossChoice(p, r, p_tok, r_tok, pick, why)


def crossover_gbps(
    w: AcrossWork,
    latency_s: float,
    inner_steps: int,
    tokens_ratio: float,
    lo: float = 1e-4,
    hi: float = 1e4,
    burst_bytes: float = 0.0,
) -> float | None:
    """The link speed above which the pipeline is faster per token (bisection on a log scale);
    None when one mode wins over the whole range. ``burst_bytes``: the link's shaper bucket
    (Link.burst_bytes; 0, a line)."""

    def pipeline_wins(gbps: float) -> bool:
        return choose(w, Link(gbps, latency_s, burst_bytes), inner_steps, tokens_ratio).pick == "pipeline"

    if pipeline_wins(lo) == pipeline_wins(hi):
        return None
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        if pipeline_wins(mid):
            hi = mid
        else:
            lo = mid
    return hi
