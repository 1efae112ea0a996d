"""The dry run: the real engine, at the job's real scale, on fake CUDA and a fake process group.

    python -m holmes.trainer.dryrun --job JOB.yaml --layout LAYOUT.json [--ranks roles|all|0,9,17]
    holmes dryrun --job JOB.yaml (--layout LAYOUT.json | --nodes NODES.yaml)

One process plays one rank after another: ``init_process_group("fake")`` makes it rank r of the
Layout's world (every collective and send/recv returns at once, moving no data), and
``FakeTensorMode`` with a ``cuda`` device (fakecuda.py) makes every tensor a shape without
memory, in bf16 as on GPUs. For each rank the real :class:`~holmes.trainer.engine.Trainer` is
built from the job and the Layout and trains ``--iterations`` (default 2) iterations: the
pipeline schedule, the overlapped optimizer with its step, the stop vote. A
:class:`~holmes.trainer.recording.Recorder` sees every operator below every Python wrapper
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

Checks (``problems``; any makes the exit status 1):

- every group's collectives are the same sequence (op, dtype, bytes) on every member that ran,
  and every send is met by its peer's receive, in order: no deadlock at the real world size;
- at most :data:`ALLOWED_STEADY_SYNCS` host syncs in the last (steady-state) iteration: the
  one documented read of the loss and the global grad norm (engine.py);
- every parameter, bucket and shard of the flat buffers starts 256-byte aligned;
- each stage's peak GPU memory within ``--tolerance`` (10%) of the planner's estimate in the
  Layout (``estimate.stages[].memoryGiB``), when the Layout carries one.

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
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from . import fakecuda

fakecuda.load_before_torch()  # torch reads its CUDA hooks once, when imported (fakecuda.py)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from holmes.contract import Layout, nvls  # noqa: E402
from holmes.contract import pipeline_schedules as sched  # noqa: E402

from . import engine as engine_mod  # noqa: E402
from . import model as model_mod  # noqa: E402
from . import preempt  # noqa: E402
from .config import CheckpointConfig, DataConfig, TrainConfig, schedule_problems  # noqa: E402
from .dist_optimizer import DistributedOptimizer  # noqa: E402
from .fakecuda import fake_cuda  # noqa: E402
from .recording import CATEGORIES, NCCL_COMMUNICATOR_BYTES, Collective, Recorder, sequence_problems  # noqa: E402
from .startup import configure  # noqa: E402

# One read of the device per iteration is by design: the loss and the global grad norm, which
# the clipping coefficient and the NaN check need on the host (engine.Trainer.train_step).
ALLOWED_STEADY_SYNCS = 1
ALIGN_BYTES = 256
GIB = 2**30


class DryRunError(ValueError):
    """Bad arguments: the message names the fix."""


def role_ranks(layout: Layout) -> list[int]:
    """One rank per stage: data index 0, tensor index 0 (see the module docstring)."""
    return [s * layout.ranks_per_stage for s in range(layout.pipeline)]


def parse_ranks(text: str, layout: Layout) -> list[int]:
    if text == "roles":
        return role_ranks(layout)
    if text == "all":
        return list(range(layout.world_size))
    try:
        ranks = sorted({int(r) for r in text.split(",") if r.strip()})
    except ValueError:
        raise DryRunError(f"--ranks {text!r}: use roles, all, or rank numbers like 0,9,17") from None
    bad = [r for r in ranks if not 0 <= r < layout.world_size]
    if bad or not ranks:
        raise DryRunError(f"--ranks {text!r}: ranks must be in [0, {layout.world_size})")
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
        checkpoint=CheckpointConfig(),
        eval=None,
        data=DataConfig(),
    )
    return cfg, skipped


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


def communicators(trainer: engine_mod.Trainer, calls: list[Collective]) -> list[dict[str, Any]]:
    """The device communicators this rank's run created: NCCL makes one lazily for each group
    the first time a collective uses it with device tensors, and one per peer for send/recv on
    a group of more than two ranks. Host (gloo) groups hold no GPU memory and are left out."""
    kinds = {pg.group_name: created for created, pg in trainer.groups.members}
    world = dist.group.WORLD.group_name
    out: dict[tuple[str, int | None], dict[str, Any]] = {}
    for c in calls:
        if c.device == "cpu":
            continue
        made = kinds.get(c.name) or {
            "kind": "world" if c.name == world else "other",
            "size": len(c.group),
            "net": trainer.layout.world_net if c.name == world else "?",
        }
        if c.peer is not None and len(c.group) > 2:
            entry = {"kind": f"{made['kind']} pair", "size": 2, "net": made.get("net"), "peer": c.peer}
            out.setdefault((c.name, c.peer), entry)
        else:
            out.setdefault((c.name, None), {k: made[k] for k in ("kind", "size", "net") if k in made})
    return list(out.values())


def run_rank(cfg: TrainConfig, layout: Layout, rank: int, buffer_scale: float = 1.0) -> dict[str, Any]:
    """Rank ``rank`` of ``layout`` through ``cfg.iterations`` iterations; JSON-ready.
    ``buffer_scale``: the job's micro-batches over those run (see :func:`reduce_micro_batches`)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    rec = Recorder()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
    t0 = time.perf_counter()
    try:
        device = torch.device("cuda", rank % layout.gpus_per_node)
        with fake_cuda(rec.on_host_sync), rec, memory_labels(rec), object_collectives(rec):
            trainer = engine_mod.Trainer(
                cfg, layout, rank=rank, device=device, backend="fake", host_backend="fake"
            )

            def next_phase(t: engine_mod.Trainer, record: dict) -> None:
                rec.phase = f"iteration {t.iteration + 1}"

            rec.phase = "iteration 1"
            trainer.train(on_iteration=next_phase)
            aligned = alignment_problems(trainer.opt, rank)
        comms = communicators(trainer, rec.collectives)
        info = layout.rank_info(rank)
        nvls_choice = rank_nvls(cfg, layout, info.stage)
        peak_by, peak_phase = _peak(rec, len(comms), buffer_scale, nvls_choice.bytes)
        steady = f"iteration {cfg.iterations}"
        return {
            "rank": rank,
            "stage": info.stage,
            "dpIndex": info.dp_index,
            "tpIndex": info.tp_index,
            "peakBytes": sum(peak_by.values()),
            "peakBytesBy": peak_by,
            "peakPhase": peak_phase,
            "hostSyncs": sum(1 for h in rec.host_syncs if h.phase == steady),
            "hostSyncsWhere": [
                {"what": h.what, "where": h.where, "phase": h.phase}
                for h in rec.host_syncs
                if h.phase != "build"
            ],
            "communicators": len(comms),
            "nvls": {"enabled": nvls_choice.enabled, "bytes": nvls_choice.bytes, "why": nvls_choice.why},
            "communicatorList": comms,
            "collectives": [c.to_json() for c in rec.collectives],
            "seconds": round(time.perf_counter() - t0, 2),
            "alignment": aligned,
        }
    finally:
        dist.destroy_process_group()


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


def check(results: list[dict[str, Any]], layout: Layout, iterations: int, tolerance: float) -> dict[str, Any]:
    """The checks of the module docstring over every rank's record."""
    problems = sequence_problems({r["rank"]: _records(r) for r in results})
    sequences_match = not problems
    steady = f"iteration {iterations}"
    for r in sorted(results, key=lambda r: r["rank"]):
        problems += r["alignment"]
        if r["hostSyncs"] > ALLOWED_STEADY_SYNCS:
            where = "; ".join(
                f"{h['what']} at {h['where']}" for h in r["hostSyncsWhere"] if h["phase"] == steady
            )
            problems.append(
                f"rank {r['rank']}: {r['hostSyncs']} host syncs in a steady-state iteration "
                f"(allowed {ALLOWED_STEADY_SYNCS}): {where}"
            )
    planned = planned_stage_bytes(layout)
    stages = []
    for s in range(layout.pipeline):
        mine = [r for r in results if r["stage"] == s]
        if not mine:
            continue
        top = max(mine, key=lambda r: r["peakBytes"])
        row: dict[str, Any] = {
            "stage": s,
            "dryRunPeakGiB": round(top["peakBytes"] / GIB, 3),
            "dryRunPeakGiBBy": {k: round(v / GIB, 3) for k, v in top["peakBytesBy"].items()},
            "communicators": top["communicators"],
        }
        if s in planned:
            ratio = planned[s] / top["peakBytes"]
            row.update(plannedGiB=round(planned[s] / GIB, 3), plannedOverDryRun=round(ratio, 3))
            if abs(ratio - 1) > tolerance:
                problems.append(
                    f"stage {s}: the planner estimates {planned[s] / GIB:.2f} GiB per GPU, the dry run "
                    f"peaks at {top['peakBytes'] / GIB:.2f} GiB ({ratio - 1:+.0%}, beyond ±{tolerance:.0%})"
                )
        stages.append(row)
    return {"stages": stages, "sequencesMatch": sequences_match, "problems": problems}


def _run_workers(argv: list[str], ranks: list[int], jobs: int) -> list[dict[str, Any]]:
    """Split the ranks over ``jobs`` processes of this tool (each rank is independent)."""
    chunks = [ranks[i::jobs] for i in range(jobs)]
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
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in chunks
        if c
    ]
    out: list[dict[str, Any]] = []
    for p in procs:
        stdout, stderr = p.communicate()
        if p.returncode:
            raise RuntimeError(f"a dry-run worker failed:\n{stderr[-4000:]}")
        out += json.loads(stdout)
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
    ap.add_argument("--layout", required=True, help="Layout JSON written by the planner (holmes plan --json)")
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
    ap.add_argument("--jobs", type=int, default=1, help="processes to spread the ranks over (default 1)")
    ap.add_argument("--collectives", action="store_true", help="list every rank's collectives in full")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.iterations < 2:
            raise DryRunError("--iterations must be >= 2: the last one is the steady state checked")
        overrides: dict[str, Any] = {"dtype": "bfloat16", "pipeline_schedule": args.pipeline_schedule}
        if args.bucket_elements:
            overrides["bucket_elements"] = args.bucket_elements
        job_cfg, layout = configure(args.job, args.layout, training=True, **overrides)
        cfg, skipped = dry_config(job_cfg, args.iterations)
        ranks = parse_ranks(args.ranks, layout)
        mb = args.micro_batches
        if mb not in ("auto", "all") and not (mb.isdigit() and int(mb) > 0):
            raise DryRunError(f"--micro-batches {mb!r}: use auto, all or a positive number")
        run = layout.micro_batches if mb == "all" else (None if mb == "auto" else int(mb))
        cfg, run_layout = reduce_micro_batches(cfg, layout, run)
    except (OSError, ValueError) as e:
        print(f"holmes dryrun: {e}", file=sys.stderr)
        return 2
    scale = layout.micro_batches / run_layout.micro_batches
    if args.worker or args.jobs <= 1:
        results = [run_rank(cfg, run_layout, r, scale) for r in ranks]
        if args.worker:
            print(json.dumps(results))
            return 0
    else:
        results = _run_workers(
            _without(_without(argv, "--ranks"), "--jobs"), ranks, min(args.jobs, len(ranks))
        )
    out: dict[str, Any] = {
        "worldSize": layout.world_size,
        "ranksRun": ranks,
        "iterations": cfg.iterations,
        "microBatches": layout.micro_batches,
        "microBatchesRun": run_layout.micro_batches,
        "dtype": cfg.dtype,
        "skipped": skipped + ["parameter initialisation (values: fake tensors hold none)"],
        **check(results, layout, cfg.iterations, args.tolerance),
        "ranks": results,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if not args.collectives:
        for r in out["ranks"]:
            r["collectiveCount"] = len(r["collectives"])
            r["collectives"] = r["collectives"][:64]  # the start of it; --collectives for all
    print(json.dumps(out, indent=1))
    return 1 if out["problems"] else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # now: the autograd engine's threads for the fake devices never join at exit
