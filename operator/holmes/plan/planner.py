"""Layout search: which nodes form which pipeline stage, in which order, with how many layers.

Steps (all deterministic):

1. Classify the nodes (:mod:`.discovery`); keep those the job's selector matches, with enough
   allocatable GPUs, Ready, not cordoned, and without classification problems.
2. Enumerate (tensor, pipeline, data): tensor divides gpusPerNode (or, on nodes of an NVLink
   domain, is a multiple of it that the largest domain holds: :mod:`.nvlink`) and whatever the trainer
   splits over it (heads, KV heads, FFN width, vocabulary, the sequence with
   sequenceParallel: ``tensor_parallel_problems``); what the spec
   fixes is kept; a stage is a whole number of nodes or a whole fraction of one node; the
   global batch splits into an integer number of micro-batches per DP rank, at least one per
   stage (1F1B needs m >= pipeline). A mixture of experts adds the expert-parallel degree E:
   it divides data and the experts; an expert group (E x tensor consecutive ranks of a stage)
   is a whole fraction of a node or whole nodes, and must lie on one island (step 4).
3. Place stages (``nicSelection: auto``): nodes are grouped by island (cluster x NIC kind) and
   each island filled with whole stages, so a stage's DP groups stay on one NIC kind whenever
   island sizes allow; leftover nodes form mixed stages (sockets). Island groups are tried in
   every order (up to ``max_island_orders``; heuristic orders beyond). ``nicSelection: off``
   is Megatron's default: nodes in name order. Tensor groups wider than a node take whole
   groups' worth of nodes of one NVLink domain each, never two (:mod:`.nvlink`).
4. Partition the layers (:mod:`.partition`) and estimate the iteration (:mod:`.costmodel`);
   keep the fastest candidate.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from holmes.contract import host_memory, nvls
from holmes.contract import pipeline_schedules as sched
from holmes.contract.flops import ModelCost, tflops_per_gpu
from holmes.contract.jobspec import JobSpec, SpecError, load_job, tensor_parallel_problems
from holmes.contract.layout import LAYOUT_VERSION, NVLINK_VERSION, VIRTUAL_VERSION, GroupFamily, Layout, Stage
from holmes.contract.network import island_settings
from holmes.contract.spec_sections import AUTO

from . import nvlink, schedule_choice
from . import partition as parts_mod
from .budget import Budget
from .candidate import Candidate, Degrees
from .costmodel import (
    GBIT,
    CostModelConfig,
    Shape,
    StageCost,
    StagePlace,
    estimate_pipeline,
    fits,
    iteration_seconds,
    outer_bytes,
    refine_partition,
)
from .discovery import NodeNic, classify_nodes, why_unusable
from .errors import InsufficientNodes, PlanError
from .explain import explanation_lines
from .gpus import NodeGpu, StageGpu, node_gpu, node_gpus, stage_gpu_of
from .nccl import fixed_socket_threads
from .topology import NodeSet, group_bandwidth_gbps, islands_of, link_latency_s, merge, summarize

_NAME = operator.attrgetter("name")


def as_job(job: JobSpec | Mapping[str, Any]) -> JobSpec:
    """A JobSpec as is; a manifest or spec mapping through the contract's one parser."""
    return job if isinstance(job, JobSpec) else load_job(job)


def for_job(cfg: CostModelConfig, job: JobSpec) -> CostModelConfig:
    """The config with what the job decides: whether the trainer recomputes activations, and
    the dtype its gradients are reduce-scattered in (the cost model's time and memory follow
    them; the job wins over the config's fallbacks)."""
    t = job.training
    if (cfg.activation_recompute, cfg.grad_bytes) == (t.activation_recompute, t.grad_reduce_bytes):
        return cfg
    return replace(cfg, activation_recompute=t.activation_recompute, grad_bytes=t.grad_reduce_bytes)


def outer_shape(job: JobSpec) -> tuple[float, int]:
    """Shape's outer_shard_bytes and outer_communicators: a job that trains as replicas holds
    the outer optimizer's state and the outer group's communicator on every GPU."""
    spec = job.training.across_islands
    return outer_bytes(spec), int(spec.mode == "replicas")


# ---- 1. node selection ------------------------------------------------------------------------


def with_job_network(nics: Sequence[NodeNic], job: JobSpec) -> list[NodeNic]:
    """The nodes with what the job says of their network: each island's vendor net plugin
    (spec.islands) and socket threads the template fixes (its env wins over Holmes')."""
    fixed = fixed_socket_threads(job.template)
    out = []
    for n in nics:
        _, entry = island_settings(job.islands, n.cluster, n.nic)
        plugin = entry.net_plugin if entry is not None else None
        out.append(
            n
            if (plugin, fixed) == (None, (None, None))
            else replace(n, net_plugin=plugin, socket_fixed=fixed)
        )
    return out


def select_nodes(nodes: Sequence[Any], job: JobSpec, cfg: CostModelConfig) -> list[NodeNic]:
    """The nodes this job may use, sorted by name; InsufficientNodes when fewer than count."""
    mapping = cfg.nic_mapping.with_cluster_label(job.nodes.cluster_label)
    nics = with_job_network(classify_nodes(nodes, mapping), job)
    sel = job.nodes.selector
    G = job.nodes.gpus_per_node
    matched = [n for n in nics if sel is None or sel.matches(n.labels)]
    usable, few_gpus, broken = [], [], []
    for n in matched:
        if n.gpus < G:
            few_gpus.append(n)
        elif not n.usable:
            broken.append(n)
        else:
            usable.append(n)
    names = [n.name for n in usable]
    dupes = sorted({x for x in names if names.count(x) > 1}) if len(set(names)) != len(names) else []
    if dupes:
        raise PlanError(f"node names appear twice in the node list: {', '.join(dupes[:5])}")
    usable.sort(key=lambda n: n.name)
    need = job.nodes.count
    if len(usable) >= need:
        return usable
    kinds: dict[str, int] = {}
    for n in usable:
        kinds[n.nic] = kinds.get(n.nic, 0) + 1
    have = ", ".join(f"{c} {k}" for k, c in sorted(kinds.items()))
    where = f" matching {sel.describe()}" if sel is not None else ""
    msg = [
        f"needs {need} nodes with {G} nvidia.com/gpu{where}; have {len(usable)}"
        + (f": {have}" if have else "")
    ]
    if sel is not None and len(matched) < len(nics):
        msg.append(f"{len(nics) - len(matched)} node(s) do not match the selector")
    if few_gpus:
        msg.append(
            f"{len(few_gpus)} node(s) have fewer than {G} allocatable nvidia.com/gpu: "
            + ", ".join(f"{n.name} ({n.gpus})" for n in few_gpus[:5])
            + (" ..." if len(few_gpus) > 5 else "")
        )
    for n in broken[:5]:
        msg.append(f"node {n.name} is not usable: {why_unusable(n)}")
    if len(broken) > 5:
        msg.append(f"... and {len(broken) - 5} more unusable nodes")
    msg.append(
        f"add nodes, fix the ones listed, or lower nodes.count to {len(usable)}"
        if usable
        else "add nodes, fix the ones listed, or change nodes.selector"
    )
    raise InsufficientNodes("; ".join(msg))


# ---- 2. degrees -------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def degree_candidates(job: JobSpec, domain_nodes: int = 1) -> list[Degrees]:
    """The degrees to cost; ``domain_nodes``: the largest NVLink domain's nodes (1: none), whose
    multiples of gpusPerNode a tensor: auto tries too."""
    m, t, p = job.model, job.training, job.parallelism
    G, N = job.nodes.gpus_per_node, job.nodes.count
    W = G * N
    tensors = (
        [p.tensor]
        if isinstance(p.tensor, int)
        else [
            x
            for x in _divisors(G) + nvlink.tensor_widths(G, domain_nodes)
            if not tensor_parallel_problems(m, x, p.sequence_parallel)
        ]
    )
    if m.moe is not None and not p.sequence_parallel:
        tensors = [x for x in tensors if x == 1]  # MoE layers need sequence parallelism with tensor
    explicit = p.explicit_partition
    out: list[Degrees] = []
    problems: list[str] = []
    for T in tensors:
        if W % T:
            continue
        if explicit is not None:
            pipes = [len(explicit)]
        elif isinstance(p.pipeline, int):
            pipes = [p.pipeline]
        else:
            pipes = [x for x in _divisors(W // T) if x <= m.layers]
        for P in pipes:
            label = f"tensor {T} x pipeline {P}"
            if (W // T) % P:
                problems.append(f"{label}: does not divide {W} GPUs")
                continue
            D = W // (T * P)
            label += f" x data {D}"
            if isinstance(p.data, int) and D != p.data:
                problems.append(f"{label}: data is fixed to {p.data}")
                continue
            if P > m.layers:
                problems.append(f"{label}: more stages than the {m.layers} layers")
                continue
            R = D * T
            if R % G and G % R:
                problems.append(
                    f"{label}: a stage has {R} GPUs, neither a multiple nor a divisor of gpusPerNode {G}"
                )
                continue
            per_step = D * t.micro_batch_size
            if t.global_batch_size % per_step:
                problems.append(
                    f"{label}: globalBatchSize {t.global_batch_size} is not divisible by "
                    f"data*microBatchSize = {per_step}"
                )
                continue
            mb = t.global_batch_size // per_step
            if mb < P:
                problems.append(
                    f"{label}: {mb} micro-batches per iteration < {P} stages (1F1B needs at least "
                    f"one per stage)"
                )
                continue
            for E in expert_candidates(job, T, D, problems, label):
                out.append(Degrees(T, P, D, mb, E))
    if not out:
        fixed = {
            k: v for k, v in (("tensor", p.tensor), ("pipeline", p.pipeline), ("data", p.data)) if v != AUTO
        }
        head = f"no (tensor, pipeline, data) fits {N} nodes x {G} GPUs = {W} GPUs" + (
            f" with {', '.join(f'{k}={v}' for k, v in fixed.items())}" if fixed else ""
        )
        shown = problems[:6] + ([f"... {len(problems) - 6} more"] if len(problems) > 6 else [])
        fix = (
            "fix: make globalBatchSize a multiple of data*microBatchSize with at least pipeline "
            "micro-batches per DP rank, or change the fixed degrees / nodes.count"
        )
        raise PlanError(head + ": " + "; ".join(shown) + "; " + fix)
    return out


def expert_candidates(job: JobSpec, T: int, D: int, problems: list[str], label: str) -> list[int]:
    """Expert-parallel degrees for (T, D): 1 for a dense model; else those dividing the experts
    and D whose group of E x T ranks is a whole fraction of a node or whole nodes."""
    moe, G = job.model.moe, job.nodes.gpus_per_node
    if moe is None:
        return [1]
    given = job.parallelism.expert
    out = []
    for E in [given] if isinstance(given, int) else _divisors(D):
        why = ""
        if D % E:
            why = f"expert {E} does not divide data {D}"
        elif moe.experts % E:
            why = f"expert {E} does not divide the {moe.experts} experts"
        elif (E * T) % G and G % (E * T):
            why = f"an expert group of {E * T} GPUs is neither a multiple nor a divisor of gpusPerNode {G}"
        if why:
            problems.append(f"{label}: {why}")
        else:
            out.append(E)
    return out


# ---- 3. placement -----------------------------------------------------------------------------


def _island_speed(nodes: Sequence[NodeNic], cfg: CostModelConfig) -> float:
    return group_bandwidth_gbps(summarize(nodes, cfg.fabric), cfg.fabric)


IslandParts = list[list[tuple[NodeNic, ...]]]  # per island, fastest first: its nodes by GPU type


def island_parts(
    usable: Sequence[NodeNic], cfg: CostModelConfig, gpus: Mapping[str, NodeGpu] | None = None
) -> IslandParts:
    """The islands, fastest first, each split by GPU type (fastest type first): what
    :func:`arrange_groups` cuts into blocks, the same for every block size (the search works it
    out once). ``gpus``: each node's GPU by name (:func:`holmes.plan.gpus.node_gpus`)."""
    gpus = gpus if gpus is not None else node_gpus(usable, cfg)
    islands = sorted(islands_of(usable), key=lambda i: (-_island_speed(i.nodes, cfg), i.name))
    return [_by_gpu_type(isl.nodes, gpus) for isl in islands]


def arrange_groups(
    usable: Sequence[NodeNic], count: int, block: int, cfg: CostModelConfig, parts: IslandParts | None = None
) -> list[list[tuple[NodeNic, ...]]]:
    """Choose ``count`` nodes and cut them into blocks of ``block`` nodes, grouped by island:
    whole blocks inside one island first (fastest islands first), leftovers as mixed blocks.
    ``parts``: :func:`island_parts` of ``usable`` when the caller has it."""
    blocks_needed = count // block
    groups: list[list[tuple[NodeNic, ...]]] = []
    leftovers: list[NodeNic] = []
    for by_type in parts if parts is not None else island_parts(usable, cfg):
        # GPU types apart inside an island (a DP group runs at its slowest GPU), fastest first;
        # what is left of each type may still share a block with another type of this island
        rest: list[NodeNic] = []
        for part in by_type:
            take = min(len(part) // block, blocks_needed - sum(len(g) for g in groups))
            if take > 0:
                groups.append([part[i * block : (i + 1) * block] for i in range(take)])
            rest.extend(part[max(0, take) * block :])
        take = min(len(rest) // block, blocks_needed - sum(len(g) for g in groups))
        if take > 0:
            groups.append([tuple(rest[i * block : (i + 1) * block]) for i in range(take)])
        leftovers.extend(rest[max(0, take) * block :])
    missing = blocks_needed - sum(len(g) for g in groups)
    if missing:
        rest = leftovers[: missing * block]
        groups.append([tuple(rest[i * block : (i + 1) * block]) for i in range(missing)])
    return groups


def _by_gpu_type(nodes: Sequence[NodeNic], gpus: Mapping[str, NodeGpu]) -> list[tuple[NodeNic, ...]]:
    """An island's nodes split by GPU type, fastest type first (one part without GFD labels)."""
    parts: dict[tuple[float, float, str], list[NodeNic]] = {}
    for n in nodes:
        g = gpus[n.name]
        parts.setdefault((-g.peak_tflops, -g.memory_gib, g.name), []).append(n)
    return [tuple(parts[k]) for k in sorted(parts)]


def island_orders(groups: Sequence[list[tuple[NodeNic, ...]]], cfg: CostModelConfig) -> list[tuple[int, ...]]:
    """Orders in which to place the island groups: all of them while there are few, else the
    given order, by cluster, and both reversed."""
    base = tuple(range(len(groups)))
    if math.factorial(len(groups)) <= cfg.max_island_orders:
        return list(itertools.permutations(base))
    by_cluster = tuple(sorted(base, key=lambda g: (sorted(n.cluster for n in groups[g][0])[0], g)))
    cands = [base, base[::-1], by_cluster, by_cluster[::-1]]
    return list(dict.fromkeys(cands))


# ---- 4. evaluation ----------------------------------------------------------------------------


def cost_placement(
    job: JobSpec,
    deg: Degrees,
    nodes: Sequence[NodeNic],
    model: ModelCost,
    cfg: CostModelConfig,
    stage_cache: dict[tuple[str, ...], tuple[NodeSet, StageGpu]],
    refine: bool = False,
    gpus: Mapping[str, NodeGpu] | None = None,
) -> Candidate | str:
    """Cost one placement (nodes in rank order); a string says why it is impossible.
    ``stage_cache``: each stage's node set and GPUs by its nodes' names (stages recur across
    candidates; summarising them is what the search's cost grows with on many nodes).
    ``gpus``: each node's GPU by name where the caller worked them out (:func:`node_gpus`)."""
    G = job.nodes.gpus_per_node
    T, P, D = deg.tensor, deg.pipeline, deg.data
    if T > G and (why := nvlink.group_problem(nodes, T // G)):
        return f"tensor {T} x pipeline {P} x data {D}: {why}"
    R = D * T
    per_node = max(1, G // R)  # stages per node
    span = max(1, R // G)  # nodes per stage
    stage_nodes = [tuple(nodes[(s // per_node) * span : (s // per_node) * span + span]) for s in range(P)]
    sets, gpus_of = [], []
    for sn in stage_nodes:
        key = tuple(map(_NAME, sn))
        if key not in stage_cache:
            of = [gpus[n] for n in key] if gpus is not None else [node_gpu(n, cfg) for n in sn]
            stage_cache[key] = (summarize(sn, cfg.fabric), stage_gpu_of(of))
        sets.append(stage_cache[key][0])
        gpus_of.append(stage_cache[key][1])
    everything = sets[0]
    for other in sets[1:]:
        everything = merge(everything, other)
    pp_net = everything.net if P > 1 else sets[0].net
    world_net = everything.net  # the control-plane collectives span every rank
    # each stage boundary on its own group: IB when both stages share one RDMA island
    p2p_nets = tuple(merge(sets[s], sets[s + 1]).net for s in range(P - 1))
    tied = model.tied and P > 1
    ends = merge(sets[0], sets[-1])  # the embedding group's nodes (tied, P > 1)
    emb_net = ends.net if tied else None
    sp = job.parallelism.sequence_parallel
    E = deg.expert
    shape = Shape(
        T, D, P, job.training.micro_batch_size, deg.micro_batches, sp, E, min(R, G), *outer_shape(job)
    )
    ranks_on_node = min(R, G)
    # NVLink per GPU of each stage (its GPUs' table entry, else the config's): inside a node, and
    # among the nodes of one NVLink domain (nvlink.py)
    nv_gbps = [g.nvlink_gbps or cfg.nvlink_gbps for g in gpus_of]
    expert_fabric = expert_groups(
        stage_nodes, E * T, G, cfg, [nvlink.node_gbps(ranks_on_node, x) for x in nv_gbps]
    )
    if isinstance(expert_fabric, str):
        return f"tensor {T} x pipeline {P} x data {D} x expert {E}: {expert_fabric}"
    act = shape.micro_batch * model.seq * model.hidden * cfg.activation_bytes

    def on_nvlink(a: int, b: int) -> float | None:
        """Bytes/s per GPU between stages a and b where one node or one NVLink domain holds both."""
        if stage_nodes[a] == stage_nodes[b] or merge(sets[a], sets[b]).nvlink_domain:
            return min(nv_gbps[a], nv_gbps[b]) * GBIT
        return None

    boundary = []
    for s in range(P - 1):
        if (nv := on_nvlink(s, s + 1)) is not None:
            boundary.append(act / T / nv)
        else:
            pair = merge(sets[s], sets[s + 1])
            bw = group_bandwidth_gbps(pair, cfg.fabric, p2p_nets[s])
            # a boundary between clusters also waits its link's latency, once per message
            boundary.append(ranks_on_node / T * act / (bw * GBIT) + link_latency_s(pair, cfg.fabric))
    # the wrap-around link (last stage -> first) a looped schedule adds (schedule_choice.py)
    wrap_pair = merge(sets[-1], sets[0])
    wrap_nv = on_nvlink(P - 1, 0) if P > 1 else nv_gbps[0] * GBIT
    if wrap_nv is not None:
        wrap_p2p = act / T / wrap_nv
    else:
        wrap_p2p = ranks_on_node / T * act / (
            group_bandwidth_gbps(wrap_pair, cfg.fabric, wrap_pair.net) * GBIT
        ) + link_latency_s(wrap_pair, cfg.fabric)
    emb_sync = 0.0
    if tied:
        nbytes = ranks_on_node * model.vocab * model.hidden / T * cfg.grad_bytes
        nv = on_nvlink(0, P - 1)
        emb_sync = (
            nbytes / (group_bandwidth_gbps(ends, cfg.fabric, emb_net) * GBIT)
            if nv is None
            else nbytes / ranks_on_node / nv
        )
    costs = []
    stage_gpus = tuple(gpus_of)
    # the same decision renders each pod's NCCL_NVLS_ENABLE (operator routes.job_routes)
    nvls_of = _nvls_bytes(tuple(g.name for g in stage_gpus), T, D, P, G, tied)
    for s in range(P):
        place = StagePlace(
            index=s,
            first=s == 0,
            last=s == P - 1,
            dp_gbps=None
            if span == 1
            else (
                nvlink.node_gbps(ranks_on_node, nv_gbps[s])
                if sets[s].nvlink_domain
                else group_bandwidth_gbps(sets[s], cfg.fabric)
            ),
            p2p_in=boundary[s - 1] if s > 0 else 0.0,
            p2p_out=boundary[s] if s < P - 1 else 0.0,
            inflight=P - s,
            embedding_sync=emb_sync if tied and s in (0, P - 1) else 0.0,
            ep_gbps=expert_fabric[s],
            ep_ranks_per_node=min(E, max(1, G // T)),
            nvls_bytes=nvls_of[s],
        )
        costs.append(StageCost(model, shape, place, _priced(cfg, stage_gpus[s])))
    mode = job.parallelism.partition
    L = model.layers
    if isinstance(mode, tuple):
        layers = parts_mod.check_explicit(mode, P, L)
    elif mode == "uniform":
        layers = parts_mod.uniform(P, L)
    else:
        layers = parts_mod.adaptive([c.busy for c in costs], L)
        even = parts_mod.uniform(P, L)
        if fits(costs, even) and iteration_seconds(costs, even) < iteration_seconds(costs, layers):
            layers = even
        if refine:
            layers = refine_partition(costs, layers)
    if not fits(costs, layers):
        s, mem = max(((s, c.memory(n)) for s, (c, n) in enumerate(zip(costs, layers))), key=lambda x: x[1])
        return (
            f"tensor {T} x pipeline {P} x data {D}: stage {s} needs {mem / 2**30:.1f} GiB per GPU, "
            f"more than {cfg.memory_headroom:.0%} of {stage_gpus[s].memory_gib:g} GiB"
        )
    seconds, stages = estimate_pipeline(costs, layers)
    return Candidate(
        seconds,
        deg,
        tuple(nodes),
        sets,
        stage_nodes,
        layers,
        stages,
        pp_net,
        emb_net,
        costs,
        world_net,
        p2p_nets,
        stage_gpus,
        wrap_p2p,
        wrap_pair.net,
    )


def expert_groups(
    stage_nodes: Sequence[tuple[NodeNic, ...]],
    group_gpus: int,
    G: int,
    cfg: CostModelConfig,
    nvlink_node_gbps: Sequence[float] = (),
) -> list[float | None] | str:
    """Per stage, the fabric an expert group's all-to-all crosses: None where each group (E x T
    consecutive ranks) sits inside one node, else the slowest group's per-node Gbit/s: NVLink's
    (``nvlink_node_gbps``, per stage) for a group inside one NVLink domain, else its island's. A
    group that would span islands is refused: the all-to-all moves more bytes than data
    parallelism, so it must stay on one RDMA fabric (or one Ethernet island)."""
    if group_gpus <= G:
        return [None] * len(stage_nodes)
    per_group = group_gpus // G
    out: list[float | None] = []
    for s, sn in enumerate(stage_nodes):
        speeds = []
        for i in range(0, len(sn), per_group):
            members = summarize(sn[i : i + per_group], cfg.fabric)
            if members.nvlink_domain and nvlink_node_gbps:
                speeds.append(nvlink_node_gbps[s])
                continue
            if members.domains != {None}:  # on NVLink-domain nodes, never across two
                return nvlink.group_problem(sn[i : i + per_group], per_group, "expert")
            if not members.single_island:
                names = ", ".join(n.name for n in sn[i : i + per_group][:4])
                return f"stage {s}'s expert group on {names} would span islands"
            speeds.append(group_bandwidth_gbps(members, cfg.fabric))
        out.append(min(speeds))
    return out


def memory_floor_problem(
    job: JobSpec, deg: Degrees, model: ModelCost, cfg: CostModelConfig, memory_gib: float
) -> str:
    """Why no placement of these degrees can fit, known without the nodes: its fullest stage
    (at least layers / pipeline layers, or the largest explicit count) needs more than the
    roomiest GPU holds even where a stage needs least (``StageCost.memory_floor``); '' if it
    may fit."""
    parts = job.parallelism.explicit_partition
    n = max(parts) if parts else -(-model.layers // deg.pipeline)
    shape = Shape(
        deg.tensor,
        deg.data,
        deg.pipeline,
        job.training.micro_batch_size,
        deg.micro_batches,
        job.parallelism.sequence_parallel,
        deg.expert,  # experts split over E: with E = 1 the floor would count every expert
        1,
        *outer_shape(job),
    )
    middle = StagePlace(index=1, first=False, last=False, dp_gbps=None, p2p_in=0.0, p2p_out=0.0, inflight=1)
    cost = StageCost(model, shape, middle, replace(cfg, gpu_memory_gib=memory_gib))
    need = cost.memory_floor(n)
    if need <= cost.mem_cap:
        return ""
    return (
        f"tensor {deg.tensor} x pipeline {deg.pipeline} x data {deg.data}: a stage of {n} layers "
        f"needs at least {need / 2**30:.1f} GiB per GPU, more than {cfg.memory_headroom:.0%} of "
        f"{memory_gib:g} GiB"
    )


@functools.lru_cache(maxsize=256)
def _nvls_bytes(
    stage_gpus: tuple[str, ...], tensor: int, data: int, pipeline: int, gpus_per_node: int, tied: bool
) -> tuple[int, ...]:
    """Per stage, the bytes NVLS's buffers take (``nvls.decide``, the decision the operator
    renders): the same for every island order whose stages hold the same GPU types, so the
    search decides once per degrees and types."""
    decision = nvls.decide(list(stage_gpus), tensor, data, pipeline, gpus_per_node, tied)
    return tuple(c.bytes for c in decision.stages)


def _priced(cfg: CostModelConfig, gpu: StageGpu) -> CostModelConfig:
    """The config a stage's costs use: its own GPUs' peak, memory and NVLink (plan/gpus.py)."""
    nv = gpu.nvlink_gbps or cfg.nvlink_gbps
    if (gpu.peak_tflops, gpu.memory_gib, nv) == (cfg.gpu_peak_tflops, cfg.gpu_memory_gib, cfg.nvlink_gbps):
        return cfg
    return replace(cfg, gpu_peak_tflops=gpu.peak_tflops, gpu_memory_gib=gpu.memory_gib, nvlink_gbps=nv)


def search(
    usable: Sequence[NodeNic], job: JobSpec, cfg: CostModelConfig, budget: Budget | None = None
) -> tuple[Candidate, list[Candidate]]:
    """Best candidate and the best one per degree choice (for the explanation). Each candidate
    is paid for from ``budget`` before it is costed (PlanTooLarge past it)."""
    cfg = for_job(cfg, job)
    budget = budget if budget is not None else Budget()
    model = ModelCost.of(job.model)
    G, N = job.nodes.gpus_per_node, job.nodes.count
    best_per_degree: list[Candidate] = []
    why_not: list[str] = []
    stage_cache: dict[tuple[str, ...], tuple[NodeSet, StageGpu]] = {}
    L = job.model.layers

    def pay(deg: Degrees, nodes: int) -> None:
        T, P, D = deg.tensor, deg.pipeline, deg.data
        budget.spend(nodes + L + P, f"{nodes} nodes x {L} layers (tensor {T} x pipeline {P} x data {D})")

    name_order = [tuple(sorted(usable, key=lambda n: n.name)[:N])]  # nicSelection off: Megatron's
    arrangements: dict[tuple[int, int], list[tuple[NodeNic, ...]]] = {}
    # what does not depend on the candidate, worked out once: each node's GPU, the islands
    gpus = node_gpus(usable, cfg)
    parts: IslandParts | None = None
    roomiest = max((gpus[n.name].memory_gib for n in usable), default=cfg.gpu_memory_gib)
    domain_nodes = nvlink.largest_domain(usable)
    for deg in degree_candidates(job, domain_nodes):
        too_big = memory_floor_problem(job, deg, model, cfg, roomiest)
        if too_big:
            why_not.append(too_big)
            continue
        span = max(1, deg.data * deg.tensor // G)
        # nodes per group that must lie in one NVLink domain: a tensor group wider than a node, or
        # on nodes of domains an expert group wider than one (elsewhere it keeps to its island)
        per_group = max(1, deg.tensor // G, deg.expert * deg.tensor // G if domain_nodes > 1 else 1)
        kind = "tensor" if deg.tensor > G else "expert"
        if job.parallelism.nic_selection == "off":
            orders = name_order
        else:
            key = (span, per_group)
            if key not in arrangements:
                budget.spend(len(usable), f"arranging {len(usable)} nodes")
                parts = parts if parts is not None else island_parts(usable, cfg, gpus)
                mine = parts if per_group == 1 else nvlink.domain_parts(parts, per_group, kind == "expert")
                if sum(len(p) for by_type in mine for p in by_type) < N:
                    arrangements[key] = []  # too few nodes in whole groups of a domain
                else:
                    groups = arrange_groups(usable, N, span, cfg, mine)
                    arrangements[key] = [
                        tuple(itertools.chain.from_iterable(blk for g in order for blk in groups[g]))
                        for order in island_orders(groups, cfg)
                    ]
            # Megatron's order too: the island-aware orders keep DP on one fabric, but when the
            # pipeline's p2p dominates (a small model) name order can be faster, and a plan must
            # never be worse than the default it is compared with
            orders = arrangements[key] + [o for o in name_order if o not in arrangements[key]]
        best: tuple[tuple[float, int, int, int, int], Candidate] | None = None
        for i, order in enumerate(orders):
            if per_group > 1 and (why := nvlink.group_problem(order, per_group, kind)):
                why_not.append(f"tensor {deg.tensor} x pipeline {deg.pipeline} x data {deg.data}: {why}")
                continue  # another order may keep every group inside a domain
            pay(deg, len(order))
            c = cost_placement(job, deg, order, model, cfg, stage_cache, gpus=gpus)
            if isinstance(c, str):
                why_not.append(c)
                break  # memory does not depend on the island order
            if best is None or c.key(i) < best[0]:
                best = (c.key(i), c)
        if best is not None:
            c = best[1]
            if job.parallelism.partition == "adaptive":
                pay(deg, len(c.nodes))
                refined = cost_placement(job, deg, c.nodes, model, cfg, stage_cache, refine=True, gpus=gpus)
                c = refined if isinstance(refined, Candidate) else c  # refining keeps to what fits
            best_per_degree.append(c)
    if not best_per_degree:
        recompute = (
            ""
            if cfg.activation_recompute
            else ", set training.activationRecompute: true (keeps one activation per layer)"
        )
        domain = [w for w in why_not if "NVLink domain" in w]
        if domain and len(domain) == len(why_not):
            field = "expert" if all("expert group" in w for w in domain) else "tensor"
            fits = "expert x tensor at most" if field == "expert" else "tensor a divisor of"
            raise PlanError(
                f"spec.parallelism.{field}: {getattr(job.parallelism, field)} puts each {field} group on "
                "several nodes, and no order of the nodes keeps every group inside one NVLink domain: "
                + "; ".join(domain[:2])
                + f"; fix: make the group fit a node ({fits} gpusPerNode {G}, or auto), or run on "
                "nodes of NVLink domains (GPU Feature Discovery's nvidia.com/gpu.clique) holding whole groups"
            )
        spans = any("would span islands" in w for w in why_not)
        raise PlanError(
            ("no layout keeps every expert group on one island and fits in GPU memory: " if spans else "")
            + ("no layout fits in GPU memory: " if not spans else "")
            + "; ".join(why_not[:4])
            + "; fix: raise pipeline or tensor (or set them to auto), lower microBatchSize"
            + recompute
            + ", or use more nodes"
        )
    best_per_degree.sort(key=lambda c: c.key(0))
    return best_per_degree[0], best_per_degree


# ---- the public entry point -------------------------------------------------------------------


def plan(
    nodes: Sequence[Any],
    job: JobSpec | Mapping[str, Any],
    config: CostModelConfig | None = None,
    budget: Budget | None = None,
) -> Layout:
    """Plan a layout for ``job`` on these nodes (v1 Node dicts or classified NodeNic), within
    ``budget`` (a fresh default one when None; pass one to share it between several plans of
    one job). PlanTooLarge when the search would exceed it."""
    cfg = config or CostModelConfig()
    try:
        job = as_job(job)
    except SpecError as e:
        raise PlanError(str(e)) from None
    cfg = for_job(cfg, job)
    usable = select_nodes(nodes, job, cfg)
    best, alternatives = search(usable, job, cfg, budget)
    option, priced = schedule_choice.choose(best, job)
    if option.problem:
        raise PlanError(f"spec.training.pipelineSchedule: {option.name} cannot run here: {option.problem}")
    layout = to_layout(best, job, cfg, option)
    lines = explanation_lines(layout, best, alternatives, job) + schedule_lines(option, priced, best)
    return replace(layout, explanation=tuple(lines))


def to_layout(
    c: Candidate, job: JobSpec, cfg: CostModelConfig, option: schedule_choice.ScheduleOption | None = None
) -> Layout:
    """The candidate as a Layout; with ``option`` (schedule_choice) its schedule's chunks and
    its estimate (the default: 1F1B, one chunk per stage)."""
    layout = _one_chunk_layout(c, job, cfg)
    if option is None:
        return layout
    if option.virtual == 1 and option.name == "1F1B":  # only the per-message/action costs change it
        return replace(layout, estimate=_timed(layout.estimate, option.seconds))
    return with_schedule(layout, option, c)


def _timed(estimate: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``estimate`` with the iteration taking ``seconds`` (the rates scaled alike)."""
    if estimate["iterationSeconds"] == _round(seconds):
        return estimate
    out = dict(estimate)
    ratio = estimate["iterationSeconds"] / seconds
    for key in ("tokensPerSecond", "samplesPerSecond", "tflopsPerGpu"):
        out[key] = _round(out[key] * ratio)
    out["iterationSeconds"] = _round(seconds)
    return out


def with_schedule(layout: Layout, option: schedule_choice.ScheduleOption, c: Candidate) -> Layout:
    """``layout`` running ``option``: each stage's chunks (virtual stages in pipeline order take
    consecutive layers), the wrap-around p2p family of a looped schedule, no embedding group
    where the first and last virtual stage share a rank, and the estimate of the schedule."""
    P, v, name = layout.pipeline, option.virtual, option.name
    ranges: list[list[tuple[int, int]]] = [[(0, 0)] * v for _ in range(P)]
    start = 0
    for k in range(P * v):
        s, ch = sched.owner(name, P, k)
        n = option.chunks[s][ch]
        ranges[s][ch] = (start, start + n)
        start += n
    stages = tuple(
        replace(st, layers=(min(a for a, _ in r), max(b for _, b in r)), chunks=tuple(r) if v > 1 else ())
        for st, r in zip(layout.stages, ranges)
    )
    groups = list(layout.groups)
    if sched.needs_wrap_link(name, P, v):
        groups.append(GroupFamily("p2p", c.wrap_net, P - 1))
    if sched.owner(name, P, P * v - 1)[0] == 0:  # first and last virtual stage share rank 0
        groups = [g for g in groups if g.kind != "embedding"]
    estimate = dict(_timed(layout.estimate, option.seconds))
    estimate["stages"] = [  # this schedule's in-flight micro-batches and receive buffers
        {**st, "memoryGiB": _round(gib)} for st, gib in zip(estimate["stages"], option.stage_memory_gib)
    ]
    estimate.update(
        memoryPerGpuGiB=_round(option.memory_gib),
        pipelineSchedule=name,
        virtualStages=v,
        bubbleSeconds=_round(option.bubble_seconds),
    )
    version = NVLINK_VERSION if layout.tensor_spans_nodes else VIRTUAL_VERSION  # v4 holds chunks too
    return replace(
        layout, stages=stages, schedule=name, version=version, groups=tuple(groups), estimate=estimate
    )


def host_per_rank(c: Candidate, job: JobSpec) -> list[float]:
    """Host bytes per rank of each stage (holmes.contract.host_memory): the process, and with
    asynchronous checkpoints the staging buffer of what the rank writes."""
    ckpt = job.training.checkpoint
    staged = ckpt is not None and ckpt.asynchronous
    return [
        host_memory.rank_bytes(cost.checkpoint_staging(n) if staged else 0.0)
        for cost, n in zip(c.costs, c.layers)
    ]


def schedule_lines(
    option: schedule_choice.ScheduleOption, priced: list[schedule_choice.ScheduleOption], c: Candidate
) -> list[str]:
    """Why this schedule: the bubble, the p2p and the memory of each one priced."""
    if c.degrees.pipeline == 1:
        return []
    base = next((o for o in priced if o.name == "1F1B"), None)
    head = f"schedule: {option.name}"
    if option.virtual > 1:
        head += f" with {option.virtual} virtual stages per GPU"
    shown = any(o.overhead_seconds for o in priced)  # only where the cost model prices it
    head += (
        f", {option.seconds:.4g} s/iteration (bubble {option.bubble_seconds:.3g} s, p2p "
        f"{option.p2p_seconds:.3g} s, {_overhead(option, shown)}memory {option.memory_gib:.1f} GiB), "
        f"the fastest of {len(priced)} priced"
    )
    if base is not None and option is not base:
        head += (
            f"; {base.seconds / option.seconds:.2f}x 1F1B: bubble {base.bubble_seconds:.3g} s -> "
            f"{option.bubble_seconds:.3g} s, p2p {base.p2p_seconds:.3g} s -> {option.p2p_seconds:.3g} s, "
        )
        if shown:
            head += f"overhead {base.overhead_seconds:.3g} s -> {option.overhead_seconds:.3g} s, "
        head += f"memory {base.memory_gib:.1f} -> {option.memory_gib:.1f} GiB"
    lines = [head]
    if option.bubble_basis:
        lines.append(
            f"  its bubble: {option.bubble_units:.3g} micro-batch steps idle (1F1B: "
            f"{c.degrees.pipeline - 1}) at M={c.degrees.micro_batches}, {option.bubble_basis}"
        )
    for o in sorted(priced, key=lambda o: o.seconds):
        if o is option:
            continue
        what = f"{o.name}" + (f" v={o.virtual}" if o.virtual > 1 else "")
        if o.problem:
            lines.append(f"  {what}: cannot run: {o.problem}")
        else:
            lines.append(
                f"  {what}: {o.seconds:.4g} s/iteration (bubble {o.bubble_seconds:.3g} s, p2p "
                f"{o.p2p_seconds:.3g} s, {_overhead(o, shown)}memory {o.memory_gib:.1f} GiB)"
            )
    if option.name == "DualPipeV":  # what it does and does not do here (the docs' words too)
        lines.append(f"  {sched.DUALPIPEV_OVERLAP}")
    return lines


def _overhead(o: schedule_choice.ScheduleOption, shown: bool) -> str:
    """The actions' fixed cost and a split backward's extra, when the cost model prices them."""
    return f"overhead {o.overhead_seconds:.3g} s, " if shown else ""


def _one_chunk_layout(c: Candidate, job: JobSpec, cfg: CostModelConfig) -> Layout:
    cfg = for_job(cfg, job)
    d = c.degrees
    model = ModelCost.of(job.model)
    G = job.nodes.gpus_per_node
    stages, groups = [], []
    start = 0
    for s, (st, nodes, n) in enumerate(zip(c.stage_sets, c.stage_nodes, c.layers)):
        stages.append(
            Stage(
                index=s,
                layers=(start, start + n),
                island=st.island_name(),
                nic=st.nic,
                dp_net=st.net,
                nodes=tuple(x.name for x in nodes),
            )
        )
        start += n
    for s, st in enumerate(c.stage_sets):
        groups.append(GroupFamily("dp", st.net, s))
    for s, st in enumerate(c.stage_sets):
        groups.append(GroupFamily("tp", st.net, s))
    if d.expert > 1:  # inside one island (cost_placement refused any other)
        groups += [GroupFamily("ep", st.net, s) for s, st in enumerate(c.stage_sets)]
    groups.append(GroupFamily("pp", c.pp_net))
    groups += [GroupFamily("p2p", net, b) for b, net in enumerate(c.p2p_nets)]
    if c.emb_net is not None:
        groups.append(GroupFamily("embedding", c.emb_net))
    world = d.tensor * d.pipeline * d.data
    tokens = job.tokens_per_iteration
    r = _round
    host = host_per_rank(c, job)
    estimate = {
        "iterationSeconds": r(c.seconds),
        "tokensPerSecond": r(tokens / c.seconds),
        "samplesPerSecond": r(job.training.global_batch_size / c.seconds),
        "tflopsPerGpu": r(
            tflops_per_gpu(
                model.flops_per_iteration(job.training.global_batch_size, recompute=cfg.activation_recompute),
                c.seconds,
                world,
            )
        ),
        "memoryPerGpuGiB": r(max(s.memory_gib for s in c.stages)),
        "parameters": model.total_params,
        "flopsPerIteration": r(
            model.flops_per_iteration(job.training.global_batch_size, recompute=cfg.activation_recompute)
        ),
        "activationRecompute": cfg.activation_recompute,
        **_expert_fields(c, model),
        "stages": [
            {
                "stage": s.index,
                "layers": s.layers,
                "computeSeconds": r(s.compute),
                "bubbleSeconds": r(s.bubble),
                "p2pSeconds": r(s.p2p),
                "dpCommSeconds": r(s.dp_comm),
                "dpExposedSeconds": r(s.dp_exposed),
                "finishSeconds": r(s.finish),
                "memoryGiB": r(s.memory_gib),
                "hostMemoryGiB": r(host[s.index] / 2**30),
                **({"allToAllSeconds": r(s.all_to_all)} if model.moe else {}),
                **_gpu_fields(c, s.index),
            }
            for s in c.stages
        ],
        "hostMemoryPerNodeGiB": r(max(host_memory.per_node(host, d.data * d.tensor, G)) / 2**30),
        "partition": job.parallelism.partition if isinstance(job.parallelism.partition, str) else "explicit",
        "nicSelection": job.parallelism.nic_selection,
    }
    return Layout(
        tensor=d.tensor,
        pipeline=d.pipeline,
        data=d.data,
        gpus_per_node=G,
        nodes=tuple(n.name for n in c.nodes),
        stages=tuple(stages),
        groups=tuple(groups),
        micro_batch_size=job.training.micro_batch_size,
        micro_batches=d.micro_batches,
        estimate=estimate,
        world_net=c.world_net,
        expert=d.expert,
        version=NVLINK_VERSION if d.tensor > G else LAYOUT_VERSION,
        nvlink_domains=nvlink.layout_domains(c.nodes) if d.tensor > G else (),
    )


def _expert_fields(c: Candidate, model: ModelCost) -> dict[str, Any]:
    """A mixture of experts' share of the estimate: its degree, the parameters a token passes
    through, the all-to-all on the slowest stage's clock and where the groups run."""
    if not model.moe:
        return {}
    active = model.total_params - model.layers * model.expert_layer_params * (
        1 - model.experts_per_token / model.experts
    )
    fabric = [c.costs[s].place.ep_gbps for s in range(len(c.costs))]
    return {
        "expert": c.degrees.expert,
        "activeParameters": int(active),
        "allToAllSeconds": _round(max(s.all_to_all for s in c.stages)),
        "expertGroupsInsideNode": all(f is None for f in fabric),
    }


def _gpu_fields(c: Candidate, stage: int) -> dict[str, Any]:
    """A stage's GPU type and the peak TFLOP/s it was priced with (slowest member)."""
    if not c.gpus:
        return {}
    g = c.gpus[stage]
    return {"gpu": g.name, "gpuPeakTflops": _round(g.peak_tflops)}


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def megatron_default(job: JobSpec, like: Layout | None = None) -> JobSpec:
    """The same job as Megatron-LM would run it: nodes in name order, equal layers; with ``like``,
    the same (tensor, pipeline, data) as that layout so only placement and partition differ."""
    par = replace(job.parallelism, nic_selection="off", partition="uniform")
    if like is not None:
        par = replace(par, tensor=like.tensor, pipeline=like.pipeline, data=like.data)
    return replace(job, parallelism=par)


def compare(
    nodes: Sequence[Any], job: JobSpec | Mapping[str, Any], config: CostModelConfig | None = None
) -> tuple[Layout, Layout, float]:
    """(Holmes layout, Megatron-default layout with the same degrees, speed-up of Holmes)."""
    job = as_job(job)
    holmes = plan(nodes, job, config)
    base = plan(nodes, megatron_default(job, holmes), config)
    return holmes, base, base.estimate["iterationSeconds"] / holmes.estimate["iterationSeconds"]
