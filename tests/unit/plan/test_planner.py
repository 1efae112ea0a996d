import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from holmes.contract import JobSpec, Layout, ModelCost, SpecError
from holmes.contract.flops import tflops_per_gpu
from holmes.plan import CostModelConfig, InsufficientNodes, PlanError, compare, explain, plan
from holmes.plan.discovery import NodeNic
from holmes.plan.planner import degree_candidates, for_job
from tests.helpers.contract.spec_helpers import minimal_spec
from tests.helpers.plan.plan_helpers import job_spec, node, paper_nodes


def test_paper_formula_gives_196_8():
    m = ModelCost.of(JobSpec.from_spec(job_spec()).model)
    # 96 samples/s on 64 GPUs: one iteration of 96 samples takes 1 s
    assert tflops_per_gpu(m.flops_per_iteration(96, recompute=True), 1.0, 64) == pytest.approx(
        196.8, abs=0.05
    )
    tied = job_spec()
    tied["model"]["tiedEmbeddings"] = True
    assert (
        7.4e9 < ModelCost.of(JobSpec.from_spec(tied).model).total_params < 7.5e9
    )  # "GPT 7.4B", Megatron ties
    assert m.total_params - ModelCost.of(JobSpec.from_spec(tied).model).total_params == 50257 * 4096


def test_paper_topology_keeps_dp_on_rdma_and_beats_megatron_default():
    holmes, base, ratio = compare(paper_nodes(), job_spec())
    assert (holmes.tensor, holmes.pipeline, holmes.data) == (1, 2, 32)
    assert [s.nic for s in holmes.stages] == ["infiniband", "roce"]
    assert all(s.dp_net == "IB" for s in holmes.stages)
    assert {g.net for g in holmes.groups if g.kind == "dp"} == {"IB"}
    assert next(g.net for g in holmes.groups if g.kind == "pp") == "Socket"
    # name order interleaves the fabrics: Megatron's DP groups mix IB and RoCE and fall back to sockets
    assert all(s.dp_net == "Socket" for s in base.stages)
    assert base.nodes == tuple(sorted(base.nodes))
    assert ratio > 1.2 and holmes.estimate["tflopsPerGpu"] > base.estimate["tflopsPerGpu"]
    text = explain(holmes)
    assert "east/infiniband" in text and "why:" in text and "one NIC kind" in text


def test_faster_stage_gets_more_layers_when_dp_is_slow():
    nodes = [node(f"ib-{i}", "infiniband", "east") for i in range(4)] + [
        node(f"eth-{i}", "ethernet", "west") for i in range(4)
    ]
    lay = plan(nodes, job_spec(pipeline=2))
    by_nic = {s.nic: s.num_layers for s in lay.stages}
    assert by_nic["infiniband"] > by_nic["ethernet"]
    assert any("gets" in line and "layers" in line for line in lay.explanation)
    uni = plan(nodes, job_spec(pipeline=2, partition="uniform"))
    assert [s.num_layers for s in uni.stages] == [18, 18]
    assert lay.estimate["iterationSeconds"] < uni.estimate["iterationSeconds"]


def test_explicit_partition_and_fixed_degrees_are_honoured():
    lay = plan(paper_nodes(), job_spec(pipeline=2, partition=[20, 16]))
    assert [s.num_layers for s in lay.stages] == [20, 16] and lay.estimate["partition"] == "explicit"
    lay = plan(paper_nodes(), job_spec(tensor=2, pipeline=4, vocab=50304))
    assert (lay.tensor, lay.pipeline, lay.data) == (2, 4, 8)
    with pytest.raises(PlanError, match="sum to 35"):
        plan(paper_nodes(), job_spec(partition=[20, 15]))


def test_insufficient_nodes_names_what_is_there_and_why():
    nodes = paper_nodes()[:3] + [
        node("small", "roce", "west", gpus=4),
        node("broken", labels={"feature.node.kubernetes.io/rdma.capable": "true"}),
    ]
    with pytest.raises(InsufficientNodes) as e:
        plan(nodes, job_spec(count=4))
    msg = str(e.value)
    assert msg.startswith("needs 4 nodes with 8 nvidia.com/gpu; have 3: 2 infiniband, 1 roce")
    assert "small (4)" in msg and "broken" in msg and "holmes.dev/nic" in msg
    spec = job_spec(count=2)
    spec["nodes"]["selector"] = {"matchLabels": {"pool": "llm"}}
    with pytest.raises(InsufficientNodes, match="matching pool=llm; have 0.*do not match"):
        plan(paper_nodes(), spec)


@pytest.mark.parametrize(
    "par, B, mb, expected",
    [
        ({"pipeline": 2, "data": 32}, 2048, 4, None),
        ({"data": 64}, 100, 1, "not divisible by data\\*microBatchSize = 64\\*1; use a multiple of 64"),
        ({"tensor": 1, "pipeline": 1}, 100, 1, "not divisible by data\\*microBatchSize = 64"),
        ({"pipeline": 8}, 64, 4, "micro-batches per iteration < 8 stages"),
    ],
)
def test_impossible_degrees_explain_the_fix(par, B, mb, expected):
    spec = job_spec(B=B, mb=mb, **par)
    if expected is None:
        assert plan(paper_nodes(), spec).data == 32
        return
    with pytest.raises(PlanError, match=expected) as e:
        plan(paper_nodes(), spec)
    assert ("fix" in str(e.value) or "use a multiple" in str(e.value)) and not isinstance(
        e.value, InsufficientNodes
    )


def test_memory_limit_is_reported():
    spec = job_spec(layers=96, hidden=12288, heads=96, B=64, mb=1, tensor=1, pipeline=1)
    with pytest.raises(PlanError, match="GiB per GPU"):
        plan(paper_nodes(), spec)


def test_bad_job_dict_is_a_plan_error():
    spec = job_spec()
    spec["model"]["layers"] = "many"
    with pytest.raises(PlanError, match="spec.model.layers"):
        plan(paper_nodes(), spec)


def test_json_round_trip_and_determinism():
    a = plan(paper_nodes(), job_spec())
    b = plan(list(reversed(paper_nodes())), job_spec())
    assert a.to_json() == b.to_json()
    again = Layout.from_json(a.to_json())
    assert again.to_dict() == a.to_dict() and explain(again) == explain(a)


def test_layout_json_stays_under_a_mebibyte_at_4096_nodes():
    nics = [
        NodeNic(
            name=f"gpu-node-{i:05d}.rack-{i // 32:03d}.example",
            cluster=f"c{i % 3}",
            nic=("infiniband", "roce", "ethernet")[i % 3],
            gbps=200.0,
            gpus=8,
        )
        for i in range(4096)
    ]
    spec = job_spec(layers=96, hidden=12288, heads=96, B=8192, mb=1, count=4096, tensor=8, vocab=50304)
    lay = plan(nics, spec)
    size = len(lay.to_json().encode())
    assert lay.world_size == 32768 and size < 2**20, size


# ---- properties ------------------------------------------------------------------------------

kinds = st.sampled_from(["infiniband", "roce", "ethernet"])


@st.composite
def clusters(draw):
    n = draw(st.sampled_from([2, 4, 6, 8]))
    G = draw(st.sampled_from([2, 4, 8]))
    nodes = [node(f"n{i:02d}", draw(kinds), draw(st.sampled_from(["a", "b"])), gpus=G) for i in range(n)]
    layers = draw(st.integers(4, 16))
    P = draw(st.sampled_from(["auto", 1, 2, 4]))
    return nodes, job_spec(
        layers=layers,
        hidden=256,
        heads=8,
        seq=128,
        vocab=1000,
        B=64,
        mb=1,
        count=n,
        gpus=G,
        pipeline=P,
        tensor="auto",
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_layout_invariants(case):
    nodes, spec = case
    try:
        lay = plan(nodes, spec)
    except PlanError as e:
        assert "fix" in str(e)
        return
    G = spec["nodes"]["gpusPerNode"]
    assert len(set(lay.nodes)) == len(lay.nodes) == spec["nodes"]["count"]  # each GPU at most once
    assert sum(s.num_layers for s in lay.stages) == spec["model"]["layers"]
    assert all(s.num_layers >= 1 for s in lay.stages)
    ranks = [lay.rank_info(r) for r in range(lay.world_size)]
    assert [r.stage for r in ranks] == sorted(r.stage for r in ranks)  # stages are contiguous blocks
    for s in lay.stages:
        assert set(s.nodes) == {r.node for r in ranks if r.stage == s.index}
    kind = {
        n["metadata"]["name"]: (
            n["metadata"]["labels"]["holmes.dev/nic"],
            n["metadata"]["labels"]["holmes.dev/cluster"],
        )
        for n in nodes
    }
    for g in lay.process_groups("dp"):
        fabrics = {kind[lay.rank_info(r).node] for r in g.ranks}
        assert (g.net == "IB") == (len(fabrics) == 1 and next(iter(fabrics))[0] != "ethernet")
    # DP stays single-island whenever every island splits into whole stages
    span = max(1, lay.data * lay.tensor // G)
    counts = {}
    for f in kind.values():
        counts[f] = counts.get(f, 0) + 1
    if all(c % span == 0 for c in counts.values()):
        for s in lay.stages:
            assert len({kind[n] for n in s.nodes}) == 1
    # deterministic, and never worse than the Megatron default with the same degrees
    assert plan(nodes, spec).to_json() == lay.to_json()
    _, base, ratio = compare(nodes, spec)
    assert ratio >= 1 - 1e-9


def test_json_is_camel_case_contract():
    d = json.loads(plan(paper_nodes(), job_spec()).to_json())
    assert {"worldSize", "tensor", "pipeline", "data", "stages", "groups", "estimate"} <= set(d)
    assert {"iterationSeconds", "tokensPerSecond", "tflopsPerGpu", "stages"} <= set(d["estimate"])
    st0 = d["estimate"]["stages"][0]
    assert {"computeSeconds", "bubbleSeconds", "p2pSeconds", "dpCommSeconds", "dpExposedSeconds"} <= set(st0)


def test_planner_config_changes_the_estimate():
    fast = plan(paper_nodes(), job_spec(), CostModelConfig(compute_efficiency=0.8))
    slow = plan(paper_nodes(), job_spec(), CostModelConfig(compute_efficiency=0.4))
    assert fast.estimate["tflopsPerGpu"] > slow.estimate["tflopsPerGpu"]


def test_grad_reduce_dtype_is_validated_and_sets_the_cost_models_bytes():
    spec = minimal_spec()
    assert JobSpec.from_spec(spec).training.grad_reduce_dtype == "float32"
    spec["training"]["gradReduceDtype"] = "bfloat16"
    job = JobSpec.from_spec(spec)
    assert job.training.grad_reduce_bytes == 2 and for_job(CostModelConfig(), job).grad_bytes == 2
    spec["training"]["gradReduceDtype"] = "fp8"
    with pytest.raises(SpecError, match="spec.training.gradReduceDtype"):
        JobSpec.from_spec(spec)


def test_tensor_auto_only_offers_degrees_the_trainer_can_split():
    spec = minimal_spec(parallelism={"tensor": "auto", "pipeline": 1})
    spec["nodes"] = {"count": 1, "gpusPerNode": 8}
    spec["training"]["globalBatchSize"] = 64
    offered = {d.tensor for d in degree_candidates(JobSpec.from_spec(spec))}
    assert offered == {1, 2, 4, 8}  # heads 8, ffn 1024, vocab 1000 all divide
    spec["model"]["vocabSize"] = 1002  # 2 x 501
    assert {d.tensor for d in degree_candidates(JobSpec.from_spec(spec))} == {1, 2}
    spec["model"].update(vocabSize=1000, architecture="llama", kvHeads=2)
    assert {d.tensor for d in degree_candidates(JobSpec.from_spec(spec))} == {1, 2}
    spec["model"].update(kvHeads=8, seqLength=36)
    spec["parallelism"]["sequenceParallel"] = True
    assert {d.tensor for d in degree_candidates(JobSpec.from_spec(spec))} == {1, 2, 4}
