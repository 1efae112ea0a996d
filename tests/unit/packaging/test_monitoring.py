"""The chart's monitoring (values metrics.*, all off by default): the operator's ServiceMonitor,
the trainers' PodMonitor, the PrometheusRule and the Grafana dashboard. Checked against
prometheus-operator's schemas (tests/unit/packaging/data, made from its CRDs), every PromQL
expression parsed by promql-parser (PyPI: the Rust parser GreptimeDB uses, a port of
Prometheus' own), and every metric they name exported by the operator
(holmes.operator.metrics) or the trainer (holmes.contract.trainer_metrics)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import prometheus_client
import promql_parser
import pytest
import yaml

from holmes.cli import load_nodes
from holmes.contract import trainer_metrics as wire
from holmes.operator import metrics
from holmes.operator.preview import children
from tests.helpers.openapi_check import check
from tests.helpers.packaging.packaging_helpers import CHART, by_kind, one, render

SCHEMAS = json.loads((Path(__file__).parent / "data" / "prometheus-operator-v1-schemas.json").read_text())
ALL_ON = {
    "metrics.serviceMonitor.enabled": "true",
    "metrics.trainerPodMonitor.enabled": "true",
    "metrics.prometheusRule.enabled": "true",
    "metrics.grafanaDashboard.enabled": "true",
}
KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")


def exported() -> set[str]:
    """Every series name the operator and the trainer export (a counter's _total, a histogram's
    _bucket/_sum/_count)."""
    names = {*wire.GAUGES.values(), *wire.STAGE_GAUGES.values(), wire.FABRIC_GAUGE, wire.TIME_GAUGE}
    for value in vars(metrics).values():
        if isinstance(value, prometheus_client.metrics.MetricWrapperBase):
            for family in value.describe():
                suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
                names |= {family.name + s for s in suffixes.get(family.type, [""])}
    return names


def selectors(expr: str) -> set[str]:
    """The metric names an expression selects (parsing it: a syntax error raises)."""
    found: set[str] = set()

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            found.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def grafana_query(expr: str) -> str:
    """A dashboard query with Grafana's variables as a query would run."""
    return expr.replace("$namespace", "team-a|team-b").replace("$__rate_interval", "2m")


def monitoring(values=None):
    return render({**ALL_ON, **(values or {})})


def test_all_off_by_default():
    docs = render()
    assert not [d for d in docs if d["kind"] in KINDS]
    assert not [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]


@pytest.mark.parametrize("kind", KINDS)
def test_each_matches_prometheus_operators_schema(kind):
    obj = one(monitoring(), kind)
    assert check(obj, SCHEMAS[kind], SCHEMAS["$defs"]) == []


def test_the_schema_check_refuses_a_misspelt_field():
    pm = copy.deepcopy(one(monitoring(), "PodMonitor"))
    pm["spec"]["podMetricsEndpoints"][0]["scrapeTimout"] = "5s"
    pm["spec"]["podTargetLabels"] = "holmes.dev/job-name"
    errors = check(pm, SCHEMAS["PodMonitor"], SCHEMAS["$defs"])
    assert any("unknown field scrapeTimout" in e for e in errors)
    assert any("podTargetLabels" in e and "is not array" in e for e in errors)


def rule_exprs(docs) -> list[str]:
    rule = one(docs, "PrometheusRule")
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


def dashboard(docs) -> dict:
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    return json.loads(cm["data"]["holmes.json"])


def test_every_alert_and_panel_parses_and_uses_only_exported_metrics():
    docs = monitoring()
    exprs = rule_exprs(docs)
    exprs += [grafana_query(t["expr"]) for p in dashboard(docs)["panels"] for t in p["targets"]]
    assert len(exprs) >= 20
    used = set().union(*(selectors(e) for e in exprs))
    assert used <= exported(), sorted(used - exported())
    # every alert's series come from this release's scrape jobs
    for e in rule_exprs(docs):
        assert 'job="holmes-metrics"' in e or 'job="holmes-system/holmes-trainers"' in e, e
    alerts = {r["alert"] for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert {"HolmesOperatorNoLeader", "HolmesJobStalled", "HolmesJobRestarting", "HolmesReplanLoop"} <= alerts


def test_the_name_check_catches_a_metric_nobody_exports():
    assert "holmes_trainer_fabric_problem" not in exported()  # the old free-text gauge
    assert selectors('sum by (namespace) (rate(holmes_restarts_total{job="x"}[5m]))') == {
        "holmes_restarts_total"
    }
    with pytest.raises(ValueError):
        selectors("sum(rate(holmes_restarts_total[5m])")


def test_thresholds_come_from_the_values():
    exprs = rule_exprs(
        monitoring(
            {"metrics.prometheusRule.stalledFor": "40m", "metrics.prometheusRule.restartsPerHour": "7"}
        )
    )
    assert any("[40m]" in e and "holmes_trainer_iteration" in e for e in exprs)
    assert any("holmes_restarts_total" in e and e.endswith("> 7") for e in exprs)


def test_the_dashboard_is_the_charts_file():
    assert dashboard(monitoring()) == json.loads(
        (CHART / "files" / "monitoring" / "dashboard.json").read_text()
    )


def test_the_pod_monitor_selects_the_rank_0_trainer_and_its_metrics_port():
    pm = one(monitoring(), "PodMonitor")
    sel = pm["spec"]["selector"]
    job = yaml.safe_load(open("examples/jobs/gpt-7b.yaml"))
    pods = [o for o in children(job, load_nodes("examples/nodes/paper.yaml")) if o["kind"] == "Pod"]

    def selected(pod) -> bool:
        labels = pod["metadata"]["labels"]
        return all(labels.get(k) == v for k, v in sel["matchLabels"].items()) and all(
            e["key"] in labels for e in sel["matchExpressions"]
        )

    assert pods and all(selected(p) for p in pods)
    port = pm["spec"]["podMetricsEndpoints"][0]["port"]
    serving = [
        p
        for p in pods
        if any(cp.get("name") == port for c in p["spec"]["containers"] for cp in c.get("ports", []))
    ]
    assert len(serving) == 1  # rank 0 serves the trainer's metrics
    assert set(pm["spec"]["podTargetLabels"]) <= set(serving[0]["metadata"]["labels"])
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    ns = one(monitoring({"watch.allNamespaces": "false", "watch.namespaces[0]": "team-a"}), "PodMonitor")
    assert ns["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}


# The labels Prometheus gives every series of a ServiceMonitor's target (prometheus-operator's
# relabelling): a scraped label of one of these names arrives renamed exported_<name>.
TARGET_LABELS = {"namespace", "service", "pod", "container", "endpoint", "job", "instance"}
OPERATOR_JOB_METRICS = ("holmes_jobs", "holmes_restarts_total", "holmes_replans_total",
                        "holmes_job_failures_total", "holmes_pods_created_total")  # fmt: skip


def test_the_target_keeps_its_labels_and_the_operator_uses_none_of_them():
    """honorLabels: false (no series can claim a tenant's namespace); then the shipped alerts and
    dashboard only work when no operator label is one Prometheus renames, as a multi-tenant
    Prometheus with overrideHonorLabels renamed the job's `namespace` before."""
    sm = one(monitoring(), "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["honorLabels"] is False
    for value in vars(metrics).values():
        if isinstance(value, prometheus_client.metrics.MetricWrapperBase):
            assert not set(value._labelnames) & TARGET_LABELS, value._name
    docs = monitoring()
    exprs = rule_exprs(docs) + [t["expr"] for p in dashboard(docs)["panels"] for t in p["targets"]]
    for e in exprs:
        if any(m in e for m in OPERATOR_JOB_METRICS):
            assert "job_namespace" in e and "(namespace" not in e and "{namespace" not in e, e


def test_secure_metrics_are_scraped_over_https_with_the_scrapers_token():
    ep = one(monitoring(), "ServiceMonitor")["spec"]["endpoints"][0]
    assert ep["scheme"] == "https" and ep["bearerTokenFile"].endswith("serviceaccount/token")
    assert ep["tlsConfig"] == {"insecureSkipVerify": True}  # the operator's self-signed certificate
    ca = {"ca": {"secret": {"name": "holmes-ca", "key": "ca.crt"}}, "serverName": "holmes-metrics"}
    given = one(monitoring({"metrics.serviceMonitor.tlsConfig.ca.secret.name": "holmes-ca",
                            "metrics.serviceMonitor.tlsConfig.ca.secret.key": "ca.crt",
                            "metrics.serviceMonitor.tlsConfig.serverName": "holmes-metrics"}),
                "ServiceMonitor")  # fmt: skip
    assert given["spec"]["endpoints"][0]["tlsConfig"] == ca
    assert check(given, SCHEMAS["ServiceMonitor"], SCHEMAS["$defs"]) == []
    plain = one(monitoring({"metrics.secure": "false"}), "ServiceMonitor")["spec"]["endpoints"][0]
    assert "scheme" not in plain and "bearerTokenFile" not in plain


def test_every_alert_has_a_runbook_url_from_the_values():
    docs = monitoring({"metrics.prometheusRule.runbookBaseURL": "https://wiki.example/holmes.md"})
    for g in one(docs, "PrometheusRule")["spec"]["groups"]:
        for r in g["rules"]:
            assert r["annotations"]["runbook_url"] == f"https://wiki.example/holmes.md#{r['alert'].lower()}"


def operator_args(docs) -> list[str]:
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]


def review_rules(docs) -> list[dict]:
    return [
        r
        for role in by_kind(docs, "ClusterRole")
        for r in role["rules"]
        if {"tokenreviews", "subjectaccessreviews"} & set(r.get("resources", []))
    ]


def test_secure_metrics_by_default_with_the_reviews_they_need():
    docs = render()
    assert "--metrics-secure" in operator_args(docs)
    assert not any(a.startswith("--metrics-cert-dir") for a in operator_args(docs))  # self-signed
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in review_rules(docs)] == [
        (["authentication.k8s.io"], ["tokenreviews"], ["create"]),
        (["authorization.k8s.io"], ["subjectaccessreviews"], ["create"]),
    ]
    (reader,) = [r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"] == "holmes-metrics-reader"]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    # plain: neither the flag nor the reviews nor the reader role
    plain = render({"metrics.secure": "false"})
    assert "--metrics-secure" not in operator_args(plain) and not review_rules(plain)
    assert not [r for r in by_kind(plain, "ClusterRole") if r["metadata"]["name"].endswith("-metrics-reader")]


def test_a_certificate_secret_is_mounted_and_served():
    docs = render({"metrics.tls.secretName": "holmes-metrics-cert"})
    assert "--metrics-cert-dir=/etc/holmes-metrics-tls" in operator_args(docs)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "metrics-tls", "secret": {"secretName": "holmes-metrics-cert"}} in pod["volumes"]
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "metrics-tls", "mountPath": "/etc/holmes-metrics-tls", "readOnly": True} in mounts
