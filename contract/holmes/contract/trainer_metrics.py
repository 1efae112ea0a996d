"""What the rank-0 trainer reports and the operator reads: the names of its metric lines and
gauges, a wire format between holmes.trainer (reporting.py writes it) and holmes.operator
(progress.py reads it into HolmesJob.status.progress; holmes.plan.calibrate reads the lines).

Two channels carry the same numbers:

- JSON lines on stdout, in ``--metrics-file`` and in the termination message: one object per
  event, the event under :data:`EVENT_KEY` (``{"holmes": "iteration", "iteration": 3, ...}``),
  keys camelCase as in status.progress;
- Prometheus gauges on the metrics port: :data:`GAUGES` (one series each),
  :data:`STAGE_GAUGES` (one series per pipeline stage, label :data:`STAGE_LABEL`),
  :data:`FABRIC_GAUGE` (how many fabric problems the start-up check found, one series per
  kind in :data:`FABRIC_KINDS`, label :data:`FABRIC_KIND_LABEL`: label values come from closed
  sets, never from free text, so a scrape's series stay few and stable) and
  :data:`TIME_GAUGE` (where the last iteration's time went, label :data:`PART_LABEL`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

EVENT_KEY: Final = "holmes"  # the key that marks a metric line among other output

START: Final = "start"
ITERATION: Final = "iteration"
EVAL: Final = "eval"
CHECKPOINT: Final = "checkpoint"
RESUME: Final = "resume"
PREEMPTED: Final = "preempted"
DONE: Final = "done"
ERROR: Final = "error"
EVENTS: Final = (START, ITERATION, EVAL, CHECKPOINT, RESUME, PREEMPTED, DONE, ERROR)
# The latest of these is the container's termination message: what is read once the pod ended.
LAST_LINE_EVENTS: Final = (ITERATION, PREEMPTED, DONE, ERROR)
# The lines whose numbers are the job's progress (an error line carries none).
PROGRESS_EVENTS: Final = (ITERATION, DONE, PREEMPTED)

# status.progress's numbers: the line's key -> its gauge
PROGRESS_GAUGES: Final[Mapping[str, str]] = {
    "iteration": "holmes_trainer_iteration",
    "loss": "holmes_trainer_loss",
    "evalLoss": "holmes_trainer_eval_loss",  # training.eval: set from the first evaluation on
    "tokensPerSecond": "holmes_trainer_tokens_per_second",
    "tflopsPerGpu": "holmes_trainer_tflops_per_gpu",
    "iterationSeconds": "holmes_trainer_iteration_seconds",
    "checkpointIteration": "holmes_trainer_checkpoint_iteration",  # 0 until the first save
    # acrossIslands replicas: outer steps this replica has taken part in (0 until the first, and
    # in a synchronous job); a replica's rank 0 reports its own replica's numbers
    "outerStep": "holmes_trainer_outer_step",
}
INTEGER_KEYS: Final = ("iteration", "checkpointIteration", "outerStep")
# every iteration line's numbers that have a gauge: progress, and two for dashboards
GAUGES: Final[Mapping[str, str]] = {
    **PROGRESS_GAUGES,
    "learningRate": "holmes_trainer_learning_rate",
    "gradNorm": "holmes_trainer_grad_norm",
}
FABRIC_WARNINGS: Final = "fabricWarnings"  # the done line's fabric mismatches (a list of messages)
STAGES: Final = "stages"  # an iteration line's per-stage rows (keys: STAGE_GAUGES' and "stage")

# Per pipeline stage, the trainer's measured times (median over recent iterations as gauges,
# the previous iteration's in a line's rows): a row's key -> its gauge. Re-planning reads them.
STAGE_LABEL: Final = "stage"
STAGE_GAUGES: Final[Mapping[str, str]] = {
    "layers": "holmes_trainer_stage_layers",
    "samples": "holmes_trainer_stage_samples",  # iterations behind the medians (gauges only)
    "computeSeconds": "holmes_trainer_stage_compute_seconds",
    "layerSeconds": "holmes_trainer_stage_layer_seconds",
    "p2pWaitSeconds": "holmes_trainer_stage_p2p_wait_seconds",
    "dpExposedSeconds": "holmes_trainer_stage_dp_exposed_seconds",
}
STAGE_INTEGER_KEYS: Final = (STAGE_LABEL, "layers", "samples")

# The start-up fabric check's findings (training.fabricCheck: warn), counted per kind; the
# messages themselves are in the start and done lines (status.progress.fabricWarnings).
FABRIC_GAUGE: Final = "holmes_trainer_fabric_problems"
FABRIC_KIND_LABEL: Final = "kind"
FABRIC_KINDS: Final[Mapping[str, str]] = {
    "devices": "ranks of IB groups whose pod lacks what NCCL's IB transport needs",
    "socketFallback": "groups planned on IB that run on TCP sockets instead",
}
TIME_GAUGE: Final = "holmes_trainer_time_seconds"  # the keys of an iteration line's "time"
PART_LABEL: Final = "part"
