"""The Helm chart without a cluster: lint, what it renders for each setting, and that
values.schema.json turns wrong values into clear errors."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers.packaging.packaging_helpers import CHART, by_kind, helm, one, render


def test_helm_lint_strict():
    out = helm("lint", "--strict", str(CHART)).stdout
    assert "0 chart(s) failed" in out


def test_lint_with_every_optional_part_on():
    helm(
        "lint",
        "--strict",
        str(CHART),
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "watch.allNamespaces=false",
        "--set",
        "watch.namespaces={team-a,team-b}",
    )


def operator_pod(docs):
    return one(docs, "Deployment")["spec"]["template"]["spec"]


def test_defaults_two_replicas_with_a_leader_lease_and_the_pieces():
    docs = render()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ClusterRole",  # holmes-edit, aggregated into edit and admin
            "ClusterRole",  # holmes-view, aggregated into view
            "ClusterRole",  # holmes-metrics-reader, for the scrapers of the secure metrics
            "ClusterRole",  # holmes-pod-logs, bound per namespace by its owner (not cluster-wide)
            "ValidatingAdmissionPolicy",  # holmes-configmaps: its ConfigMap writes, its jobs' only
            "ValidatingAdmissionPolicyBinding",
            "Service",
            "Deployment",
            "PodDisruptionBudget",
        ]
    )
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate"}
    args = operator_pod(docs)["containers"][0]["args"]
    assert "--leader-elect" in args and "--leader-elect-namespace=holmes-system" in args
    assert "--progress-interval=10" in args
    anti = operator_pod(docs)["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    lease_rules = one(docs, "Role")["rules"]
    assert {v for r in lease_rules for v in r["verbs"]} == {"create", "get", "update"}
    assert [r.get("resourceNames") for r in lease_rules if "get" in r["verbs"]] == [[dep["metadata"]["name"]]]
    for d in docs:
        if d["kind"] not in (
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ):
            assert d["metadata"]["namespace"] == "holmes-system", d["kind"]
    # selector labels of the Service select the operator pod
    svc = one(docs, "Service")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    port_names = {p["name"] for p in operator_pod(docs)["containers"][0]["ports"]}
    assert svc["spec"]["ports"][0]["targetPort"] in port_names


def test_without_leader_election_one_replica_recreate_and_no_lease():
    docs = render({"leaderElection.enabled": "false", "replicas": "3"})
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert not [d for d in docs if d["kind"] == "Role"]
    assert not any(a.startswith("--leader-elect") for a in operator_pod(docs)["containers"][0]["args"])


def test_pod_security_standard_restricted():
    """The checks of the PSS "restricted" profile (kubernetes.io/docs/concepts/security/
    pod-security-standards), applied to the rendered operator pod."""
    pod = operator_pod(render())
    psc = pod.get("securityContext", {})
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    for vol in pod.get("volumes", []):
        assert set(vol) - {"name"} <= {
            "emptyDir",
            "configMap",
            "secret",
            "projected",
            "downwardAPI",
            "persistentVolumeClaim",
            "ephemeral",
            "csi",
        }, vol
    for c in pod["containers"]:
        sc = c.get("securityContext", {})
        assert sc.get("allowPrivilegeEscalation") is False
        assert sc.get("capabilities", {}).get("drop") == ["ALL"]
        assert not sc.get("capabilities", {}).get("add")
        assert not sc.get("privileged")
        assert sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True
        assert sc.get("runAsUser", psc.get("runAsUser", 1)) != 0
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {}))
        assert seccomp.get("type") in ("RuntimeDefault", "Localhost")
        assert sc.get("readOnlyRootFilesystem") is True  # beyond the profile: asked by the design
        assert not any(p.get("hostPort") for p in c.get("ports", []))


def served(objs: list[dict]) -> list[dict]:
    """The (Role|RoleBinding)s of the served namespaces, without the leader-election ones."""
    return [o for o in objs if not o["metadata"]["name"].endswith("-leader")]


def operator_cluster_role(docs: list[dict], name: str = "holmes") -> dict:
    return next(d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"] == name)


def test_watch_namespaces_gives_roles_per_namespace_and_flags():
    docs = render({"watch.allNamespaces": "false", "watch.namespaces": "{team-a,team-b}"})
    roles = served(by_kind(docs, "Role"))
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in served(by_kind(docs, "RoleBinding"))) == [
        "team-a",
        "team-b",
    ]
    # the ClusterRole keeps only cluster-scoped reads
    cr = operator_cluster_role(docs)
    assert {r for rule in cr["rules"] for r in rule["resources"]} == {
        "nodes",
        "customresourcedefinitions",
        "namespaces",  # no pods: those are read in the served namespaces only
        "priorityclasses",
        "resourceflavors",
        "workloadpriorityclasses",  # list/watch: a job's kueue.x-k8s.io/priority-class value
        "localqueues",  # list/watch: a job's ClusterQueue ...
        "clusterqueues",  # ... and whether its flavor has a Topology (Kueue's TAS)
        "resourceslices",  # list/watch: DRA devices
        "tokenreviews",  # create: secure metrics (a scraper's token) ...
        "subjectaccessreviews",  # ... and whether its user may get /metrics
    }
    args = operator_pod(docs)["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args
    # empty list: the release namespace
    docs = render({"watch.allNamespaces": "false"}, namespace="ml")
    assert [r["metadata"]["namespace"] for r in served(by_kind(docs, "Role"))] == ["ml"]
    assert "--namespace=ml" in operator_pod(docs)["containers"][0]["args"]


def test_rbac_has_no_wildcards_and_no_secret_access():
    docs = render()
    for role in by_kind(docs, "ClusterRole") + by_kind(render({"watch.allNamespaces": "false"}), "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "nonResourceURLs"):
                assert "*" not in rule.get(field, []), f"wildcard in {role['kind']} {field}: {rule}"
            assert "secrets" not in rule.get("resources", [])
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_member_clusters_read_only_the_named_secrets_in_the_release_namespace():
    docs = render({"members.enabled": "true", "members.secretNames": "{member-b,member-c}"}, namespace="ml")
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--members-namespace=ml" in args
    assert [a for a in args if a.startswith("--member-secret")] == [
        "--member-secret=member-b",
        "--member-secret=member-c",
    ]
    roles = [r for r in by_kind(docs, "Role") if any("secrets" in x["resources"] for x in r["rules"])]
    assert [(r["metadata"]["namespace"], r["rules"]) for r in roles] == [
        (
            "ml",
            [
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "resourceNames": ["member-b", "member-c"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        )
    ]
    # no names: refused with the value to set (never every Secret of the namespace)
    out = helm("template", "h", str(CHART), "--set", "members.enabled=true", check=False)
    assert out.returncode != 0 and "members.secretNames" in out.stderr
    for role in by_kind(docs, "ClusterRole"):
        assert all("secrets" not in x.get("resources", []) for x in role["rules"])
    assert not any(
        "--members-namespace" in a
        for a in one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_values_flow_into_the_pod():
    docs = render(
        {
            "image.repository": "reg.example/holmes-operator",
            "image.tag": "1.2.3",
            "trainer.image.repository": "reg.example/holmes-trainer",
            "trainer.image.digest": "sha256:" + "a" * 64,
            "logLevel": "debug",
            "extraEnv[0].name": "FOO",
            "extraEnv[0].value": "bar",
            "nodeSelector.pool": "system",
            "tolerations[0].key": "dedicated",
            "tolerations[0].operator": "Exists",
            "resources.limits.memory": "1Gi",
            "priorityClassName": "system-cluster-critical",
            "extraArgs[0]": "--verbose",
        }
    )
    pod = operator_pod(docs)
    c = pod["containers"][0]
    assert c["image"] == "reg.example/holmes-operator:1.2.3"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HOLMES_TRAINER_IMAGE"] == "reg.example/holmes-trainer@sha256:" + "a" * 64
    assert env["FOO"] == "bar"
    assert "--log-level=debug" in c["args"] and c["args"][-1] == "--verbose"
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert c["resources"]["limits"]["memory"] == "1Gi"


def test_metrics_off_and_service_monitor_on():
    docs = render({"metrics.enabled": "false"})
    assert not by_kind(docs, "Service")
    assert "--metrics-port=0" in operator_pod(docs)["containers"][0]["args"]
    docs = render({"metrics.serviceMonitor.enabled": "true", "metrics.serviceMonitor.labels.release": "prom"})
    sm = one(docs, "ServiceMonitor")
    svc = one(docs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["namespaceSelector"]["matchNames"] == ["holmes-system"]


def test_crd_rendering_switches():
    crd = one(render(), "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "holmesjobs.holmes.dev"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    crd = one(render({"crds.keep": "false"}), "CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})
    assert not by_kind(render({"crds.install": "false"}), "CustomResourceDefinition")


@pytest.mark.parametrize(
    "args, message",
    [  # helm 3.22's schema messages (the local cluster's helm, hack/build-k8s.sh)
        (
            ["--set", "logLevel=verbose"],
            "at '/logLevel': value must be one of 'debug', 'info', 'warning', 'error'",
        ),
        (["--set", "imagee.tag=1"], "at '': additional properties 'imagee' not allowed"),
        (["--set", "metrics.port=http"], "at '/metrics/port': got string, want integer"),
        (["--set", "liveness.port=70000"], "at '/liveness/port': maximum: got 70,000, want 65,535"),
        (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy': value must be one of 'Always'"),
        (["--set", "image.digest=latest"], "at '/image/digest': 'latest' does not match pattern"),
        (["--set", "watch.namespaces={Bad_NS}"], "at '/watch/namespaces/0': 'Bad_NS' does not match pattern"),
        (["--set", "crds.install=yes"], "at '/crds/install': got string, want boolean"),
        (
            ["--set", "extraEnv[0].name=X", "--set", "extraEnv[0].value=1"],
            "at '/extraEnv/0/value': got number, want string",
        ),
        (
            ["--set", "nics.clusterRdmaKinds.east=ib"],
            "at '/nics/clusterRdmaKinds/east': value must be one of 'infiniband', 'roce'",
        ),
        (
            ["--set", "metrics.serviceMonitor.interval=often"],
            "at '/metrics/serviceMonitor/interval': 'often' does not match pattern",
        ),
        (
            ["--set", "costModel.gpuPeakTflop=989"],
            "at '/costModel': additional properties 'gpuPeakTflop' not allowed",
        ),
        (
            ["--set-json", 'costModel={"fabric":{"crossClusterGbps":-1}}'],
            "at '/costModel/fabric/crossClusterGbps': minimum: got -1, want 0",
        ),
        (
            ["--set-json", 'costModel={"fabric":{"links":[{"between":["e","w"],"gbps":1,"latency":2}]}}'],
            "at '/costModel/fabric/links/0': additional properties 'latency' not allowed",
        ),
        (
            ["--set-json", 'costModel={"fabric":{"netEfficiency":{"ib":0.9}}}'],
            "at '/costModel/fabric/netEfficiency': additional properties 'ib' not allowed",
        ),
        (
            [
                "--set",
                "costModel.computeEfficiency=0.7",
            ],  # --set keeps decimals as strings: use -f or --set-json
            "at '/costModel/computeEfficiency': got string, want number",
        ),
    ],
)
def test_schema_rejects_wrong_values_clearly(args, message):
    proc = helm("template", "r", str(CHART), *args, check=False)
    assert proc.returncode != 0, "a wrong value was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_service_account_name_required_when_not_created():
    proc = helm("template", "r", str(CHART), "--set", "serviceAccount.create=false", check=False)
    assert proc.returncode != 0 and "serviceAccount.name is required" in proc.stderr
    docs = render({"serviceAccount.create": "false", "serviceAccount.name": "mine"})
    assert not by_kind(docs, "ServiceAccount")
    assert operator_pod(docs)["serviceAccountName"] == "mine"
    assert one(docs, "ClusterRoleBinding")["subjects"][0]["name"] == "mine"


def test_values_yaml_documents_every_top_level_key_of_the_schema():
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(schema["properties"]) - {"global"}


COST_MODEL = {
    "gpuPeakTflops": 989,
    "computeEfficiency": 0.45,
    "gradBytes": 2,
    "fabric": {
        "crossClusterGbps": 100,
        "netEfficiency": {"roce": 0.00005},
        "links": [{"between": ["east", "west"], "gbps": 10, "latencyMs": 20.5}],  # a list of records
    },
    "nicMapping": {"clusterRdmaKinds": {"east": "infiniband"}, "defaultGbps": {"roce": 400}},
}


def test_cost_model_value_becomes_a_configmap_mounted_and_passed_to_the_operator(tmp_path):
    from holmes.plan.costmodel_file import from_mapping, load_yaml_text

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"costModel": COST_MODEL}))
    docs = render(extra=["-f", str(values)])
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["name"] == "holmes-cost-model" and cm["metadata"]["namespace"] == "holmes-system"
    # The rendered file reads (with the reader `holmes plan --config` uses) to exactly these numbers,
    # including one Helm's toYaml would have written as 5e-05 (a string to YAML 1.1).
    assert load_yaml_text(cm["data"]["costmodel.yaml"]) == from_mapping(COST_MODEL)
    pod = operator_pod(docs)
    c = pod["containers"][0]
    assert "--cost-model=/etc/holmes-operator/costmodel.yaml" in c["args"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "cost-model")
    assert mount == {
        "name": "cost-model",
        "mountPath": "/etc/holmes-operator",
        "readOnly": True,
    }  # no subPath:
    # the kubelet then updates the file when the ConfigMap changes, and the operator re-reads it.
    vol = next(v for v in pod["volumes"] if v["name"] == "cost-model")
    assert vol == {"name": "cost-model", "configMap": {"name": "holmes-cost-model"}}
    # Mounting a ConfigMap needs no API permission: RBAC is what it is without a cost model.
    rbac = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount")
    default = render()
    assert [d for d in docs if d["kind"] in rbac] == [d for d in default if d["kind"] in rbac]


def test_no_cost_model_renders_nothing_for_it():
    docs = render()
    assert not by_kind(docs, "ConfigMap")
    pod = operator_pod(docs)
    assert not any(a.startswith("--cost-model") for a in pod["containers"][0]["args"])
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]


def test_cost_model_schema_is_the_cost_model_files_schema():
    """values.schema.json's costModel is holmes.plan.costmodel_file.json_schema(): a CostModelConfig field
    added later must be added there too (regenerate it with that function)."""
    import json

    from holmes.plan.costmodel_file import json_schema

    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["costModel"]
    assert {k: v for k, v in schema.items() if k != "description"} == json_schema()


def test_the_whole_print_config_output_is_a_valid_cost_model_value(tmp_path):
    """`holmes plan --print-config` (every key, the defaults) pasted under costModel passes the
    schema and reaches the operator unchanged."""
    from holmes.plan import CostModelConfig
    from holmes.plan.costmodel_file import dump_yaml, load_yaml_text

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"costModel": yaml.safe_load(dump_yaml())}))
    cm = one(render(extra=["-f", str(values)]), "ConfigMap")
    assert load_yaml_text(cm["data"]["costmodel.yaml"]) == CostModelConfig()


def test_job_policy_values_become_operator_flags():
    assert not [a for a in operator_pod(render())["containers"][0]["args"] if a.startswith("--allow")]
    docs = render({"jobPolicy.allowNodeName": "true", "jobPolicy.serviceAccounts": "{trainer,reader}"})
    args = operator_pod(docs)["containers"][0]["args"]
    assert "--allow-node-name" in args and "--allow-service-accounts=trainer,reader" in args
    assert "--allow-runtime-classes" not in " ".join(args)


# ---- issue 35: tenant RBAC, the operator pod's availability, network policy, GitOps ----------


def rules_granting(docs: list[dict], resource: str) -> list[tuple[str, str, dict]]:
    """(kind, namespace, rule) of every (Cluster)Role rule that names ``resource``."""
    return [
        (d["kind"], d["metadata"].get("namespace", ""), rule)
        for d in by_kind(docs, "ClusterRole") + by_kind(docs, "Role")
        for rule in d["rules"]
        if resource in rule.get("resources", [])
    ]


def test_namespaced_install_reads_pods_only_in_its_namespaces():
    docs = render({"watch.allNamespaces": "false", "watch.namespaces": "{team-a,team-b}"})
    grants = rules_granting(docs, "pods")
    assert sorted(ns for kind, ns, _ in grants) == ["team-a", "team-b"]
    assert {kind for kind, _, _ in grants} == {"Role"}
    # nodes stay cluster-scoped: read, and patched with Holmes' topology labels
    nodes = [(k, r["verbs"]) for k, _, r in rules_granting(docs, "nodes")]
    assert nodes == [("ClusterRole", ["list", "watch", "patch"])]
    # every namespace: one ClusterRole rule covers every pod, the operator's children included
    assert [(k, r["verbs"]) for k, _, r in rules_granting(render(), "pods")] == [
        ("ClusterRole", ["list", "watch", "create", "delete", "patch"])
    ]


def test_tenant_cluster_roles_aggregate_into_edit_and_view():
    docs = render()
    edit = operator_cluster_role(docs, "holmes-edit")
    view = operator_cluster_role(docs, "holmes-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in view["metadata"]["labels"]
    grants = {
        name: {(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}
        for name, role in (("edit", edit), ("view", view))
    }
    reads = {(r, v) for r in ("holmesjobs", "holmesjobs/status") for v in ("get", "list", "watch")}
    assert grants["view"] == reads
    writes = {("holmesjobs", v) for v in ("create", "update", "patch", "delete", "deletecollection")}
    assert grants["edit"] == reads | writes  # status stays the operator's
    for role in (edit, view):
        assert all(rule["apiGroups"] == ["holmes.dev"] for rule in role["rules"])
    # a second release names its own
    assert operator_cluster_role(render(release="other"), "other-holmes-edit")


def test_pod_logs_never_cluster_wide():
    """watch.allNamespaces: no cluster-wide pods/log (it would reach kube-system's pods): a
    ClusterRole to bind per namespace instead; a namespaced install keeps it in its Roles."""
    docs = render()
    grants = rules_granting(docs, "pods/log")
    assert [(k, ns) for k, ns, _ in grants] == [("ClusterRole", "")]
    bound = {b["roleRef"]["name"] for b in by_kind(docs, "ClusterRoleBinding")}
    (logs,) = [
        r
        for r in by_kind(docs, "ClusterRole")
        if any("pods/log" in x.get("resources", []) for x in r["rules"])
    ]
    assert logs["metadata"]["name"] == "holmes-pod-logs" and "holmes-pod-logs" not in bound
    assert operator_cluster_role(docs)["metadata"]["name"] in bound
    assert not [x for x in operator_cluster_role(docs)["rules"] if "pods/log" in x.get("resources", [])]
    namespaced = render({"watch.allNamespaces": "false", "watch.namespaces": "{team-a}"})
    assert [(k, ns) for k, ns, _ in rules_granting(namespaced, "pods/log")] == [("Role", "team-a")]


def test_tenant_role_aggregation_can_be_turned_off():
    docs = render({"rbac.aggregateToDefaultRoles": "false"})
    for name in ("holmes-edit", "holmes-view"):
        labels = operator_cluster_role(docs, name)["metadata"]["labels"]
        assert not [k for k in labels if k.startswith("rbac.authorization.k8s.io/aggregate-to-")], name


def probe_of(docs: list[dict], kind: str) -> dict:
    return operator_pod(docs)["containers"][0][kind]


def test_readiness_and_startup_probes_ask_the_health_endpoint():
    docs = render({"startup.failureThreshold": "7"})
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert probe_of(docs, kind)["httpGet"] == {"path": "/healthz", "port": "health"}, kind
    assert probe_of(docs, "startupProbe")["failureThreshold"] == 7


def test_pod_disruption_budget_only_with_several_replicas():
    pdb = one(render(), "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= (
        one(render(), "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )
    for values in (
        {"replicas": "1"},
        {"leaderElection.enabled": "false"},
        {"podDisruptionBudget.enabled": "false"},
    ):
        assert not by_kind(render(values), "PodDisruptionBudget"), values


def test_pod_disruption_budget_is_policy_v1_with_no_branch_for_older_servers():
    """Every release the chart supports (kubeVersion >= 1.34) serves policy/v1: no dead
    policy/v1beta1 branch (gone in 1.25), no server-version test, so deploy/install.yaml (one
    render for every server) carries the same PodDisruptionBudget helm installs."""
    from tests.helpers.packaging.packaging_helpers import REPO

    assert one(render(), "PodDisruptionBudget")["apiVersion"] == "policy/v1"
    template = (CHART / "templates" / "pdb.yaml").read_text()
    assert "v1beta1" not in template and ".Capabilities" not in template
    assert "podDisruptionBudget.enabled=false" not in (REPO / "hack" / "chart-sync.sh").read_text()
    installed = [d for d in yaml.safe_load_all((REPO / "deploy" / "install.yaml").read_text()) if d]
    assert one(installed, "PodDisruptionBudget")["apiVersion"] == "policy/v1"


def test_no_template_branches_on_a_server_older_than_kube_version():
    """kubeVersion >= 1.34: a template asking for an API every supported server serves, or for a
    version below 1.34, is dead code."""
    for path in sorted((CHART / "templates").glob("*")):
        text = path.read_text()
        assert "policy/v1beta1" not in text and "semverCompare" not in text, path.name
        assert 'Capabilities.APIVersions.Has "policy/v1"' not in text, path.name


def labeller_docs(values: dict[str, str] | None = None, namespace: str = "holmes-system") -> list[dict]:
    return render({"labeller.enabled": "true", **(values or {})}, namespace=namespace)


def test_the_labeller_runs_in_a_privileged_namespace_of_its_own_by_default():
    """Its hostPath volumes need Pod Security "privileged": in its own namespace, the release's
    can stay restricted. Every object naming where it runs (its ServiceAccount, the bindings'
    subjects, the admission policy's user) names that namespace."""
    docs = labeller_docs()
    ns = one(docs, "Namespace")
    assert ns["metadata"]["name"] == "holmes-labeller"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    ds = one(docs, "DaemonSet")
    sa = next(a for a in by_kind(docs, "ServiceAccount") if a["metadata"]["name"] == "holmes-labeller")
    assert ds["metadata"]["namespace"] == sa["metadata"]["namespace"] == "holmes-labeller"
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "holmes-labeller"
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        binding = next(b for b in by_kind(docs, kind) if b["metadata"]["name"] == "holmes-labeller")
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "holmes-labeller", "namespace": "holmes-labeller"}
        ], kind
    (policy,) = [yaml.safe_dump(p) for p in labeller_policies(docs, "ValidatingAdmissionPolicy")]
    assert "system:serviceaccount:holmes-labeller:holmes-labeller" in policy
    assert "system:serviceaccount:holmes-system:" not in policy
    # the operator stays in the release namespace
    assert one(docs, "Deployment")["metadata"]["namespace"] == "holmes-system"


@pytest.mark.parametrize(
    ("values", "where", "created"),
    [
        ({"labeller.namespace.name": ""}, "holmes-system", False),  # the release's, as before 0.1.0
        ({"labeller.namespace.name": "nic", "labeller.namespace.create": "false"}, "nic", False),
        ({"labeller.namespace.name": "holmes-system"}, "holmes-system", False),  # never created twice
    ],
)
def test_the_labellers_namespace_is_configurable(values, where, created):
    docs = labeller_docs(values)
    assert one(docs, "DaemonSet")["metadata"]["namespace"] == where
    assert bool(by_kind(docs, "Namespace")) == created


def test_the_labeller_tolerates_named_taints_only():
    """Not every taint (it would run on control-plane and any dedicated node): the GPU
    Operator's GPU-node taint by default, each one explicit; values.yaml says how to add more."""
    tolerations = one(labeller_docs(), "DaemonSet")["spec"]["template"]["spec"]["tolerations"]
    assert tolerations == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert all(t.get("key") for t in tolerations)
    values = (CHART / "values.yaml").read_text()
    assert "[{operator: Exists}] tolerates every taint" in values


def test_a_bad_labeller_namespace_is_refused_by_the_schema():
    r = helm(
        "template",
        "h",
        str(CHART),
        "--set",
        "labeller.enabled=true",
        "--set",
        "labeller.namespace.name=Bad_NS",
        check=False,
    )
    assert r.returncode != 0 and "/labeller/namespace/name" in r.stderr, r.stderr


def test_lease_timings_default_to_kubernetes_own():
    args = operator_pod(render())["containers"][0]["args"]
    assert {
        "--leader-elect-lease-duration=15",
        "--leader-elect-renew-deadline=10",
        "--leader-elect-retry-period=2",
    } <= set(args)


def test_bind_address_reaches_health_and_metrics_with_ipv6_in_brackets():
    args = operator_pod(render())["containers"][0]["args"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in args and "--metrics-addr=0.0.0.0" in args
    args = operator_pod(render({"bindAddress": "::"}))["containers"][0]["args"]
    assert "--liveness=http://[::]:8080/healthz" in args and "--metrics-addr=::" in args


def test_port_range_value_becomes_the_flag_and_the_schema_checks_it():
    args = operator_pod(render({"trainer.portRange": "30000-30999"}))["containers"][0]["args"]
    assert "--port-range=30000-30999" in args
    assert not any(a.startswith("--port-range") for a in operator_pod(render())["containers"][0]["args"])
    out = helm("template", "h", str(CHART), "--set", "trainer.portRange=30000", check=False)
    assert out.returncode != 0 and "portRange" in out.stderr


def test_trainer_metrics_port_is_off_dcgm_exporters_9400():
    from holmes.operator.core.render import RenderSettings

    args = operator_pod(render())["containers"][0]["args"]
    assert f"--trainer-metrics-port={RenderSettings.metrics_port}" in args
    assert RenderSettings.metrics_port != 9400


def test_network_policy_off_by_default_and_covers_operator_and_trainers():
    assert not by_kind(render(), "NetworkPolicy")
    docs = render(
        {
            "networkPolicy.enabled": "true",
            "watch.allNamespaces": "false",
            "watch.namespaces": "{team-a}",
            "trainer.portRange": "30000-30999",
        },
        extra=["--set-json", 'networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"x":"y"}}}]'],
    )
    pols = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in by_kind(docs, "NetworkPolicy")}
    assert set(pols) == {("holmes-system", "holmes"), ("team-a", "holmes-trainers")}
    op = pols[("holmes-system", "holmes")]["spec"]
    assert [r["ports"][0]["port"] for r in op["ingress"]] == [8080, 9090]
    assert op["ingress"][1]["from"] == [{"namespaceSelector": {"matchLabels": {"x": "y"}}}]
    tr = pols[("team-a", "holmes-trainers")]["spec"]
    assert tr["podSelector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "holmes-operator"}}
    peers, from_operator, scrapers = tr["ingress"]
    assert "ports" not in peers  # NCCL's sockets: ephemeral ports
    assert from_operator["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "holmes-system"
    }
    assert from_operator["ports"] == [{"port": 30000, "endPort": 30999, "protocol": "TCP"}]
    assert scrapers["ports"] == from_operator["ports"]
    # without a range: the one metrics port
    docs = render({"networkPolicy.enabled": "true", "watch.allNamespaces": "false"})
    tr = next(p for p in by_kind(docs, "NetworkPolicy") if p["metadata"]["name"].endswith("-trainers"))
    assert tr["spec"]["ingress"][1]["ports"] == [{"port": 29510, "protocol": "TCP"}]


def test_crd_keeps_argo_cd_from_pruning_or_deleting_it():
    crd = one(render(), "CustomResourceDefinition")
    assert crd["metadata"]["annotations"]["argocd.argoproj.io/sync-options"] == "Prune=false,Delete=false"


def labeller_policies(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in by_kind(docs, kind) if d["metadata"]["name"] == "holmes-labeller"]


def test_labeller_admission_policy_with_the_labeller_unless_turned_off():
    off = render({"labeller.enabled": "true", "labeller.admissionPolicy": "false"})
    assert not labeller_policies(off, "ValidatingAdmissionPolicy")
    docs = render({"labeller.enabled": "true"})
    (policy,) = labeller_policies(docs, "ValidatingAdmissionPolicy")
    (binding,) = labeller_policies(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    sa = one(docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    assert policy["spec"]["matchConditions"][0]["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:holmes-labeller:{sa}"'
    )
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes"]
    rules = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert "variables.nodeName" in rules and "holmes.dev/" in rules and "object.spec" in rules
    assert "authentication.kubernetes.io/node-name" in policy["spec"]["variables"][0]["expression"]
    assert not labeller_policies(render(), "ValidatingAdmissionPolicy")  # no labeller, no policy


def test_configmap_policy_with_every_namespace_unless_turned_off():
    """watch.allNamespaces: the operator's ConfigMap writes limited to its HolmesJobs' (RBAC
    cannot name them; tests/e2e/packaging/test_cluster_wide_rbac_cluster.py runs it on the API server)."""
    docs = render()
    (policy,) = [
        p for p in by_kind(docs, "ValidatingAdmissionPolicy") if p["metadata"]["name"] == "holmes-configmaps"
    ]
    (binding,) = [
        b
        for b in by_kind(docs, "ValidatingAdmissionPolicyBinding")
        if b["metadata"]["name"] == "holmes-configmaps"
    ]
    assert binding["spec"] == {"policyName": "holmes-configmaps", "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["configmaps"] and rule["operations"] == ["CREATE", "UPDATE", "DELETE"]
    assert policy["spec"]["matchConditions"][0]["expression"] == (
        'request.userInfo.username == "system:serviceaccount:holmes-system:holmes"'
    )
    owned = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    for var, obj in (("oldOwned", "oldObject"), ("newOwned", "object")):
        assert owned[var].startswith(f"{obj} != null && ")
        for part in ("'holmes-operator'", "'holmes.dev/job-name'", "r.kind == 'HolmesJob'", "'holmes.dev/'"):
            assert part in owned[var], (var, part)
        assert "%s" not in owned[var] and ("oldObject" in owned[var]) == (obj == "oldObject")
    # the operator's own ConfigMap, as it renders it, is what the policy calls owned
    from holmes.operator.core import child_names

    assert (
        f"'{child_names.LABEL_MANAGED_BY}'" in owned["newOwned"]
        and f"'{child_names.MANAGED_BY}'" in owned["newOwned"]
    )
    assert f"'{child_names.LABEL_JOB}'" in owned["newOwned"]
    mine = render({"serviceAccount.create": "false", "serviceAccount.name": "mine"})
    assert "system:serviceaccount:holmes-system:mine" in yaml.safe_dump(
        one(mine, "ValidatingAdmissionPolicy")
    )
    for values in ({"rbac.configMapPolicy": "false"}, {"watch.allNamespaces": "false"}):
        assert not by_kind(render(values), "ValidatingAdmissionPolicy"), values
