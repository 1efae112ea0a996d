"""`holmes plan --config COSTMODEL.yaml` / `--print-config`: the cost model's numbers from a file."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from holmes.cli import main
from holmes.plan import CostModelConfig, plan
from holmes.plan.costmodel_file import CostModelError, dump_yaml, from_mapping, load_yaml_text, to_mapping
from tests.helpers.plan.plan_helpers import job_spec, paper_nodes

ROOT = Path(__file__).resolve().parents[3]
NODES = str(ROOT / "examples" / "nodes" / "paper.yaml")
JOB = str(ROOT / "examples" / "jobs" / "gpt-7b.yaml")


def test_printed_defaults_read_back_to_the_defaults():
    text = dump_yaml()
    doc = yaml.safe_load(text)
    assert doc["gpuPeakTflops"] == CostModelConfig().gpu_peak_tflops
    assert doc["fabric"]["crossClusterGbps"] == CostModelConfig().fabric.cross_cluster_gbps
    assert doc["nicMapping"]["defaultGbps"] == dict(CostModelConfig().nic_mapping.default_gbps)
    assert load_yaml_text(text) == CostModelConfig()
    # every init field of CostModelConfig is in the file (a field added later is printed too)
    assert len(doc) == len([f for f in dataclasses.fields(CostModelConfig) if f.init])


def test_keys_override_and_pair_mappings_merge_with_the_defaults():
    cfg = from_mapping(
        {
            "gpuPeakTflops": 989,
            "computeEfficiency": 0.5,
            "overlap": False,
            "fabric": {"crossClusterGbps": 400, "netEfficiency": {"roce": 0.8}},
            "nicMapping": {"defaultGbps": {"ethernet": 100}, "rdmaDefaultKind": "roce"},
        }
    )
    assert cfg.gpu_peak_tflops == 989.0 and isinstance(cfg.gpu_peak_tflops, float)
    assert cfg.compute_efficiency == 0.5 and cfg.overlap is False
    assert (
        cfg.fabric.cross_cluster_gbps == 400
        and cfg.fabric.socket_gbps == CostModelConfig().fabric.socket_gbps
    )
    assert dict(cfg.fabric.net_efficiency) == {"infiniband": 0.9, "roce": 0.8}
    assert dict(cfg.nic_mapping.default_gbps) == {"infiniband": 200.0, "roce": 100.0, "ethernet": 100.0}
    assert cfg.nic_mapping.rdma_default_kind == "roce"
    assert from_mapping(to_mapping(cfg)) == cfg
    assert from_mapping(None) == CostModelConfig() and from_mapping({}) == CostModelConfig()


@pytest.mark.parametrize(
    "doc, message",
    [
        (
            {"gpuPeakTflop": 1},
            "unknown key gpuPeakTflop (did you mean gpuPeakTflops?); valid keys: gpuPeakTflops,",
        ),
        ({"gpu_peak_tflops": 1}, "did you mean gpuPeakTflops?"),
        (
            {"fabric": {"crossCluster": 1}},
            "unknown key fabric.crossCluster (did you mean crossClusterGbps?); "
            "valid keys under fabric: netEfficiency,",
        ),
        ({"gpuPeakTflops": "fast"}, "gpuPeakTflops: expected a number, got str 'fast'"),
        ({"overlap": "yes"}, "overlap: expected true or false"),
        ({"gradBytes": 2.5}, "gradBytes: expected an integer"),
        ({"gradBytes": True}, "gradBytes: expected an integer"),
        ({"fabric": 3}, "fabric: expected a mapping"),
        (
            {"fabric": {"netEfficiency": {"ib": 0.9}}},
            "fabric.netEfficiency: unknown name 'ib'; valid: infiniband, roce",
        ),
        ({"fabric": {"netEfficiency": {"roce": 1.5}}}, "fabric.netEfficiency.roce: 1.5 is an efficiency"),
        ({"nicMapping": {"defaultGbps": {"roce": 0}}}, "nicMapping.defaultGbps.roce: a bandwidth"),
        ({"nicMapping": {"nfdRdmaLabels": "x"}}, "nicMapping.nfdRdmaLabels: expected a list of a string"),
        ({"nvlinkGbps": -1}, "nvlinkGbps: -1.0 must be a finite number >= 0"),
        ({"overlapEfficiency": 2}, "overlapEfficiency: 2.0 is an efficiency"),
        (
            {"computeEfficiency": 0},
            "computeEfficiency: a bandwidth, FLOP rate, memory size or efficiency must be > 0",
        ),
        ([1, 2], "must be a mapping of keys to values, got list"),
    ],
)
def test_bad_keys_and_values_are_refused_naming_the_key(doc, message):
    with pytest.raises(CostModelError) as e:
        from_mapping(doc)
    assert message in str(e.value)


def test_config_changes_the_plan():
    fast_roce = from_mapping(
        {"nicMapping": {"defaultGbps": {"roce": 400}}, "fabric": {"netEfficiency": {"roce": 0.9}}}
    )
    base = plan(paper_nodes(), job_spec())
    tuned = plan(paper_nodes(), job_spec(), fast_roce)
    assert tuned.estimate["iterationSeconds"] < base.estimate["iterationSeconds"]
    h100 = plan(paper_nodes(), job_spec(), from_mapping({"gpuPeakTflops": 989}))
    assert h100.estimate["tflopsPerGpu"] > 1.5 * base.estimate["tflopsPerGpu"]


def test_cli_print_config_then_plan_with_an_edited_file(tmp_path, capsys):
    assert main(["plan", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# Holmes cost model") and load_yaml_text(text) == CostModelConfig()
    doc = yaml.safe_load(text)
    doc["gpuPeakTflops"] = 989.0
    p = tmp_path / "cm.yaml"
    p.write_text(yaml.safe_dump(doc))
    assert main(["plan", "--config", str(p), "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["gpuPeakTflops"] == 989.0
    assert main(["plan", "--nodes", NODES, "--job", JOB, "--json"]) == 0
    default = yaml.safe_load(capsys.readouterr().out)["estimate"]["tflopsPerGpu"]
    assert main(["plan", "--nodes", NODES, "--job", JOB, "--json", "--config", str(p)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["estimate"]["tflopsPerGpu"] > 1.5 * default


def test_cli_refuses_a_bad_config_file(tmp_path, capsys):
    p = tmp_path / "cm.yaml"
    p.write_text("fabric: {crossClusterGbps: lots}\n")
    assert main(["plan", "--nodes", NODES, "--job", JOB, "--config", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"cost-model file {p}: fabric.crossClusterGbps: expected a number" in err
    p.write_text("a: [1\n")
    assert main(["plan", "--print-config", "--config", str(p)]) == 2
    assert "is not valid YAML" in capsys.readouterr().err
    assert main(["plan", "--nodes", NODES, "--job", JOB, "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read cost-model file" in capsys.readouterr().err
    assert main(["plan", "--nodes", NODES]) == 2
    assert "give --job" in capsys.readouterr().err
