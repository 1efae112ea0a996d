"""The layout signature (holmes.contract.layout.layout_signature): what two worlds must share to
pair their optimizer state rank by rank. One function for the trainer (resume, replicas
meeting) and the operator (replicas planned per cluster)."""

from __future__ import annotations

import pytest

from holmes.contract.layout import layout_signature
from holmes.operator.core import replicas
from holmes.plan import PlanError
from tests.helpers.contract.layout_helpers import virtual_layout

# Two looped layouts whose stages span the same layers but split them into other chunks
# (virtual stages in order: rank 0, rank 1, rank 0, rank 1).
FOUR_TWO = virtual_layout("Interleaved1F1B", [[(0, 2), (4, 6)], [(2, 4), (6, 8)]])
FIVE_ONE = virtual_layout("Interleaved1F1B", [[(0, 2), (5, 6)], [(2, 5), (6, 8)]])


def test_chunks_are_part_of_the_signature_when_the_spans_coincide():
    assert [s.layers for s in FOUR_TWO.stages] == [s.layers for s in FIVE_ONE.stages]
    a, b = layout_signature(FOUR_TWO), layout_signature(FIVE_ONE)
    assert a["stageLayers"] == b["stageLayers"] and a != b
    assert a["chunks"] == [[[0, 2], [4, 6]], [[2, 4], [6, 8]]] and a["pipelineSchedule"] == "Interleaved1F1B"
    assert layout_signature(FOUR_TWO) == layout_signature(
        virtual_layout("Interleaved1F1B", [[(0, 2), (4, 6)], [(2, 4), (6, 8)]])
    )


def test_the_operator_refuses_replicas_the_trainer_would_refuse_when_they_meet():
    replicas.check_paired([("east", FOUR_TWO), ("west", FOUR_TWO)])
    with pytest.raises(PlanError, match=r"best layouts differ .*chunks \[\[\[0, 2\], \[5, 6\]\]"):
        replicas.check_paired([("east", FOUR_TWO), ("west", FIVE_ONE)])
