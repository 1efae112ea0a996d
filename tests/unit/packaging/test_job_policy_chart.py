"""The chart's jobPolicy values, the operator's job-policy flags and their docs name the same
controls (template.POLICY_OPTIONS), and the chart's own pods against the Pod Security levels."""

from __future__ import annotations

import yaml

from holmes.operator.core.template import (
    BASELINE,
    POLICY_OPTIONS,
    RESTRICTED,
    TemplatePolicy,
    rendered_pod_violations,
)
from tests.helpers.packaging.packaging_helpers import CHART, REPO, one, render

EVERY_EXCEPTION = {  # each value set to something the default is not
    f"jobPolicy.{o.chart}": (
        RESTRICTED if o.field == "level" else f"{{{o.field}-a,{o.field}-b}}" if o.is_list else "true"
    )
    for o in POLICY_OPTIONS
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
        want = RESTRICTED if o.field == "level" else (f"{o.field}-a", f"{o.field}-b") if o.is_list else True
        assert getattr(policy, o.field) == want, o.chart


def test_the_docs_name_every_flag_and_value():
    api = (REPO / "docs" / "api.md").read_text()
    install = (REPO / "docs" / "install.md").read_text()
    for o in POLICY_OPTIONS:
        assert f"`--{o.flag}" in api and f"`{o.chart}`" in api, o.flag
        assert f"`{o.chart}`" in install or f"`jobPolicy.{o.chart}`" in install, o.chart


def test_the_operator_pod_passes_restricted():
    pod = one(render(), "Deployment")["spec"]["template"]
    sa = pod["spec"]["serviceAccountName"]  # it calls the API: its token is the point
    assert rendered_pod_violations(pod, RESTRICTED, service_accounts=(sa,)) == []


def test_the_labeller_needs_a_privileged_namespace_for_its_read_only_host_files_only():
    ds = one(render({"labeller.enabled": "true"}), "DaemonSet")["spec"]["template"]
    sa = ds["spec"]["serviceAccountName"]
    refused = rendered_pod_violations(ds, BASELINE, service_accounts=(sa,))
    # /sys and the host's route table (the default route names the front-end interface)
    assert [v.split(":")[0] for v in refused] == ["spec.volumes[0].hostPath", "spec.volumes[1].hostPath"], (
        refused
    )
    assert [v["hostPath"]["path"] for v in ds["spec"]["volumes"]] == ["/sys", "/proc/1/net/route"]
    without_route = one(
        render({"labeller.enabled": "true", "labeller.defaultRoute.hostPath": ""}), "DaemonSet"
    )
    assert [v["name"] for v in without_route["spec"]["template"]["spec"]["volumes"]] == ["sys"]
