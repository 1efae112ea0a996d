"""The chart's operator command line is one the operator accepts, meaning what the values say."""

from __future__ import annotations

import pytest

from tests.helpers.packaging.packaging_helpers import one, render


def operator_pod(docs):
    return one(docs, "Deployment")["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    "values",
    [
        {},
        {
            "watch.allNamespaces": "false",
            "watch.namespaces": "{team-a,team-b}",
            "logLevel": "debug",
            "logFormat": "plain",
            "metrics.enabled": "false",
            "liveness.port": "18080",
            "nics.clusterRdmaKinds.east": "infiniband",
            "nics.clusterRdmaKinds.west": "roce",
            "nics.rdmaDefaultKind": "roce",
            "trainer.masterPort": "23456",
            "trainer.metricsPort": "23457",
            "restartBackoff.seconds": "3",
            "restartBackoff.maxSeconds": "60",
        },
    ],
)
def test_the_operator_accepts_the_chart_command_line(values, monkeypatch):
    """The rendered args parse with the operator's own argument parser, to the intended settings."""
    from holmes.operator.__main__ import parse_args

    docs = render(values)
    c = operator_pod(docs)["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    monkeypatch.setenv("HOLMES_TRAINER_IMAGE", env["HOLMES_TRAINER_IMAGE"])
    assert c["command"][:3] == ["python", "-m", "holmes.operator"]
    args = parse_args(c["args"])
    if values.get("watch.allNamespaces") == "false":
        assert args.namespace == ["team-a", "team-b"] and not args.all_namespaces
    else:
        assert args.all_namespaces and not args.namespace
    assert args.log_level == values.get("logLevel", "info")
    assert args.log_format == values.get("logFormat", "json")
    port = int(values.get("liveness.port", 8080))
    assert args.liveness == f"http://0.0.0.0:{port}/healthz"
    assert args.metrics_port == (0 if values.get("metrics.enabled") == "false" else 9090)
    assert args.trainer_image == "holmes-trainer:0.1.0"
    assert args.master_port == int(values.get("trainer.masterPort", 29500))
    assert args.trainer_metrics_port == int(values.get("trainer.metricsPort", 29510))
    assert (args.restart_backoff.base, args.restart_backoff.cap) == (
        float(values.get("restartBackoff.seconds", 10)),
        float(values.get("restartBackoff.maxSeconds", 300)),
    )
    kinds = {k.split(".")[-1]: v for k, v in values.items() if k.startswith("nics.clusterRdmaKinds.")}
    assert sorted(args.cluster_rdma_kind) == sorted(f"{c}={k}" for c, k in kinds.items())
    assert args.rdma_default_kind == (values.get("nics.rdmaDefaultKind") or None)


def test_the_operator_plans_with_the_charts_cost_model(tmp_path):
    """costModel: the rendered --cost-model flag and ConfigMap give the operator exactly the numbers
    `holmes plan --config` reads from the same mapping (NIC flags from nics.* on top)."""
    import yaml

    from holmes.operator.__main__ import cost_model, parse_args
    from holmes.plan.costmodel_file import from_mapping

    doc = {
        "fabric": {"crossClusterGbps": 100, "netEfficiency": {"roce": 0.7}},
        "overlap": False,
        "nicMapping": {"clusterRdmaKinds": {"east": "roce"}},
    }
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump({"costModel": doc, "nics": {"clusterRdmaKinds": {"west": "infiniband"}}})
    )
    docs = render(extra=["-f", str(values)])
    mounted = tmp_path / "costmodel.yaml"
    mounted.write_text(one(docs, "ConfigMap")["data"]["costmodel.yaml"])
    args = [
        a.replace("/etc/holmes-operator/costmodel.yaml", str(mounted))
        for a in operator_pod(docs)["containers"][0]["args"]
    ]
    cfg = cost_model(parse_args(args)).config
    want = from_mapping(doc)
    assert cfg.fabric == want.fabric and cfg.overlap is False
    assert dict(cfg.nic_mapping.cluster_rdma_kinds) == {"east": "roce", "west": "infiniband"}
