"""What a cluster-wide install (watch.allNamespaces, the chart's default) allows, asked of the
real API server with the chart's RBAC and admission policy applied as rendered (no operator pod,
no image: the rights are the server's to grant or refuse):

- the operator's service account writes a HolmesJob's ConfigMap and no other, kube-system's
  included (templates/configmap-policy.yaml: RBAC cannot name them), and the operator itself,
  run with that account's token, makes its job's layout ConfigMap under the policy;
- a tenant's own token (bound to <fullname>-edit) reads no pod logs in kube-system, nor does the
  operator's (pods/log is never granted cluster-wide);
- `kubectl delete all --all` leaves HolmesJobs (they are not in the category "all");
- the operator's secure metrics (run as a host process, --metrics-secure) are refused without a
  token or with one the API server does not accept (401), refused to one not bound to
  <fullname>-metrics-reader (403), served to one that is (200): the server's own TokenReview
  and SubjectAccessReview decide. (The chart-installed operator pod's 401s:
  tests/e2e/packaging/test_chart_cluster.py.)
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from holmes.operator.core import child_names
from localkube.operatorproc import OperatorProcess, install_crd
from tests.helpers import polling
from tests.helpers.packaging.chart_release import tiny_job
from tests.helpers.packaging.packaging_helpers import CHART, helm

DENIED_UPDATE = "may update or delete only a HolmesJob's ConfigMap"
DENIED_WRITE = "may write only a HolmesJob's ConfigMap"


@pytest.fixture(scope="module")
def crd(cluster):
    install_crd(cluster.kubeconfig)


@pytest.fixture
def release(cluster, namespace):
    """The chart's RBAC and ConfigMap policy of a cluster-wide release in ``namespace``, applied;
    yields its full name (also its service account's name)."""
    name = "cw" + uuid.uuid4().hex[:6]
    shown = ["--show-only", "templates/rbac.yaml", "--show-only", "templates/configmap-policy.yaml"]
    manifest = helm("template", name, str(CHART), "-n", namespace, *shown).stdout
    assert "kind: ValidatingAdmissionPolicyBinding" in manifest
    cluster.kubectl("apply", "-f", "-", input=manifest)
    yield f"{name}-holmes"
    cluster.kubectl("delete", "-f", "-", input=manifest, check=False)


def configmap(name: str, ns: str, job: dict | None = None, **data: str) -> str:
    """A ConfigMap as YAML; with ``job``, labelled and owned as the operator makes a job's."""
    meta: dict = {"name": name, "namespace": ns}
    if job is not None:
        jm = job["metadata"]
        meta["labels"] = {
            child_names.LABEL_MANAGED_BY: child_names.MANAGED_BY,
            child_names.LABEL_JOB: jm["name"],
        }
        meta["ownerReferences"] = [
            {
                "apiVersion": job["apiVersion"],
                "kind": "HolmesJob",
                "name": jm["name"],
                "uid": jm["uid"],
                "controller": True,
            }
        ]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})


def test_the_operator_writes_only_its_jobs_configmaps(cluster, crd, namespace, release):
    """The ValidatingAdmissionPolicy, run by the API server: the operator's service account
    (impersonated: the policy matches its user name, RBAC its bindings) updates its job's
    ConfigMap, and is refused one in kube-system, an unowned one beside the job's, taking that
    one over by labelling it, and creating one that is no job's."""
    operator = f"--as=system:serviceaccount:{namespace}:{release}"
    probe = "holmes-cmpolicy-" + uuid.uuid4().hex[:6]
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(tiny_job("j", runPolicy__suspend=True))
    )
    job = cluster.get_json("holmesjob", "j", "-n", namespace)
    cluster.kubectl("apply", "-f", "-", input=configmap("j-layout", namespace, job, v="1"))
    cluster.kubectl("apply", "-f", "-", input=configmap(probe, "kube-system", v="1"))
    cluster.kubectl("apply", "-f", "-", input=configmap(probe, namespace, v="1"))

    def replace(text: str):  # PUT, as the operator's _create_or_replace_configmap does
        return cluster.kubectl(operator, "replace", "-f", "-", input=text, check=False)

    try:
        # the policy takes effect a moment after it is created (same data: nothing changes if
        # an early try gets through)
        r = polling.wait_for(
            "the policy to refuse the operator a kube-system ConfigMap",
            lambda: (lambda r: r if DENIED_UPDATE in r.stderr else None)(
                replace(configmap(probe, "kube-system", v="1"))
            ),
            60,
            0.5,
        )
        assert r.returncode != 0 and "ValidatingAdmissionPolicy" in r.stderr, r.stderr
        r = replace(configmap(probe, "kube-system", v="2"))
        assert r.returncode != 0 and DENIED_UPDATE in r.stderr, r.stderr
        assert cluster.get_json("configmap", probe, "-n", "kube-system")["data"] == {"v": "1"}
        # the job's own: updated
        replace(configmap("j-layout", namespace, job, v="2")).check_returncode()
        assert cluster.get_json("configmap", "j-layout", "-n", namespace)["data"] == {"v": "2"}
        # an unowned one beside it, and the same relabelled and owned as the job's: refused
        for text in (configmap(probe, namespace, v="2"), configmap(probe, namespace, job, v="2")):
            r = replace(text)
            assert r.returncode != 0 and DENIED_UPDATE in r.stderr, r.stderr
        # a new one that is no job's, in kube-system: refused (RBAC alone allows the create)
        new = configmap(probe + "-new", "kube-system")
        r = cluster.kubectl(operator, "create", "-f", "-", input=new, check=False)
        assert r.returncode != 0 and DENIED_WRITE in r.stderr, r.stderr
        # a new one of the job's: created
        cluster.kubectl(operator, "create", "-f", "-", input=configmap("j-extra", namespace, job, v="1"))
        # delete: RBAC's to refuse (the operator has no configmaps delete; the policy would too)
        r = cluster.kubectl(operator, "delete", "configmap", probe, "-n", "kube-system", check=False)
        assert r.returncode != 0 and "forbidden" in r.stderr.lower(), r.stderr
    finally:
        cluster.kubectl("delete", "configmap", probe, "-n", "kube-system", "--ignore-not-found", check=False)


def test_no_pod_logs_in_kube_system_for_a_tenant_token_or_the_operator(cluster, namespace, release):
    tenant = "tenant-" + uuid.uuid4().hex[:6]
    edit = release.removesuffix("-holmes") + "-holmes-edit"
    cluster.kubectl("create", "serviceaccount", tenant, "-n", namespace)
    cluster.kubectl(
        "create",
        "rolebinding",
        tenant,
        "-n",
        namespace,
        f"--clusterrole={edit}",
        f"--serviceaccount={namespace}:{tenant}",
    )
    token = cluster.kubectl("create", "token", tenant, "-n", namespace).stdout.strip()
    # the token's own request (authorization comes before the lookup: no pod needs to exist)
    for ns in ("kube-system", namespace):
        r = cluster.kubectl(
            f"--token={token}", "get", "--raw", f"/api/v1/namespaces/{ns}/pods/any/log", check=False
        )
        assert r.returncode != 0 and 'cannot get resource "pods/log"' in r.stderr, (ns, r.stderr)
    # while the binding works: the tenant reads HolmesJobs there
    cluster.kubectl(f"--token={token}", "get", "holmesjobs", "-n", namespace)
    operator = f"--as=system:serviceaccount:{namespace}:{release}"
    r = cluster.kubectl(
        "auth", "can-i", "get", "pods", "--subresource=log", "-n", "kube-system", operator, check=False
    )
    assert r.stdout.strip() == "no", r.stdout + r.stderr


def test_kubectl_delete_all_leaves_holmesjobs(cluster, crd, namespace):
    """`kubectl delete all --all` deletes a namespace's workloads (the category "all"), not its
    HolmesJobs (category holmes only)."""
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(tiny_job("kept", runPolicy__suspend=True))
    )
    cluster.kubectl("create", "service", "clusterip", "swept", "--tcp=80:80", "-n", namespace)
    out = cluster.kubectl("delete", "all", "--all", "-n", namespace).stdout
    assert 'service "swept" deleted' in out and "holmesjob" not in out, out
    assert [j["metadata"]["name"] for j in cluster.get_json("holmes", "-n", namespace)["items"]] == ["kept"]


def https_status(url: str, token: str | None = None) -> int | None:
    """The HTTP status of a GET over TLS, the (self-signed) certificate not verified."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def test_secure_metrics_answer_as_the_api_servers_reviews_decide(cluster, crd, namespace, release, tmp_path):
    scraper, nobody = "scraper-" + uuid.uuid4().hex[:6], "nobody-" + uuid.uuid4().hex[:6]
    for sa in (scraper, nobody):
        cluster.kubectl("create", "serviceaccount", sa, "-n", namespace)
    reader = f"{release}-metrics-reader"  # the chart's ClusterRole: get on /metrics
    cluster.kubectl(
        "create",
        "clusterrolebinding",
        scraper,
        f"--clusterrole={reader}",
        f"--serviceaccount={namespace}:{scraper}",
    )
    op = OperatorProcess(
        cluster.kubeconfig, [namespace], tmp_path / "operator.log", extra=["--metrics-secure"]
    )
    try:
        op.start()
        url = f"https://127.0.0.1:{op.metrics_port}/metrics"
        assert polling.wait_for("the metrics server", lambda: https_status(url), 60, 0.5) == 401
        assert https_status(url, "not-a-token") == 401
        token = cluster.kubectl("create", "token", scraper, "-n", namespace).stdout.strip()
        # RBAC reaches the authorizer's cache a moment after the binding
        assert polling.wait_for(
            "metrics served to the scraper", lambda: https_status(url, token) == 200 or None, 30, 0.5
        )
        denied = cluster.kubectl("create", "token", nobody, "-n", namespace).stdout.strip()
        assert https_status(url, denied) == 403
    finally:
        op.stop()
        cluster.kubectl("delete", "clusterrolebinding", scraper, check=False)


def test_the_operator_as_its_service_account_creates_its_jobs_configmap_under_the_policy(
    cluster, crd, namespace, release, tmp_path
):
    """The operator itself (a host process) with the release's service-account token, its RBAC
    and the ConfigMap policy: the layout ConfigMap it makes for a job is one the policy lets it
    write (labelled and owned as the policy asks)."""
    # the policy in force first (refusing an unowned ConfigMap), so that it judges the operator's
    probe = configmap("not-a-jobs", namespace)
    as_operator = f"--as=system:serviceaccount:{namespace}:{release}"
    polling.wait_for(
        "the policy in force",
        lambda: (
            DENIED_WRITE in cluster.kubectl(as_operator, "create", "-f", "-", input=probe, check=False).stderr
        ),
        60,
        0.5,
    )
    cluster.kubectl("create", "serviceaccount", release, "-n", namespace)
    token = cluster.kubectl("create", "token", release, "-n", namespace, "--duration=1h").stdout.strip()
    cfg = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    cfg["users"] = [{"name": "operator", "user": {"token": token}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = "operator"
    kc = tmp_path / "operator.kubeconfig"
    kc.write_text(yaml.safe_dump(cfg))
    op = OperatorProcess(str(kc), [namespace], tmp_path / "operator.log")
    try:
        op.start()
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(tiny_job("real")))
        cm = polling.wait_for(
            "the operator's layout ConfigMap",
            lambda: (lambda r: r.returncode == 0 and json.loads(r.stdout))(
                cluster.kubectl("get", "configmap", "real-layout", "-n", namespace, "-o", "json", check=False)
            ),
            120,
            1.0,
        )
        assert cm["metadata"]["ownerReferences"][0]["kind"] == "HolmesJob"
        assert "denied request" not in op.tail(400), op.tail()
    finally:
        op.stop()
        cluster.kubectl("delete", "holmesjob", "real", "-n", namespace, "--wait=false", check=False)
