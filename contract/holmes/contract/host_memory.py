"""Host memory per rank and per node: what the planner's estimate and the trainer's dry run count.

Per rank (one process per GPU):

- :data:`PROCESS_BYTES`: the process itself (torch's and CUDA's host side, Python, the data
  loader's buffers). A model, not a measurement (unproven on CPU: a CUDA context's host share
  is only seen on a GPU);
- with asynchronous checkpoints, the staging buffer (trainer async_checkpoint.HostStager):
  exactly what the rank writes, its share of the stage's weights (1/D of them, on the
  parameters' dtype) and its optimizer shard (:data:`SHARD_STATE_BYTES` per parameter, more
  with a replica's outer state), in one buffer pinned by registering it with CUDA (no
  power-of-two rounding), and the checkpoint process that writes it
  (:data:`WRITER_PROCESS_BYTES`, a model). It counts against the pod's memory cgroup like any
  host memory.

Per node: the ranks it runs, in rank order (stage s holds ranks [s*D*T, (s+1)*D*T)). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

PROCESS_BYTES = 4 * 2**30  # per rank: a model of the process's own host memory
# per rank with asynchronous checkpoints: its checkpoint process (an interpreter with torch and
# a gloo group; the staging buffer it reads is shared, counted once); a model, not measured
WRITER_PROCESS_BYTES = 1 * 2**30
SHARD_STATE_BYTES = 12  # per optimizer shard parameter: fp32 master, exp_avg, exp_avg_sq


def staging_bytes(
    weight_params: float, data: int, param_bytes: int, shard_params: float, shard_bytes: float
) -> float:
    """A rank's checkpoint staging: 1/``data`` of its ``weight_params`` (the stage's weights on
    this tensor-parallel rank) on ``param_bytes``, and ``shard_params`` x ``shard_bytes``."""
    return weight_params * param_bytes / data + shard_params * shard_bytes


def rank_bytes(staging: float) -> float:
    """A rank's host memory: the process, and with asynchronous saves (``staging`` > 0) its
    staging buffer and its checkpoint process."""
    return PROCESS_BYTES + (staging + WRITER_PROCESS_BYTES if staging else 0.0)


def per_node(per_stage_rank: Sequence[float], ranks_per_stage: int, gpus_per_node: int) -> list[float]:
    """Each node's host memory, from one rank's figure per stage (every rank of a stage alike)."""
    world = len(per_stage_rank) * ranks_per_stage
    nodes = math.ceil(world / gpus_per_node)
    out = [0.0] * nodes
    for r in range(world):
        out[r // gpus_per_node] += per_stage_rank[r // ranks_per_stage]
    return out
