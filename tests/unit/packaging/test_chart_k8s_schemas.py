"""Every object the chart renders, with the value combinations the chart's tests use, against the
published schema of every Kubernetes release the chart supports (Chart.yaml kubeVersion: 1.34 to
1.37, hack/k8s_openapi.py's VERSIONS): an API version the release does not serve by default, an
unknown field, a wrong type, a missing required field fails (tests/helpers/k8s_openapi_check.py
says exactly what is checked). The tests run 1.37.2 only; this is what stands for the others
(docs/install.md#compatibility-matrix). `make k8s-openapi` fetches the schemas once."""

from __future__ import annotations

import copy
import functools
import re

import pytest
import yaml
from k8s_openapi import VERSIONS, load

from tests.helpers.k8s_openapi_check import check_object
from tests.helpers.packaging.packaging_helpers import CHART, render

# Groups that are no Kubernetes API: checked against their own published schemas elsewhere.
OTHER_GROUPS = {
    "monitoring.coreos.com": "tests/unit/packaging/test_monitoring.py (prometheus-operator's CRDs)",
    # Kubeflow Trainer's CRD: applied to the real API server serving it by
    # tests/e2e/operator/test_trainjob_cluster.py (its content: test_trainjob_runtime_chart.py)
    "trainer.kubeflow.org": "tests/e2e/operator/test_trainjob_cluster.py (Kubeflow Trainer's CRDs)",
}
MONITORING = {
    "metrics.serviceMonitor.enabled": "true",
    "metrics.trainerPodMonitor.enabled": "true",
    "metrics.prometheusRule.enabled": "true",
    "metrics.grafanaDashboard.enabled": "true",
}
# The value combinations the chart's tests render, merged: cluster-wide with everything on, and
# namespaced with the defaults turned the other way. Between them every template renders
# (test_every_kind_of_every_combination_is_checked).
COMBINATIONS: dict[str, dict[str, str]] = {
    "defaults": {},
    "cluster-wide, everything on": {
        **MONITORING,
        "labeller.enabled": "true",
        "members.enabled": "true",
        "members.secretNames": "{member-b,member-c}",
        "metrics.tls.secretName": "holmes-metrics-cert",
        "networkPolicy.enabled": "true",
        "jobPolicy.allowNodeName": "true",
        "jobPolicy.serviceAccounts": "{trainer,reader}",
        "jobPolicy.runtimeClasses": "{nvidia}",
        "rawPriorityNamespaces": "{platform,batch}",
        "trainer.portRange": "30000-30999",
        "bindAddress": "::",
        "costModel.nvlinkGbps": "900",
        "trainjob.runtime.enabled": "true",
    },
    "namespaced, defaults turned": {
        "watch.allNamespaces": "false",
        "watch.namespaces": "{team-a,team-b}",
        "networkPolicy.enabled": "true",
        "metrics.secure": "false",
        "leaderElection.enabled": "false",
        "podDisruptionBudget.enabled": "false",
        "serviceAccount.create": "false",
        "serviceAccount.name": "mine",
        "rbac.aggregateToDefaultRoles": "false",
        "topologyLabels.enabled": "false",
        "crds.validationRules": "false",
        "crds.keep": "false",
        "labeller.enabled": "true",
        "labeller.namespace.name": "",
        "labeller.admissionPolicy": "false",
        "labeller.serviceAccount.create": "false",
        "labeller.serviceAccount.name": "nic-labeller",
        "labeller.defaultRoute.hostPath": "",
    },
    "no metrics, no CRD": {"metrics.enabled": "false", "crds.install": "false", "rbac.create": "true"},
}


@functools.cache
def release(version: str) -> dict:
    return load(version)


@functools.cache
def rendered(combination: str) -> tuple[dict, ...]:
    return tuple(render(COMBINATIONS[combination]))


def kubernetes_objects(docs):
    for d in docs:
        group = d["apiVersion"].rpartition("/")[0]
        if group in OTHER_GROUPS:
            continue
        yield d


def test_the_versions_checked_are_those_the_chart_supports():
    """kubeVersion's lower bound is the oldest release checked; the newest is the one the tests run."""
    floor = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    m = re.fullmatch(r">=\s*1\.(\d+)\.0-0", floor)
    assert m, f"Chart.yaml kubeVersion {floor!r}: expected >=1.N.0-0"
    minors = [int(v.split(".")[1]) for v in VERSIONS]
    assert minors == list(range(int(m[1]), minors[-1] + 1)), "one release per minor, none skipped"
    build = (CHART.parents[1] / "hack" / "build-k8s.sh").read_text()
    assert f"DEFAULT_K8S_VERSION={VERSIONS[-1]} " in build, "the newest checked is the one the tests run"
    # and the oldest is the compatibility tier's (make compat)
    assert f"COMPAT_K8S_VERSION ?= {VERSIONS[0]}\n" in (CHART.parents[1] / "Makefile").read_text()


@pytest.mark.parametrize("combination", list(COMBINATIONS))
@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_is_valid_for_every_supported_release(combination, version):
    docs = rendered(combination)
    objects = list(kubernetes_objects(docs))
    assert len(objects) >= 8
    errors = [e for d in objects for e in check_object(d, release(version))]
    assert errors == [], f"Kubernetes {version}, values {COMBINATIONS[combination]}:\n" + "\n".join(errors)


def test_every_kind_of_every_combination_is_checked():
    """Nothing is skipped silently: every group the chart renders is Kubernetes' or named above."""
    kinds = {(d["apiVersion"], d["kind"]) for c in COMBINATIONS for d in rendered(c)}
    skipped = {k for k in kinds if k[0].rpartition("/")[0] in OTHER_GROUPS}
    assert {k for _, k in skipped} == {
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "ClusterTrainingRuntime",
    }
    # the templates' kinds, all rendered by some combination
    templated = set(
        re.findall(
            r"^kind: (\w+)", "".join(p.read_text() for p in (CHART / "templates").glob("*.yaml")), re.M
        )
    )
    assert templated <= {k for _, k in kinds}


# ---- the check itself: it refuses what the API server would ----------------------------------


def deployment() -> dict:
    return copy.deepcopy(next(d for d in rendered("defaults") if d["kind"] == "Deployment"))


def test_the_check_refuses_an_unknown_field_a_wrong_type_and_a_missing_required_field():
    r = release(VERSIONS[0])
    assert check_object(deployment(), r) == []
    d = deployment()
    d["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    d["spec"]["replicas"] = "2"
    del d["spec"]["selector"]
    errors = check_object(d, r)
    assert any("unknown field 'imagePullPolicyy'" in e for e in errors), errors
    assert any(".spec.replicas: '2' is not integer" in e for e in errors), errors
    assert any(".spec: selector is required" in e for e in errors), errors
    # maps stay open: any label, any ConfigMap key
    d = deployment()
    d["metadata"]["labels"]["anything.example.com/x"] = "y"
    assert check_object(d, r) == []


def test_the_check_refuses_an_api_a_release_does_not_serve():
    """storagemigration.k8s.io/v1 is GA in 1.37 only; 1.34 has it as v1alpha1 (off by default)."""
    svm = {
        "apiVersion": "storagemigration.k8s.io/v1",
        "kind": "StorageVersionMigration",
        "metadata": {"name": "x"},
        "spec": {"resource": {"group": "apps", "resource": "deployments"}},
    }
    assert check_object(svm, release("v1.37.2")) == []
    assert check_object(svm, release(VERSIONS[0])) == [
        "StorageVersionMigration x: storagemigration.k8s.io/v1 is not an API of this release"
    ]
    svm["apiVersion"] = "storagemigration.k8s.io/v1alpha1"
    assert check_object(svm, release(VERSIONS[0])) == [
        "StorageVersionMigration x: storagemigration.k8s.io/v1alpha1 is alpha, "
        "not served without a feature gate"
    ]
