"""TrainConfig speaks the job's vocabulary: every field it names like the contract's JobSpec
sections is filled from the job, by that name."""

from __future__ import annotations

from dataclasses import MISSING, fields

from holmes_dev.jobs import holmes_job

from holmes.contract import load_job
from holmes.trainer.config import CheckpointConfig, OptimizerConfig, TrainConfig

TRAINING = {
    "globalBatchSize": 16,
    "microBatchSize": 2,
    "iterations": 3,
    "learningRate": 1e-3,
    # every optional field the trainer names too, off the trainer's default (so a copy shows)
    "seed": 99,
    "weightDecay": 0.2,
    "gradClip": 0.5,
    "warmupIterations": 3,
    "decay": "linear",
    "minLearningRate": 1e-5,
    "betas": [0.8, 0.9],
    "activationRecompute": True,  # the job's default, not a bare engine's
    "gradReduceDtype": "bfloat16",
    "fabricCheck": "fail",
    "pipelineSchedule": "GPipe",
    "eval": {"data": {"path": "/eval.bin"}, "intervalIterations": 2},
    "checkpoint": {"path": "/ckpt", "intervalIterations": 5, "onPreemption": False, "asynchronous": False},
    "acrossIslands": {"mode": "replicas", "innerSteps": 4, "fragments": 2},
}
JOB = holmes_job(
    "tiny",
    {
        "model": {"layers": 4, "hiddenSize": 32, "attentionHeads": 4, "seqLength": 16, "vocabSize": 64},
        "training": TRAINING,
        "nodes": {"count": 2, "gpusPerNode": 2},
    },
)


def _default(trainer_type: type, name: str):
    f = next(f for f in fields(trainer_type) if f.name == name)
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def test_every_field_named_like_the_contracts_is_the_jobs():
    spec = load_job(JOB)
    cfg = TrainConfig.from_jobspec(spec)
    pairs = [(cfg, spec.training), (cfg.optimizer, spec.training), (cfg.checkpoint, spec.training.checkpoint)]
    shared = {}
    for ours, theirs in pairs:
        names = {f.name for f in fields(ours)} & {f.name for f in fields(theirs)} - {"data", "checkpoint"}
        shared[type(ours)] = names
        for name in names:
            assert getattr(ours, name) == getattr(theirs, name), name
            assert getattr(ours, name) != _default(type(ours), name), (
                f"{name}: the job above leaves it default"
            )
    assert shared == {
        TrainConfig: {
            "global_batch_size",
            "micro_batch_size",
            "iterations",
            "seed",
            "eval",
            "activation_recompute",
            "grad_reduce_dtype",
            "fabric_check",
            "across_islands",
            "pipeline_schedule",
        },
        OptimizerConfig: {
            "learning_rate",
            "min_learning_rate",
            "warmup_iterations",
            "decay",
            "weight_decay",
            "betas",
            "grad_clip",
        },
        CheckpointConfig: {"path", "interval_iterations", "on_preemption", "asynchronous"},
    }
    assert cfg.eval is spec.training.eval  # the contract's EvalSpec itself, not a copy
