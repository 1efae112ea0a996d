"""`kubectl holmes`'s kubectl flags, run by the real kubectl from PATH against the real API server
(no operator: the jobs are objects the API server keeps): -A lists every namespace's jobs, -o
json|yaml prints what the API serves, and --as/--as-group reach the API server as impersonation
(its RBAC decides: a user allowed one namespace reads there and is refused, by name, elsewhere)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from holmes_dev.jobs import tiny_job

from localkube.controlplane import binary
from tests.helpers.operator.cluster_helpers import apply, running_operator, wait_for

pytestmark = pytest.mark.timeout(300)
USER, GROUP = "alice@example.com", "holmes-readers"


def kubectl_user(cluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real kubectl as a user runs it: KUBECONFIG in the environment, kubectl-holmes on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "PATH": path}
    return subprocess.run(
        [binary("kubectl"), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def reader(cluster, namespace: str, subject: dict) -> None:
    """A Role reading HolmesJobs (and what `why` reads) in ``namespace``, bound to ``subject``."""
    rules = [
        {"apiGroups": ["holmes.dev"], "resources": ["holmesjobs"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["events", "pods"], "verbs": ["list"]},
    ]
    meta = {"name": "holmes-reader", "namespace": namespace}
    apply(
        cluster,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
    )
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "holmes-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", **subject}],
    }
    apply(cluster, binding)


@pytest.fixture
def two_namespaces(crd, namespace):
    other = f"t-{uuid.uuid4().hex[:8]}"
    crd.kubectl("create", "namespace", other)
    apply(crd, tiny_job("first", namespace, count=2))
    apply(crd, tiny_job("second", other, count=2))
    reader(crd, namespace, {"kind": "User", "name": USER})
    reader(crd, other, {"kind": "Group", "name": GROUP})
    yield namespace, other
    crd.kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_all_namespaces_lists_every_namespaces_jobs(crd, two_namespaces):
    ns, other = two_namespaces
    r = kubectl_user(crd, "holmes", "status", "-A")
    assert r.returncode == 0, r.stderr
    head, *rows = r.stdout.splitlines()
    assert head.split()[:3] == ["NAMESPACE", "NAME", "PHASE"], r.stdout
    assert [ns, "first"] in [row.split()[:2] for row in rows] and [other, "second"] in [
        row.split()[:2] for row in rows
    ]
    r = kubectl_user(crd, "holmes", "status", "-n", other)  # one namespace: no NAMESPACE column
    assert r.returncode == 0 and r.stdout.split()[:2] == ["NAME", "PHASE"] and "second" in r.stdout, r.stdout
    assert "first" not in r.stdout
    r = kubectl_user(crd, "holmes", "why", "first", "-A")
    assert r.returncode == 1 and "give -n NAMESPACE instead" in r.stderr, r.stderr


def test_output_json_and_yaml_are_what_the_api_serves(crd, two_namespaces):
    ns, other = two_namespaces
    # the plugin reads the storage version; kubectl's preferred one is v1beta1 (the same object)
    served = crd.get_json("holmesjobs.v1alpha1.holmes.dev", "first", "-n", ns)
    r = kubectl_user(crd, "holmes", "status", "first", "-n", ns, "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == served
    r = kubectl_user(crd, "holmes", "status", "first", "-n", ns, "-o", "yaml")
    assert r.returncode == 0 and yaml.safe_load(r.stdout) == served, r.stderr
    r = kubectl_user(crd, "holmes", "status", "-A", "-o", "json")
    assert r.returncode == 0, r.stderr
    listed = {(j["metadata"]["namespace"], j["metadata"]["name"]) for j in json.loads(r.stdout)["items"]}
    assert {(ns, "first"), (other, "second")} <= listed
    r = kubectl_user(crd, "holmes", "why", "first", "-n", ns, "-o", "json")
    assert r.returncode == 0, r.stderr
    why = json.loads(r.stdout)
    assert (why["namespace"], why["name"]) == (ns, "first") and why["why"], why


def test_as_and_as_group_reach_the_api_server_as_impersonation(crd, two_namespaces, tmp_path):
    ns, other = two_namespaces
    r = kubectl_user(crd, "holmes", "status", "first", "-n", ns, "--as", USER)
    assert r.returncode == 0 and f"HolmesJob {ns}/first" in r.stdout, r.stderr
    r = kubectl_user(crd, "holmes", "why", "first", "-n", ns, "--as", USER)
    assert r.returncode == 0, r.stderr
    # the user's Role is in one namespace: the other and the cluster-wide list are refused
    r = kubectl_user(crd, "holmes", "status", "second", "-n", other, "--as", USER)
    assert r.returncode == 1 and f"reading HolmesJob {other}/second: 403 Forbidden (as {USER})" in r.stderr, (
        r.stderr
    )
    r = kubectl_user(crd, "holmes", "status", "-A", "--as", USER)
    assert (
        r.returncode == 1 and f"listing HolmesJobs in every namespace: 403 Forbidden (as {USER})" in r.stderr
    )
    # the group's Role is in the other namespace
    r = kubectl_user(crd, "holmes", "status", "second", "-n", other, "--as", USER, "--as-group", GROUP)
    assert r.returncode == 0 and f"HolmesJob {other}/second" in r.stdout, r.stderr
    # plan lists the nodes as the impersonated user: the tenant's Role grants no nodes
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(tiny_job("planned", count=2)))
    r = kubectl_user(crd, "holmes", "plan", "-f", str(job), "-o", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["nodes"], r.stderr
    r = kubectl_user(crd, "holmes", "plan", "-f", str(job), "--as", USER)
    assert r.returncode != 0 and "cannot list nodes" in r.stderr and "403" in r.stderr, r.stderr


def test_the_operator_on_v1alpha1_serves_a_job_written_as_v1beta1(crd, namespace, tmp_path):
    """v1beta1 beside the storage version, conversion None: the operator, which watches v1alpha1,
    places a job applied as v1beta1, and a v1beta1 reader (kubectl's preferred version) reads the
    status it wrote."""
    ops = running_operator(crd, namespace, tmp_path, tail=40)
    op = next(ops)
    try:
        apply(crd, {**tiny_job("beta", namespace, count=40), "apiVersion": "holmes.dev/v1beta1"})

        def waiting():
            job = crd.get_json("holmesjobs.v1beta1.holmes.dev", "beta", "-n", namespace)
            return job if "WaitingForNodes" in json.dumps(job.get("status")) else None

        job = wait_for("the operator's status on the v1beta1 job", waiting, op=op)
        assert job["apiVersion"] == "holmes.dev/v1beta1" and job["status"]["phase"] == "Pending"
        r = kubectl_user(crd, "holmes", "why", "beta", "-n", namespace)
        assert r.returncode == 0 and "needs 40 nodes" in r.stdout, r.stdout + r.stderr
    finally:
        next(ops, None)
