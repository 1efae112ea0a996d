"""GitOps artefacts without a cluster: deploy/ builds with kustomize; the Argo CD and Flux
examples point at paths that exist and carry values the chart's schema accepts."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.helpers.packaging.packaging_helpers import CHART, DEPLOY, GITOPS, REPO, cache_bin, helm, run


def kubectls() -> list[str]:
    """Both kubectls we have: the one built with the cluster (its release's kustomize) and any on PATH."""
    out = [str(cache_bin() / "kubectl")] if (cache_bin() / "kubectl").exists() else []
    if shutil.which("kubectl"):
        out.append(shutil.which("kubectl"))
    assert out, "no kubectl: run hack/build-k8s.sh"
    return out


@pytest.mark.parametrize("kubectl", kubectls())
def test_kustomize_builds_deploy(kubectl):
    docs = [d for d in yaml.safe_load_all(run([kubectl, "kustomize", str(DEPLOY)]).stdout) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "CustomResourceDefinition", "Deployment", "ClusterRole", "ServiceAccount"} <= kinds
    ns = next(d for d in docs if d["kind"] == "Namespace")["metadata"]["name"]
    for d in docs:
        if d["kind"] in ("Deployment", "ServiceAccount", "Service"):
            assert d["metadata"]["namespace"] == ns


def load_all(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def helm_values_accepted(values: dict) -> list[dict]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values, f)
        f.flush()
        out = helm("template", "holmes", str(CHART), "-n", "holmes-system", "-f", f.name).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_argocd_application():
    (app,) = load_all(GITOPS / "argocd" / "application.yaml")
    assert app["apiVersion"] == "argoproj.io/v1alpha1" and app["kind"] == "Application"
    src = app["spec"]["source"]
    assert (REPO / src["path"] / "Chart.yaml").exists()
    docs = helm_values_accepted(src["helm"]["valuesObject"])
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
        src["helm"]["valuesObject"]["image"]["repository"] + ":"
    )
    assert "ServerSideApply=true" in app["spec"]["syncPolicy"]["syncOptions"]


def test_flux_helmrelease_and_kustomization():
    docs = load_all(GITOPS / "flux" / "helmrelease.yaml")
    repo = next(d for d in docs if d["kind"] == "GitRepository")
    hr = next(d for d in docs if d["kind"] == "HelmRelease")
    assert hr["apiVersion"] == "helm.toolkit.fluxcd.io/v2"
    assert hr["spec"]["chart"]["spec"]["sourceRef"]["name"] == repo["metadata"]["name"]
    assert (REPO / hr["spec"]["chart"]["spec"]["chart"] / "Chart.yaml").exists()
    helm_values_accepted(hr["spec"]["values"])
    (ks,) = load_all(GITOPS / "flux" / "kustomization-deploy.yaml")
    assert (REPO / ks["spec"]["path"] / "kustomization.yaml").exists()
    assert ks["spec"]["sourceRef"]["name"] == repo["metadata"]["name"]
    # the source must not ignore the folders the two objects read
    ignore = repo["spec"]["ignore"]
    for path in (hr["spec"]["chart"]["spec"]["chart"], ks["spec"]["path"]):
        assert f"!/{path.strip('./').split('/')[0]}/" in ignore


def test_schema_really_rejects_bad_example_values():
    """The example checks above can fail: a wrong key is refused."""
    with pytest.raises(AssertionError, match="additional properties"):
        helm_values_accepted({"images": {"repository": "x"}})
