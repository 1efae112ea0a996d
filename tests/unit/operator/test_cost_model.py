"""--cost-model: the operator plans with the file `holmes plan --config` reads, re-reads it when
it changes, keeps the last good model on a bad edit, and refuses a bad file at start-up."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import yaml
from prometheus_client import REGISTRY

from holmes import cli
from holmes.contract.layout import Layout
from holmes.operator.__main__ import cost_model, main, parse_args
from holmes.operator.core import child_names
from holmes.operator.placement_facts import builtin_cost_model, export_state
from holmes.plan import CostModelConfig, NicMapping
from holmes.plan.costmodel_file import CostModelFile
from tests.helpers.operator.opfixtures import REPO, FakeWorld, default_nodes, manifest, with_link_layers

SLOW_ROCE = {"fabric": {"netEfficiency": {"roce": 0.05}}}  # RoCE at 5% of line rate
SLOW_CROSS = {"fabric": {"crossClusterGbps": 1}}  # 1 Gbit/s between east and west


def write(path, doc) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def planned(model: CostModelFile, job=None) -> FakeWorld:
    """One reconcile of a fresh job through the pure path (decide)."""
    w = FakeWorld(job or manifest(count=4), with_link_layers(default_nodes()))
    w.cost_model = model
    w.step()
    assert w.status["launched"], w.status
    return w


def metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


@pytest.mark.parametrize("doc", [SLOW_ROCE, SLOW_CROSS], ids=["roce-efficiency", "cross-cluster"])
def test_the_operator_plans_what_holmes_plan_prints_for_the_same_file(tmp_path, doc, capsys):
    path = write(tmp_path / "costmodel.yaml", doc)
    default = planned(builtin_cost_model())
    tuned = planned(CostModelFile(path))
    # The file's numbers change what the job gets: other nodes or other layer splits, and the estimate.
    assert tuned.status["layout"]["stages"] != default.status["layout"]["stages"]
    assert (
        tuned.status["layout"]["estimate"]["iterationSeconds"]
        != default.status["layout"]["estimate"]["iterationSeconds"]
    )

    # ... and it is exactly the layout `holmes plan --config FILE --json` prints for the same nodes and job.
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": tuned.nodes}))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(tuned.job | {"status": {}}))
    assert cli.main(["plan", "--config", path, "--nodes", str(nodes), "--job", str(job), "--json"]) == 0
    printed = Layout.from_dict(json.loads(capsys.readouterr().out))
    assert Layout.from_json(tuned.configmap["data"][child_names.LAYOUT_FILE]) == printed
    assert tuned.status["layout"]["estimate"] == {
        k: v for k, v in printed.estimate.items() if isinstance(v, (int, float, str))
    }


def test_nic_flags_go_on_top_of_the_files_nic_mapping(tmp_path):
    path = write(
        tmp_path / "c.yaml",
        {
            "nicMapping": {
                "clusterRdmaKinds": {"east": "infiniband", "west": "infiniband"},
                "defaultGbps": {"roce": 40},
            },
            "gpuPeakTflops": 989,
        },
    )
    cfg = cost_model(parse_args(["--cost-model", path, "--cluster-rdma-kind", "west=roce"])).config
    assert dict(cfg.nic_mapping.cluster_rdma_kinds) == {"east": "infiniband", "west": "roce"}
    assert cfg.nic_mapping.gbps_for("roce") == 40 and cfg.gpu_peak_tflops == 989
    assert cfg.nic_mapping.rdma_default_kind is None
    assert cost_model(parse_args(["--rdma-default-kind", "roce"])).config == CostModelConfig(
        nic_mapping=NicMapping(rdma_default_kind="roce")
    )
    # NFD-only nodes (no link-layer label) are usable once the file names their cluster's kind.
    w = FakeWorld(
        manifest(
            count=6,
            gpus=2,
            training={"globalBatchSize": 12, "microBatchSize": 1, "iterations": 5, "learningRate": 1.0e-3},
        )
    )
    w.cost_model = cost_model(parse_args(["--cost-model", path, "--cluster-rdma-kind", "west=roce"]))
    w.step()
    nics = {n: s["nic"] for s in w.status["layout"]["stages"] for n in s["nodes"]}
    assert nics["ib-1"] == "infiniband" and nics["roce-1"] == "roce"


def test_an_edited_file_is_used_from_the_next_plan_and_a_bad_edit_keeps_the_last_good(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="holmes.costmodel")
    f = tmp_path / "costmodel.yaml"
    write(f, SLOW_ROCE)
    model = CostModelFile(str(f), on_state=export_state)
    before = planned(model).status["layout"]
    assert metric("holmes_cost_model_valid") == 1

    reloads = metric("holmes_cost_model_reloads_total")
    write(f, SLOW_CROSS)  # like the kubelet updating a mounted ConfigMap
    after = planned(model).status["layout"]
    assert after == planned(CostModelFile(str(f), on_state=export_state)).status["layout"] != before
    assert metric("holmes_cost_model_reloads_total") == reloads + 1
    changed = [r for r in caplog.records if "cost model reloaded" in r.getMessage()]
    assert len(changed) == 1
    assert "fabric.crossClusterGbps 25.0 -> 1.0" in changed[0].getMessage()
    assert "fabric.netEfficiency.roce 0.05 -> 0.5" in changed[0].getMessage()

    caplog.clear()
    f.write_text("fabric: {crossClusterGbps: -3}\n")  # a bad edit
    assert planned(model).status["layout"] == after  # the last good model stays in use
    assert planned(model).status["layout"] == after
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, "one error per bad content, not one per plan"
    assert "fabric.crossClusterGbps: -3.0 must be a finite number >= 0" in errors[0].getMessage()
    assert "keeps the last good cost model" in errors[0].getMessage()
    assert metric("holmes_cost_model_valid") == 0
    f.unlink()  # gone: also kept, also reported
    assert planned(model).status["layout"] == after
    assert any("cannot read cost-model file" in r.getMessage() for r in caplog.records)

    write(f, SLOW_CROSS)  # fixed (back to the model in use)
    assert planned(model).status["layout"] == after
    assert metric("holmes_cost_model_valid") == 1
    assert metric("holmes_cost_model_reloads_total") == reloads + 1


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read cost-model file {path}: No such file or directory"),
        (
            "gpuPeakTflop: 989\n",
            "cost-model file {path}: unknown key gpuPeakTflop (did you mean gpuPeakTflops?)",
        ),
        (
            "fabric: {netEfficiency: {roce: 1.5}}\n",
            "fabric.netEfficiency.roce: 1.5 is an efficiency, a fraction in [0, 1]",
        ),
        ("fabric: [1\n", "cost-model file {path} is not valid YAML"),
    ],
)
def test_a_bad_file_stops_the_operator_at_start_up_with_exit_code_2(tmp_path, capsys, content, message):
    path = tmp_path / "costmodel.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["--cost-model", str(path), "--kubeconfig", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m holmes.operator: error: --cost-model: ")
    assert message.format(path=path) in err


def test_the_bad_file_exit_is_the_process_exit_code(tmp_path):
    path = tmp_path / "costmodel.yaml"
    path.write_text("overlapEfficiency: 2\n")
    proc = subprocess.run(
        [sys.executable, "-m", "holmes.operator", "--cost-model", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr
    assert "overlapEfficiency: 2.0 is an efficiency, a fraction in [0, 1]" in proc.stderr
    assert "Traceback" not in proc.stderr
