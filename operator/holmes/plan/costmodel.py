"""Cost model: time of one training iteration of a GPT-style model on a placement.

Assumptions (defaults in :class:`CostModelConfig`, all configurable):

- Compute: every GPU reaches ``compute_efficiency`` x ``gpu_peak_tflops`` on transformer
  FLOPs (A100 bf16 dense: 312 TFLOP/s, efficiency 0.66). FLOPs per token and layer, forward:
  ``8h^2 + 4h*ffn + 4sh`` (QKV/proj/MLP GEMMs + attention scores; = 24h^2(1 + s/6h) for ffn=4h);
  backward twice the forward; activation recomputation adds one more forward. Model FLOPs per
  iteration (:mod:`.flops`): ``96 B s l h^2 (1 + s/6h + V/16lh)`` with recomputation (the
  formula the paper reports TFLOPS with), ``72 B s l h^2 (1 + s/6h + V/12lh)`` without; the
  estimate's TFLOPS/GPU uses the one that matches the job. The LM head
  (``2 s h V`` forward) sits on the last stage; the embedding lookup costs no FLOPs but its
  parameters sit on the first stage (and a copy on the last when embeddings are tied).
- Tensor parallelism stays in a node: 2 all-reduces of the activations per layer in forward,
  2 in backward (+2 with recomputation), ring cost over NVLink (``nvlink_gbps`` per GPU). With
  sequence parallelism each all-reduce becomes an all-gather plus a reduce-scatter: the same
  bytes, so the same time, but the norm regions' activations (and with recomputation each
  layer's kept input) are split over the T ranks too (Korthikanti et al. 2022).
- Pipeline: 1F1B with m micro-batches. Stage s takes ``t_s = fwd + bwd`` per micro-batch plus the
  p2p of its activations in and out; iteration = ``(m-1) * max_s(step_s) + sum_s t_s + 2*sum p2p``
  (warm-up/cool-down bubble), then each stage's exposed DP communication. A stage's last backward
  ends earlier than stage 0's by the backward chain before it, which it may use to hide DP time.
- P2P: each tensor-parallel group sends one activation ``mb*s*h`` (bf16) per micro-batch and
  direction (scatter-gather over the TP ranks); the boundary is NVLink when both stages share a
  node, else that boundary's own group: RDMA when both stages are on one RDMA island, else sockets.
- DP (distributed optimizer): per iteration a reduce-scatter of the stage's gradients
  (``grad_bytes`` = 4, or 2 with the job's ``training.gradReduceDtype: bfloat16``) and an
  all-gather of its parameters (``param_bytes`` = 2),
  ring cost ``bytes*(D-1)/D`` through each node's NICs (all T tensor-parallel DP groups of a node
  share them) and over NVLink inside a node, whichever is slower. Bandwidth-bound: per-message
  latency is ignored (buckets are tens of MB).
- Overlap: the overlapped optimizer starts reduce-scatter during the last micro-batch's backward
  and waits for the all-gather in the next first forward, hiding up to ``overlap_efficiency``
  (0.5: the collectives compete with compute for SMs and memory bandwidth) of those windows;
  ``overlap=False`` exposes all of it. Tied embeddings add an all-reduce of the embedding
  gradient between first and last stage (exposed).
- Bandwidth per node, Gbit/s (all NICs of a node together): from ``holmes.dev/nic-gbps`` or the
  NIC mapping's defaults (InfiniBand 200, RoCE 100, Ethernet 25). NCCL efficiency on RDMA:
  InfiniBand 0.9, RoCE 0.5 (congestion, PFC); sockets 0.6 of the TCP path, which is the host
  network (``socket_gbps`` = 25) for RDMA nodes and capped, across clusters, by the link of
  each pair of clusters (``fabric.links``, else ``cross_cluster_gbps`` = 25); a pipeline
  boundary between clusters also waits its link's one-way latency once per message.
- Calibration: with these defaults a 3.6B GPT (30 layers, h=3072, global batch 1024) on 4 nodes
  x 8 A100 is estimated at 199 / 160 / 121 TFLOPS/GPU on InfiniBand / RoCE / Ethernet, the
  paper's measured 197 / 160 / 122.
- Memory per GPU (checked against the trainer's dry run, holmes.trainer.dryrun, within 10% on
  the example jobs): weights + fp32 main grads (``param_bytes + 4``), per parameter of the DP
  shard the optimizer state (12 bytes) plus the fp32 reduced gradient, the all-gather's source
  copy and the weight-decay mask (``SHARD_EXTRA_BYTES + param_bytes``); torch's pipeline receive
  buffers, one activation and one gradient buffer per micro-batch held for the whole run
  (:meth:`StageCost.pipeline_buffers`); ``NCCL_COMMUNICATOR_BYTES`` per communicator, and on
  NVSwitch nodes where NVLS pays (``holmes.contract.nvls``) its buffers per communicator; and
  activations: with recomputation each layer keeps its input per
  in-flight micro-batch (``min(P - s, m)`` at stage s) plus one layer's full working set
  (Korthikanti et al. 2022: ``s b h (10 + 24/T + 5 a s / (h T))`` bytes for GPT; the llama terms
  in ``ModelCost.layer_activation_bytes_per_token``), twice while that layer's backward runs
  (its gradients coexist with it; the last stage's logits and their gradient are freed before);
  a candidate that needs
  more than ``memory_headroom`` x ``gpu_memory_gib`` is rejected. Without recomputation every
  layer keeps that full working set per in-flight micro-batch.
- Recomputation on or off comes from the job (``spec.training.activationRecompute``, what the
  trainer runs): :func:`.planner.plan` puts it into the config; ``CostModelConfig.activation_recompute``
  only matters when the cost model is driven without a job.
- Mixture of experts (``model.moe``, expert-parallel degree E; Megatron's layout: the experts of
  a layer split over E data-parallel ranks of a stage, each expert over the stage's tensor
  group): a layer computes its attention, router and the ``topk + shared`` experts each token
  passes through; each MoE layer all-to-alls its tokens twice per forward (dispatch, combine)
  and twice per backward (+2 with recomputation), ``tokens x topk x h`` bf16 per rank of which
  ``(E - e)/E`` leave the node (e of the group's ranks on the node), over NVLink inside a node
  and through the node's NICs on the group's own fabric (the planner keeps the group inside one
  island) otherwise; not overlapped with compute. Expert weights are split E x T ways, their
  gradients reduced and their optimizer state sharded over the D/E expert-data-parallel ranks.
  Tokens are assumed evenly routed (the load-balancing loss's aim; no token dropping).
- Optimizer step time, kernel launch overheads and stragglers are ignored (a pipeline schedule's
  per-action and per-message costs only where set: ``pipeline_action_seconds``, ``p2p_message_seconds``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from holmes.contract import host_memory
from holmes.contract.flops import ModelCost
from holmes.contract.spec_sections import GRAD_REDUCE_BYTES, AcrossIslandsSpec

from .discovery import NicMapping
from .topology import Fabric

MAIN_GRAD_BYTES = 4  # the trainer's gradient buffer is fp32
# Per parameter of a DP shard, besides fp32 master weights and moments (optimizer_bytes): the
# fp32 reduced-gradient shard, the model-dtype copy the all-gather sends, the weight-decay mask
# (trainer/holmes/trainer/dist_optimizer.py; the dry run measures them)
SHARD_EXTRA_BYTES = 4 + 1
# GPU memory of one NCCL communicator beyond tensors (its channels' buffers, FIFOs): a model,
# the same number as holmes.trainer.dryrun.recording.NCCL_COMMUNICATOR_BYTES (tests keep them equal)
NCCL_COMMUNICATOR_BYTES = 100 * 2**20
P2P_COMMUNICATORS = 2  # per p2p group: its own and its pair's (StageCost.communicators)
GBIT = 1e9 / 8  # bytes per second in one Gbit/s
OUTER_STATE_BYTES = 4  # the replicas' outer optimizer keeps fp32 anchors and momenta (trainer outer.py)
BACKWARD_WORKING_SETS = 2  # a recomputed layer's working set and its gradients (see memory())


@dataclass(frozen=True)
class GpuProduct:
    """One GPU product's dense bf16 peak and memory (a ``gpuProducts`` entry)."""

    peak_tflops: float
    memory_gib: float
    # NVLink per GPU, one direction, Gbit/s (None: the config's nvlinkGbps): inside a node and,
    # on rack-scale NVLink, across the nodes of one NVLink domain
    nvlink_gbps: float | None = None

    def __post_init__(self) -> None:
        for name in ("peak_tflops", "memory_gib"):
            if not getattr(self, name) > 0:
                raise ValueError(f"GpuProduct.{name} must be > 0, got {getattr(self, name)}")
        if self.nvlink_gbps is not None and not self.nvlink_gbps > 0:
            raise ValueError(f"GpuProduct.nvlink_gbps must be > 0, got {self.nvlink_gbps}")


@dataclass(frozen=True)
class CostModelConfig:
    gpu_peak_tflops: float = 312.0
    compute_efficiency: float = 0.66
    gpu_memory_gib: float = 80.0
    memory_headroom: float = 0.9
    nvlink_gbps: float = 2400.0  # per GPU, one direction (A100 NVLink3: 300 GB/s)
    fabric: Fabric = field(default_factory=Fabric)
    overlap: bool = True
    overlap_efficiency: float = 0.5
    grad_bytes: int = 4
    param_bytes: int = 2
    activation_bytes: int = 2
    optimizer_bytes: int = 12  # fp32 master weights + two Adam moments
    activation_recompute: bool = True  # fallback only: plan() uses the job's activationRecompute
    nic_mapping: NicMapping = field(default_factory=NicMapping)
    max_island_orders: int = 24  # island orders tried per (tensor, pipeline, data)
    # GPU types (plan/gpus.py): entries added to / overriding its built-in product table
    gpu_products: tuple[tuple[str, GpuProduct], ...] = ()
    # seconds a pipeline step loses per p2p message it waits for, beyond the bytes (the schedule's
    # host-side step, the wait); 0 ignores it. It ranks schedules with virtual stages, whose GPUs
    # wait on v times the messages (plan/schedule_choice.py); bench/pipeline_schedules.py measures it
    p2p_message_seconds: float = 0.0
    # seconds each pipeline schedule action costs a GPU beyond its FLOPs: a chunk's forward, its
    # backward, or under a split backward its input- and weight-gradient passes (the schedule
    # runtime's host step, the hooks, a paused rank's wake-up); 0 ignores it. It ranks schedules
    # by how many actions they run: v chunks per GPU run v times 1F1B's, a split backward 3 per
    # chunk instead of 2 (plan/schedule_choice.py); bench/pipeline_schedules.py measures it
    pipeline_action_seconds: float = 0.0
    # a split backward's input- plus weight-gradient passes over one full backward (zero-bubble
    # schedules). 1.0, the default, is the zero-bubble papers' premise on GPUs: the two passes
    # are the full backward's matmuls, split. On CPU torch's two autograd passes can cost more;
    # bench/pipeline_schedules.py measures it on one block
    split_backward_ratio: float = 1.0

    def __post_init__(self) -> None:
        for name in (
            "gpu_peak_tflops",
            "compute_efficiency",
            "gpu_memory_gib",
            "nvlink_gbps",
            "split_backward_ratio",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"CostModelConfig.{name} must be > 0, got {getattr(self, name)}")
        for name in ("p2p_message_seconds", "pipeline_action_seconds"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"CostModelConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.overlap_efficiency <= 1:
            raise ValueError(
                f"CostModelConfig.overlap_efficiency must be in [0, 1], got {self.overlap_efficiency}"
            )

    @property
    def flops_per_second(self) -> float:
        return self.gpu_peak_tflops * 1e12 * self.compute_efficiency


# ---- per-stage costs ------------------------------------------------------------------------


@dataclass(frozen=True)
class StagePlace:
    """Where a stage runs, as far as its costs go (layer count excluded)."""

    index: int
    first: bool
    last: bool
    dp_gbps: float | None  # achieved per-node bandwidth of its DP groups; None = inside one node
    p2p_in: float  # seconds per micro-batch for the boundary before it (0 for stage 0)
    p2p_out: float
    inflight: int  # micro-batches whose activations are alive at once (1F1B)
    embedding_sync: float = 0.0  # seconds: tied-embedding gradient all-reduce (first/last stage)
    # a mixture of experts: achieved per-node bandwidth of its expert groups' fabric (None: each
    # group inside one node, on NVLink) and how many of a group's ranks share a node
    ep_gbps: float | None = None
    ep_ranks_per_node: int = 1
    nvls_bytes: float = 0.0  # NVLink SHARP's buffers on this stage's GPUs (holmes.contract.nvls)


@dataclass(frozen=True)
class Shape:
    """What every stage shares: the job's degrees and batch."""

    tensor: int
    data: int
    pipeline: int
    micro_batch: int
    micro_batches: int
    sequence_parallel: bool = False  # the job's parallelism.sequenceParallel
    expert: int = 1  # expert-parallel degree (a mixture of experts; divides data)
    ranks_per_node: int = 1  # GPUs of this job on one node (they share its NICs)
    outer_shard_bytes: float = 0.0  # replicas: the outer optimizer's per shard parameter (outer_bytes)
    outer_communicators: int = 0  # replicas: the outer group's communicator


def outer_bytes(spec: AcrossIslandsSpec) -> float:
    """Per parameter of a DP shard, what a replica's outer optimizer holds on the GPU all along
    (acrossIslands.mode replicas; trainer outer.py, measured by the dry run): the fp32 anchor,
    the fp32 Nesterov momentum when outerMomentum > 0 and, with overlapSteps, the exchange in
    flight (one fragment of the shard on the exchange dtype, held across the steps it overlaps,
    activations' peak included). 0 for a job that is not replicas."""
    if spec.mode != "replicas":
        return 0.0
    held: float = OUTER_STATE_BYTES * (1 + (spec.outer_momentum > 0))
    if spec.overlap_steps:
        held += GRAD_REDUCE_BYTES[spec.exchange_dtype] / spec.fragments
    return held


class StageCost:
    """Costs of one stage as a function of its layer count (the adaptive partition's input)."""

    def __init__(self, model: ModelCost, shape: Shape, place: StagePlace, cfg: CostModelConfig):
        self.model, self.shape, self.place, self.cfg = model, shape, place, cfg
        T, mb = shape.tensor, shape.micro_batch
        tokens = mb * model.seq
        rate = cfg.flops_per_second
        act = tokens * model.hidden * cfg.activation_bytes
        self.nvlink = nvlink = cfg.nvlink_gbps * GBIT  # bytes/s per GPU
        tp_allreduce = 0.0 if T == 1 else 2 * (T - 1) / T * act / nvlink
        recompute = 1 if cfg.activation_recompute else 0
        f = tokens * model.layer_fwd_flops_per_token() / T / rate
        self.layer_fwd = f + 2 * tp_allreduce
        self.layer_bwd = 2 * f + 2 * tp_allreduce + recompute * (f + 2 * tp_allreduce)
        self.a2a = self.all_to_all_seconds()
        self.layer_fwd += 2 * self.a2a  # dispatch and combine
        self.layer_bwd += (2 + 2 * recompute) * self.a2a
        hf = tokens * model.head_fwd_flops_per_token() / T / rate if place.last else 0.0
        self.head_fwd, self.head_bwd = hf, 2 * hf
        self.extra_params = (
            (model.embedding_params if place.first else 0)
            + (model.head_params if place.last else 0)
            + (model.vocab * model.hidden if place.last and model.tied and not place.first else 0)
        )
        self.mem_cap = cfg.gpu_memory_gib * 2**30 * cfg.memory_headroom
        self._layer_params, self._expert_layer_params = model.layer_params, model.expert_layer_params
        # what the partition search asks of each layer count again and again, remembered (the
        # inputs above do not change after construction)
        self._terms: dict[int, tuple[float, float, float, float]] = {}
        self._memory: dict[int, float] = {}

    def terms(self, n: int) -> tuple[float, float, float, float]:
        """(step, forward + backward, exposed DP, backward) of n layers: what :func:`timeline`
        adds up, worked out once per layer count."""
        t = self._terms.get(n)
        if t is None:
            t = self._terms[n] = (self.step(n), self.fwd(n) + self.bwd(n), self.dp_exposed(n), self.bwd(n))
        return t

    def all_to_all_seconds(self) -> float:
        """One all-to-all of one MoE layer for one micro-batch (0 without expert parallelism)."""
        m, s, place = self.model, self.shape, self.place
        E = s.expert
        if not m.moe or E == 1:
            return 0.0
        tokens = s.micro_batch * m.seq / (s.tensor if s.sequence_parallel else 1)
        sent = tokens * m.experts_per_token * m.hidden * self.cfg.activation_bytes * (E - 1) / E
        inside = sent / self.nvlink
        if place.ep_gbps is None:
            return inside
        off_node = (E - place.ep_ranks_per_node) / (E - 1)  # of what a rank sends
        through_nics = s.ranks_per_node * sent * off_node / (place.ep_gbps * GBIT)
        return max(inside, through_nics)

    def all_to_all(self, n: int) -> float:
        """All-to-all seconds per iteration of n layers (forward, backward, recomputation)."""
        passes = 4 + 2 * self.cfg.activation_recompute
        return self.shape.micro_batches * n * passes * self.a2a

    # per micro-batch
    def fwd(self, n: int) -> float:
        return n * self.layer_fwd + self.head_fwd

    def bwd(self, n: int) -> float:
        return n * self.layer_bwd + self.head_bwd

    def step(self, n: int) -> float:
        """Steady-state 1F1B step: one forward, one backward, the p2p on both sides."""
        return self.fwd(n) + self.bwd(n) + self.place.p2p_in + self.place.p2p_out

    def params(self, n: int) -> int:
        return n * self._layer_params + self.extra_params

    def expert_params(self, n: int) -> int:
        """The routed experts among params(n): split over the expert group, not replicated."""
        return n * self._expert_layer_params

    def dp_times(self, n: int) -> tuple[float, float]:
        """(reduce-scatter, all-gather) seconds per iteration for this stage's DP groups."""
        D, T, E = self.shape.data, self.shape.tensor, self.shape.expert
        e = self.expert_params(n)
        p = self.params(n) - e
        cfg = self.cfg

        def t(nbytes: float, group: int, split: int) -> float:
            """A ring over ``group`` DP ranks of a tensor of ``nbytes`` split ``split`` ways."""
            if group == 1 or nbytes == 0:
                return 0.0
            ring = (group - 1) / group
            inside = nbytes / split * ring / self.nvlink  # each GPU's share over NVLink
            if self.place.dp_gbps is None:
                return inside
            # the node's NICs carry one replica's worth (all its tensor groups share them), or
            # the slices it holds when one replica spans nodes (experts over E x T > node GPUs)
            on_node = min(1.0, self.shape.ranks_per_node / split) if split > T else 1.0
            through_nics = nbytes * on_node * ring / (self.place.dp_gbps * GBIT)
            return max(inside, through_nics)

        # the dense part over the D ranks, the experts over the D/E expert-data-parallel ranks
        rs = t(p * cfg.grad_bytes, D, T) + t(e * cfg.grad_bytes, D // E, E * T)
        ag = t(p * cfg.param_bytes, D, T) + t(e * cfg.param_bytes, D // E, E * T)
        return rs, ag

    def dp_exposed(self, n: int) -> float:
        rs, ag = self.dp_times(n)
        if self.cfg.overlap:
            e = self.cfg.overlap_efficiency
            rs = max(0.0, rs - e * self.bwd(n))
            ag = max(0.0, ag - e * self.fwd(n))
        return rs + ag + self.place.embedding_sync

    def busy(self, n: int) -> float:
        """Per-iteration time this stage is busy: what the adaptive partition balances."""
        if self.memory(n) > self.mem_cap:
            return float("inf")
        step, _, exposed, _ = self.terms(n)
        return self.shape.micro_batches * step + exposed

    def communicators(self) -> int:
        """NCCL communicators a GPU of this stage holds: world (the grad norm), dp, tp, two for
        the p2p group of each boundary it sits on, the tied embedding's group, the expert group
        and its expert-data-parallel group, and a replica's outer group (one replica alone has
        none: it is counted all the same, 0.1 GiB over). Two per boundary: the group's own (the
        fabric preflight's probe, 1F1B's mixed send-and-receive batches) and the pair's that
        torch 2.13's ``_batch_p2p`` sends all-send or all-recv batches on, one op at a time
        (ProcessGroupNCCL keys a lone send or recv by the pair)."""
        s, place = self.shape, self.place
        tied = self.model.tied and s.pipeline > 1 and (place.first or place.last)
        experts = (s.expert > 1) + (s.expert > 1 and s.data > s.expert)
        boundaries = (not place.first) + (not place.last)
        groups = 1 + (s.data > 1) + (s.tensor > 1) + P2P_COMMUNICATORS * boundaries
        return groups + tied + experts + s.outer_communicators

    def shard_bytes(self) -> float:
        """Per parameter of a distributed-optimizer shard: optimizer state and the extras."""
        cfg = self.cfg
        shard = cfg.optimizer_bytes + SHARD_EXTRA_BYTES + cfg.param_bytes + self.shape.outer_shard_bytes
        # the trainer accumulates into an fp32 gradient buffer whatever dtype it reduces in
        if cfg.grad_bytes != MAIN_GRAD_BYTES and self.shape.data > 1:
            shard += cfg.grad_bytes  # the reduced shard, in the reduce dtype
        return shard

    def checkpoint_staging(self, n: int) -> float:
        """Host bytes per GPU an asynchronous checkpoint stages for a stage of n layers
        (holmes.contract.host_memory): 1/D of the stage's weights on this tensor-parallel rank
        and the optimizer shard's state (a replica's outer state too); experts: 1/(D/E) of
        this rank's and their shard."""
        s, cfg = self.shape, self.cfg
        p = (self.params(n) - self.expert_params(n)) / s.tensor
        shard = host_memory.SHARD_STATE_BYTES + self.shape.outer_shard_bytes
        out = host_memory.staging_bytes(p, s.data, cfg.param_bytes, p / s.data, shard)
        e = self.expert_params(n) / (s.tensor * s.expert)
        if e:
            d = s.data // s.expert
            out += host_memory.staging_bytes(e, d, cfg.param_bytes, e / d, shard)
        return out

    def expert_memory(self, n: int) -> float:
        """Bytes per GPU of n layers' routed experts: this GPU's slice (E x T ways) in weights and
        fp32 gradients, its optimizer shard over the D/E expert-data-parallel ranks."""
        s, cfg = self.shape, self.cfg
        e = self.expert_params(n) / (s.tensor * s.expert)
        return e * (cfg.param_bytes + MAIN_GRAD_BYTES) + e * self.shard_bytes() / (s.data // s.expert)

    def pipeline_buffers(self) -> float:
        """torch's PipelineStage allocates one receive buffer per micro-batch for the whole run
        (pipelining/stage.py, _setup_forward_recv_info / _create_grad_recv_info): activations in
        on every stage but the first, their gradients on every stage but the last. Each is the
        activation crossing a boundary: [mb, s/T (sequence parallel) or s, h], bf16."""
        m, s = self.model, self.shape
        sp = s.tensor if s.sequence_parallel else 1
        one = s.micro_batch * m.seq / sp * m.hidden * self.cfg.activation_bytes
        return s.micro_batches * one * ((not self.place.first) + (not self.place.last))

    def memory_floor(self, n: int) -> float:
        """Less than any stage of ``n`` or more layers needs under this shape, wherever it sits:
        :meth:`memory` without what only some positions hold (embedding and head, logits, receive
        buffers, communicators) and with one micro-batch in flight. The search drops a degree
        choice whose fullest stage cannot fit by this alone before it looks at a single node."""
        return self.memory(n) - self.pipeline_buffers() - self.communicators() * NCCL_COMMUNICATOR_BYTES

    def memory(self, n: int) -> float:
        """Bytes per GPU of a stage of n layers (module docstring), remembered per n."""
        mem = self._memory.get(n)
        if mem is None:
            mem = self._memory[n] = self._memory_of(n)
        return mem

    def _memory_of(self, n: int) -> float:
        m, s = self.model, self.shape
        T, D = s.tensor, s.data
        cfg = self.cfg
        p = (self.params(n) - self.expert_params(n)) / T
        static = p * (cfg.param_bytes + MAIN_GRAD_BYTES) + p * self.shard_bytes() / D
        static += self.expert_memory(n)
        static += self.pipeline_buffers() + self.communicators() * NCCL_COMMUNICATOR_BYTES
        static += self.place.nvls_bytes
        b, seq, h, a = s.micro_batch, m.seq, m.hidden, m.heads
        shared, split = m.layer_activation_bytes_per_token()
        sp = T if s.sequence_parallel else 1  # the norm regions and each layer's input, split too
        full_layer = seq * b * (shared / sp + split / T + 5 * a * seq / T)
        inflight = min(self.place.inflight, s.micro_batches)
        # the loss's logits and their gradient (last stage) are gone before the layers' backward
        logits = b * seq * m.vocab / T * 4 * 2 if self.place.last else 0.0
        if cfg.activation_recompute:
            # a layer's backward holds its recomputed working set and the gradients of its
            # largest tensors at once: twice the forward figure, as the dry run measures
            # (gpt-7b: 6.6 GiB against 3.6)
            kept = n * inflight * seq * b * h * cfg.activation_bytes / sp
            acts = kept + max(BACKWARD_WORKING_SETS * full_layer, logits)
        else:
            acts = n * inflight * full_layer + logits
        return static + acts


@dataclass(frozen=True)
class StageEstimate:
    index: int
    layers: int
    compute: float  # seconds per iteration: m * (fwd + bwd), the all-to-all left out
    p2p: float  # seconds per iteration: m * (p2p in + out)
    bubble: float  # idle seconds inside the pipeline (warm-up / cool-down / waiting on slower stages)
    dp_comm: float  # reduce-scatter + all-gather, seconds
    dp_exposed: float  # the part not hidden by overlap
    finish: float  # when this stage is done with the iteration
    memory_gib: float
    all_to_all: float = 0.0  # seconds per iteration: the experts' all-to-all (inside compute)


class Timeline(NamedTuple):
    """One partition's iteration on the cost model's clock (see the module docstring)."""

    seconds: float  # the iteration: the latest stage finish
    finishes: list[float]  # per stage: when it is done (pipeline - backward chain + exposed DP)
    steps: list[float]  # per stage: steady 1F1B step
    pipeline: float  # (m-1) * slowest step + warm-up/cool-down
    exposed: list[float]  # per stage: exposed DP communication


def timeline(costs: Sequence[StageCost], layers: Sequence[int]) -> Timeline:
    m = costs[0].shape.micro_batches
    terms = [c.terms(n) for c, n in zip(costs, layers)]
    steps = [t[0] for t in terms]
    t_pp = (m - 1) * max(steps) + sum(t[1] for t in terms) + 2 * sum(c.place.p2p_out for c in costs[:-1])
    exposed = [t[2] for t in terms]
    finishes, chain = [], 0.0  # chain: backward path from stage s back to stage 0
    for c, t, e in zip(costs, terms, exposed):
        finishes.append(t_pp - chain + e)
        chain += t[3] + c.place.p2p_out
    return Timeline(max(finishes), finishes, steps, t_pp, exposed)


def iteration_seconds(costs: Sequence[StageCost], layers: Sequence[int]) -> float:
    return timeline(costs, layers).seconds


def fits(costs: Sequence[StageCost], layers: Sequence[int]) -> bool:
    """Every stage's memory within its cap."""
    return all(c.memory(n) <= c.mem_cap for c, n in zip(costs, layers))


def estimate_pipeline(costs: Sequence[StageCost], layers: Sequence[int]) -> tuple[float, list[StageEstimate]]:
    """Iteration seconds and per-stage breakdown for a partition (see module docstring)."""
    m = costs[0].shape.micro_batches
    tl = timeline(costs, layers)
    out = []
    for s, (c, n) in enumerate(zip(costs, layers)):
        rs, ag = c.dp_times(n)
        out.append(
            StageEstimate(
                index=s,
                layers=n,
                compute=m * (c.fwd(n) + c.bwd(n)) - c.all_to_all(n),
                p2p=m * (c.place.p2p_in + c.place.p2p_out),
                bubble=max(0.0, tl.pipeline - m * tl.steps[s]),
                dp_comm=rs + ag,
                dp_exposed=tl.exposed[s],
                finish=tl.finishes[s],
                memory_gib=c.memory(n) / 2**30,
                all_to_all=c.all_to_all(n),
            )
        )
    return tl.seconds, out


def refine_partition(
    costs: Sequence[StageCost], layers: Sequence[int], max_moves: int = 10_000
) -> tuple[int, ...]:
    """Move single layers away from the stages that set the iteration time (the slowest steady
    step, the latest finisher) while the full estimate improves: the min-max partition cannot see
    the pipeline fill/drain or the DP time later stages hide behind the backward chain.
    Best improvement first, lowest indices on ties: deterministic."""
    cur = list(layers)
    best, finishes, steps, _, _ = timeline(costs, cur)
    P = len(cur)
    for _ in range(max_moves):
        donors = sorted(
            {max(range(P), key=lambda s: (steps[s], -s)), max(range(P), key=lambda s: (finishes[s], -s))}
        )
        move = None
        for i in donors:
            if cur[i] == 1:
                continue
            for j in range(P):
                if j == i:
                    continue
                cur[i] -= 1
                cur[j] += 1
                if (
                    costs[i].memory(cur[i]) <= costs[i].mem_cap
                    and costs[j].memory(cur[j]) <= costs[j].mem_cap
                ):
                    t = iteration_seconds(costs, cur)
                    if t < best * (1 - 1e-12) and (move is None or t < move[0]):
                        move = (t, i, j)
                cur[i] += 1
                cur[j] -= 1
        if move is None:
            break
        _, i, j = move
        cur[i] -= 1
        cur[j] += 1
        best, finishes, steps, _, _ = timeline(costs, cur)
    return tuple(cur)
