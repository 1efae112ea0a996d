import json
import subprocess
import sys
from pathlib import Path

import yaml

from holmes.cli import main

ROOT = Path(__file__).resolve().parents[3]
NODES = str(ROOT / "examples" / "nodes" / "paper.yaml")
JOB = str(ROOT / "examples" / "jobs" / "gpt-7b.yaml")


def test_plan_prints_table_and_compare_ratio(capsys):
    assert main(["plan", "--nodes", NODES, "--job", JOB, "--compare"]) == 0
    out = capsys.readouterr().out
    assert "east/infiniband" in out and "west/roce" in out and "Megatron default" in out
    assert "x the Megatron-default speed" in out


def test_plan_json_is_a_layout(capsys):
    assert main(["plan", "--nodes", NODES, "--job", JOB, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["worldSize"] == 64 and doc["version"] == 2 and doc["worldNet"] == "Socket"
    assert main(["plan", "--nodes", NODES, "--job", JOB, "--json", "--compare"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["speedup"] > 1 and both["megatronDefault"]["worldSize"] == 64


def test_plain_list_of_nodes_is_accepted(tmp_path, capsys):
    items = yaml.safe_load(Path(NODES).read_text())["items"]
    p = tmp_path / "nodes.yaml"
    p.write_text(yaml.safe_dump(items))
    assert main(["plan", "--nodes", str(p), "--job", JOB]) == 0


def test_bad_inputs_exit_non_zero_with_a_message(tmp_path, capsys):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("a: [1, 2\n")
    assert main(["plan", "--nodes", str(bad_yaml), "--job", JOB]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["plan", "--nodes", str(tmp_path / "missing.yaml"), "--job", JOB]) == 2
    assert "cannot read nodes file" in capsys.readouterr().err
    job = yaml.safe_load(Path(JOB).read_text())
    job["spec"]["model"]["layerz"] = 3
    job["spec"]["nodes"]["count"] = 9
    jp = tmp_path / "job.yaml"
    jp.write_text(yaml.safe_dump(job))
    assert main(["plan", "--nodes", NODES, "--job", str(jp)]) == 2
    assert "unknown field layerz" in capsys.readouterr().err
    del job["spec"]["model"]["layerz"]
    jp.write_text(yaml.safe_dump(job))
    assert main(["plan", "--nodes", NODES, "--job", str(jp)]) == 2
    assert "needs 9 nodes" in capsys.readouterr().err


def test_console_script_runs_without_kubernetes_or_torch_imported():
    code = (
        "import sys; from holmes.cli import main; "
        f"rc = main(['plan', '--nodes', {NODES!r}, '--job', {JOB!r}]);"
        "assert 'kubernetes' not in sys.modules and 'torch' not in sys.modules; sys.exit(rc)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "why:" in r.stdout


def test_a_closed_pipe_ends_quietly():
    """`holmes plan ... | head -1`: the reader goes away; no BrokenPipeError traceback."""
    p = subprocess.Popen(
        [sys.executable, "-m", "holmes.cli", "plan", "--nodes", NODES, "--job", JOB, "--compare"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.close()  # like `head` exiting before the plan is printed
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_node_lists_in_json_skip_the_yaml_parser(tmp_path, monkeypatch):
    """kubectl get nodes -o json: parsed by the json module (a 15,000-node dump is ~100 MB)."""
    from holmes.cli import load_nodes

    nodes = load_nodes(NODES)
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))

    def no_yaml(*a, **k):
        raise AssertionError("the YAML parser ran on a JSON file")

    monkeypatch.setattr(yaml, "load_all", no_yaml)
    assert load_nodes(str(path)) == nodes


def test_tensor_auto_on_a_70b_model_picks_a_tensor_degree(capsys):
    """examples/jobs/llama3-70b.yaml does not fit one GPU's slice without tensor parallelism; its
    small twin runs in tests/trainer/test_tensor_parallel.py."""
    job = str(ROOT / "examples" / "jobs" / "llama3-70b.yaml")
    assert main(["plan", "--nodes", NODES, "--job", job, "--json"]) == 0
    layout = json.loads(capsys.readouterr().out)
    assert layout["tensor"] > 1 and {"kind": "tp", "net": "IB", "stage": 0} in layout["groups"]
    assert main(["plan", "--nodes", NODES, "--job", job]) == 0
    assert f"tensor {layout['tensor']} x pipeline {layout['pipeline']} x data" in capsys.readouterr().out
