"""`holmes plan --pods`: the exact objects the operator would create, as a v1 List, and the
framework examples rendered through it."""

import json
from pathlib import Path

import pytest

from holmes.cli import main
from holmes.contract import Layout

REPO = Path(__file__).resolve().parents[2]
PAPER = str(REPO / "examples" / "nodes" / "paper.yaml")
EXAMPLES = ["megatron-gpt-7b", "torchtitan-llama3-8b", "deepspeed-gpt-pipeline"]


def plan_pods(capsys, job, *extra):
    code = main(["plan", "--nodes", PAPER, "--job", str(job), "--pods", "--json", *extra])
    out = capsys.readouterr()
    return code, out


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_render_the_launcher_pods(capsys, name):
    code, out = plan_pods(capsys, REPO / "examples" / "jobs" / f"{name}.yaml", "--allow-host-namespaces")
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert doc["apiVersion"] == "v1" and doc["kind"] == "List"
    kinds = [o["kind"] for o in doc["items"]]
    assert kinds[:2] == ["ConfigMap", "Service"] and kinds.count("Pod") == 8
    layout = Layout.from_json(doc["items"][0]["data"]["layout.json"])
    for pod in doc["items"][2:]:
        c = pod["spec"]["containers"][0]
        assert c["command"][1:3] == ["/holmes-launch/launch.py", "--"]
        assert pod["spec"]["initContainers"][0]["name"] == "holmes-launch"
        assert pod["spec"]["affinity"]["nodeAffinity"]  # pinned to its planned node
    if name.startswith("megatron"):
        assert {f"megatron-nccl-stage-{s}.yaml" for s in range(layout.pipeline)} <= set(
            doc["items"][0]["data"]
        )


def test_holmes_jobs_render_too_and_the_images_flag_is_used(capsys):
    code, out = plan_pods(
        capsys, REPO / "examples" / "jobs" / "gpt-7b.yaml", "--trainer-image", "reg/holmes:9"
    )
    assert code == 0, out.err
    pods = [o for o in json.loads(out.out)["items"] if o["kind"] == "Pod"]
    assert pods and all("initContainers" not in p["spec"] for p in pods)
    assert pods[0]["spec"]["containers"][0]["command"][:3] == ["python", "-m", "holmes.trainer.run"]


def test_a_job_the_operator_would_not_launch_says_why(capsys):
    code, out = plan_pods(capsys, REPO / "examples" / "jobs" / "megatron-gpt-7b.yaml")  # hostNetwork
    assert code == 2 and "would create no pods" in out.err and "--allow-host-namespaces" in out.err
