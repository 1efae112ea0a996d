"""The training engine: one rank's part of a Layout, from groups to metrics and checkpoints.

The default process group must already be initialised (the entry point or a test does it).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from holmes.contract import ModelCost, flops
from holmes.contract import trainer_metrics as wire
from holmes.contract.layout import Layout, layout_signature

from . import checkpoint, fabric, outer, preempt
from .assemble import load_start_weights, stage_model
from .async_checkpoint import AsyncCheckpointer, Saved
from .config import OptimizerConfig, TrainConfig, TrainerConfigError
from .data import BatchLoader, Sharding, TokenWindows, make_source
from .dist_optimizer import DistributedOptimizer
from .evaluate import Evaluator
from .groups import build_groups
from .load_barrier import meet_after_load
from .model import TIED_COPY, global_name
from .models import sharding
from .reporting import MetricsSink
from .schedule import MicroBatchRunner
from .stage_times import StageTimes

CHECKPOINT_TIMEOUT_SECONDS = 1800.0  # checkpoint coordination: writers of a 70B stage take minutes


def learning_rate(cfg: OptimizerConfig, iteration: int, total: int) -> float:
    """Linear warm-up, then cosine, linear or no decay to min_learning_rate at the last
    iteration; a pure function of i (so a resumed run continues the same schedule)."""
    lr, lo, warm = cfg.learning_rate, cfg.min_learning_rate, cfg.warmup_iterations
    if iteration < warm:
        return lr * (iteration + 1) / warm
    if cfg.decay == "constant" or total <= warm:
        return lr
    progress = min(1.0, (iteration - warm) / max(1, total - warm))
    if cfg.decay == "linear":
        return lr + (lo - lr) * progress
    return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * progress))


def replicas_of(cfg: TrainConfig, place: outer.ReplicaPlace | None) -> outer.ReplicaPlace | None:
    """This run's place among replicas (None: one synchronous world). mode replicas without a
    place is one replica (outer steps on itself); auto follows what the operator decided (a
    place given or not); pipeline with a place is a mismatch between job and launcher."""
    mode = cfg.across_islands.mode
    if mode == "pipeline":
        if place is not None:
            raise outer.ReplicaError(
                f"{outer.ENV_REPLICA} is set but spec.training.acrossIslands.mode is pipeline: set "
                "mode replicas (or auto), or start the trainer without the replica variables"
            )
        return None
    if mode == "replicas" and place is None:
        return outer.ReplicaPlace(0, 1, "", 0)
    return place


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        layout: Layout,
        *,
        rank: int,
        device: torch.device,
        backend: str,
        sink: MetricsSink | None = None,
        fabric_root: str | None = None,
        preemption: preempt.Preemption | None = None,
        host_backend: str = "gloo",
        replica: outer.ReplicaPlace | None = None,
    ):
        cfg.check_against_layout(layout)
        self.replica = replicas_of(cfg, replica)
        if self.replica is not None and cfg.checkpoint.path:  # each replica resumes its own state
            path = os.path.join(cfg.checkpoint.path, f"replica-{self.replica.replica}")
            cfg = cfg.with_(checkpoint=replace(cfg.checkpoint, path=path))
        if dist.get_world_size() != layout.world_size:
            raise RuntimeError(
                f"the layout needs {layout.world_size} ranks but {dist.get_world_size()} "
                "were started: launch nnodes*nproc-per-node = layout worldSize processes"
            )
        self.cfg, self.layout, self.rank, self.device = cfg, layout, rank, device
        self.sink = sink or MetricsSink(enabled=False)
        info = layout.rank_info(rank)
        self.info = info
        P, D, M = layout.pipeline, layout.data, layout.micro_batches
        self.schedule = cfg.schedule_for(layout)
        # the ranks holding layer 0 and the last layer (one rank holds both in a V-shaped schedule)
        ranges = layout.stages[info.stage].ranges
        self.first = any(a == 0 for a, _ in ranges)
        self.last = any(b == layout.num_layers for _, b in ranges)
        tied_split = cfg.model.tied_embeddings and layout.embedding_split
        # SIGTERM (preempt.py): every rank votes each iteration on a gloo group of its own, made
        # first: the fabric preflight gathers its findings on it, before any NCCL group exists
        # (host_backend: gloo; the dry run's fake group plays it there)
        self.preemption = preemption or preempt.Preemption()
        self.vote = preempt.StopVote(cfg.timeout_seconds, host_backend)
        self.fabric = fabric.check_devices(
            mode=cfg.fabric_check,
            rank=rank,
            layout=layout,
            backend=backend,
            host_group=self.vote.group,
            root=fabric_root,
            timeout_s=cfg.timeout_seconds,
        )
        self.groups = build_groups(
            layout, rank, backend, cfg.timeout_seconds, need_embedding=tied_split, nets=self.fabric.nets
        )
        fabric.check_groups(
            self.fabric,
            rank=rank,
            layout=layout,
            groups=self.groups,
            device=device,
            host_group=self.vote.group,
            timeout_s=cfg.timeout_seconds,
        )
        self.sink.fabric_problems(self.fabric.counts())
        self.groups.preemption = self.vote.group
        # Checkpoint coordination (DCP's plan exchange and barriers) on a host group of its own:
        # pickled plans stay in host memory, and a save slower than the NCCL timeout (a big
        # model on a slow filesystem) cannot trip the NCCL watchdog of the world group.
        self.checkpoint_group = dist.new_group(
            backend=host_backend,
            timeout=timedelta(seconds=max(cfg.timeout_seconds, CHECKPOINT_TIMEOUT_SECONDS)),
        )
        # asynchronous saves (async_checkpoint.py): staged here, written while training goes on
        self.checkpointer = None
        if cfg.checkpoint.path and cfg.checkpoint.asynchronous:
            self.checkpointer = AsyncCheckpointer(self.checkpoint_group, rank, on_commit=self._committed)
        self.groups.created.append(
            {"kind": "preemption", "size": layout.world_size, "backend": "gloo", "net": "Socket"}
        )
        self.preempted: dict[str, Any] | None = None
        self.module = stage_model(cfg, layout, rank, device, self.groups, recompute=cfg.activation_recompute)
        self.tp = self.module.tp
        # Before the optimizer copies the weights into its shards: a run that resumes takes its
        # checkpoint's (maybe_resume, with the optimizer state), a fresh one the job's.
        self.resume_iteration = self._newest_checkpoint()
        self.weight_load_seconds: dict[int, float] | None = None
        if self.resume_iteration is None:
            t_load = time.perf_counter()
            load_start_weights(self.module, cfg, None, self.groups.world)
            if cfg.model.init is not None:  # one stage on slow storage: stop here, saying so
                self.weight_load_seconds = meet_after_load(
                    time.perf_counter() - t_load,
                    self.vote.group,
                    cfg.timeout_seconds,
                    "the Hugging Face weights (spec.model.init.huggingface.path)",
                )
        tied_name = None
        if tied_split:
            tied_name = "embedding.tok.weight" if self.first else TIED_COPY
        self.opt = DistributedOptimizer(
            self.module,
            cfg.optimizer,
            dp_group=self.groups.dp,
            dp_size=D,
            dp_rank=info.dp_index,
            micro_batches=M,
            overlap=cfg.overlap,
            bucket_elements=cfg.bucket_elements,
            embedding_group=self.groups.embedding if tied_split else None,
            tied_param_name=tied_name,
            tied_in_norm=self.first,
            reduce_dtype=getattr(torch, cfg.grad_reduce_dtype),
            tp=self.tp,
            tp_replicated={
                n for n, _ in self.module.named_parameters() if sharding.split_of(global_name(n)) is None
            },
        )
        # replicas: the outer group (the same rank of every replica) and the outer optimizer
        self.outer: outer.OuterSync | None = None
        if self.replica is not None:
            group: outer.OuterGroup = outer.LocalGroup()
            if self.replica.replicas > 1:
                group = outer.OuterGroup.connect(
                    self.replica, rank, layout.world_size, backend, cfg.timeout_seconds
                )
                self.groups.created.append(
                    {"kind": "outer", "size": group.size, "backend": backend, "net": outer.OUTER_NET}
                )
            self.outer = outer.OuterSync(self.opt, cfg.across_islands, group)
        self.runner = MicroBatchRunner(
            self.module,
            cfg.model,
            getattr(torch, cfg.dtype),
            stage=info.stage,
            stages=P,
            micro_batches=M,
            micro_batch_size=layout.micro_batch_size,
            device=device,
            pp_group=self.groups.pp,
            p2p_groups=self.groups.p2p,
            schedule=self.schedule,
            tp=self.tp,
            on_weight_grads=self.opt.collect_grads,
        )
        self.opt.count_uses(self.runner.chunk_params)
        # every stage's times at rank 0, on the all-reduce train_step already does (stage_times.py)
        self.stage_times = StageTimes([s.num_layers for s in layout.stages], info.stage, D * layout.tensor, M)
        self.loader = None
        if self.first or self.last:
            source = make_source(
                cfg.data.path,
                cfg.model.vocab_size,
                cfg.model.seq_length,
                cfg.seed,
                cfg.data.token_dtype,
                blend=cfg.data.blend,
            )
            R, r = (1, 0) if self.replica is None else (self.replica.replicas, self.replica.replica)
            # replicas read disjoint samples: replica r's DP rank d is DP rank r*D + d of R*D
            shards = Sharding(cfg.global_batch_size * R, D * R, r * D + info.dp_index)
            self.loader = BatchLoader(source, shards)
        self.evaluator = None
        if cfg.eval is not None:
            windows = TokenWindows(cfg.eval.path, cfg.model.vocab_size, cfg.model.seq_length)
            self.evaluator = Evaluator(
                self.module,
                cfg.model,
                layout,
                rank,
                self.groups,
                windows,
                device,
                getattr(torch, cfg.dtype),
                limit=cfg.eval.windows,
            )
        # what one iteration computes never changes: count it once, not per iteration
        self.model_cost = ModelCost.of(cfg.model)
        self.flops_per_iteration = self.model_cost.flops_per_iteration(
            cfg.global_batch_size, recompute=cfg.activation_recompute
        )
        self.tokens_per_iteration = cfg.global_batch_size * cfg.model.seq_length
        self.iteration = 0
        self.last_save_seconds: float | None = None
        self.history: list[dict[str, Any]] = []
        self.last_eval_loss: float | None = None

    # ---- checkpoints ---------------------------------------------------------------------
    def _training_meta(self) -> dict[str, Any]:
        """What a checkpoint must share with the run that continues it (besides the model)."""
        return {"globalBatchSize": self.cfg.global_batch_size, "optimizer": self.cfg.optimizer.kind}

    def save_checkpoint(self, *, synchronous: bool = False, **marker: Any) -> str:
        """Collective (checkpoint group): model, optimizer state and RNG under global names, then
        the marker (holmes.json) with ``marker``'s extra fields. Returns the directory. With
        training.checkpoint.asynchronous (and not ``synchronous``) it returns once the state is
        staged; the marker follows when every rank has written (async_checkpoint.py)."""
        root = self.cfg.checkpoint.path
        if root is None:
            raise TrainerConfigError("no checkpoint to save: set training.checkpoint.path")
        # an overlapped outer exchange in flight is settled first: the anchor saved is after it
        marker = {**marker, **({} if self.outer is None else self.outer.checkpoint_marker())}
        self.opt.wait_param_gathers()
        # each data-parallel rank writes (and so stages) its share of the stage's weights
        share = (self.info.dp_index, self.layout.data)
        state = checkpoint.model_tensors(self.module, tied_copy=False, share=share)
        state.update(checkpoint.optimizer_tensors(self.opt, self.tp, saving=True))
        state.update(checkpoint.rng_state(self.rank))
        meta = {
            "format": checkpoint.FORMAT,
            "layout": layout_signature(self.layout),
            "model": self.cfg.model.shape(),
            **self._training_meta(),
            "consumedSamples": self.iteration * self.cfg.global_batch_size,
            **marker,
        }
        if self.checkpointer is not None and not synchronous:
            return self.checkpointer.save(root, self.iteration, state, meta)
        self.wait_for_checkpoint()
        t0 = time.perf_counter()
        path = checkpoint.save(root, self.iteration, state, self.rank, meta, group=self.checkpoint_group)
        self._committed(Saved(self.iteration, path, time.perf_counter() - t0, time.perf_counter() - t0))
        return path

    def _committed(self, saved: Saved) -> None:
        # staging to commit: what a synchronous save on preemption is expected to need (an
        # overestimate for a background write, which shares the machine with training)
        self.last_save_seconds = saved.total_seconds
        extra = {} if self.checkpointer is None else {"stagingSeconds": round(saved.stage_seconds, 3)}
        self.sink.emit(
            wire.CHECKPOINT,
            iteration=saved.iteration,
            path=saved.path,
            seconds=round(saved.total_seconds, 3),
            **extra,
        )

    def wait_for_checkpoint(self) -> None:
        """Collective: the in-flight asynchronous save committed (its failure raised here)."""
        if self.checkpointer is not None:
            self.checkpointer.wait()

    def _newest_checkpoint(self) -> int | None:
        root = self.cfg.checkpoint.path
        if not root:
            return None
        found = torch.tensor(
            [-1 if (n := checkpoint.newest_complete(root)) is None else n],
            dtype=torch.long,
            device=self.device,
        )
        dist.broadcast(found, src=0, group=self.groups.world)  # rank 0 decides: all load the same one
        iteration = int(found.item())
        return None if iteration < 0 else iteration

    def maybe_resume(self) -> None:
        """Continue from the newest complete checkpoint, written under this layout or another
        (checkpoint.py): weights, optimizer state and step count exactly; RNG only under the
        same layout."""
        root, iteration = self.cfg.checkpoint.path, self.resume_iteration
        if iteration is None:
            return
        assert root is not None, "_newest_checkpoint found it under training.checkpoint.path"
        path = checkpoint.iteration_dir(root, iteration)
        signature = layout_signature(self.layout)
        meta = checkpoint.check_resume(path, self.cfg.model.shape(), self._training_meta(), signature)
        same_layout = meta.get("layout") == signature
        self.opt.wait_param_gathers()
        saved = checkpoint.saved_sizes(path)
        if meta.get("format", 1) == 1:  # per-bucket optimizer shards: same layout only (checked)
            tp = f".tp{self.info.tp_index}" if self.layout.tensor > 1 else ""
            prefix = f"optim.stage{self.info.stage}{tp}.dp{self.info.dp_index}"
            state = checkpoint.model_tensors(self.module, global_names=False, saved=saved)
            state.update(self.opt.bucket_state_dict(prefix))
            step_key = f"{prefix}.step"
        else:
            state = checkpoint.model_tensors(self.module, saved=saved)
            state.update(checkpoint.optimizer_tensors(self.opt, self.tp, saving=False))
            step_key = "optim.step"
        if same_layout:  # a rank's RNG stream belongs to its place in the layout
            state.update({k: v for k, v in checkpoint.rng_state(self.rank).items() if k in saved})
        checkpoint.load(path, state, group=self.checkpoint_group)
        self.opt.step_count = int(state[step_key])
        if same_layout:
            checkpoint.restore_rng(state, self.rank)
        if self.outer is not None:  # an overlapped exchange's mix still due
            self.outer.resume(meta)
        self.iteration = iteration
        self.resume_iteration = None
        self.sink.emit(
            wire.RESUME,
            iteration=iteration,
            path=path,
            consumedSamples=iteration * self.cfg.global_batch_size,
            layoutChanged=not same_layout,
            rngRestored=same_layout,
        )

    def _stop_for_preemption(self, signalled: int, due: bool) -> None:
        """Every rank, at the same iteration boundary: save if wanted and it fits in the least
        grace any rank has left (all decide alike), then note it for the exit code (83)."""
        cfg = self.cfg
        path, seconds, left = None, 0.0, None
        self.wait_for_checkpoint()  # a save in flight is finished first: it may be all there is
        if cfg.checkpoint.path and (cfg.checkpoint.on_preemption or due):
            needed = preempt.save_seconds_needed(self.last_save_seconds)
            fits, left = self.vote.save_fits(self.preemption.seconds_left(preempt.grace_seconds()), needed)
            if fits:
                path = self.save_checkpoint(synchronous=True, preempted=True)
                assert self.last_save_seconds is not None, "a synchronous save measures itself"
                seconds = self.last_save_seconds
        last = self.history[-1] if self.history else {}
        self.preempted = {"iteration": self.iteration, "saved": path is not None}
        self.sink.emit(
            wire.PREEMPTED,
            iteration=self.iteration,
            loss=last.get("loss"),
            **self.outer_progress(),
            saved=path is not None,
            **({"path": path} if path else {}),
            seconds=round(seconds, 3),
            signalledRanks=signalled,
            **({"graceLeftSeconds": round(left, 3)} if left is not None and math.isfinite(left) else {}),
        )

    def _settle_outer(self) -> None:
        """Before leaving: the other replicas' all-reduce in flight needs this rank to finish it."""
        if self.outer is not None:
            self.outer.settle()

    def outer_progress(self) -> dict[str, Any]:
        """The outer steps taken, for a last line (read once the pod ended: trainer_metrics)."""
        return {} if self.outer is None else {"outerStep": self.outer.outer_steps}

    def evaluate(self) -> dict[str, Any]:
        """training.eval's loss on its windows with the current weights (collective)."""
        if self.evaluator is None:
            raise TrainerConfigError("nothing to evaluate on: set training.eval")
        self.opt.wait_param_gathers()
        t0 = time.perf_counter()
        result = self.evaluator.run()
        seconds = round(time.perf_counter() - t0, 3)
        self.sink.emit(wire.EVAL, iteration=self.iteration, seconds=seconds, **result)
        return result

    # ---- one iteration -------------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        cfg, lay, i = self.cfg, self.layout, self.iteration
        M, D = lay.micro_batches, lay.data
        lr = learning_rate(cfg.optimizer, i, cfg.iterations)
        t0 = time.perf_counter()
        self.opt.times.reset()
        self.runner.reset_times()
        inputs = targets = None
        if self.loader is not None:
            x, y = self.loader.batch(i)
            inputs = self._upload(x) if self.first else None
            targets = self._upload(y) if self.last else None
        t_data = time.perf_counter() - t0

        t1 = time.perf_counter()
        loss_sum = self.runner.run(inputs, targets)
        t_sched = time.perf_counter() - t1

        self.opt.finish_grad_sync()
        t2 = time.perf_counter()
        if loss_sum is None or self.tp.rank > 0:  # every tp rank of the last stage has the loss
            loss_part = torch.zeros((), device=self.device)
        else:
            loss_part = loss_sum / (M * D)
        red = torch.cat(
            [
                torch.stack([self.opt.local_grad_sq(), loss_part.to(torch.float32)]),
                self._upload(torch.tensor(self.stage_times.outgoing(), dtype=torch.float32)),
            ]
        )
        dist.all_reduce(red, group=self.groups.world)  # every rank: global grad norm and mean loss
        # The iteration's one read of the device (the dry run allows exactly one): clipping and
        # the NaN check need both numbers on the host. One copy, then host-side reads.
        host = red.cpu()
        grad_norm, loss = math.sqrt(float(host[0])), float(host[1])
        stages = self.stage_times.incoming(host[2:].tolist())
        t_norm = time.perf_counter() - t2
        if not (math.isfinite(grad_norm) and math.isfinite(loss)):
            raise FloatingPointError(
                f"iteration {i + 1}: loss {loss} / grad norm {grad_norm} is not finite; "
                "lower learningRate or check the data"
            )
        clip = cfg.optimizer.grad_clip
        coef = min(1.0, clip / (grad_norm + 1e-6)) if clip > 0 else 1.0

        t3 = time.perf_counter()
        # Queued, not waited for: the GPU runs the update and the all-gathers while the host
        # goes on to the next iteration (the forward pre-hooks wait for each gather).
        self.opt.step(lr, coef)
        t_step = time.perf_counter() - t3
        self.iteration += 1
        synced = None if self.outer is None else self.outer.after_step(self.iteration)
        seconds = time.perf_counter() - t0

        times = self.opt.times
        param_wait, run_compute = times.param_wait.seconds(), self.runner.compute
        compute = max(0.0, run_compute - param_wait)
        exposed = (
            times.grad_wait.seconds() + param_wait + times.embedding.seconds() + times.tp.seconds() + t_norm
        )
        if not cfg.overlap:  # synchronous all-gathers ran inside step
            t_step = max(0.0, t_step - param_wait)
        bubble = max(0.0, t_sched - run_compute)
        dp_exposed = times.grad_wait.seconds() + param_wait + times.embedding.seconds()
        self.stage_times.record(compute, self.runner.p2p_wait, dp_exposed)
        record = {
            "iteration": self.iteration,
            "loss": loss,
            "learningRate": lr,
            "gradNorm": grad_norm,
            "iterationSeconds": seconds,
            "tokensPerSecond": self.tokens_per_iteration / seconds,
            "tflopsPerGpu": flops.tflops_per_gpu(self.flops_per_iteration, seconds, lay.world_size),
            "time": {
                "compute": compute,
                "bubble": bubble,
                "exposedComm": exposed,
                "optimizer": t_step,
                "data": t_data,
            },
        }
        if self.outer is not None:
            record["outerStep"] = self.outer.outer_steps  # status.progress.outerStep (trainer_metrics)
        if synced is not None:
            record["outer"] = synced
        if stages is not None:
            record[wire.STAGES] = stages  # measured in the previous iteration (stage_times.py)
        self.history.append(record)
        return record

    def _load_seconds(self) -> list[float]:
        """Each rank's start-weight load, in rank order (load_barrier.py)."""
        took = self.weight_load_seconds or {}
        return [round(took[r], 3) for r in sorted(took)]

    def _upload(self, batch: torch.Tensor) -> torch.Tensor:
        """Host batch -> device without making the host wait: a copy from pageable memory is
        synchronous (the host would wait for the previous step's queued work before queueing
        this forward), one from pinned memory with non_blocking is not."""
        if self.device.type != "cuda":
            return batch.to(self.device)
        return batch.pin_memory().to(self.device, non_blocking=True)

    def train(
        self, on_iteration: Callable[[Trainer, dict[str, Any]], None] | None = None
    ) -> list[dict[str, Any]]:
        cfg = self.cfg
        self.maybe_resume()
        if self.outer is not None:  # a replica behind the others takes their weights
            self.iteration = self.outer.join(self.iteration, layout_signature(self.layout))
        self.sink.emit(
            wire.START,
            iteration=self.iteration,
            iterations=cfg.iterations,
            worldSize=self.layout.world_size,
            pipeline=self.layout.pipeline,
            data=self.layout.data,
            tensor=self.layout.tensor,
            sequenceParallel=self.tp.sequence_parallel,
            architecture=cfg.model.architecture,
            parameters=self.model_cost.total_params,
            overlap=cfg.overlap,
            gradReduceDtype=cfg.grad_reduce_dtype,
            pipelineSchedule=self.schedule,
            virtualStages=self.layout.virtual_stages,
            activationRecompute=cfg.activation_recompute,
            flopsFormula=self.model_cost.formula_name(cfg.activation_recompute),
            device=str(self.device),
            layout={**layout_signature(self.layout), "nodes": list(self.layout.nodes)},  # calibration
            groups=self.groups.created,  # this rank's communicators, the world group first
            fabric=self.fabric.summary(),  # every rank's findings (gathered)
            **({"weightLoadSeconds": self._load_seconds()} if self.weight_load_seconds else {}),
            **({"replica": self.replica.replica, "replicas": self.replica.replicas} if self.replica else {}),
        )
        every = cfg.checkpoint.interval_iterations
        while self.iteration < cfg.iterations:
            self.vote.launch(self.preemption.requested)  # waited for after the step: overlapped
            record = self.train_step()
            ev = cfg.eval
            if ev and (self.iteration % ev.interval_iterations == 0 or self.iteration == cfg.iterations):
                result = self.evaluate()
                record.update(evalLoss=result["loss"], evalPerplexity=result["perplexity"])
                self.last_eval_loss = result["loss"]
            self.sink.emit(wire.ITERATION, **record)
            self.sink.stages(self.stage_times.summary())
            if on_iteration is not None:
                on_iteration(self, record)
            if self.checkpointer is not None:
                self.checkpointer.poll()  # reports a save that committed meanwhile
            signalled = self.vote.result()
            due = bool(cfg.checkpoint.path) and (
                self.iteration == cfg.iterations or bool(every) and self.iteration % every == 0
            )
            if signalled and self.iteration < cfg.iterations:  # the last one finishes normally
                self._stop_for_preemption(signalled, due)
                self._settle_outer()
                self.opt.wait_param_gathers()
                return self.history
            if due:
                self.save_checkpoint()
        self.wait_for_checkpoint()
        self._settle_outer()
        self.opt.wait_param_gathers()
        last = self.history[-1] if self.history else {}
        self.sink.emit(
            wire.DONE,
            iteration=self.iteration,
            loss=last.get("loss"),
            **({"evalLoss": self.last_eval_loss} if self.last_eval_loss is not None else {}),
            tokensPerSecond=last.get("tokensPerSecond"),
            tflopsPerGpu=last.get("tflopsPerGpu"),
            fabricWarnings=self.fabric.messages(),  # wire.FABRIC_WARNINGS
            **self.outer_progress(),
        )
        return self.history
