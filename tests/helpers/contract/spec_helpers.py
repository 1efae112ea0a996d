"""A small valid job spec and the problems a spec is refused with: shared by the contract's
spec tests and those of spec.framework and the planner."""

from __future__ import annotations

import pytest

from holmes.contract.jobspec import JobSpec, SpecError


def minimal_spec(**sections):
    spec = {
        "model": {"layers": 8, "hiddenSize": 256, "attentionHeads": 8, "seqLength": 128, "vocabSize": 1000},
        "training": {"globalBatchSize": 16, "microBatchSize": 2, "iterations": 10, "learningRate": 1.0e-3},
        "nodes": {"count": 2, "gpusPerNode": 4},
    }
    spec.update(sections)
    return spec


def problems_of(spec):
    with pytest.raises(SpecError) as e:
        JobSpec.from_spec(spec)
    return e.value.problems
