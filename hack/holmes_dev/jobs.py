"""HolmesJob manifests for tests, benchmarks and demos: the object around a spec, and the small
job most cluster tests train or park (``sleep``) on the local cluster."""

from __future__ import annotations

from typing import Any

API_VERSION = "holmes.dev/v1alpha1"
TINY_MODEL = {"layers": 4, "hiddenSize": 64, "attentionHeads": 4, "seqLength": 32, "vocabSize": 128}


def holmes_job(name: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    """A HolmesJob object: apiVersion, kind, metadata (name; namespace when given) and spec."""
    metadata = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": API_VERSION, "kind": "HolmesJob", "metadata": metadata, "spec": spec}


def tiny_training(iterations: int = 5, **fields: Any) -> dict[str, Any]:
    """spec.training for TINY_MODEL: a global batch of 8 in micro-batches of 1; fields add to it."""
    return {
        "globalBatchSize": 8,
        "microBatchSize": 1,
        "iterations": iterations,
        "learningRate": 1.0e-3,
        **fields,
    }


def trainer_command(command: list[str]) -> dict[str, Any]:
    """spec.template whose trainer container runs ``command`` instead of the trainer."""
    return {"spec": {"containers": [{"name": "trainer", "command": command}]}}


def tiny_job(
    name: str,
    namespace: str | None = None,
    count: int = 4,
    gpus: int = 1,
    command: list[str] | None = None,
    run_policy: dict[str, Any] | None = None,
    iterations: int = 5,
    **sections: Any,
) -> dict[str, Any]:
    """TINY_MODEL on ``count`` nodes of ``gpus`` GPUs (backoffLimit 2 unless ``run_policy``), its
    trainer replaced by ``command`` when given; ``sections`` (parallelism=, training=, ...) replace
    the spec's sections whole."""
    spec: dict[str, Any] = {
        "model": dict(TINY_MODEL),
        "training": tiny_training(iterations),
        "nodes": {"count": count, "gpusPerNode": gpus},
        "runPolicy": run_policy or {"backoffLimit": 2},
    }
    if command is not None:
        spec["template"] = trainer_command(command)
    spec.update(sections)
    return holmes_job(name, spec, namespace)
