"""The chart against the real local control plane, in order: server-side dry run, `helm install
--wait` (the node agent runs the operator pod with its service-account token, so RBAC is
real), the operator's permissions are exactly the chart's and a forbidden call is refused,
HolmesJobs driven by that operator read correctly under kstatus and the Argo CD health script
(finished, running, stalled), `helm upgrade` changes a value and the CRD, `helm uninstall`
leaves only the kept CRD, and a re-install adopts it.

The operator serves only this module's job namespace (watch.allNamespaces=false), so it never
touches other tests' jobs; the release lives in a namespace of its own, so the per-namespace
Role really is created outside the release namespace.
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from pathlib import Path

import pytest
import yaml

from holmes.operator.core import child_names
from tests.helpers.packaging.chart_release import CRD_NAME, Env, apply_job, job_obj, operator_pod, tiny_job
from tests.helpers.packaging.health_rules import argocd, kstatus
from tests.helpers.packaging.packaging_helpers import CHART, CRDS, cache_bin, helm, run

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def env(cluster):
    yield from Env(cluster.kubeconfig, built_images=cluster.real_nodes).provisioned()


# ---- install -------------------------------------------------------------------------------


def test_template_applies_with_server_side_dry_run(env):
    # rendered for this server, as `helm install` renders it
    server = json.loads(env.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    out = helm(
        "template", env.release, str(CHART), "-n", env.release_ns, *env.values(), "--kube-version", server
    ).stdout
    res = env.kubectl("apply", "--dry-run=server", "-f", "-", input=out)
    assert "deployment.apps/" + env.fullname + " created (server dry run)" in res.stdout
    assert "role.rbac.authorization.k8s.io/" + env.fullname + " created (server dry run)" in res.stdout


def test_helm_install_wait_runs_the_operator_pod(env):
    res = env.install()
    notes = res.stdout.split("NOTES:", 1)[1]
    assert f"rollout status deployment/{env.fullname}" in notes and env.job_ns in notes
    dep = env.get("deployment", env.fullname, "-n", env.release_ns)
    assert dep["status"].get("availableReplicas") == 1
    pod = operator_pod(env)
    assert pod and pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"]
    assert pod["spec"]["serviceAccountName"] == env.fullname
    # the Role sits in the served namespace, not the release namespace
    role = env.get("role", env.fullname, "-n", env.job_ns)
    assert role["metadata"]["labels"]["app.kubernetes.io/instance"] == env.release
    # the operator's liveness endpoint answers at its pod IP, where a kubelet would probe it
    # (the agent runs no probes, so ask it ourselves)
    ip = pod["status"]["podIP"]
    env.wait_for(
        "the liveness endpoint", lambda: http_ok(f"http://{ip}:{env.liveness_port}/healthz"), timeout=60
    )
    # secure metrics (the chart's default): HTTPS, and refused without a token the API server
    # accepts (tests/unit/operator/test_metrics_auth.py serves them to an authorized one)
    refused = env.wait_for(
        "the metrics endpoint", lambda: https_status(f"https://{ip}:{env.metrics_port}/metrics")
    )
    assert refused == 401
    assert https_status(f"https://{ip}:{env.metrics_port}/metrics", token="not-a-token") == 401
    lease = env.wait_for(
        "the operator to take the leader Lease",
        lambda: (
            lambda lease: lease if lease["spec"].get("holderIdentity") == pod["metadata"]["name"] else None
        )(env.get("lease", env.fullname, "-n", env.release_ns)),
        timeout=60,
    )
    assert lease["spec"]["leaseDurationSeconds"] == 15


def http_ok(url: str) -> str | None:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode() or "ok" if r.status == 200 else None
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def https_status(url: str, token: str | None = None) -> int | None:
    """The HTTP status of a GET over TLS without verifying the (self-signed) certificate."""
    import ssl
    import urllib.error
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


# ---- least privilege -----------------------------------------------------------------------

# Every permission the chart grants, and why the operator needs it (operator/holmes/operator/).
NEEDED = {
    ("holmesjobs.holmes.dev", "list"): "kopf watch (on.event, daemon)",
    ("holmesjobs.holmes.dev", "watch"): "kopf watch (on.event, daemon)",
    ("holmesjobs.holmes.dev", "patch"): "kopf finalizer and annotations",
    ("holmesjobs.holmes.dev", "delete"): "kube.KubeIO.delete_job (ttlSecondsAfterFinished)",
    ("holmesjobs.holmes.dev/status", "patch"): "kube.KubeIO.patch_status",
    ("pods", "list"): "informer.Informer (the pods cache)",
    ("pods", "watch"): "informer.Informer (the pods cache)",
    ("pods", "create"): "kube.KubeIO.apply",
    ("pods", "delete"): "kube.KubeIO._delete_pod (gang restart, suspend)",
    ("pods", "patch"): "jobset_watch.JobSetPlans.plan_one (a labelled JobSet's pod ungated onto its node)",
    ("pods/log", "get"): "kube.KubeIO.log_tail (the trainer's last line, for status.progress)",
    ("configmaps", "get"): "jobset_watch.JobSetPlans.plan_one (a labelled JobSet's plan, read back)",
    ("configmaps", "list"): "informer.Informer (the ConfigMaps cache)",
    ("configmaps", "watch"): "informer.Informer (the ConfigMaps cache)",
    ("configmaps", "create"): "kube.KubeIO._create_or_replace_configmap",
    ("configmaps", "update"): "kube.KubeIO._create_or_replace_configmap (re-plan)",
    ("services", "list"): "informer.Informer (the Services cache)",
    ("services", "watch"): "informer.Informer (the Services cache)",
    ("services", "create"): "kube.KubeIO.apply",
    ("resourcequotas", "list"): "informer.Informer (a gang waits for its namespace's quota, core/quota.py)",
    ("resourcequotas", "watch"): "informer.Informer (a gang waits for its namespace's quota, core/quota.py)",
    ("events", "create"): "kopf.event",
    ("nodes", "list"): "the node informer",
    ("nodes", "watch"): "the node informer",
    ("nodes", "patch"): "topology_labels.TopologyLabels (Holmes' topology labels)",
    ("customresourcedefinitions.apiextensions.k8s.io", "list"): "kopf resource scanning",
    ("customresourcedefinitions.apiextensions.k8s.io", "watch"): "kopf resource scanning",
    ("namespaces", "list"): "watches.Watches (Pod Security labels); kopf namespace observation",
    ("namespaces", "watch"): "watches.Watches (Pod Security labels); kopf namespace observation",
    ("priorityclasses.scheduling.k8s.io", "list"): "informer.Informer (runPolicy.priorityClassName)",
    ("priorityclasses.scheduling.k8s.io", "watch"): "informer.Informer (runPolicy.priorityClassName)",
    ("resourceflavors.kueue.x-k8s.io", "list"): "informer.Informer (Kueue flavors' node labels)",
    ("resourceflavors.kueue.x-k8s.io", "watch"): "informer.Informer (Kueue flavors' node labels)",
    ("localqueues.kueue.x-k8s.io", "list"): "informer.Informer (a job's ClusterQueue: TAS)",
    ("localqueues.kueue.x-k8s.io", "watch"): "informer.Informer (a job's ClusterQueue: TAS)",
    ("clusterqueues.kueue.x-k8s.io", "list"): "informer.Informer (its flavors' Topology: TAS)",
    ("clusterqueues.kueue.x-k8s.io", "watch"): "informer.Informer (its flavors' Topology: TAS)",
    ("workloadpriorityclasses.kueue.x-k8s.io", "list"): "informer.Informer (kueue.x-k8s.io/priority-class)",
    ("workloadpriorityclasses.kueue.x-k8s.io", "watch"): "informer.Informer (kueue.x-k8s.io/priority-class)",
    ("workloads.kueue.x-k8s.io", "list"): "informer.Informer (the Workloads cache)",
    ("workloads.kueue.x-k8s.io", "watch"): "informer.Informer (the Workloads cache)",
    ("workloads.kueue.x-k8s.io", "create"): "kube.KubeIO.apply_queueing",
    ("workloads.kueue.x-k8s.io", "delete"): "kube.KubeIO.apply_queueing (the job's pods changed)",
    (
        "workloads.kueue.x-k8s.io",
        "patch",
    ): "kube.KubeIO.apply_queueing (adopting MultiKueue's prebuilt Workload)",
    ("workloads.kueue.x-k8s.io/status", "patch"): "kube.KubeIO.apply_queueing (Finished)",
    ("podgroups.scheduling.volcano.sh", "list"): "informer.Informer (the PodGroups' phase, watches.py)",
    ("podgroups.scheduling.volcano.sh", "watch"): "informer.Informer (the PodGroups' phase, watches.py)",
    ("podgroups.scheduling.volcano.sh", "create"): "kube.KubeIO.apply_queueing",
    ("podgroups.scheduling.volcano.sh", "patch"): "kube.KubeIO.apply_queueing (a new gang size)",
    ("jobsets.jobset.x-k8s.io", "list"): "informer.Informer (labelled JobSets, jobset_watch.py)",
    ("jobsets.jobset.x-k8s.io", "watch"): "informer.Informer (labelled JobSets, jobset_watch.py)",
    ("jobsets.jobset.x-k8s.io", "patch"): "jobset_watch.JobSetPlans.mark (holmes.dev/plan-status)",
    ("resourceslices.resource.k8s.io", "list"): "informer.Informer (DRA devices, watches.py)",
    ("resourceslices.resource.k8s.io", "watch"): "informer.Informer (DRA devices, watches.py)",
    ("resourceclaimtemplates.resource.k8s.io", "create"): "kube.KubeIO._create_claim_template",
    ("computedomains.resource.nvidia.com", "create"): "kube.KubeIO._create_compute_domain",
    ("resourceclaims.resource.k8s.io", "list"): "informer.Informer (devices claims hold, watches.py)",
    ("resourceclaims.resource.k8s.io", "watch"): "informer.Informer (devices claims hold, watches.py)",
    ("tokenreviews.authentication.k8s.io", "create"): "metrics_server.api_reviews (a scraper's token)",
    ("subjectaccessreviews.authorization.k8s.io", "create"): "metrics_server.api_reviews (its /metrics get)",
}
# Cluster-wide reads (the ClusterRole in every mode): besides nodes and CRDs, PriorityClasses
# and Kueue's ResourceFlavors and WorkloadPriorityClasses. Not pods: a namespaced install reads
# pods in its namespaces only.
CLUSTER_READS = (
    "nodes",
    "customresourcedefinitions",
    "namespaces",
    "priorityclasses",
    "resourceflavors",
    "workloadpriorityclasses",
    "localqueues",
    "clusterqueues",
    "resourceslices",
)
# Cluster-scoped creates (listed by `can-i --list` in every namespace): the secure metrics' reviews.
CLUSTER_CREATES = ("tokenreviews", "subjectaccessreviews")
# In the release namespace only: the leader-election Lease (leader.LeaderElector).
LEADER = {
    ("leases.coordination.k8s.io", "create"): "leader.LeaderElector._create",
    ("leases.coordination.k8s.io", "get"): "leader.LeaderElector._get (its own Lease only)",
    ("leases.coordination.k8s.io", "update"): "leader.LeaderElector renewals (its own Lease only)",
}
# What every authenticated user may do anyway (system:basic-user, system:discovery, ...).
BASELINE = {
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
    "selfsubjectreviews.authentication.k8s.io",  # `kubectl auth whoami` (1.28+)
    "clustertrustbundles.certificates.k8s.io",  # readable by every authenticated user (1.33+)
}


def granted(env: Env, ns: str) -> set[tuple[str, str]]:
    """(resource, verb) the operator's service account may use in namespace ns, as the
    apiserver's own authorizer lists them."""
    return parse_can_i(
        env.kubectl(
            "auth", "can-i", "--list", "-n", ns, f"--as=system:serviceaccount:{env.release_ns}:{env.fullname}"
        ).stdout
    )


def parse_can_i(out: str) -> set[tuple[str, str]]:
    perms = set()
    for line in out.splitlines()[1:]:
        cols = line.split()
        if not cols or cols[0] in BASELINE or cols[0].startswith("["):  # non-resource URLs
            continue
        verbs = line[line.rindex("[") + 1 : line.rindex("]")].split()
        perms |= {(cols[0], v) for v in verbs}
    return perms


def test_operator_may_do_exactly_what_it_needs(env):
    assert granted(env, env.job_ns) == set(NEEDED)
    # outside the served namespace: only the cluster-scoped reads
    assert granted(env, env.release_ns) == {
        k
        for k in NEEDED
        if (k[0].split(".")[0] in CLUSTER_READS and k[1] in ("list", "watch"))
        or k == ("nodes", "patch")
        or (k[0].split(".")[0] in CLUSTER_CREATES and k[1] == "create")
    } | set(LEADER)


def sa_kubeconfig(env: Env, tmp_path: Path) -> str:
    """A kubeconfig that authenticates with the operator pod's own service-account token."""
    token = env.kubectl("create", "token", env.fullname, "-n", env.release_ns).stdout.strip()
    cfg = yaml.safe_load(Path(env.kubeconfig).read_text())
    cfg["users"] = [{"name": "operator", "user": {"token": token}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = "operator"
    path = tmp_path / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_a_forbidden_call_is_refused(env, tmp_path):
    kc = sa_kubeconfig(env, tmp_path)
    kubectl = [str(cache_bin() / "kubectl"), f"--kubeconfig={kc}"]
    # allowed: what the operator does
    run(kubectl + ["get", "pods", "-n", env.job_ns])
    run(kubectl + ["get", "nodes"])
    # refused: secrets, nodes writes, any pod call outside the served namespaces (the
    # namespaced install lists no pod elsewhere, nor cluster-wide), HolmesJob writes there
    for args in (
        ["get", "secrets", "-n", env.job_ns],
        ["get", "pods", "-n", env.release_ns],
        ["get", "pods", "-n", "default"],
        ["get", "pods", "--all-namespaces"],
        ["label", "node", "ib-0", "x=y"],
        ["delete", "pod", "no-such-pod", "-n", env.release_ns],
        ["delete", "holmesjobs", "--all", "-n", env.release_ns],
    ):
        proc = run(kubectl + args, check=False)
        assert proc.returncode != 0 and "Forbidden" in proc.stderr, (args, proc.stderr)


# ---- jobs driven by the chart-installed operator, read by GitOps health rules ---------------


def pod_logs(env: Env, cluster, job: str) -> str:
    """The tail of each trainer pod's log, for failure messages."""
    if cluster.state_dir is None:
        return ""
    out = []
    for p in env.get("pods", "-n", env.job_ns, "-l", f"{child_names.LABEL_JOB}={job}")["items"]:
        log = cluster.pod_log(env.job_ns, p["metadata"]["name"], child_names.TRAINER_CONTAINER)
        out.append(f"--- {p['metadata']['name']}:\n" + "\n".join(log.splitlines()[-25:]))
    return "\n".join(out)


def test_finished_job_succeeds_and_reads_healthy(env, cluster):
    apply_job(env, tiny_job("done", runPolicy__ttlSecondsAfterFinished=8))
    obj = env.wait_for(
        "HolmesJob done to succeed",
        lambda: (lambda o: o if o.get("status", {}).get("phase") in ("Succeeded", "Failed") else None)(
            job_obj(env, "done")
        ),
        timeout=300,
    )
    assert obj["status"]["phase"] == "Succeeded", (
        json.dumps(obj["status"].get("conditions"), indent=1)[:2000] + "\n" + pod_logs(env, cluster, "done")
    )
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert kstatus(obj)[0] == "Current"
    assert argocd(obj)[0] == "Healthy"
    events = env.get("events", "-n", env.job_ns, "--field-selector", "involvedObject.name=done")["items"]
    assert any(e["reason"] == "AllPodsSucceeded" or "Succeeded" in e.get("message", "") for e in events)
    # ttlSecondsAfterFinished: the operator deletes the finished job (holmesjobs delete)
    env.wait_for(
        "the finished job to be deleted after its TTL",
        lambda: env.kubectl("get", "holmesjob", "done", "-n", env.job_ns, check=False).returncode != 0,
        timeout=60,
    )


def test_stalled_job_reads_failed_and_degraded(env):
    # a misspelt template field: the CRD keeps the template open, the API server's dry run (under
    # the chart's RBAC) refuses the rendered pod naming it (a name too long is refused at admission)
    bad = "bad-field"
    apply_job(env, tiny_job(bad, template={"spec": {"nodeSelectr": {"pool": "a"}}}))
    obj = env.wait_for(
        "HolmesJob bad to stall",
        lambda: (
            lambda o: (
                o
                if any(
                    c["type"] == "Stalled" and c["status"] == "True"
                    for c in o.get("status", {}).get("conditions", [])
                )
                else None
            )
        )(job_obj(env, bad)),
        timeout=180,
    )
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    state, message = kstatus(obj)
    assert state == "Failed" and "spec.template.spec.nodeSelectr" in message, message
    state, message = argocd(obj)
    assert state == "Degraded" and "nodeSelectr" in message, message


def set_suspend(env, name: str, suspend: bool) -> None:
    patch = {"spec": {"runPolicy": {"suspend": suspend}}}
    env.kubectl("patch", "holmesjob", name, "-n", env.job_ns, "--type=merge", "-p", json.dumps(patch))


def test_running_job_reads_current_and_progressing_then_suspend_and_resume(env):
    apply_job(env, tiny_job("long", training__iterations=100000))
    obj = env.wait_for(
        "HolmesJob long to run",
        lambda: (lambda o: o if o.get("status", {}).get("phase") == "Running" else None)(
            job_obj(env, "long")
        ),
        timeout=120,
    )
    assert kstatus(obj)[0] == "Current"
    assert argocd(obj)[0] == "Progressing"
    assert len(env.get("pods", "-n", env.job_ns, "-l", f"{child_names.LABEL_JOB}=long")["items"]) == 2
    # an edit the operator has not seen yet reads InProgress / Progressing (observedGeneration)
    set_suspend(env, "long", True)
    obj = job_obj(env, "long")
    if obj["status"].get("observedGeneration") != obj["metadata"]["generation"]:
        assert kstatus(obj)[0] == "InProgress" and argocd(obj)[0] == "Progressing"
    # suspend deletes the pods (pods delete) ...
    obj = env.wait_for(
        "HolmesJob long to be suspended",
        lambda: (lambda o: o if o.get("status", {}).get("phase") == "Suspended" else None)(
            job_obj(env, "long")
        ),
        timeout=60,
    )
    assert argocd(obj)[0] == "Suspended"
    env.wait_for(
        "the suspended job's pods to go",
        lambda: not env.get("pods", "-n", env.job_ns, "-l", f"{child_names.LABEL_JOB}=long")["items"],
        timeout=60,
    )
    # ... resume plans again and replaces the layout ConfigMap (configmaps update)
    cm = child_names.layout_configmap_name("long")
    cm_before = env.get("configmap", cm, "-n", env.job_ns)["metadata"]["resourceVersion"]
    set_suspend(env, "long", False)
    env.wait_for(
        "HolmesJob long to run again",
        lambda: (lambda o: o if o.get("status", {}).get("phase") == "Running" else None)(
            job_obj(env, "long")
        ),
        timeout=120,
    )
    assert env.get("configmap", cm, "-n", env.job_ns)["metadata"]["resourceVersion"] != cm_before
    env.kubectl("delete", "holmesjob", "long", "-n", env.job_ns, "--wait=true", "--timeout=60s")


def test_operator_logged_no_forbidden_call(env, cluster):
    log = operator_log(env, cluster)
    assert log, "the operator pod's log was not found"
    # a 403 as a code, not inside a number (a random port such as 40321)
    refused = [line for line in log.splitlines() if "Forbidden" in line or re.search(r"\b403\b", line)]
    assert not refused, refused[:5]


def operator_log(env: Env, cluster) -> str:
    if cluster.state_dir is None:
        pytest.skip("pod logs are only readable for a cluster this session started")
    pod = operator_pod(env)
    return cluster.pod_log(env.release_ns, pod["metadata"]["name"], "operator")


# ---- upgrade and uninstall ------------------------------------------------------------------


def test_helm_upgrade_changes_a_value_and_the_crd(env, tmp_path):
    chart = tmp_path / "holmes"
    shutil.copytree(CHART, chart)
    crd_file = next((chart / "files" / "crds").glob("*.yaml"))
    crd = yaml.safe_load(crd_file.read_text())
    crd["spec"]["versions"][0].setdefault("additionalPrinterColumns", []).append(
        {"name": "Upgraded", "type": "string", "jsonPath": ".metadata.name"}
    )
    crd_file.write_text(yaml.safe_dump(crd))
    old_pod = operator_pod(env)["metadata"]["name"]
    env.helm(
        "upgrade",
        env.release,
        str(chart),
        "-n",
        env.release_ns,
        *env.values(),
        "--set",
        "logLevel=debug",
        "--wait",
        "--timeout",
        "3m",
        timeout=240,
    )
    live = env.get("crd", CRD_NAME)
    assert "Upgraded" in [c["name"] for c in live["spec"]["versions"][0]["additionalPrinterColumns"]]
    dep = env.get("deployment", env.fullname, "-n", env.release_ns)
    assert "--log-level=debug" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    # Recreate: the old operator pod is gone before the new one runs; one operator at a time
    pod = env.wait_for(
        "the new operator pod",
        lambda: (
            lambda p: (
                p
                if p and p["metadata"]["name"] != old_pod and p["status"].get("phase") == "Running"
                else None
            )
        )(operator_pod(env)),
        timeout=120,
    )
    assert "--log-level=debug" in pod["spec"]["containers"][0]["args"]


def test_helm_uninstall_leaves_only_the_kept_crd(env):
    apply_job(env, tiny_job("left", runPolicy__suspend=True))
    env.helm("uninstall", env.release, "-n", env.release_ns, "--wait", timeout=180)
    # the Deployment's pod goes through garbage collection (ReplicaSet, then pod)
    env.wait_for(
        "the operator pod to go",
        lambda: (
            not env.get("pods", "-n", env.release_ns, "-l", f"app.kubernetes.io/instance={env.release}")[
                "items"
            ]
        ),
        timeout=90,
    )
    instance = f"app.kubernetes.io/instance={env.release}"
    leftovers = env.kubectl(
        "get",
        "all,serviceaccounts,configmaps,roles,rolebindings,clusterroles,clusterrolebindings,crd",
        "-A",
        "-l",
        instance,
        "-o",
        "name",
    ).stdout.split()
    assert leftovers == [f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}"]
    crd = env.get("crd", CRD_NAME)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # the CRD stays, so HolmesJobs stay (with no operator serving them)
    assert job_obj(env, "left")["metadata"]["name"] == "left"


def test_reinstall_adopts_the_kept_crd_and_restores_it(env):
    env.install()
    live = env.get("crd", CRD_NAME)
    cols = [c["name"] for c in live["spec"]["versions"][0].get("additionalPrinterColumns", [])]
    assert "Upgraded" not in cols  # back to crds/ as the chart carries it
    src = yaml.safe_load((CRDS / "holmesjob.yaml").read_text())
    assert live["spec"]["versions"][0]["schema"] == src["spec"]["versions"][0]["schema"]  # its CEL rules too
    env.kubectl("delete", "holmesjob", "--all", "-n", env.job_ns, "--wait=true", "--timeout=60s")


def test_cluster_wide_rbac_grants_the_same_calls_in_every_namespace(env):
    """The default (watch.allNamespaces=true) RBAC, applied on its own: the same permissions in
    any namespace."""
    rel = env.release + "-cw"
    out = helm("template", rel, str(CHART), "-n", env.release_ns, "--show-only", "templates/rbac.yaml").stdout
    env.kubectl("apply", "-f", "-", input=out)
    try:
        sa = f"--as=system:serviceaccount:{env.release_ns}:{rel}-holmes"
        # and without pod logs, which a cluster-wide install grants per namespace only (issue 55)
        expected = {k for k in NEEDED if k != ("pods/log", "get")}
        for ns in (env.job_ns, "default"):
            out = env.kubectl("auth", "can-i", "--list", "-n", ns, sa).stdout
            assert parse_can_i(out) == expected
    finally:
        env.kubectl(
            "delete",
            "-f",
            "-",
            input=helm(
                "template", rel, str(CHART), "-n", env.release_ns, "--show-only", "templates/rbac.yaml"
            ).stdout,
            check=False,
        )


# ---- tenants: the aggregated holmes-edit / holmes-view ClusterRoles (issue 35) ----------------


def can_i(env: Env, who: str, verb: str, resource: str, ns: str | None) -> bool:
    """``resource`` may name a subresource (``holmesjobs.holmes.dev/status``): kubectl reads
    RESOURCE/X as an object's name, so it goes to --subresource."""
    where = ["-n", ns] if ns else ["--all-namespaces"]
    resource, _, sub = resource.partition("/")
    subresource = [f"--subresource={sub}"] if sub else []
    proc = env.kubectl("auth", "can-i", verb, resource, *subresource, *where, f"--as={who}", check=False)
    assert proc.stdout.strip() in ("yes", "no"), proc.stdout + proc.stderr
    return proc.stdout.strip() == "yes"


def test_tenant_bound_to_holmes_edit_may_create_holmesjobs_there_and_nothing_more(env):
    tenant = "tenant-" + uuid.uuid4().hex[:6]
    env.kubectl("create", "serviceaccount", tenant, "-n", env.job_ns)
    env.kubectl(
        "create",
        "rolebinding",
        tenant,
        "-n",
        env.job_ns,
        f"--clusterrole={env.fullname}-edit",
        f"--serviceaccount={env.job_ns}:{tenant}",
    )
    who = f"system:serviceaccount:{env.job_ns}:{tenant}"
    for verb in ("create", "get", "list", "watch", "update", "patch", "delete"):
        assert can_i(env, who, verb, "holmesjobs.holmes.dev", env.job_ns), verb
    # status is the operator's; nothing else in the namespace, nothing elsewhere
    assert not can_i(env, who, "patch", "holmesjobs.holmes.dev/status", env.job_ns)
    assert can_i(env, who, "get", "holmesjobs.holmes.dev/status", env.job_ns)
    for verb, res, ns in (
        ("create", "holmesjobs.holmes.dev", env.release_ns),
        ("create", "holmesjobs.holmes.dev", "default"),
        ("list", "holmesjobs.holmes.dev", None),
        ("create", "pods", env.job_ns),
        ("list", "pods", env.job_ns),
        ("get", "secrets", env.job_ns),
        ("create", "configmaps", env.job_ns),
        ("create", "rolebindings.rbac.authorization.k8s.io", env.job_ns),
    ):
        assert not can_i(env, who, verb, res, ns), (verb, res, ns)
    # exactly: everything the tenant may do in its namespace, as the apiserver lists it
    listed = parse_can_i(env.kubectl("auth", "can-i", "--list", "-n", env.job_ns, f"--as={who}").stdout)
    hj = "holmesjobs.holmes.dev"
    writes = {(hj, v) for v in ("create", "update", "patch", "delete", "deletecollection")}
    reads = {(r, v) for r in (hj, hj + "/status") for v in ("get", "list", "watch")}
    assert listed == writes | reads


def test_built_in_view_and_edit_roles_aggregate_the_holmes_rules(env):
    """Kubernetes' controller-manager aggregates labelled ClusterRoles into edit/view: whoever
    the cluster already lets view (edit) a namespace sees (edits) its HolmesJobs."""
    name = "viewer-" + uuid.uuid4().hex[:6]
    env.kubectl("create", "serviceaccount", name, "-n", env.job_ns)
    sa = f"--serviceaccount={env.job_ns}:{name}"
    env.kubectl("create", "rolebinding", name, "-n", env.job_ns, "--clusterrole=view", sa)
    viewer = f"system:serviceaccount:{env.job_ns}:{name}"
    env.wait_for(
        "the view ClusterRole to aggregate holmes-view",
        lambda: can_i(env, viewer, "list", "holmesjobs.holmes.dev", env.job_ns),
        timeout=60,
    )
    assert not can_i(env, viewer, "create", "holmesjobs.holmes.dev", env.job_ns)
