"""The chart's jobPolicy values, the operator's job-policy flags and their docs name the same
controls (template.POLICY_OPTIONS). (The chart's own pods against the Pod Security levels: on the
real API server, tests/e2e/operator/test_pod_security_cluster.py.)"""

from __future__ import annotations

import yaml

from holmes.operator.core.template import POLICY_OPTIONS, TemplatePolicy
from tests.helpers.packaging.packaging_helpers import CHART, REPO, one, render

EVERY_EXCEPTION = {  # each value set to something the default is not
    f"jobPolicy.{o.chart}": f"{{{o.field}-a,{o.field}-b}}" if o.is_list else "true" for o in POLICY_OPTIONS
}


def operator_policy(docs, monkeypatch) -> TemplatePolicy:
    from holmes.operator.__main__ import parse_args

    c = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    monkeypatch.setenv("HOLMES_TRAINER_IMAGE", "holmes-trainer:test")
    return parse_args(c["args"]).policy


def test_the_default_values_are_the_default_policy(monkeypatch):
    values = yaml.safe_load((CHART / "values.yaml").read_text())["jobPolicy"]
    assert list(values) == [o.chart for o in POLICY_OPTIONS]
    assert operator_policy(render(), monkeypatch) == TemplatePolicy()


def test_every_value_reaches_the_operator_as_its_flag(monkeypatch):
    policy = operator_policy(render(EVERY_EXCEPTION), monkeypatch)
    for o in POLICY_OPTIONS:
        want = (f"{o.field}-a", f"{o.field}-b") if o.is_list else True
        assert getattr(policy, o.field) == want, o.chart


def test_the_docs_name_every_flag_and_value():
    api = (REPO / "docs" / "api.md").read_text()
    install = (REPO / "docs" / "install.md").read_text()
    for o in POLICY_OPTIONS:
        assert f"`--{o.flag}" in api and f"`{o.chart}`" in api, o.flag
        assert f"`{o.chart}`" in install or f"`jobPolicy.{o.chart}`" in install, o.chart
