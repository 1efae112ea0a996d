"""Holmes' plan status on a labelled JobSet (core/jobset_status.py, issue 53): one annotation,
condition-like, rewritten only when the state, reason or message change, ``since`` kept while
the state and reason stay."""

from __future__ import annotations

import json

from holmes.operator.core import jobset_status as st
from tests.helpers.operator.jobset_plans import jobset


def annotated(patch: dict) -> dict:
    js = jobset()
    js["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    return js


def test_each_reason_has_a_state_and_the_annotation_is_json():
    patch = st.status_patch(jobset(), "WaitingForAdmission", "Workload w is not admitted", "T1")
    assert patch is not None
    value = json.loads(patch["metadata"]["annotations"][st.ANN_STATUS])
    assert value == {
        "state": "Waiting",
        "reason": "WaitingForAdmission",
        "message": "Workload w is not admitted",
        "since": "T1",
    }
    assert {st.STATES[r] for r in ("PlanWritten", "WaitingForNodes", "InvalidPlanRequest")} == {
        "Planned",
        "Waiting",
        "Invalid",
    }


def test_written_only_on_change_and_since_moves_with_the_reason():
    js = annotated(st.status_patch(jobset(), "WaitingForAdmission", "a", "T1"))
    assert st.status_patch(js, "WaitingForAdmission", "a", "T2") is None
    js = annotated(st.status_patch(js, "WaitingForAdmission", "b", "T2"))
    assert st.current(js)["since"] == "T1" and st.current(js)["message"] == "b"
    js = annotated(st.status_patch(js, "PlanWritten", "p", "T3"))
    assert st.current(js) == {"state": "Planned", "reason": "PlanWritten", "message": "p", "since": "T3"}


def test_a_broken_annotation_is_rewritten():
    js = jobset()
    js["metadata"]["annotations"][st.ANN_STATUS] = "not json"
    assert st.current(js) == {}
    assert st.status_patch(js, "PlanWritten", "p", "T") is not None
