"""What the dry-run tests share (test_dryrun.py, test_dryrun_replicas.py): a small job."""

from __future__ import annotations

from pathlib import Path

import yaml
from holmes_dev.jobs import holmes_job


def job(
    tmp_path: Path, *, pipeline: int, data: int, tensor: int, gpus_per_node: int | None = None, **training
) -> str:
    """``gpus_per_node`` below data x tensor: a stage over several nodes (tensor groups over the
    nodes of an NVLink domain when below tensor)."""
    gpus = gpus_per_node or data * tensor
    spec = {
        "model": {
            "layers": 4,
            "hiddenSize": 64,
            "attentionHeads": 4,
            "seqLength": 32,
            "vocabSize": 128,
            "tiedEmbeddings": True,
        },
        "training": {
            "globalBatchSize": 2 * 4 * data,
            "microBatchSize": 2,
            "iterations": 100,
            "learningRate": 1.0e-3,
            "data": {"synthetic": {}},
            **training,
        },
        "parallelism": {
            "tensor": tensor,
            "pipeline": pipeline,
            "data": data,
            "sequenceParallel": tensor > 1,
        },
        "nodes": {"count": pipeline * data * tensor // gpus, "gpusPerNode": gpus},
        "template": {"spec": {"containers": [{"name": "trainer", "image": "x"}]}},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(holmes_job("dry", spec)))
    return str(path)
