"""The layout as a picture (holmes.view): the 1F1B schedule laid out from the estimate, the SVG
drawn from a planned Layout or from a job's status, and `holmes plan --svg`."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from holmes.cli import main
from holmes.contract import load_job
from holmes.contract.documents import load_documents
from holmes.operator.core.summary import layout_status
from holmes.plan import CostModelConfig, plan
from holmes.view import picture, svg, timeline

ROOT = Path(__file__).resolve().parents[3]
PAPER_NODES = str(ROOT / "examples" / "nodes" / "paper.yaml")
MIXED_NODES = str(ROOT / "examples" / "nodes" / "mixed-gpus.yaml")
GPT = str(ROOT / "examples" / "jobs" / "gpt-7b.yaml")
LLAMA_70B = str(ROOT / "examples" / "jobs" / "llama3-70b.yaml")
NS = {"s": "http://www.w3.org/2000/svg"}


def planned(nodes: str, job: str):
    return plan(load_documents(nodes)[0]["items"], load_job(job), CostModelConfig())


def texts(doc: str, cls: str) -> list[str]:
    root = ET.fromstring(doc)
    return [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text") if t.get("class") == cls]


def titles(doc: str) -> set[str]:
    return {t.text or "" for t in ET.fromstring(doc).iter("{http://www.w3.org/2000/svg}title")}


# ---- the schedule ---------------------------------------------------------------------------


def test_equal_stages_without_transfers_have_the_textbook_1f1b_bubble():
    """P stages of forward 1 and backward 2, m micro-batches: the iteration is (m + P - 1) x 3
    and every stage idles (P - 1) x 3 (Narayanan et al.'s bubble)."""
    P, m = 4, 8
    s = timeline.simulate([1.0] * P, [2.0] * P, [0.0] * (P - 1), m, [0.0] * P)
    assert s.seconds == pytest.approx((m + P - 1) * 3)
    assert [s.idle(i) for i in range(P)] == pytest.approx([(P - 1) * 3] * P)
    assert all(len(s.of(i)) == 2 * m for i in range(P))


def test_every_stage_waits_its_turn_and_dp_comes_after_the_last_backward():
    s = timeline.simulate([1.0, 1.0], [2.0, 2.0], [0.5], 2, [0.0, 1.5])
    by = {(b.stage, b.kind, b.micro_batch): b for b in s.blocks}
    assert by[(1, "F", 0)].start == pytest.approx(by[(0, "F", 0)].end + 0.5)  # the transfer
    assert by[(0, "B", 0)].start >= by[(1, "B", 0)].end + 0.5
    dp = by[(1, "DP", -1)]
    assert (
        dp.start == pytest.approx(max(b.end for b in s.of(1) if b.kind == "B")) and dp.end - dp.start == 1.5
    )
    assert (0, "DP", -1) not in by  # nothing exposed, nothing drawn


def test_boundary_transfers_are_recovered_from_the_stages_sums():
    m = 4
    boundaries = [0.3, 0.1, 0.2]
    per_stage = [m * (a + b) for a, b in zip([0.0, *boundaries], [*boundaries, 0.0])]
    assert timeline.transfers(per_stage, m) == pytest.approx(boundaries)


def test_the_schedule_of_a_planned_layout_is_close_to_the_cost_models_iteration():
    for nodes, job in ((PAPER_NODES, GPT), (MIXED_NODES, LLAMA_70B)):
        layout = planned(nodes, job)
        s = timeline.from_estimate(layout.estimate, layout.micro_batches)
        assert s is not None
        assert s.seconds == pytest.approx(layout.estimate["iterationSeconds"], rel=0.05), (nodes, job)


# ---- the picture ------------------------------------------------------------------------------


def test_the_svg_parses_and_names_every_node_stage_island_and_the_slow_link():
    layout = planned(PAPER_NODES, GPT)
    doc = svg.render(picture.from_layout(layout, "paper"))
    ET.fromstring(doc)
    assert titles(doc) == set(layout.nodes)
    assert texts(doc, "stage") == [f"stage {s.index}" for s in layout.stages]
    assert texts(doc, "island") == ["island east/infiniband", "island west/roce"]
    assert "slow link: activations over Socket" in doc  # the boundary between the islands
    assert "data-parallel x32 over IB" in doc
    m, P = layout.micro_batches, layout.pipeline
    root = ET.fromstring(doc)
    fills = [r.get("fill") for r in root.iter("{http://www.w3.org/2000/svg}rect")]
    assert fills.count(svg.FORWARD) == P * m + 1 and fills.count(svg.BACKWARD) == P * m + 1  # + legend
    assert fills.count(svg.EXPOSED) == 1 + sum(
        1 for e in layout.estimate["stages"] if e["dpExposedSeconds"] > 0
    )


def test_a_node_shared_by_two_stages_shows_each_stage_its_own_gpus():
    layout = planned(MIXED_NODES, LLAMA_70B)
    assert layout.stages[0].nodes == layout.stages[1].nodes  # 16 stages on 8 nodes
    doc = svg.render(picture.from_layout(layout))
    assert titles(doc) == set(layout.nodes) and len(texts(doc, "stage")) == 16
    assert "activations inside a node (NVLink)" in doc
    G = layout.gpus_per_node
    green = [
        r for r in ET.fromstring(doc).iter("{http://www.w3.org/2000/svg}rect") if r.get("fill") == "#76b900"
    ]
    assert len(green) == layout.world_size  # each GPU drawn green once, in its own stage's row
    assert len(green) == len(layout.nodes) * G


def test_a_running_jobs_status_draws_its_islands_and_the_crossing():
    layout = planned(PAPER_NODES, GPT)
    nic_of = {n: s.nic for s in layout.stages for n in s.nodes}
    job = yaml.safe_load(Path(GPT).read_text())
    job["metadata"]["namespace"] = "lab"
    job["status"] = {"layout": layout_status(layout, nic_of, "gpt-7b-layout")}
    pic = picture.from_status(job)
    assert pic.links == (picture.CROSSES_ISLANDS,) and pic.gpus_per_node == 8
    doc = svg.render(pic)
    assert titles(doc) == set(layout.nodes) and len(texts(doc, "stage")) == 2
    assert "slow link: crosses islands" in doc and "no per-stage times" in doc


def test_a_status_without_a_layout_says_why_and_what_to_do():
    with pytest.raises(picture.PictureError, match="status.layout has no stages yet.*holmes plan --svg"):
        picture.from_status({"metadata": {"name": "j"}, "status": {"phase": "Pending"}})


# ---- holmes plan --svg --------------------------------------------------------------------


def test_holmes_plan_svg_writes_the_planned_layout(tmp_path, capsys):
    out = tmp_path / "layout.svg"
    assert main(["plan", "--nodes", PAPER_NODES, "--job", GPT, "--svg", str(out)]) == 0
    assert "Holmes layout" in capsys.readouterr().out  # the table still printed
    assert {f"gpu-node-{i}" for i in range(1, 9)} == titles(out.read_text())


def test_holmes_plan_svg_from_a_layout_configmap_and_from_a_status(tmp_path, capsys):
    assert main(["plan", "--nodes", PAPER_NODES, "--job", GPT, "--json"]) == 0
    layout_json = capsys.readouterr().out
    cm = tmp_path / "cm.yaml"
    cm.write_text(yaml.safe_dump({"kind": "ConfigMap", "data": {"layout.json": layout_json}}))
    out = tmp_path / "cm.svg"
    assert main(["plan", "--svg", str(out), "--layout", str(cm)]) == 0
    assert "Estimated schedule of one iteration" in out.read_text()
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"metadata": {"name": "j"}, "status": {}}))
    assert main(["plan", "--svg", str(out), "--from-status", str(job)]) == 2
    assert "status.layout has no stages yet" in capsys.readouterr().err
    assert main(["plan", "--layout", str(cm)]) == 2
    assert "give --svg FILE" in capsys.readouterr().err


def test_a_tensor_group_wider_than_a_node_is_outlined_inside_each_node():
    """GB200 NVL72: tensor 8 on 4-GPU nodes. Each node outlines its 4 GPUs of the group, not 8
    GPUs' width running past its GPUs."""
    layout = planned(
        str(ROOT / "examples/nodes/gb200-nvl72.yaml"), str(ROOT / "examples/jobs/llama3-70b-gb200.yaml")
    )
    assert layout.tensor == 8 and layout.gpus_per_node == 4
    root = ET.fromstring(svg.render(picture.from_layout(layout)))
    grey = [
        r
        for r in root.iter("{http://www.w3.org/2000/svg}rect")
        if r.get("stroke") == svg.NET_COLOURS["NVLink"]
    ]
    gpu = next(r for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("fill") == "#76b900")
    node_row = 4 * (float(gpu.get("width") or 0) + 2) + 1  # the node's 4 GPUs and their gaps
    assert grey and max(float(r.get("width") or 0) for r in grey) <= node_row
