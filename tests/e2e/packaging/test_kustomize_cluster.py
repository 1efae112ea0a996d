"""`kubectl apply -k deploy/` is accepted by the real apiserver (server-side dry run: every
object is validated and admitted, nothing is persisted, so no second operator starts)."""

from __future__ import annotations

import yaml

from tests.helpers.packaging.packaging_helpers import DEPLOY


def test_apply_k_deploy_server_dry_run(cluster):
    ns = yaml.safe_load((DEPLOY / "namespace.yaml").read_text())["metadata"]["name"]
    created = cluster.kubectl("get", "namespace", ns, check=False).returncode != 0
    if created:  # namespaced objects can only be dry-run into a namespace that exists
        cluster.kubectl("create", "namespace", ns)
    try:
        # validated by the server (kubectl's default --validate=strict): an unknown field fails
        out = cluster.kubectl("apply", "-k", str(DEPLOY), "--dry-run=server").stdout
    finally:
        if created:
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    lines = [line for line in out.splitlines() if line.strip()]
    built = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(DEPLOY)).stdout) if d]
    assert len(lines) == len(built), out
    assert all("(server dry run)" in line for line in lines), out
    for kind in (
        "namespace",
        "customresourcedefinition",
        "serviceaccount",
        "clusterrole",
        "clusterrolebinding",
        "service",
        "deployment",
    ):
        assert any(line.startswith(kind) for line in lines), (kind, out)
