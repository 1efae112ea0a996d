"""The dry run: the real engine, at the job's real scale, on fake CUDA and a fake process group.

    python -m holmes.trainer.dryrun --job JOB.yaml --layout LAYOUT.json [--ranks roles|all|0,9,17]
    python -m holmes.trainer.dryrun --job JOB.yaml --layout layout-0.json layout-1.json   # replicas
    holmes dryrun --job JOB.yaml (--layout LAYOUT.json | --nodes NODES.yaml)

Each process plays one rank after another (the ranks are spread over one process per CPU this
one may use, ``--jobs``): ``init_process_group("fake")`` makes it rank r of the
Layout's world (every collective and send/recv returns at once, moving no data), and
``FakeTensorMode`` with a ``cuda`` device (dryrun/fakecuda.py) makes every tensor a shape without
memory, in bf16 as on GPUs. For each rank the real :class:`~holmes.trainer.engine.Trainer` is
built from the job and the Layout and trains ``--iterations`` (default 2) iterations: the
pipeline schedule, the overlapped optimizer with its step, the stop vote. A
:class:`~holmes.trainer.dryrun.recording.Recorder` sees every operator below every Python wrapper
and keeps the rank's collectives, host syncs and GPU memory.

Which ranks: ``roles`` (the default) runs one rank per pipeline stage: the one at data index 0
and tensor index 0. The other ranks of a stage are identical for what is checked: they build
the same stage (the same layers, shapes and buckets: parameters are split evenly over the
tensor ranks, buckets over the data ranks), run the same schedule over the same number of
micro-batches, and issue the same collectives in the same order on groups of the same sizes;
what differs is which samples they read (data index) and which elements their norm mask
keeps (tensor index), neither of which changes an operator's shape or a collective. The
representatives share the pp, world, p2p and embedding groups, so every group that spans
stages is compared across its members. ``all`` runs every rank (small worlds, tests).

Replicas (``acrossIslands.mode: replicas``, outer.py): one Layout per replica (the operator's
``layout-<r>.json``; ``holmes dryrun --nodes`` plans them as the operator does). Each replica is
a world of its own, run rank after rank as above with its 1/R of globalBatchSize; its ranks are
numbered after the replicas before it (replica q's rank r is q * worldSize + r, the pods' order)
and ``roles`` takes the same ranks in every replica. The outer group is a fake group too
(``outer.OuterGroup.fake``: rank = replica, size = replicas), so the real OuterSync runs: join,
the delta's all-reduce, fragments, the overlapped exchange settled overlapSteps later, the outer
Nesterov step. What an outer step issues and holds does not depend on innerSteps, only how often
it comes: the dry run makes a fragment due every overlapSteps + 2 steps (:func:`outer_config`)
and runs until one exchange has been sent, landed and been followed by a plain iteration.

Checks (``problems``; any makes the exit status 1):

- every group's collectives are the same sequence (op, dtype, bytes) on every member that ran,
  and every send is met by its peer's receive, in order: no deadlock at the real world size;
- at most :data:`ALLOWED_STEADY_SYNCS` host syncs in every iteration after the first: the
  one documented read of the loss and the global grad norm (engine.py); an iteration where the
  outer optimizer acts may add :data:`ALLOWED_OUTER_SYNCS` (none);
- no collective on host tensors over a group that is NCCL in a real run (NCCL refuses them);
- replicas: the fragments tile every master shard and the D shards tile the flat parameters;
  the outer group carries exactly join's key and one all-reduce of each due fragment (on the
  exchange dtype), and, by the sequence check, the same on rank r of every replica;
- every parameter, bucket and shard of the flat buffers starts 256-byte aligned;
- each stage's peak GPU memory within ``--tolerance`` (10%) of the planner's estimate in the
  Layout (``estimate.stages[].memoryGiB``), when the Layout carries one; with replicas the outer
  optimizer's anchor, momentum and exchange buffers count (category ``outer``).

What it cannot run under fake tensors: checkpoint save/load (torch.distributed.checkpoint
writes real bytes) and evaluation (it reads a token file): both are switched off, and said so
in the output. Data is synthetic (same shapes as a token file's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from . import fakecuda

fakecuda.load_before_torch()  # torch reads its CUDA hooks once, when imported (fakecuda.py)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from holmes.contract import Layout, host_memory, nvls  # noqa: E402
from holmes.contract import pipeline_schedules as sched  # noqa: E402
from holmes.contract.layout import layout_signature  # noqa: E402

from .. import checkpoint, outer, preempt  # noqa: E402
from .. import engine as engine_mod  # noqa: E402
from .. import model as model_mod  # noqa: E402
from ..config import CheckpointConfig, DataConfig, TrainConfig, schedule_problems  # noqa: E402
from ..dist_optimizer import DistributedOptimizer  # noqa: E402
from ..startup import configure  # noqa: E402
from .fakecuda import fake_cuda  # noqa: E402
from .recording import (  # noqa: E402
    CATEGORIES,
    NCCL_COMMUNICATOR_BYTES,
    Collective,
    Recorder,
    device_communicators,
    sequence_problems,
)

# One read of the device per iteration is by design: the loss and the global grad norm, which
# the clipping coefficient and the NaN check need on the host (engine.Trainer.train_step).
ALLOWED_STEADY_SYNCS = 1
# An iteration where the outer optimizer acts (replicas, outer.py) reads the device no more: the
# delta, its all-reduce, the outer step and the republished parameters are all queued on the
# device, and waiting for the all-reduce (Work.wait) makes NCCL's stream wait, not the host.
ALLOWED_OUTER_SYNCS = 0
ALIGN_BYTES = 256
GIB = 2**30


class DryRunError(ValueError):
    """Bad arguments: the message names the fix."""


def role_ranks(layout: Layout) -> list[int]:
    """One rank per stage: data index 0, tensor index 0 (see the module docstring)."""
    return [s * layout.ranks_per_stage for s in range(layout.pipeline)]


def parse_ranks(text: str, layout: Layout, replicas: int = 1) -> list[int]:
    """Global ranks: replica q's rank r is q * worldSize + r (one replica: the Layout's ranks)."""
    W = layout.world_size
    if text == "roles":
        return [q * W + r for q in range(replicas) for r in role_ranks(layout)]
    if text == "all":
        return list(range(replicas * W))
    try:
        ranks = sorted({int(r) for r in text.split(",") if r.strip()})
    except ValueError:
        raise DryRunError(f"--ranks {text!r}: use roles, all, or rank numbers like 0,9,17") from None
    bad = [r for r in ranks if not 0 <= r < replicas * W]
    if bad or not ranks:
        within = f"{replicas} replicas x {W}" if replicas > 1 else f"{W}"
        raise DryRunError(f"--ranks {text!r}: ranks must be in [0, {within})")
    return ranks


def dry_config(cfg: TrainConfig, iterations: int) -> tuple[TrainConfig, list[str]]:
    """The job's configuration, minus what fake tensors cannot run (said in ``skipped``)."""
    skipped = []
    if cfg.checkpoint.path:
        skipped.append("checkpoint save (torch.distributed.checkpoint writes real bytes)")
    if cfg.eval is not None:
        skipped.append("evaluation (reads a token file)")
    if cfg.data.path or cfg.data.blend:
        skipped.append("the token file: synthetic samples of the same shape instead")
    cfg = replace(
        cfg,
        iterations=iterations,
        # no saves; whether the job's would be staged (the host memory each rank counts)
        checkpoint=CheckpointConfig(asynchronous=bool(cfg.checkpoint.path) and cfg.checkpoint.asynchronous),
        eval=None,
        data=DataConfig(),
    )
    return cfg, skipped


def outer_config(cfg: TrainConfig, iterations: int) -> tuple[TrainConfig, dict[str, Any]]:
    """Replicas: the outer optimizer's period shortened so that a few iterations reach it.
    What an outer step issues and holds does not depend on innerSteps (only how often it comes),
    so the dry run makes each fragment due every overlapSteps + 2 steps: iteration 1 is the
    start (join), one exchange is sent, lands overlapSteps later (settled) and a plain iteration
    follows it, the last one run. ``iterations`` grows to reach that when needed."""
    spec = cfg.across_islands
    every = spec.overlap_steps + 2
    run = replace(spec, inner_steps=spec.fragments * every)
    iterations = max(iterations, every + spec.overlap_steps + 1)
    note = {"innerSteps": spec.inner_steps, "innerStepsRun": run.inner_steps, "iterationsRun": iterations}
    return replace(cfg, across_islands=run, iterations=iterations), note


# ---- labels: which category a new storage belongs to -----------------------------------------


@contextlib.contextmanager
def _patched(obj: Any, name: str, wrap: Any) -> Iterator[None]:
    real = getattr(obj, name)
    setattr(obj, name, wrap(real))
    try:
        yield
    finally:
        setattr(obj, name, real)


def _labelled(rec: Recorder, category: str):
    def wrap(real):
        def call(*args, **kwargs):
            with rec.label(category):
                return real(*args, **kwargs)

        return call

    return wrap


def _optimizer_labels(rec: Recorder):
    """DistributedOptimizer.__init__ makes the flat buffers and the shards' state: label them."""

    def wrap(real):
        def init(self, *args, **kwargs):
            with rec.label("optimizer"):
                real(self, *args, **kwargs)
            rec.relabel(self.param_buffer, "parameters")
            rec.relabel(self.grad_buffer, "gradients")

        return init

    return wrap


def _host_group(rec: Recorder):
    """The stop vote's group is gloo in a real run (host memory): say so to the recorder."""

    def wrap(real):
        def init(self, *args, **kwargs):
            real(self, *args, **kwargs)
            rec.host_groups.add(self.group.group_name)

        return init

    return wrap


def _outside_fake_mode(real):
    def call(*args, **kwargs):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return real(*args, **kwargs)

    return call


@contextlib.contextmanager
def memory_labels(rec: Recorder) -> Iterator[None]:
    from torch.distributed.pipelining import stage as pp_stage

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(model_mod, "meta_stage", _outside_fake_mode))
        # values do not exist under fake tensors: drawing them would only cost time
        stack.enter_context(_patched(model_mod, "init_parameters", lambda real: lambda *a, **k: None))
        stack.enter_context(_patched(engine_mod, "stage_model", _labelled(rec, "parameters")))
        stack.enter_context(_patched(DistributedOptimizer, "__init__", _optimizer_labels(rec)))
        stack.enter_context(_patched(preempt.StopVote, "__init__", _host_group(rec)))
        stack.enter_context(_patched(DistributedOptimizer, "_launch_reduce", _labelled(rec, "gradients")))
        stack.enter_context(_patched(DistributedOptimizer, "finish_grad_sync", _labelled(rec, "gradients")))
        stack.enter_context(_patched(DistributedOptimizer, "step", _labelled(rec, "optimizer")))
        # the outer optimizer's anchor and momentum, and the exchange's buffers (replicas)
        for name in ("__init__", "join", "sync", "send", "settle", "apply"):
            stack.enter_context(_patched(outer.OuterSync, name, _labelled(rec, "outer")))
        for name in ("_prepare_forward_infra", "_prepare_backward_infra"):
            stack.enter_context(_patched(pp_stage.PipelineStage, name, _labelled(rec, "pipelineBuffers")))
        yield


@contextlib.contextmanager
def object_collectives(rec: Recorder) -> Iterator[None]:
    """all_gather_object under the fake group: the fake group moves no bytes, so there is
    nothing to unpickle. Recorded as the two all-gathers torch issues (sizes, then the padded
    pickles), answered with this rank's own object for every rank."""
    real = dist.all_gather_object

    def gather(object_list: list, obj: Any, group: Any = None) -> None:
        ranks = tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
        nbytes = len(json.dumps(obj, default=str).encode())
        pg = group or dist.group.WORLD
        device = (
            "cpu" if pg.group_name in rec.host_groups else "cuda"
        )  # object pickles travel on the device on NCCL
        for dtype, n in (("int64", 8), ("uint8", nbytes)):
            rec.collectives.append(
                Collective(ranks, "allgather_", dtype, n * len(ranks), None, rec.phase, device, pg.group_name)
            )
        for i in range(len(object_list)):
            object_list[i] = obj

    dist.all_gather_object = gather
    try:
        yield
    finally:
        dist.all_gather_object = real


# ---- one rank --------------------------------------------------------------------------------


def alignment_problems(opt: DistributedOptimizer, rank: int) -> list[str]:
    """Every parameter view, bucket and shard of the flat buffers starts ALIGN_BYTES-aligned in
    both buffers (the allocator aligns the buffers themselves)."""
    out = []
    sizes = {"parameter buffer": opt.param_buffer.element_size(), "gradient buffer": 4}
    for what, elem in sizes.items():
        for i, start in enumerate(opt.offsets):
            if start * elem % ALIGN_BYTES:
                out.append(f"rank {rank}: {opt.names[i]} starts at byte {start * elem} of the {what}")
        for b in opt.buckets:
            for label, at in (("bucket", b.start), ("shard", b.shard.start)):
                if at * elem % ALIGN_BYTES:
                    out.append(f"rank {rank}: {label} {b.index} starts at byte {at * elem} of the {what}")
    return out


def communicators(
    trainer: engine_mod.Trainer, calls: list[Collective], outside: dict[str, tuple[int, ...]] | None = None
) -> list[dict[str, Any]]:
    """The device communicators this rank's run created (:func:`device_communicators`).
    ``outside``: the outer group over replicas (a communicator of its own, on OUTER_NET)."""
    kinds = {pg.group_name: created for created, pg in trainer.groups.members}
    for name, ranks in (outside or {}).items():
        kinds[name] = {"kind": "outer", "size": len(ranks), "net": outer.OUTER_NET}
    return device_communicators(kinds, dist.group.WORLD.group_name, trainer.layout.world_net, calls)


def per_phase(syncs: list[Any], iterations: int) -> dict[str, int]:
    """Host syncs per iteration ("iteration 1" .. "iteration N"), zeros included."""
    return {
        f"iteration {i}": sum(1 for h in syncs if h.phase == f"iteration {i}")
        for i in range(1, iterations + 1)
    }


def host_tensor_problems(rec: Recorder, rank: int) -> list[str]:
    """Collectives on host tensors over groups that are NCCL in a real run: NCCL takes device
    tensors only ("Tensors must be CUDA and dense"); the fake group takes anything."""
    seen: dict[tuple[str, str, str], int] = {}
    for c in rec.collectives:
        if c.device == "cpu" and c.name not in rec.host_groups:
            seen[(c.op, c.dtype, c.name)] = seen.get((c.op, c.dtype, c.name), 0) + 1
    return [
        f"rank {rank}: {n} {op} of {dtype} host tensors on group {name} ({_group_kind(name, rec)}), "
        "which is NCCL on GPUs and takes device tensors only: create the tensor on the device"
        for (op, dtype, name), n in seen.items()
    ]


def _group_kind(name: str, rec: Recorder) -> str:
    return "the outer group over replicas" if name in rec.outside_groups else "a device group"


def outer_schedule(spec: Any, iterations: int) -> list[int]:
    """The fragment each outer exchange of iterations 1..N sends, in issue order (outer.py)."""
    due = [outer.fragment_due(t, spec.inner_steps, spec.fragments) for t in range(1, iterations + 1)]
    return [f for f in due if f is not None]


def outer_events(spec: Any, iterations: int) -> set[int]:
    """Iterations in which the outer optimizer acts: an exchange sent (or, overlapped, applied)."""
    sent = [
        t
        for t in range(1, iterations + 1)
        if outer.fragment_due(t, spec.inner_steps, spec.fragments) is not None
    ]
    return {t + d for t in sent for d in {0, spec.overlap_steps}} & set(range(1, iterations + 1))


def fragment_problems(sync: outer.OuterSync, flat_elements: int, dp: int, rank: int) -> list[str]:
    """The fragments tile every master shard, in order, without gap or overlap, and the shards
    of the D data ranks tile the flat parameters: over one cycle of fragments the outer step
    sees every weight exactly once."""
    out = []
    for k, m in enumerate(sync.masters):
        at = 0
        for f, per_bucket in enumerate(sync.slices):
            sl = per_bucket[k]
            if sl.start != at:
                out.append(f"rank {rank}: fragment {f} of bucket {k} starts at {sl.start}, not {at}")
            at = sl.stop
        if at != m.numel():
            out.append(f"rank {rank}: the fragments of bucket {k} end at {at} of its {m.numel()} elements")
    covered = sum(sl.stop - sl.start for per_bucket in sync.slices for sl in per_bucket)
    if covered * dp != flat_elements:
        out.append(
            f"rank {rank}: the fragments cover {covered} elements x {dp} data ranks = {covered * dp}, "
            f"the flat parameters hold {flat_elements}"
        )
    return out


def outer_record(
    sync: outer.OuterSync,
    opt: DistributedOptimizer,
    rec: Recorder,
    layout: Layout,
    rank: int,
    iterations: int,
) -> dict[str, Any]:
    """What the outer optimizer held and sent, and its checks: the fragments tile the shards,
    and the outer group saw exactly the exchanges the schedule makes due (join's key, then one
    all-reduce of each due fragment's delta on the exchange dtype)."""
    spec, itemsize = sync.spec, sync.exchange_dtype.itemsize
    fragment_elements = [sum(sl.stop - sl.start for sl in per_bucket) for per_bucket in sync.slices]
    problems = fragment_problems(sync, opt.param_buffer.numel(), layout.data, rank)
    name = None if sync.group.pg is None else sync.group.pg.group_name
    seen = [c.key() for c in rec.collectives if name is not None and c.name == name]
    expected = []
    if name is not None:
        dtype = str(sync.exchange_dtype).replace("torch.", "")
        expected = [("allreduce_", "int64", 4 * 8)]  # join: iteration, fingerprint (outer.join)
        expected += [
            ("allreduce_", dtype, fragment_elements[f] * itemsize) for f in outer_schedule(spec, iterations)
        ]
    if seen != expected:
        problems.append(
            f"rank {rank}: the outer group saw {len(seen)} collectives ({_keys(seen)}), the outer steps "
            f"due in {iterations} iterations need {len(expected)} ({_keys(expected)}): an exchange "
            "went to another group, or a replica's fragments differ"
        )
    state = sum(t.numel() * t.element_size() for t in sync.anchors + sync.momenta)
    return {
        "replicas": sync.group.size,
        "innerSteps": spec.inner_steps,
        "fragments": spec.fragments,
        "overlapSteps": spec.overlap_steps,
        "exchangeDtype": spec.exchange_dtype,
        "outerSteps": sync.outer_steps,
        "fragmentBytes": [n * itemsize for n in fragment_elements],
        "bytesPerCycle": sum(fragment_elements) * itemsize,
        "stateBytes": state,
        "collectives": len(seen),
        "problems": problems,
    }


def _keys(keys: list) -> str:
    shown = ", ".join("/".join(map(str, k)) for k in keys[:4])
    return shown + (", ..." if len(keys) > 4 else "")


def run_rank(
    cfg: TrainConfig,
    layout: Layout,
    rank: int,
    buffer_scale: float = 1.0,
    replica: outer.ReplicaPlace | None = None,
) -> dict[str, Any]:
    """Rank ``rank`` of ``layout`` through ``cfg.iterations`` iterations; JSON-ready.
    ``buffer_scale``: the job's micro-batches over those run (see :func:`reduce_micro_batches`).
    ``replica``: the replica this world is (replicas, outer.py); its ranks are recorded by their
    global number, replica * worldSize + rank (the pods' order), and its outer group's too."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    W = layout.world_size
    offset = 0 if replica is None else replica.replica * W
    rec = Recorder(rank_offset=offset)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=W)
    t0 = time.perf_counter()
    try:
        device = torch.device("cuda", rank % layout.gpus_per_node)
        with fake_cuda(rec.on_host_sync), rec, memory_labels(rec), object_collectives(rec), rec.batched_p2p():
            trainer = engine_mod.Trainer(
                cfg, layout, rank=rank, device=device, backend="fake", host_backend="fake", replica=replica
            )
            rec.host_groups.add(trainer.checkpoint_group.group_name)  # gloo in a real run
            sync = trainer.outer
            if sync is not None and sync.group.pg is not None:  # the same rank of every replica
                rec.outside_groups[sync.group.pg.group_name] = tuple(
                    q * W + rank for q in range(sync.group.size)
                )

            def next_phase(t: engine_mod.Trainer, record: dict) -> None:
                rec.phase = f"iteration {t.iteration + 1}"

            rec.phase = "iteration 1"
            trainer.train(on_iteration=next_phase)
            aligned = alignment_problems(trainer.opt, offset + rank)
        comms = communicators(trainer, rec.collectives, rec.outside_groups)
        info = layout.rank_info(rank)
        nvls_choice = rank_nvls(cfg, layout, info.stage)
        peak_by, peak_phase = _peak(rec, len(comms), buffer_scale, nvls_choice.bytes)
        steady = f"iteration {cfg.iterations}"
        where = {"replica": replica.replica, "localRank": rank} if replica is not None else {}
        return {
            "rank": offset + rank,
            **where,
            "stage": info.stage,
            "dpIndex": info.dp_index,
            "tpIndex": info.tp_index,
            "peakBytes": sum(peak_by.values()),
            "peakBytesBy": peak_by,
            "peakPhase": peak_phase,
            "hostSyncs": sum(1 for h in rec.host_syncs if h.phase == steady),
            "hostSyncsBy": per_phase(rec.host_syncs, cfg.iterations),
            "hostSyncsWhere": [
                {"what": h.what, "where": h.where, "phase": h.phase}
                for h in rec.host_syncs
                if h.phase != "build"
            ],
            "communicators": len(comms),
            "hostBytes": rank_host_bytes(cfg, trainer),
            "nvls": {"enabled": nvls_choice.enabled, "bytes": nvls_choice.bytes, "why": nvls_choice.why},
            "communicatorList": comms,
            "collectives": [c.to_json() for c in rec.collectives],
            "seconds": round(time.perf_counter() - t0, 2),
            "alignment": aligned,
            "hostTensors": host_tensor_problems(rec, offset + rank),
            "outerIterations": []
            if sync is None
            else sorted(outer_events(cfg.across_islands, cfg.iterations)),
            **(
                {}
                if sync is None
                else {"outer": outer_record(sync, trainer.opt, rec, layout, offset + rank, cfg.iterations)}
            ),
        }
    finally:
        dist.destroy_process_group()


def rank_host_bytes(cfg: TrainConfig, trainer: engine_mod.Trainer) -> dict[str, int]:
    """Host memory of this rank (holmes.contract.host_memory): the process (a model) and, where
    the job's checkpoints are asynchronous, the staging buffer of what the rank writes."""
    staging = 0
    if cfg.checkpoint.asynchronous:
        share = (trainer.info.dp_index, trainer.layout.data)
        staging = checkpoint.staging_size(trainer.module, trainer.opt, trainer.tp, share)
    writer = host_memory.WRITER_PROCESS_BYTES if staging else 0
    return {"process": host_memory.PROCESS_BYTES, "checkpointStaging": staging, "checkpointProcess": writer}


def rank_nvls(cfg: TrainConfig, layout: Layout, stage: int) -> nvls.NvlsChoice:
    """NVLS for a GPU of ``stage`` (holmes.contract.nvls), on the GPU type the planner priced
    the stage with (the Layout's estimate; none: no NVSwitch assumed): the decision the
    planner counted and the operator renders into the pod's NCCL_NVLS_ENABLE."""
    tied = cfg.model.tied_embeddings and layout.pipeline > 1
    return nvls.from_layout(layout, tied).stages[stage]


def _peak(
    rec: Recorder, communicators: int, buffer_scale: float, nvls_bytes: int = 0
) -> tuple[dict[str, int], str]:
    """The highest of the phases' peaks once the communicators' buffers (NVLS's too, where the
    rank turns it on) are counted and the pipeline buffers scaled to the job's micro-batches
    (both are held from their creation to the end, so they add to every later moment alike)."""
    best: tuple[int, dict[str, int], str] = (-1, {}, "")
    for phase, by in rec.memory.phase_peaks.items():
        by = {k: by.get(k, 0) for k in CATEGORIES}
        by["pipelineBuffers"] = round(by["pipelineBuffers"] * buffer_scale)
        by["communication"] = communicators * NCCL_COMMUNICATOR_BYTES + nvls_bytes
        if sum(by.values()) > best[0]:
            best = (sum(by.values()), by, phase)
    return best[1], best[2]


def reduce_micro_batches(cfg: TrainConfig, layout: Layout, run: int | None) -> tuple[TrainConfig, Layout]:
    """The same job with ``run`` micro-batches per iteration (default: the pipeline depth).

    Every 1F1B (and GPipe) iteration is a warm-up of P-s-1 forwards, identical steady steps and
    a cool-down: with M >= P a stage already holds its most activations (min(P-s, M)), issues
    each kind of collective and p2p it ever issues, in the same order per step, and reads the
    device as often per iteration. What grows with M is the number of steady steps, and
    torch's receive buffers (one activation and one gradient buffer per micro-batch, allocated
    at the first step and held): those are scaled by M/run in the peak. Running all M costs
    minutes per stage on fake tensors (--micro-batches all). Schedules with virtual stages
    (v chunks per rank) warm up over up to 2P micro-batches, and DualPipeV needs 2P: they run
    2P by default."""
    M = layout.micro_batches
    virtual = sched.kind(cfg.schedule_for(layout)).placement != sched.SINGLE
    depth = 2 * layout.pipeline if virtual else layout.pipeline
    run = min(M, run or max(depth, 2))
    if run == M:
        return cfg, layout
    if run < layout.pipeline:
        raise DryRunError(
            f"--micro-batches {run}: 1F1B needs at least the pipeline depth ({layout.pipeline})"
        )
    smaller = replace(layout, micro_batches=run)
    cfg = replace(cfg, global_batch_size=layout.micro_batch_size * run * layout.data)
    problems = schedule_problems(cfg.schedule_for(layout), layout.pipeline, layout.virtual_stages, run)
    if problems:
        raise DryRunError(f"--micro-batches {run}: {'; '.join(problems)}")
    return cfg, smaller


# ---- the whole run ---------------------------------------------------------------------------


def planned_stage_bytes(layout: Layout) -> dict[int, float]:
    """The planner's memory per GPU for each stage, from the Layout's estimate (bytes)."""
    out = {}
    for s in layout.estimate.get("stages", []) or []:
        if "memoryGiB" in s and "stage" in s:
            out[int(s["stage"])] = float(s["memoryGiB"]) * GIB
    return out


def _records(result: dict[str, Any]) -> list[Collective]:
    return [
        Collective(tuple(c["group"]), c["op"], c["dtype"], c["bytes"], c.get("peer"))
        for c in result["collectives"]
    ]


def check(
    results: list[dict[str, Any]], layouts: list[Layout], iterations: int, tolerance: float
) -> dict[str, Any]:
    """The checks of the module docstring over every rank's record; ``layouts``: one per
    replica (one for a job that is not replicas)."""
    problems = sequence_problems({r["rank"]: _records(r) for r in results})
    sequences_match = not problems
    for r in sorted(results, key=lambda r: r["rank"]):
        problems += r["alignment"] + r["hostTensors"] + r.get("outer", {}).get("problems", [])
        problems += host_sync_problems(r, iterations)
    stages = []
    for q, layout in enumerate(layouts):
        planned = planned_stage_bytes(layout)
        for s in range(layout.pipeline):
            mine = [r for r in results if r["stage"] == s and r.get("replica", 0) == q]
            if not mine:
                continue
            top = max(mine, key=lambda r: r["peakBytes"])
            outer_bytes = top["peakBytesBy"].get("outer", 0)
            row: dict[str, Any] = {
                **({"replica": q} if len(layouts) > 1 else {}),
                "stage": s,
                "dryRunPeakGiB": round(top["peakBytes"] / GIB, 3),
                "dryRunPeakGiBBy": {k: round(v / GIB, 3) for k, v in top["peakBytesBy"].items()},
                "communicators": top["communicators"],
            }
            if outer_bytes:  # the same moment's peak without the outer optimizer's share
                row["withoutOuterGiB"] = round((top["peakBytes"] - outer_bytes) / GIB, 3)
            if s in planned:
                ratio = planned[s] / top["peakBytes"]
                row.update(plannedGiB=round(planned[s] / GIB, 3), plannedOverDryRun=round(ratio, 3))
                if abs(ratio - 1) > tolerance:
                    where = f"replica {q} " if len(layouts) > 1 else ""
                    peak = top["peakBytes"] / GIB
                    problems.append(
                        f"{where}stage {s}: the planner estimates {planned[s] / GIB:.2f} GiB per GPU, "
                        f"the dry run peaks at {peak:.2f} GiB ({ratio - 1:+.0%}, beyond ±{tolerance:.0%})"
                    )
            stages.append(row)
    return {
        "stages": stages,
        "hostPerNodeGiB": host_per_node(results, layouts[0]),
        "sequencesMatch": sequences_match,
        "problems": problems,
    }


def host_per_node(results: list[dict[str, Any]], layout: Layout) -> list[float]:
    """Each node's host memory (the first replica's), every rank of a stage counted as the
    most any of its ranks run here holds (a run of some ranks only stands for the others)."""
    per_stage = [0.0] * layout.pipeline
    for r in results:
        if r.get("replica", 0) == 0 and "hostBytes" in r:
            per_stage[r["stage"]] = max(per_stage[r["stage"]], float(sum(r["hostBytes"].values())))
    nodes = host_memory.per_node(per_stage, layout.data * layout.tensor, layout.gpus_per_node)
    return [round(b / GIB, 3) for b in nodes]


def host_sync_problems(r: dict[str, Any], iterations: int) -> list[str]:
    """Iterations 2..N (1 starts up): ALLOWED_STEADY_SYNCS each, ALLOWED_OUTER_SYNCS more in
    one where the outer optimizer acts."""
    out = []
    acting = set(r.get("outerIterations", []))
    for i in range(2, iterations + 1):
        phase = f"iteration {i}"
        n = r["hostSyncsBy"].get(phase, 0)
        allowed = ALLOWED_STEADY_SYNCS + (ALLOWED_OUTER_SYNCS if i in acting else 0)
        if n > allowed:
            where = "; ".join(
                f"{h['what']} at {h['where']}" for h in r["hostSyncsWhere"] if h["phase"] == phase
            )
            kind = "an outer-step" if i in acting else "a steady-state"
            problems = f"rank {r['rank']}: {n} host syncs in {kind} iteration ({phase}, allowed {allowed}): "
            out.append(problems + where)
    return out


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS has one, e.g. not macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _run_workers(argv: list[str], ranks: list[int], jobs: int) -> list[dict[str, Any]]:
    """Split the ranks over ``jobs`` processes of this tool (each rank is independent)."""
    chunks = [c for c in (ranks[i::jobs] for i in range(jobs)) if c]
    out: list[dict[str, Any]] = []
    with contextlib.ExitStack() as files:
        # output to files, not pipes: a worker that filled a pipe no one reads yet would wait
        # for the workers before it instead of running beside them
        logs = [
            (
                files.enter_context(tempfile.TemporaryFile("w+")),
                files.enter_context(tempfile.TemporaryFile("w+")),
            )
            for _ in chunks
        ]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "holmes.trainer.dryrun",
                    *argv,
                    "--worker",
                    "--ranks",
                    ",".join(map(str, c)),
                ],
                stdout=stdout,
                stderr=stderr,
                text=True,
            )
            for c, (stdout, stderr) in zip(chunks, logs)
        ]
        for p, (stdout, stderr) in zip(procs, logs):
            p.wait()
            if p.returncode:
                for other in procs:  # the rest would run on for nothing; reaped, not left behind
                    other.kill()
                    other.wait()
                stderr.seek(0)
                raise RuntimeError(f"a dry-run worker failed:\n{stderr.read()[-4000:]}")
            stdout.seek(0)
            out += json.loads(stdout.read())
    return sorted(out, key=lambda r: r["rank"])


def _without(argv: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m holmes.trainer.dryrun",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--job", required=True, help="HolmesJob manifest (YAML) or its spec")
    ap.add_argument(
        "--layout",
        required=True,
        nargs="+",
        help="Layout JSON written by the planner (holmes plan --json); several: one per replica, "
        "in replica order (acrossIslands.mode replicas: the operator's layout-<r>.json)",
    )
    ap.add_argument("--ranks", default="roles", help="roles (one per stage, default) | all | 0,9,17")
    ap.add_argument("--iterations", type=int, default=2, help="iterations to run (>= 2; default 2)")
    ap.add_argument(
        "--micro-batches",
        default="auto",
        help="micro-batches per iteration to run: auto (the pipeline depth), all, or a number",
    )
    ap.add_argument("--tolerance", type=float, default=0.10, help="planner vs dry-run memory (default 0.10)")
    ap.add_argument("--bucket-elements", type=int, help="gradient bucket size (the trainer's default else)")
    ap.add_argument("--pipeline-schedule", default="auto", help="default: the layout's")
    ap.add_argument(
        "--jobs",
        type=int,
        help="processes to spread the ranks over (default: one per CPU this process may use, "
        "at most one per rank)",
    )
    ap.add_argument("--collectives", action="store_true", help="list every rank's collectives in full")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def load_replicas(
    job: str, layout_paths: list[str], overrides: dict[str, Any]
) -> tuple[TrainConfig, list[Layout]]:
    """The job's configuration and one Layout per replica (one path: no replicas). Replicas
    share the job's globalBatchSize (each runs its 1/R, as the operator gives it) and pair
    their optimizer shards rank by rank, so their Layouts must have one signature."""
    R = len(layout_paths)
    if R == 1:
        cfg, layout = configure(job, layout_paths[0], training=True, **overrides)
        return cfg, [layout]
    whole, _ = configure(job, layout_paths[0], training=False, **overrides)
    mode = whole.across_islands.mode
    if mode == "pipeline":
        raise DryRunError(
            f"{R} layouts are {R} replicas, but spec.training.acrossIslands.mode is pipeline: set it "
            "to replicas (or auto), or give one layout"
        )
    if whole.global_batch_size % R:
        raise DryRunError(
            f"spec.training.globalBatchSize {whole.global_batch_size} does not split into {R} replicas: "
            f"make it a multiple of {R} x microBatchSize"
        )
    share = {**overrides, "global_batch_size": whole.global_batch_size // R}
    found = [configure(job, p, training=True, **share) for p in layout_paths]
    layouts = [lay for _, lay in found]
    first = layout_signature(layouts[0])
    for q, lay in enumerate(layouts[1:], 1):
        if layout_signature(lay) != first:
            raise DryRunError(
                f"the layout of replica {q} ({layout_paths[q]}) differs from replica 0's in "
                f"{', '.join(k for k in first if layout_signature(lay).get(k) != first[k])}: replicas "
                "pair their optimizer shards rank by rank, so plan them alike (the operator refuses them too)"
            )
    return found[0][0], layouts


def is_replicas(cfg: TrainConfig, replicas: int) -> bool:
    """Whether the trainer runs the outer optimizer (engine.replicas_of): several replicas, or
    mode replicas on one (its outer steps on itself)."""
    return replicas > 1 or cfg.across_islands.mode == "replicas"


def outer_summary(results: list[dict[str, Any]], note: dict[str, Any]) -> dict[str, Any]:
    """The outer optimizer across the ranks run: the most any rank sends per outer step and per
    cycle of fragments, and holds as state."""
    mine = [r["outer"] for r in results if "outer" in r]
    if not mine:
        return {}
    first = mine[0]
    keys = ("replicas", "fragments", "overlapSteps", "exchangeDtype")
    return {
        **{k: first[k] for k in keys},
        **note,
        "bytesPerOuterStep": max(max(o["fragmentBytes"]) for o in mine),
        "bytesPerCycle": max(o["bytesPerCycle"] for o in mine),
        "stateBytes": max(o["stateBytes"] for o in mine),
        "outerStepsRun": min(o["outerSteps"] for o in mine),
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.iterations < 2:
            raise DryRunError("--iterations must be >= 2: the last one is the steady state checked")
        if args.jobs is not None and args.jobs < 1:
            raise DryRunError(f"--jobs {args.jobs}: give 1 or more processes, or leave it out (one per CPU)")
        overrides: dict[str, Any] = {"dtype": "bfloat16", "pipeline_schedule": args.pipeline_schedule}
        if args.bucket_elements:
            overrides["bucket_elements"] = args.bucket_elements
        job_cfg, layouts = load_replicas(args.job, args.layout, overrides)
        layout, R = layouts[0], len(layouts)
        cfg, skipped = dry_config(job_cfg, args.iterations)
        note: dict[str, Any] = {}
        if is_replicas(cfg, R):
            cfg, note = outer_config(cfg, cfg.iterations)
        ranks = parse_ranks(args.ranks, layout, R)
        mb = args.micro_batches
        if mb not in ("auto", "all") and not (mb.isdigit() and int(mb) > 0):
            raise DryRunError(f"--micro-batches {mb!r}: use auto, all or a positive number")
        run = layout.micro_batches if mb == "all" else (None if mb == "auto" else int(mb))
        cfg, run_layout = reduce_micro_batches(cfg, layout, run)
        run_layouts = [replace(lay, micro_batches=run_layout.micro_batches) for lay in layouts]
    except (OSError, ValueError) as e:
        print(f"holmes dryrun: {e}", file=sys.stderr)
        return 2
    scale = layout.micro_batches / run_layout.micro_batches
    W = layout.world_size
    jobs = min(args.jobs or usable_cpus(), len(ranks))
    if args.worker or jobs <= 1:
        results = []
        for g in ranks:
            q = g // W
            place = outer.ReplicaPlace(q, R, "", 0) if R > 1 else None
            results.append(run_rank(cfg, run_layouts[q], g % W, scale, place))
        if args.worker:
            print(json.dumps(results))
            return 0
    else:
        results = _run_workers(_without(_without(argv, "--ranks"), "--jobs"), ranks, jobs)
    out: dict[str, Any] = {
        "worldSize": W,
        **({"replicas": R} if R > 1 else {}),
        "ranksRun": ranks,
        "iterations": cfg.iterations,
        "microBatches": layout.micro_batches,
        "microBatchesRun": run_layout.micro_batches,
        "dtype": cfg.dtype,
        "skipped": skipped + ["parameter initialisation (values: fake tensors hold none)"],
        **({"outer": outer_summary(results, note)} if note else {}),
        **check(results, layouts, cfg.iterations, args.tolerance),
        "ranks": results,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if not args.collectives:
        for r in out["ranks"]:
            r["collectiveCount"] = len(r["collectives"])
            r["collectives"] = r["collectives"][:64]  # the start of it; --collectives for all
    print(json.dumps(out, indent=1))
    return 1 if out["problems"] else 0
