"""A running job relaunches only when what its plan or pods depend on changed, compared with
defaults applied (issue 50, item 1): a CRD upgrade that adds a defaulted field, a label a policy
engine adds under template.metadata, and an operator upgrade (a ConfigMap of the release before
the launch record) leave its pods alone; an edit names its field in the Event and condition."""

from __future__ import annotations

import copy
import json

from holmes.contract import JobSpec
from holmes.operator.core import child_names, spec_change
from holmes.operator.core.reconcile import RestartBackoff
from tests.helpers.operator.opfixtures import FakeWorld, manifest

TRAINING = {"globalBatchSize": 8, "microBatchSize": 1, "iterations": 5, "learningRate": 1.0e-3}


def running(job: dict, backoff: RestartBackoff = RestartBackoff(0)) -> FakeWorld:
    w = FakeWorld(job, backoff=backoff)
    w.step()
    assert w.status["launched"] and len(w.pods) == 4
    w.set_phase("Running")
    w.step()
    return w


def untouched(w: FakeWorld, attempt: int = 1) -> None:
    """A pass that keeps the running attempt: no pod deleted or created, no SpecChanged."""
    before = copy.deepcopy(w.pods)
    d = w.step()
    assert not d.delete_pods and not d.create_pods, (
        d.delete_pods,
        [p["metadata"]["name"] for p in d.create_pods],
    )
    assert w.pods == before and w.status["attempt"] == attempt and w.status["phase"] == "Running"
    assert w.reasons().count("SpecChanged") == attempt - 1 and w.condition("Stalled")["status"] == "False"


def crd_defaults(w: FakeWorld, **sections: dict) -> None:
    """What the API server returns after a CRD upgrade that adds defaulted fields: the stored
    object with the new defaults filled in (no write, so no new generation)."""
    for section, fields in sections.items():
        w.job["spec"].setdefault(section, {}).update(fields)


def as_the_release_before(w: FakeWorld) -> None:
    """The job's ConfigMap as the release before the launch record wrote it: the same
    annotations (holmes.dev/spec-hash kept its meaning) and job.yaml, no launch-spec.json."""
    w.configmap["data"].pop(child_names.LAUNCH_SPEC_FILE)


# ---- the comparison, pure ----------------------------------------------------------------------


def test_defaults_applied_on_both_sides_compare_equal():
    before = manifest(parallelism={"tensor": 1})["spec"]
    after = copy.deepcopy(before)
    after["parallelism"]["expert"] = "auto"  # the CRD's new default, the parser's too
    after["model"]["architecture"] = "gpt"
    cm = {
        "metadata": {"annotations": {child_names.ANN_SPEC_HASH: child_names.spec_hash(before)}},
        "data": {child_names.LAUNCH_SPEC_FILE: spec_change.launch_record(JobSpec.from_spec(before))},
    }
    assert child_names.spec_hash(after) != child_names.spec_hash(before)  # what relaunched before
    assert spec_change.changes(cm, after, JobSpec.from_spec(after)) == []
    after["training"]["iterations"] = 9
    after["template"] = {"metadata": {"labels": {"team": "a"}}, "spec": {"nodeSelector": {"x": "y"}}}
    assert spec_change.changes(cm, after, JobSpec.from_spec(after)) == [
        "template.spec",
        "training.iterations",
    ]
    assert spec_change.changes(cm, after, JobSpec.from_spec(after), metadata=True) == [
        "template.metadata",
        "template.spec",
        "training.iterations",
    ]


def test_diff_names_leaves_and_list_items():
    old = {"a": {"b": 1, "c": [1, {"d": 2}]}, "e": [1]}
    new = {"a": {"b": 2, "c": [1, {"d": 3}]}, "e": [1, 2], "f": 0}
    assert spec_change.diff(old, new) == ["a.b", "a.c[1].d", "e", "f"]
    assert spec_change.describe([f"f{i}" for i in range(7)]).endswith("spec.f4 and 2 more field(s)")


# ---- the reconcile -----------------------------------------------------------------------------


def test_a_crd_upgrade_adding_a_defaulted_field_does_not_relaunch():
    w = running(manifest(parallelism={"tensor": 1}))
    crd_defaults(w, parallelism={"expert": "auto"}, model={"architecture": "gpt"})
    untouched(w)


def test_a_label_or_annotation_under_template_metadata_does_not_relaunch():
    w = running(manifest())
    w.edit_spec(
        template={"metadata": {"labels": {"policy.example/owner": "team-a"}, "annotations": {"a": "b"}}}
    )
    untouched(w)
    assert w.status["observedGeneration"] == 2


def test_an_edit_the_plan_depends_on_relaunches_naming_the_field():
    w = running(manifest())
    w.edit_spec(
        training={**TRAINING, "iterations": 9},
        template={"metadata": {"labels": {"team": "a"}}},
    )
    d = w.step()
    assert sorted(d.delete_pods) == [f"tiny-1-{r}" for r in range(4)] and len(d.create_pods) == 4
    assert w.status["attempt"] == 2 and w.status["restarts"] == 0
    (msg,) = [e.message for e in w.events if e.reason == "SpecChanged"]
    assert msg.startswith("spec.training.iterations changed: relaunching"), msg
    relaunched = w.condition("Relaunched")
    assert relaunched["status"] == "True" and relaunched["reason"] == "SpecChanged"
    assert relaunched["message"] == "attempt 2: spec.training.iterations changed"
    # the new attempt records its own spec: the next pass keeps it, the condition stays
    w.set_phase("Running")
    w.step()
    untouched(w, attempt=2)
    assert w.condition("Relaunched")["message"] == "attempt 2: spec.training.iterations changed"


def test_an_operator_upgrade_does_not_relaunch_what_the_release_before_launched():
    # launched by the release before (its ConfigMap), then the chart upgrade: a new operator
    # and a CRD whose new default the API server fills in
    w = running(manifest(parallelism={"tensor": 1}))
    as_the_release_before(w)
    untouched(w)
    crd_defaults(w, parallelism={"expert": "auto"}, model={"architecture": "gpt"})
    untouched(w)
    w.edit_spec(template={"metadata": {"labels": {"team": "a"}}})
    untouched(w)
    w.edit_spec(training={**TRAINING, "iterations": 9})
    d = w.step()
    assert len(d.create_pods) == 4 and w.status["attempt"] == 2
    assert w.condition("Relaunched")["message"] == "attempt 2: spec.training.iterations changed"
    assert child_names.LAUNCH_SPEC_FILE in w.configmap["data"]  # the new attempt records it


def test_a_defaulted_model_field_is_not_a_model_edit():
    """spec.model is immutable once started: a CRD default added to it is not an edit."""
    w = running(manifest())
    crd_defaults(w, model={"architecture": "gpt"})
    untouched(w)
    w.job["spec"]["model"]["layers"] = 8  # an API server without CEL rules lets it through
    w.step()
    stalled = w.condition("Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "ImmutableField"


def test_a_metadata_edit_during_the_backoff_launches_at_once_naming_it():
    """No pods to keep: any edit may be what fixes the job (a label a policy asks for)."""
    w = running(manifest(), backoff=RestartBackoff(60))
    w.set_phase("Failed", "tiny-1-0")
    w.step()
    assert w.status["phase"] == "Restarting"
    crd_defaults(w, model={"architecture": "gpt"})
    assert not w.step().create_pods  # not an edit: the back-off goes on
    w.edit_spec(template={"metadata": {"labels": {"team": "a"}}})
    d = w.step()
    assert len(d.create_pods) == 4
    (msg,) = [e.message for e in w.events if e.reason == "SpecChanged"]
    assert msg.startswith("spec.template.metadata changed: launching now"), msg


def test_the_launch_record_is_the_jobs_own_spec_with_its_defaults():
    w = running(manifest())
    record = json.loads(w.configmap["data"][child_names.LAUNCH_SPEC_FILE])
    assert "runPolicy" not in record and record["parallelism"]["expert"] == "auto"
    assert record["model"]["architecture"] == "gpt"
