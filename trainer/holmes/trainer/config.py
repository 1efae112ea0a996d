"""TrainConfig: everything the engine needs, as one frozen dataclass.

Built from the HolmesJob spec (``TrainConfig.from_job``, through holmes.contract's one parser;
the model is the contract's ``ModelSpec`` itself) and checked against the Layout
(``check_against_layout``); the engine never reads YAML itself. Errors say what to fix.

One vocabulary with the spec: fields the job carries keep the contract's names (``betas``,
``interval_iterations``, ...), their defaults are the contract dataclasses' (read from them, not
restated) and ``from_jobspec`` fills them by name; the model and the eval section are the
contract's ``ModelSpec`` and ``EvalSpec`` themselves. Only knobs the job does
not carry (optimizer kind, eps, dtype, bucket size, ...) are defined here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from holmes.contract import JobSpec, Layout, ModelSpec, load_job
from holmes.contract import pipeline_schedules as sched
from holmes.contract.jobspec import tensor_parallel_problems
from holmes.contract.spec_sections import (
    DECAYS,
    FABRIC_CHECKS,
    AcrossIslandsSpec,
    CheckpointSpec,
    EvalSpec,
    ParallelismSpec,
    TrainingSpec,
)

DTYPES = ("float32", "bfloat16")
OPTIMIZERS = ("adamw", "sgd")


class TrainerConfigError(ValueError):
    """A valid job that this trainer cannot run as configured, or with this Layout (the job
    spec's own problems are holmes.contract.SpecError); the message says what to change."""


# Pipeline schedules the engine runs (holmes.contract.pipeline_schedules); "auto": the Layout's.
PIPELINE_SCHEDULES = (sched.AUTO, *sched.SCHEDULE_NAMES)


def check_schedule(name: str) -> None:
    if name not in PIPELINE_SCHEDULES:
        raise TrainerConfigError(f"pipeline schedule {name!r} is not one of {', '.join(PIPELINE_SCHEDULES)}")


def schedule_problems(name: str, pipeline: int, virtual: int, micro_batches: int) -> list[str]:
    """What torch's schedule ``name`` refuses for this pipeline, said with the fix."""
    return sched.micro_batch_problems(name, pipeline, micro_batches)


@dataclass(frozen=True)
class OptimizerConfig:
    kind: str = "adamw"
    learning_rate: float = 3e-4  # the job always gives it (required there); a bare engine's default
    min_learning_rate: float = TrainingSpec.min_learning_rate
    warmup_iterations: int = TrainingSpec.warmup_iterations
    decay: str = TrainingSpec.decay  # cosine | linear | constant (after warm-up)
    weight_decay: float = TrainingSpec.weight_decay
    betas: tuple[float, float] = TrainingSpec.betas  # Adam's beta1, beta2
    eps: float = 1e-8
    grad_clip: float = TrainingSpec.grad_clip  # global L2 norm; 0 disables clipping

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise TrainerConfigError(f"optimizer {self.kind!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.decay not in DECAYS:
            raise TrainerConfigError(f"learning-rate decay {self.decay!r} is not one of {', '.join(DECAYS)}")
        if self.learning_rate <= 0:
            raise TrainerConfigError(f"learningRate must be > 0, got {self.learning_rate}")
        if not 0 <= self.min_learning_rate <= self.learning_rate:
            raise TrainerConfigError(
                f"minLearningRate {self.min_learning_rate} must be between 0 and learningRate "
                f"{self.learning_rate}"
            )


@dataclass(frozen=True)
class DataConfig:
    path: str | None = None  # None: synthetic data; else a flat token file (see data.py)
    token_dtype: str | None = None  # uint16 | uint32; None: read the file's sidecar, else uint16
    blend: tuple[tuple[str, float], ...] = ()  # (token file, weight) pairs; wins over path


@dataclass(frozen=True)
class CheckpointConfig:
    """The job's training.checkpoint (``CheckpointSpec``), where a bare engine may also run
    without one: no path, or interval 0."""

    path: str | None = None  # a directory shared by all ranks (one PVC for all pods)
    interval_iterations: int = 0  # save every N iterations (and at the end); 0: only at the end
    on_preemption: bool = CheckpointSpec.on_preemption  # on SIGTERM, save when it fits (preempt.py)
    asynchronous: bool = CheckpointSpec.asynchronous  # stage, then write while training goes on


@dataclass(frozen=True)
class TrainConfig:
    model: ModelSpec
    global_batch_size: int
    micro_batch_size: int
    iterations: int
    seed: int = TrainingSpec.seed
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalSpec | None = None  # evaluate every interval_iterations (and after the last)
    overlap: bool = True  # overlapped grad reduce-scatter and param all-gather
    # checkpoint each transformer block (model.py). from_jobspec always takes the job's
    # training.activationRecompute (default true there); False here keeps a bare engine plain.
    activation_recompute: bool = False
    bucket_elements: int = 40_000_000  # gradient bucket size (elements), as Megatron's default
    timeout_seconds: float = 600.0  # process-group timeout: how long a dead peer can stall us
    dtype: str = "float32"  # parameters and activations; bfloat16 on GPUs
    grad_reduce_dtype: str = TrainingSpec.grad_reduce_dtype  # the DP reduce-scatter's dtype
    fabric_check: str = TrainingSpec.fabric_check  # fail | warn | off (see fabric.py)
    # auto: the Layout's (planned with its chunks); else one of PIPELINE_SCHEDULES, which must
    # place virtual stages as the Layout does (1F1B and GPipe run any one-chunk Layout)
    pipeline_schedule: str = TrainingSpec.pipeline_schedule
    sequence_parallel: bool = ParallelismSpec.sequence_parallel  # with tensor > 1
    # pipeline (one world) or replicas (DiLoCo between worlds, outer.py); from the job by name
    across_islands: AcrossIslandsSpec = field(default_factory=AcrossIslandsSpec)

    def __post_init__(self) -> None:
        for name in ("dtype", "grad_reduce_dtype"):
            if getattr(self, name) not in DTYPES:
                raise TrainerConfigError(f"{name} {getattr(self, name)!r} is not one of {', '.join(DTYPES)}")
        for name in ("global_batch_size", "micro_batch_size", "iterations", "bucket_elements"):
            if getattr(self, name) < 1:
                raise TrainerConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_schedule(self.pipeline_schedule)
        if self.fabric_check not in FABRIC_CHECKS:
            raise TrainerConfigError(
                f"fabric_check {self.fabric_check!r} is not one of {', '.join(FABRIC_CHECKS)}"
            )
        if self.timeout_seconds <= 0:
            raise TrainerConfigError("timeoutSeconds must be > 0")

    def with_(self, **changes: Any) -> TrainConfig:
        return replace(self, **changes)

    # ---- from the HolmesJob ------------------------------------------------------------
    @classmethod
    def from_job(cls, source: Any, **overrides: Any) -> TrainConfig:
        """A HolmesJob manifest, its ``spec`` or a file of either (holmes.contract.load_job)."""
        return cls.from_jobspec(load_job(source), **overrides)

    @classmethod
    def from_jobspec(
        cls, job: JobSpec, *, dtype: str = "float32", optimizer: str = "adamw", **overrides: Any
    ) -> TrainConfig:
        """JobSpec -> TrainConfig. Fields named as the contract's are taken from it by name (a
        field added to both needs no line here); knobs the HolmesJob API does not carry (dtype,
        optimizer kind, overlap, bucket size, timeout) come as keyword overrides from the entry
        point."""
        t, checkpoint = job.training, CheckpointConfig()
        if t.checkpoint is not None:
            checkpoint = CheckpointConfig(**_from_contract(CheckpointConfig, t.checkpoint))
        kwargs: dict[str, Any] = dict(
            _from_contract(cls, t),  # batch sizes, iterations, seed, eval, recompute, fabric check, ...
            model=job.model,
            dtype=_dtype_name(dtype),
            optimizer=OptimizerConfig(kind=optimizer, **_from_contract(OptimizerConfig, t)),
            data=DataConfig(
                path=None if t.data.synthetic else t.data.path,
                blend=tuple((b.path, b.weight) for b in t.data.blend),
            ),
            checkpoint=checkpoint,
            sequence_parallel=job.parallelism.sequence_parallel,
        )
        kwargs.update(overrides)
        return cls(**kwargs)

    # ---- against the Layout --------------------------------------------------------------
    def check_model_layout(self, layout: Layout) -> None:
        """What any use of the model under this Layout needs (training, evaluation)."""
        problems = tensor_parallel_problems(self.model, layout.tensor, self.sequence_parallel)
        if problems:
            raise TrainerConfigError(
                f"the layout's tensor parallelism cannot split this model: {'; '.join(problems)}; "
                "re-plan with another parallelism.tensor"
            )
        if layout.tensor > 1 and not any(g.kind == "tp" for g in layout.groups):
            raise TrainerConfigError(
                f"the layout has tensor {layout.tensor} but no tp group family: re-plan the layout"
            )
        if layout.num_layers != self.model.layers:
            raise TrainerConfigError(
                f"layout stages cover {layout.num_layers} layers but model.layers is "
                f"{self.model.layers}: re-plan the layout for this model"
            )

    def check_against_layout(self, layout: Layout) -> None:
        self.check_model_layout(layout)
        if layout.micro_batch_size != self.micro_batch_size:
            raise TrainerConfigError(
                f"layout microBatchSize {layout.micro_batch_size} != job microBatchSize "
                f"{self.micro_batch_size}"
            )
        per_iter = layout.micro_batch_size * layout.micro_batches * layout.data
        if per_iter != self.global_batch_size:
            raise TrainerConfigError(
                f"layout runs microBatchSize*microBatches*data = {layout.micro_batch_size}*"
                f"{layout.micro_batches}*{layout.data} = {per_iter} samples per iteration, "
                f"but globalBatchSize is {self.global_batch_size}"
            )
        has_embedding = any(g.kind == "embedding" for g in layout.groups)
        split = layout.embedding_split  # first and last virtual stage on different ranks
        if self.model.tied_embeddings and split and not has_embedding:
            raise TrainerConfigError(
                "model.tiedEmbeddings is true but the layout has no embedding group to sum the "
                "first and last stage's embedding gradients: re-plan the layout for this job"
            )
        if has_embedding and not (self.model.tied_embeddings and split):
            raise TrainerConfigError(
                "the layout has an embedding group but the job's model does not tie embeddings "
                "across stages (or its schedule puts the first and last virtual stage on one "
                "rank): re-plan the layout for this job"
            )
        if self.eval is not None:
            check_eval_layout(layout)
        name = self.schedule_for(layout)
        problems = schedule_problems(name, layout.pipeline, layout.virtual_stages, layout.micro_batches)
        if problems:
            raise TrainerConfigError("; ".join(problems))

    def schedule_for(self, layout: Layout) -> str:
        """The schedule to run on ``layout``: the job's, else (auto) the one it was planned for.
        A schedule placing virtual stages otherwise than the Layout is refused (re-plan)."""
        name = layout.schedule if self.pipeline_schedule == sched.AUTO else self.pipeline_schedule
        want, have = sched.kind(name).placement, sched.kind(layout.schedule).placement
        if layout.pipeline > 1 and (want != have or layout.virtual_stages not in sched.virtual_choices(name)):
            raise TrainerConfigError(
                f"pipeline schedule {name} needs {'/'.join(map(str, sched.virtual_choices(name)))} "
                f"virtual stage(s) per rank placed {want}, but the layout was planned for "
                f"{layout.schedule} with {layout.virtual_stages}: re-plan with training.pipelineSchedule "
                f"{name} (or auto)"
            )
        return name


_EVAL_CHUNKS = (
    "training.eval runs one chunk per GPU, but the layout has virtual stages: set "
    "training.pipelineSchedule to 1F1B (or leave eval out)"
)


def check_eval_layout(layout: Layout) -> None:
    """Evaluation reads its windows stage by stage: one chunk per GPU."""
    if layout.virtual_stages > 1:
        raise TrainerConfigError(_EVAL_CHUNKS)


# TrainingSpec's sections that the trainer holds in a shape of its own (a bare engine runs without
# a token file or a checkpoint directory): converted above, never copied by name.
OWN_SHAPE = ("data", "checkpoint")


def _from_contract(trainer_type: type, section: Any) -> dict[str, Any]:
    """``section``'s values (a JobSpec dataclass) of the fields ``trainer_type`` names alike."""
    theirs = {f.name for f in fields(section)} - set(OWN_SHAPE)
    return {f.name: getattr(section, f.name) for f in fields(trainer_type) if f.name in theirs}


def _dtype_name(v: str) -> str:
    aliases = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp32": "float32", "float32": "float32"}
    if str(v) not in aliases:
        raise TrainerConfigError(f"dtype {v!r} is not one of bf16, bfloat16, fp32, float32")
    return aliases[str(v)]
