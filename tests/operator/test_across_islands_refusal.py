"""spec.training.acrossIslands.mode replicas is refused by the operator until it renders one world
per island (the trainer alone would run one world with an outer optimizer over itself)."""

from holmes.contract import load_job
from holmes.operator.core.template import TemplatePolicy
from holmes.operator.core.validation import refusal
from tests.contract.spec_helpers import minimal_spec


def manifest(mode):
    spec = minimal_spec()
    spec["training"]["acrossIslands"] = {"mode": mode}
    return {"apiVersion": "holmes.dev/v1alpha1", "kind": "HolmesJob", "metadata": {"name": "j"}, "spec": spec}


def test_replicas_are_refused_naming_the_field_and_what_runs_instead():
    m = manifest("replicas")
    reason, message = refusal(m, load_job(m), TemplatePolicy(), False, None)
    assert reason == "InvalidSpec"
    assert "spec.training.acrossIslands.mode: replicas" in message and "use pipeline, or auto" in message


def test_pipeline_and_auto_go_on():
    for mode in ("pipeline", "auto"):
        m = manifest(mode)
        assert refusal(m, load_job(m), TemplatePolicy(), False, None) is None
