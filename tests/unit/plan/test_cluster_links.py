"""The link between clusters described per pair (cost model ``fabric.links``): the file's round
trip and errors, the planner placing the pipeline's boundaries on the faster pairs (bandwidth and
latency), and the across-islands choice priced on the replicas' ring."""

from dataclasses import replace

import pytest
import yaml

from holmes.cli import load_nodes
from holmes.contract import load_job
from holmes.plan import CostModelConfig, plan
from holmes.plan.across_plan import compare_across
from holmes.plan.costmodel_file import CostModelError, dump_yaml, from_mapping, load_yaml_text, to_mapping
from holmes.plan.topology import ClusterLink
from tests.helpers.plan.plan_helpers import job_spec, node

PAPER = load_nodes("examples/nodes/paper.yaml")  # east: 4 InfiniBand, west: 4 RoCE


def fabric(**keys):
    return from_mapping({"fabric": keys})


def link(a, b, gbps, latency_ms=0.0):
    return {"between": [a, b], "gbps": gbps, "latencyMs": latency_ms}


# ---- the file ---------------------------------------------------------------------------------


def test_links_round_trip_through_the_file():
    cfg = fabric(links=[link("east", "west", 10, 20), link("north", "east", 1, 45.5)])
    east_west = ClusterLink(("east", "west"), 10.0, 20.0)
    assert cfg.fabric.links == (east_west, ClusterLink(("north", "east"), 1.0, 45.5))
    as_file = {"between": ["north", "east"], "gbps": 1.0, "latencyMs": 45.5}
    assert to_mapping(cfg)["fabric"]["links"][1] == as_file
    assert load_yaml_text(dump_yaml(cfg)) == cfg


def test_a_listed_pair_is_found_in_either_order_and_others_take_the_cross_cluster_default():
    cfg = fabric(crossClusterGbps=40, crossClusterLatencyMs=2, links=[link("east", "west", 10, 20)])
    assert (cfg.fabric.link("west", "east").gbps, cfg.fabric.link("west", "east").latency_ms) == (10, 20)
    # a cluster not present yet (it may join later) is fine; pairs with it take the default
    assert (cfg.fabric.link("east", "south").gbps, cfg.fabric.link("east", "south").latency_ms) == (40, 2)


def test_old_single_value_files_read_unchanged():
    cfg = load_yaml_text("fabric: {crossClusterGbps: 1, crossClusterLatencyMs: 30}\n")
    assert cfg.fabric.links == ()
    assert (cfg.fabric.cross_cluster_gbps, cfg.fabric.cross_cluster_latency_ms) == (1.0, 30.0)
    assert (cfg.fabric.link("east", "west").gbps, cfg.fabric.link("east", "west").latency_ms) == (1.0, 30.0)
    assert load_yaml_text("gpuPeakTflops: 989\n").fabric.links == ()


@pytest.mark.parametrize(
    "links, message",
    [
        (
            [link("east", "west", 10), link("west", "east", 1)],
            "fabric.links[1] lists the pair east-west again (fabric.links[0] already does): "
            "keep one entry per pair of clusters",
        ),
        ([link("east", "east", 10)], "fabric.links[0].between pairs cluster 'east' with itself"),
        (
            [{"between": ["east"], "gbps": 1, "latencyMs": 0}],
            "fabric.links[0].between must name two clusters, got ['east']: write [east, west]",
        ),
        ([link("east", "west", 0)], "fabric.links[0].gbps: a bandwidth, FLOP rate, memory size"),
        ([link("east", "west", -2)], "fabric.links[0].gbps: -2.0 must be a finite number >= 0"),
        ([link("east", "west", 1, -1)], "fabric.links[0].latencyMs: -1.0 must be a finite number >= 0"),
        ([{"between": ["east", "west"], "gbps": 1}], "fabric.links[0]: missing latencyMs"),
        (
            [{"between": ["east", "west"], "gbps": 1, "latency": 1}],
            "unknown key fabric.links[0].latency (did you mean latencyMs?)",
        ),
        ({"east": 1}, "fabric.links: expected a list of mappings of between, gbps, latencyMs"),
        ([{"between": "east-west", "gbps": 1, "latencyMs": 0}], "fabric.links[0].between: expected a list"),
    ],
)
def test_bad_links_are_refused_naming_the_key_and_the_fix(links, message):
    with pytest.raises(CostModelError) as e:
        load_yaml_text(yaml.safe_dump({"fabric": {"links": links}}))
    assert message in str(e.value)


def test_a_link_built_in_code_is_checked_too():
    with pytest.raises(ValueError, match="latency_ms must be a finite number >= 0"):
        ClusterLink(("a", "b"), 1.0, float("nan"))
    with pytest.raises(ValueError, match="lists the pair a-b again"):
        twice = (ClusterLink(("a", "b"), 1, 0), ClusterLink(("b", "a"), 2, 1))
        replace(CostModelConfig().fabric, links=twice)


def test_a_socket_group_spanning_clusters_runs_at_its_slowest_pair():
    from holmes.plan.discovery import classify_nodes
    from holmes.plan.topology import SOCKET_NET, group_bandwidth_gbps, link_latency_s, summarize

    cfg = fabric(socketGbps=100, links=[link("b", "c", 2, 5), link("a", "c", 50, 30)])
    spread = summarize(classify_nodes([node(f"{c}-1", "infiniband", c) for c in "abc"]), cfg.fabric)
    # pairs: a-b (the 25 Gbit/s default), a-c (50), b-c (2): the slowest is b-c
    eff = cfg.fabric.socket_efficiency
    assert group_bandwidth_gbps(spread, cfg.fabric, SOCKET_NET) == pytest.approx(2 * eff)
    assert link_latency_s(spread, cfg.fabric) == pytest.approx(0.030)  # a message fans out: the longest wait
    one = summarize(classify_nodes([node(f"a-{i}", "infiniband", "a") for i in (1, 2)]), cfg.fabric)
    assert link_latency_s(one, cfg.fabric) == 0.0


# ---- the planner ------------------------------------------------------------------------------

# three clusters of two InfiniBand nodes: three pipeline stages, one per cluster; which cluster
# holds the middle stage decides which two pairs the boundaries cross
THREE = [node(f"{c}-{i}", "infiniband", c) for c in ("a", "b", "c") for i in (1, 2)]
THREE_JOB = load_job(job_spec(count=6, tensor=1, pipeline=3, data=16))


def middle_cluster(cfg):
    layout = plan(THREE, THREE_JOB, cfg)
    clusters = [s.island.split("/")[0] for s in layout.stages]
    assert sorted(clusters) == ["a", "b", "c"], clusters  # one stage per cluster
    return clusters[1]


@pytest.mark.parametrize("slow, middle", [(("a", "b"), "c"), (("a", "c"), "b"), (("b", "c"), "a")])
def test_the_pipeline_keeps_its_boundaries_off_the_slow_pair(slow, middle):
    cfg = fabric(links=[link(*slow, 1)])
    assert middle_cluster(cfg) == middle


@pytest.mark.parametrize("far, middle", [(("a", "b"), "c"), (("b", "c"), "a")])
def test_latency_alone_moves_the_boundaries_off_the_distant_pair(far, middle):
    """Same bandwidth everywhere; one pair 50 ms apart: every micro-batch's message would wait on it."""
    cfg = fabric(links=[link(*far, 25, 50)])
    assert middle_cluster(cfg) == middle


@pytest.mark.parametrize(
    "keys",
    [{"links": [link("east", "west", 25, 20)]}, {"crossClusterLatencyMs": 20}],
    ids=["listed", "default"],
)
def test_each_message_across_clusters_waits_the_links_latency(keys):
    job = load_job(yaml.safe_load(open("examples/jobs/gpt-7b.yaml")))
    near = plan(PAPER, job, fabric())
    far = plan(PAPER, job, fabric(**keys))
    assert (far.pipeline, far.data, far.nodes) == (near.pipeline, near.data, near.nodes)
    grown = far.estimate["iterationSeconds"] - near.estimate["iterationSeconds"]
    # every micro-batch crosses the boundary forward and back: at least m messages on the
    # critical path, at most two per micro-batch on each side plus the fill and drain
    m = near.micro_batches
    assert m * 0.020 <= grown <= (2 * m + 4) * 0.020


def test_a_listed_pair_prices_like_the_same_single_value():
    """The per-pair link and the old single value describe the same network on two clusters."""
    job = load_job(yaml.safe_load(open("examples/jobs/gpt-7b.yaml")))
    listed = plan(PAPER, job, fabric(links=[link("west", "east", 5, 10)]))
    single = plan(PAPER, job, fabric(crossClusterGbps=5, crossClusterLatencyMs=10))
    seconds = single.estimate["iterationSeconds"]
    assert listed.estimate["iterationSeconds"] == pytest.approx(seconds, rel=1e-12)
    assert listed.nodes == single.nodes


def test_holmes_plan_names_the_link_each_boundary_crosses(capsys):
    from holmes.cli import main

    assert main(["plan", "--nodes", "examples/nodes/paper.yaml", "--job", "examples/jobs/gpt-7b.yaml"]) == 0
    default = "boundary 0|1 over east-west at 25 Gbit/s, 0 ms (crossCluster default)"
    assert f"pipeline across clusters: {default}" in capsys.readouterr().out


def test_holmes_plan_reads_the_links_from_its_config_file(tmp_path, capsys):
    from holmes.cli import main

    wan = tmp_path / "costmodel.yaml"
    wan.write_text("fabric:\n  links:\n    - {between: [west, east], gbps: 10, latencyMs: 20}\n")
    args = ["plan", "--nodes", "examples/nodes/paper.yaml", "--job", "examples/jobs/gpt-7b.yaml"]
    assert main([*args, "--config", str(wan)]) == 0
    line = "pipeline across clusters: boundary 0|1 over east-west at 10 Gbit/s, 20 ms\n"  # no default mark
    assert line in capsys.readouterr().out


# ---- across islands: pipeline or replicas -----------------------------------------------------


def across_job(count, batch=2048, **across):
    d = yaml.safe_load(open("examples/jobs/gpt-7b.yaml"))
    d["spec"]["training"]["globalBatchSize"] = batch
    d["spec"]["training"]["acrossIslands"] = {"mode": "auto", "innerSteps": 50, **across}
    d["spec"]["nodes"]["count"] = count
    return load_job(d)


def test_the_across_choice_uses_the_listed_pair_not_the_default():
    job = across_job(8)
    wan = fabric(links=[link("east", "west", 1, 30)])  # the default between other pairs stays 25
    found = compare_across(PAPER, job, wan)
    single = compare_across(PAPER, job, fabric(crossClusterGbps=1, crossClusterLatencyMs=30))
    assert found.pick == single.pick == "replicas"
    assert found.exchange_s == pytest.approx(single.exchange_s, rel=1e-12)
    assert "over the link east-west at 1 Gbit/s, 30 ms" in found.lines[1]
    assert "boundary 0|1 over east-west at 1 Gbit/s, 30 ms" in found.lines[0]


def test_with_three_clusters_the_replicas_ring_is_priced_at_its_slowest_hop():
    nodes = [node(f"{c}-{i}", "infiniband", c, labels={"pool": "llm"}) for c in "abc" for i in (1, 2, 3, 4)]
    job = across_job(12, batch=1536, innerSteps=20)  # 512 sequences per replica
    one_slow = compare_across(nodes, job, fabric(links=[link("b", "c", 1, 5)]))
    fast = compare_across(nodes, job, fabric())
    assert one_slow.replicas == 3
    # the ring a -> b -> c -> a crosses b-c: its exchange runs at 1 Gbit/s, not the default 25
    assert one_slow.exchange_s > 20 * fast.exchange_s
    assert "ring a -> b -> c -> a, priced at its slowest hop b-c at 1 Gbit/s, 5 ms" in one_slow.lines[1]
    # the ring waits on its slowest hop's bandwidth and, at every step, its longest latency
    far = compare_across(nodes, job, fabric(links=[link("a", "c", 25, 40), link("a", "b", 10, 0)]))
    assert "slowest hop a-b at 10 Gbit/s, 0 ms and its longest latency, 40 ms" in far.lines[1]
