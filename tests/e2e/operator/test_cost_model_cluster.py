"""--cost-model against the local control plane: the operator subprocess plans with the file's
numbers (status.layout is what holmes.plan gives with them), and an edit of the file is used
for the next job without a restart."""

from __future__ import annotations

import json

import pytest
import yaml
from holmes_dev.jobs import tiny_job

from holmes.contract.jobspec import JobSpec
from holmes.operator.__main__ import cost_model, parse_args
from holmes.plan import plan
from localkube.operatorproc import RDMA_KINDS, OperatorProcess, install_crd
from tests.helpers.polling import wait_for

pytestmark = pytest.mark.timeout(120)


def job(name: str, ns: str) -> dict:
    return tiny_job(name, ns, count=4, command=["sh", "-c", "sleep 600"], run_policy={"backoffLimit": 0})


def layout_of(cluster, ns: str, name: str, op: OperatorProcess, timeout: float = 60) -> dict:
    def layout():
        r = cluster.kubectl("get", "holmesjob", name, "-n", ns, "-o", "json", check=False)
        return ((json.loads(r.stdout).get("status") or {}) if r.returncode == 0 else {}).get("layout")

    return wait_for(f"{name}'s status.layout", layout, timeout, detail=lambda: f"\n{op.tail()}")


def expected(cluster, manifest: dict, path: str) -> list:
    """What holmes.plan gives with the file (and the operator's NIC flags) on the cluster's nodes."""
    cfg = cost_model(
        parse_args(["--cost-model", path, *[f"--cluster-rdma-kind={k}" for k in RDMA_KINDS]])
    ).config
    nodes = cluster.get_json("nodes")["items"]
    layout = plan(nodes, JobSpec.from_manifest(manifest), cfg)
    return [[s.index, list(s.layers), list(s.nodes or layout.stage_nodes(s.index))] for s in layout.stages]


def stages(layout: dict) -> list:
    return [[s["index"], s["layers"], s["nodes"]] for s in layout["stages"]]


def test_the_operator_plans_with_its_cost_model_file_and_picks_up_edits(cluster, namespace, tmp_path):
    install_crd(cluster.kubeconfig)
    f = tmp_path / "costmodel.yaml"
    f.write_text(yaml.safe_dump({"fabric": {"crossClusterGbps": 1}}))
    op = OperatorProcess(
        cluster.kubeconfig, [namespace], tmp_path / "operator.log", extra=["--cost-model", str(f)]
    ).start()
    try:
        first = job("cm-a", namespace)
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(first))
        got = layout_of(cluster, namespace, "cm-a", op)
        assert stages(got) == expected(cluster, first, str(f))
        default = tmp_path / "empty.yaml"
        default.write_text("{}\n")
        assert stages(got) != expected(cluster, first, str(default)), "the file must change this plan"

        f.write_text(yaml.safe_dump({"fabric": {"netEfficiency": {"roce": 0.05}}}))
        second = job("cm-b", namespace)
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(second))
        got = layout_of(cluster, namespace, "cm-b", op)
        assert stages(got) == expected(cluster, second, str(f))
        assert "cost model reloaded" in op.log_path.read_text()
        assert "holmes_cost_model_reloads_total 1.0" in op.metrics()
    finally:
        op.stop()
