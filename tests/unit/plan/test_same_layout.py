"""The faster search plans exactly what commit 4c2f746 planned (issue 47): the whole Layout JSON
of every case in layout_cases.py, the issue's 8,192-node job on 15,360 nodes included, or the
same PlanError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.plan.layout_cases import CASES, outcome

RECORDED = json.loads((Path(__file__).parent / "data" / "layouts_4c2f746.json").read_text())


def test_every_case_is_recorded():
    assert sorted(RECORDED) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_layout_is_the_one_4c2f746_planned(name):
    got, want = outcome(name), RECORDED[name]
    # the readable parts first, so a change shows where it is
    assert got.get("message") == want.get("message")
    assert got.get("signature") == want.get("signature")
    assert got.get("iterationSeconds") == want.get("iterationSeconds")
    assert got.get("nodes") == want.get("nodes"), "the same shape on other nodes or in another order"
    assert got == want, "the same shape and nodes, but the groups, estimate or explanation differ"


def test_the_comparison_sees_a_different_layout():
    """The digests are of the whole Layout: another case's record does not match."""
    assert outcome("megatron-order") != RECORDED["gpu-types-llama70b"]
    assert RECORDED["scaling-1024-of-1920"]["json"] != RECORDED["large"]["json"]
