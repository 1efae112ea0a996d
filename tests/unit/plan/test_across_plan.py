"""holmes plan with spec.training.acrossIslands: the pipeline over every node against one
replica per cluster, on the paper's testbed (4 InfiniBand nodes in east, 4 RoCE in west)."""

from dataclasses import replace

import pytest
import yaml

from holmes.cli import load_nodes, main
from holmes.contract import load_job
from holmes.plan import CostModelConfig
from holmes.plan.across_plan import compare_across

NODES = load_nodes("examples/nodes/paper.yaml")


def job(**across):
    d = yaml.safe_load(open("examples/jobs/gpt-7b.yaml"))
    d["spec"]["training"]["acrossIslands"] = {"mode": "auto", **across}
    return load_job(d)


def link(gbps, latency_ms=0.0):
    c = CostModelConfig()
    return replace(c, fabric=replace(c.fabric, cross_cluster_gbps=gbps, cross_cluster_latency_ms=latency_ms))


def test_a_wan_between_the_clusters_makes_replicas_faster_per_token():
    found = compare_across(NODES, job(innerSteps=50), link(1.0, latency_ms=30))
    assert found.replicas == 2 and found.pick == "replicas"
    assert found.pipeline_s > found.replicas_s
    assert any("measured" in line and "H=20" in line for line in found.lines)  # the assumption, sourced


def test_the_exchange_grows_as_the_link_slows_and_shrinks_with_bfloat16():
    slow = compare_across(NODES, job(innerSteps=50), link(1.0))
    fast = compare_across(NODES, job(innerSteps=50), link(25.0))
    half = compare_across(NODES, job(innerSteps=50, exchangeDtype="bfloat16"), link(1.0))
    assert slow.exchange_s == pytest.approx(25 * fast.exchange_s, rel=1e-6)
    assert half.exchange_s == pytest.approx(slow.exchange_s / 2, rel=1e-6)


def test_overlapped_steps_hide_the_exchange_behind_compute():
    """tau iterations of compute hide up to tau * compute of each fragment's exchange: a few
    steps hide part of it on a slow link, enough steps all of it."""
    plain = compare_across(NODES, job(innerSteps=50, fragments=5), link(0.1))
    compute = plain.replica.estimate["iterationSeconds"]
    exposed = plain.replicas_s - compute
    part = compare_across(NODES, job(innerSteps=50, fragments=5, overlapSteps=1), link(0.1))
    assert plain.hidden == 0 and 0 < part.hidden < 1
    assert part.hidden == pytest.approx(compute / (plain.exchange_s / 5))
    assert part.replicas_s == pytest.approx(compute + (1 - part.hidden) * exposed)
    assert part.lines[2].startswith(
        f"overlap: {part.hidden:.0%} of the exchange hidden behind 1 inner steps' compute"
    )
    whole = compare_across(NODES, job(innerSteps=50, fragments=5, overlapSteps=10), link(0.1))
    assert whole.hidden == 1 and whole.replicas_s == pytest.approx(compute)


def test_one_cluster_has_no_link_to_cross():
    east = [n for n in NODES if n["metadata"]["labels"].get("holmes.dev/cluster") == "east"]
    small = load_job(
        {**yaml.safe_load(open("examples/jobs/gpt-7b.yaml"))["spec"], "nodes": {"count": 4, "gpusPerNode": 8}}
    )
    assert compare_across(east, small, CostModelConfig()) is None


def test_holmes_plan_prints_both_and_which_is_faster(capsys):
    import tempfile

    d = yaml.safe_load(open("examples/jobs/gpt-7b.yaml"))
    d["spec"]["training"]["acrossIslands"] = {"mode": "replicas", "innerSteps": 20}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(d, f)
        f.flush()
        assert main(["plan", "--nodes", "examples/nodes/paper.yaml", "--job", f.name]) == 0
    out = capsys.readouterr().out
    assert "Across islands (spec.training.acrossIslands.mode: replicas)" in out
    assert "pipeline across the clusters:" in out and "replicas, one per cluster (2):" in out
    assert "faster per token:" in out and "convergence: replicas need" in out


# Mixtral's 47B parameters cost an exchange over a 1 Gbit/s WAN (0.6 Gbit/s achieved on its
# sockets) that every 20 steps outweighs the pipeline's activations: replicas win there from
# H=100 on
@pytest.mark.parametrize(
    "example,wan_inner_steps", [("gpt-7b", 20), ("llama3-8b", 20), ("megatron-mixtral-8x7b", 100)]
)
def test_auto_keeps_the_pipeline_on_a_fast_link_and_picks_replicas_over_a_wan(example, wan_inner_steps):
    d = yaml.safe_load(open(f"examples/jobs/{example}.yaml"))
    d["spec"]["training"]["acrossIslands"] = {"mode": "auto", "innerSteps": 20}
    spec = load_job(d)
    assert compare_across(NODES, spec, link(400.0)).pick == "pipeline"
    assert compare_across(NODES, spec, link(25.0)).pick == "pipeline"
    d["spec"]["training"]["acrossIslands"]["innerSteps"] = wan_inner_steps
    assert compare_across(NODES, load_job(d), link(1.0, latency_ms=20)).pick == "replicas"
    if wan_inner_steps > 20:
        assert compare_across(NODES, spec, link(1.0, latency_ms=20)).pick == "pipeline"


def test_the_exchange_goes_no_faster_than_the_hosts_sockets():
    """The outer group is a Socket group: a link faster than the hosts' 25 Gbit/s sockets does not
    shorten the exchange, and it runs at the socket efficiency as the pipeline's traffic does."""
    at_25 = compare_across(NODES, job(innerSteps=50), link(25.0))
    at_400 = compare_across(NODES, job(innerSteps=50), link(400.0))
    assert at_400.exchange_s == pytest.approx(at_25.exchange_s, rel=1e-9)
    fabric = CostModelConfig().fabric
    at_1 = compare_across(NODES, job(innerSteps=50), link(1.0))
    params_bytes = at_1.exchange_s * 1.0 * fabric.socket_efficiency * 1e9 / 8  # 2 (R-1)/R = 1 for R=2
    assert at_25.exchange_s == pytest.approx(params_bytes * 8 / (25.0 * fabric.socket_efficiency * 1e9))


def test_a_small_model_bound_by_the_socket_between_clusters_goes_to_replicas_even_on_a_fast_link():
    # 0.05B parameters: the pipeline's layout is data parallel across the clusters, its gradients
    # crossing every step over the hosts' 25 Gbit/s sockets (the RDMA fabrics end at the cluster),
    # which cost more than the replicas' extra tokens; a faster link does not widen the sockets
    d = yaml.safe_load(open("examples/jobs/gpt-7b.yaml"))
    d["spec"]["model"].update(layers=8, hiddenSize=512, attentionHeads=8)
    d["spec"]["training"]["acrossIslands"] = {"mode": "auto", "innerSteps": 20}
    fast = compare_across(NODES, load_job(d), link(400.0))
    assert fast.pipeline.data > 1 and fast.pick == "replicas"
    assert compare_across(NODES, load_job(d), link(25.0)).pipeline_s == pytest.approx(fast.pipeline_s)


def test_a_replica_that_auto_plans_counts_its_outer_optimizer_and_the_pipeline_does_not():
    """auto: the pipeline holds no outer optimizer, each replica does (trainer outer.py). Before,
    replica_job kept mode auto and the replica was priced without it: 1.8 GiB of fp32 anchor and
    momentum per GPU short (P=1 x D=32, as the dry run of examples/jobs/gpt-7b-replicas.yaml)."""
    from holmes.contract import ModelCost
    from holmes.contract.spec_sections import AcrossIslandsSpec
    from holmes.plan import plan
    from holmes.plan.across_plan import clusters_of, replica_job
    from holmes.plan.planner import outer_shape

    def memory(layout):
        return [s["memoryGiB"] for s in layout.estimate["stages"]]

    cfg = CostModelConfig()
    auto = compare_across(NODES, job(), cfg)
    east = clusters_of(NODES)["east"]
    share = replica_job(job(), 2, len(east))
    assert share.training.across_islands.mode == "replicas"
    bare = replace(share, training=replace(share.training, across_islands=AcrossIslandsSpec()))
    assert memory(auto.replica) == memory(plan(east, share, cfg))
    extra = [a - b for a, b in zip(memory(auto.replica), memory(plan(east, bare, cfg)))]
    shard = ModelCost.of(share.model).total_params / auto.replica.data  # one DP shard's parameters
    assert extra == [pytest.approx((shard * 8 + 100 * 2**20) / 2**30, rel=0.005)]
    assert outer_shape(job()) == (0.0, 0)  # auto's pipeline: one world, no outer optimizer
