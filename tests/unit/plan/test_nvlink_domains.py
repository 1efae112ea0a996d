"""NVLink domains (GB200/GB300 NVL72): discovery of the clique, tensor groups over the nodes of one
domain and never two, traffic inside a domain priced on NVLink, and the explanation of the choice.
The cluster is examples/nodes/gb200-nvl72.yaml: two racks of 18 nodes x 4 GB200, InfiniBand
between; the job examples/jobs/llama3-70b-gb200.yaml (a Llama-70B shape, tensor 8)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from holmes.cli import main
from holmes.contract import names
from holmes.contract.layout import NVLINK_VERSION
from holmes.plan.costmodel import CostModelConfig
from holmes.plan.costmodel_file import from_mapping
from holmes.plan.discovery import classify_node
from holmes.plan.errors import PlanError
from holmes.plan.gpus import node_gpu
from holmes.plan.planner import as_job, for_job, plan, search, select_nodes

ROOT = Path(__file__).resolve().parents[3]
NODES = yaml.safe_load((ROOT / "examples/nodes/gb200-nvl72.yaml").read_text())["items"]
JOB = yaml.safe_load((ROOT / "examples/jobs/llama3-70b-gb200.yaml").read_text())


def job(**parallelism):
    doc = copy.deepcopy(JOB)
    doc["spec"]["parallelism"].update(parallelism)
    return doc


def clique(node: dict) -> str | None:
    return node["metadata"]["labels"].get(names.LABEL_GPU_CLIQUE)


def relabel(nodes: list[dict], domain_of) -> list[dict]:
    out = copy.deepcopy(nodes)
    for i, n in enumerate(out):
        labels = n["metadata"]["labels"]
        labels.pop(names.LABEL_GPU_CLIQUE, None)
        d = domain_of(i)
        if d is not None:
            labels[names.LABEL_GPU_CLIQUE] = d
    return out


def tensor_groups(layout):
    """Each tensor group's nodes (names), from the layout's own rank rules."""
    G = layout.gpus_per_node
    return [tuple(dict.fromkeys(layout.nodes[r // G] for r in g.ranks)) for g in layout.process_groups("tp")]


# ---- discovery ---------------------------------------------------------------------------------


def test_the_clique_label_is_the_nodes_nvlink_domain_and_a_malformed_one_a_problem():
    n = classify_node(NODES[0])
    assert n.nvlink_domain == clique(NODES[0]) and not n.problems
    bad = copy.deepcopy(NODES[0])
    bad["metadata"]["labels"][names.LABEL_GPU_CLIQUE] = "rack-one"
    n = classify_node(bad)
    assert n.nvlink_domain is None
    assert any(
        "nvidia.com/gpu.clique='rack-one'" in p and "<cluster UUID>.<clique id>" in p for p in n.problems
    )


def test_gb200_is_priced_with_its_nvlink_and_gpu_products_may_give_any_product_one():
    cfg = CostModelConfig()
    assert node_gpu(classify_node(NODES[0]), cfg).nvlink_gbps == 7200.0
    other = copy.deepcopy(NODES[0])
    other["metadata"]["labels"][names.LABEL_GPU_PRODUCT] = "NVIDIA-Future-X9"
    cfg = from_mapping(
        {"gpuProducts": {"Future-X9": {"peakTflops": 3000, "memoryGib": 200, "nvlinkGbps": 14400}}}
    )
    assert node_gpu(classify_node(other), cfg).nvlink_gbps == 14400.0
    cfg = from_mapping({"gpuProducts": {"Future-X9": {"peakTflops": 3000, "memoryGib": 200}}})
    assert node_gpu(classify_node(other), cfg).nvlink_gbps is None  # the config's nvlinkGbps


# ---- placement ---------------------------------------------------------------------------------


def test_tensor_8_spans_two_nodes_of_one_domain_and_never_two():
    layout = plan(NODES, job(tensor=8))
    assert layout.tensor == 8 and layout.version == NVLINK_VERSION
    domain = {n["metadata"]["name"]: clique(n) for n in NODES}
    groups = tensor_groups(layout)
    assert groups and all(len(g) == 2 and len({domain[x] for x in g}) == 1 for g in groups)
    assert all(layout.nvlink_domain(x) == domain[x] for x in layout.nodes)
    why = "\n".join(layout.explanation)
    assert "tensor groups of 8 span 2 nodes of one NVLink domain each (never two)" in why


def test_domains_interleaved_in_name_order_still_keep_each_group_inside_one():
    """Every other node (by name) in the other rack: name order would pair nodes of two domains."""
    nodes = relabel(NODES, lambda i: f"{'ab'[i % 2] * 8}-0000-0000-0000-000000000000.{i % 2}")
    layout = plan(nodes, job(tensor=8))
    domain = {n["metadata"]["name"]: clique(n) for n in nodes}
    assert all(len({domain[x] for x in g}) == 1 for g in tensor_groups(layout))


def test_an_odd_domain_leaves_its_last_node_out_of_the_tensor_groups():
    """17 nodes in one domain and 19 in the other: groups of two nodes never straddle them."""
    nodes = relabel(NODES, lambda i: "aaaa-1.1" if i < 17 else "bbbb-2.1")
    nodes = nodes + relabel([NODES[0]], lambda i: "bbbb-2.1")
    nodes[-1]["metadata"]["name"] = "gb200-r2-n19"
    layout = plan(nodes, job(tensor=8))
    domain = {n["metadata"]["name"]: clique(n) for n in nodes}
    assert all(len({domain[x] for x in g}) == 1 for g in tensor_groups(layout))


def test_tensor_groups_across_nodes_without_a_domain_are_refused_naming_the_field_and_the_fix():
    with pytest.raises(PlanError) as e:
        plan(relabel(NODES, lambda i: None), job(tensor=8))
    msg = str(e.value)
    assert msg.startswith("spec.parallelism.tensor: 8 puts each tensor group on several nodes")
    assert (
        "in no NVLink domain" in msg
        and "fix: make the group fit a node (tensor a divisor of gpusPerNode 4" in msg
    )


def test_tensor_groups_that_only_fit_across_domains_are_refused():
    """Every node its own domain: no two nodes share one, so a group of two nodes never fits."""
    with pytest.raises(PlanError, match="would span NVLink domains"):
        plan(relabel(NODES, lambda i: f"{i:04d}-rack.1"), job(tensor=8))


# ---- pricing and the search ----------------------------------------------------------------------


def _best(nodes, doc):
    j = as_job(doc)
    cfg = for_job(CostModelConfig(), j)
    return search(select_nodes(nodes, j, cfg), j, cfg)


def test_data_parallel_and_pipeline_traffic_inside_a_domain_is_priced_on_nvlink():
    """The same layout (tensor 4, node-bound) with and without the clique labels: inside a domain
    the DP groups and the stage boundaries run at NVLink's speed, across domains on the NICs."""
    with_domains, _ = _best(NODES, job(tensor=4, pipeline=9))
    without, _ = _best(relabel(NODES, lambda i: None), job(tensor=4, pipeline=9))
    inside = [s for s, st in enumerate(with_domains.stage_sets) if st.nvlink_domain]
    crossing = [s for s, st in enumerate(with_domains.stage_sets) if not st.nvlink_domain]
    assert inside and crossing
    s = inside[0]
    assert with_domains.costs[s].place.dp_gbps == 4 * 7200.0  # the node's 4 GPUs' NVLink
    assert without.costs[s].place.dp_gbps < 1600  # its InfiniBand
    assert with_domains.stages[s].dp_comm < without.stages[s].dp_comm / 10
    c = crossing[0]
    assert with_domains.costs[c].place.dp_gbps == without.costs[c].place.dp_gbps
    assert with_domains.costs[0].place.p2p_out < without.costs[0].place.p2p_out / 10


def test_tensor_auto_picks_a_group_wider_than_a_node_where_faster_and_shows_the_node_bound_plan():
    layout = plan(NODES, job(tensor="auto"))
    assert layout.tensor == 8
    why = "\n".join(layout.explanation)
    assert "node-bound plan beside it: tensor 4 x pipeline" in why
    best, alternatives = _best(NODES, job(tensor="auto"))
    node_bound = min((c for c in alternatives if c.degrees.tensor <= 4), key=lambda c: c.seconds)
    assert best.seconds < node_bound.seconds


def test_without_domains_tensor_auto_stays_inside_a_node():
    layout = plan(relabel(NODES, lambda i: None), job(tensor="auto"))
    assert layout.tensor <= 4 and layout.version != NVLINK_VERSION
    assert "NVLink domain" not in "\n".join(layout.explanation)


def test_holmes_plan_on_the_example_says_where_the_tensor_groups_sit(capsys):
    nodes, job_file = (
        str(ROOT / "examples/nodes/gb200-nvl72.yaml"),
        str(ROOT / "examples/jobs/llama3-70b-gb200.yaml"),
    )
    assert main(["plan", "--nodes", nodes, "--job", job_file]) == 0
    out = capsys.readouterr().out
    assert "36 nodes x 4 GPUs = 144 ranks: tensor 8 x pipeline" in out
    assert "tensor groups of 8 span 2 nodes of one NVLink domain each (never two)" in out
    assert main(["plan", "--nodes", nodes, "--job", job_file, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["version"] == NVLINK_VERSION and sorted(map(len, doc["nvlinkDomains"].values())) == [18, 18]


def moe_doc(count: int, **parallelism) -> dict:
    """A DeepSeek-V2-Lite shape (64 experts) on the example's GB200 nodes."""
    from tests.helpers.plan.moe_helpers import SHAPES, TRAINER

    model, moe = SHAPES["deepseek-v2-lite"]
    doc = copy.deepcopy(JOB)
    doc["spec"].update(framework="megatron", template={"spec": {"containers": [TRAINER]}})
    doc["spec"]["model"] = {**model, "moe": moe}
    doc["spec"]["training"].update(globalBatchSize=256, microBatchSize=1, activationRecompute=True)
    doc["spec"]["nodes"]["count"] = count
    doc["spec"]["parallelism"] = {"tensor": 1, "sequenceParallel": False, **parallelism}
    return doc


def test_expert_groups_over_nodes_stay_in_one_domain_and_their_all_to_all_runs_on_nvlink():
    """Expert 8 on 4-GPU nodes: each expert group spans two nodes, of one domain (even where name
    order interleaves the domains), its all-to-all priced on the nodes' NVLink, not InfiniBand."""
    nodes = relabel(NODES, lambda i: f"{'ab'[i % 2] * 8}-0000-0000-0000-000000000000.{i % 2}")
    domain = {n["metadata"]["name"]: clique(n) for n in nodes}
    best, _ = _best(nodes, moe_doc(8, pipeline=2, expert=8))
    assert best.degrees.expert == 8
    assert all(c.place.ep_gbps == 4 * 7200.0 for c in best.costs)
    names_ = [n.name for n in best.nodes]
    assert all(domain[names_[i]] == domain[names_[i + 1]] for i in range(0, len(names_), 2))
    without, _ = _best(relabel(NODES, lambda i: None), moe_doc(8, pipeline=2, expert=8))
    assert all(c.place.ep_gbps is not None and c.place.ep_gbps < 1600 for c in without.costs)


def test_expert_groups_on_nodes_without_a_domain_keep_to_their_island_beside_a_domain():
    """Every other node in a domain, the rest unlabelled: expert groups of two nodes lie in the
    domain (NVLink) or on unlabelled nodes of the island (InfiniBand), never across the two."""
    nodes = relabel(NODES, lambda i: "aaaa-1.1" if i % 2 == 0 else None)  # interleaved by name
    domain = {n["metadata"]["name"]: clique(n) for n in nodes}
    best, _ = _best(nodes, moe_doc(32, pipeline=2, expert=8))
    names_ = [n.name for n in best.nodes]
    pairs = [(domain[names_[i]], domain[names_[i + 1]]) for i in range(0, len(names_), 2)]
    assert all(a == b for a, b in pairs) and {a for a, _ in pairs} == {"aaaa-1.1", None}
