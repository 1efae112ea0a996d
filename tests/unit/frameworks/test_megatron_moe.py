"""A mixture of experts handed to Megatron-LM and torchtitan as their own flags: the expert groups
the Layout derives are megatron-core's own (its RankGenerator), every expert group megatron-core
creates is named in the communicator file, the flags build megatron-core's TransformerConfig and
parse as torchtitan's ParallelismConfig (the real packages, megatron-core 0.16.1, torchtitan 0.3.0)."""

import re
from pathlib import Path

import yaml

from holmes.contract import Layout
from holmes.operator.core import framework_launch as fw
from holmes.plan.planner import plan
from tests.helpers.frameworks.framework_helpers import (
    MEGATRON,
    job,
    launched,
    pod_argv,
    small_config,
    titan_config,
)
from tests.helpers.plan.moe_helpers import moe_job, three_islands
from tests.helpers.plan.plan_helpers import paper_nodes

EXPERT_GROUPS = {"ep", "ep_tp", "ep_dp", "tp_ep_mp", "tp_ep_pp"}


def moe_render_job(**parallelism):
    m = job(pipeline=3, command=[*MEGATRON, "--disable-bias-linear"])  # megatron-core: MoE biases need ETP 1
    m["spec"]["model"]["architecture"] = "llama"
    m["spec"]["model"]["moe"] = {"experts": 4, "expertsPerToken": 2, "sharedExperts": 1}
    m["spec"]["parallelism"].update(sequenceParallel=True, **parallelism)
    m["spec"]["nodes"]["clusterLabel"] = "kubernetes.io/os"  # one site: an island is a NIC kind
    return m


def test_the_layouts_expert_groups_are_megatron_cores():
    from megatron.core.parallel_state import RankGenerator

    for nodes, count, pipeline in ((paper_nodes, 8, 2), (three_islands, 12, 3)):
        layout = plan(nodes(), moe_job("mixtral", count, pipeline=pipeline))
        T, D, P, E = layout.tensor, layout.data, layout.pipeline, layout.expert
        gen = RankGenerator(tp=T, ep=E, dp=D // E, pp=P, cp=1, order="tp-cp-ep-dp-pp")
        ours = sorted(g.ranks for g in layout.process_groups("ep"))
        assert E > 1 and ours == sorted(tuple(r) for r in gen.get_ranks("ep"))
        dense = RankGenerator(tp=T, ep=1, dp=D, pp=P, cp=1, order="tp-cp-ep-dp-pp")
        assert sorted(g.ranks for g in layout.process_groups("dp")) == sorted(
            map(tuple, dense.get_ranks("dp"))
        )


def test_every_group_megatron_core_creates_is_named_in_the_communicator_file():
    import megatron.core.parallel_state as ps

    created = set(re.findall(r'get_nccl_options\("([a-z_]+)"', Path(ps.__file__).read_text()))
    assert EXPERT_GROUPS <= created  # the names checked against the installed megatron-core
    layout = plan(paper_nodes(), moe_job("mixtral", pipeline=2))
    for s, stage in enumerate(layout.stages):
        cfg = fw.megatron_nccl_config(layout, s)
        missing = created - set(cfg) - {"cp", "hcp", "intra_dp_cp", "pos_embd"}  # context parallel: refused
        assert not missing, missing
        nets = {k: v["net_name"] for k, v in cfg.items()}
        assert nets["ep"] == nets["ep_dp"] == nets["tp_ep_mp"] == stage.dp_net  # its island
        assert nets["tp_ep_pp"] == nets["pp"] == "Socket"  # across the islands


def test_megatron_gets_the_experts_as_its_own_flags_and_builds_its_config():
    w, d = launched(moe_render_job(expert=2))
    assert d.create_pods, w.reasons()
    layout = Layout.from_json(d.configmap["data"]["layout.json"])
    assert layout.expert == 2
    for pod in d.create_pods:
        argv = pod_argv(pod)
        pairs = dict(zip(argv[::2], argv[1::2])) | {a: b for a, b in zip(argv[1::2], argv[2::2])}
        assert pairs["--num-experts"] == "4" and pairs["--expert-model-parallel-size"] == "2"
        assert pairs["--moe-router-topk"] == "2" and pairs["--moe-ffn-hidden-size"] == "256"
        assert pairs["--moe-shared-expert-intermediate-size"] == "256"
        cfg = small_config(pod)
        assert (cfg.num_moe_experts, cfg.expert_model_parallel_size, cfg.moe_router_topk) == (4, 2, 2)
        assert cfg.sequence_parallel and cfg.moe_shared_expert_intermediate_size == 256
    stage_file = yaml.safe_load(d.configmap["data"]["megatron-nccl-stage-0.yaml"])
    assert EXPERT_GROUPS <= set(stage_file)


def test_an_expert_flag_contradicting_the_plan_stalls_with_both_values():
    m = moe_render_job(expert="auto")
    m["spec"]["template"]["spec"]["containers"][0]["command"] += ["--expert-model-parallel-size", "8"]
    w, d = launched(m)
    stalled = w.condition("Stalled")
    assert stalled["reason"] == "InvalidSpec" and not d.create_pods
    assert (
        "--expert-model-parallel-size 8" in stalled["message"]
        and "expert-parallel size" in stalled["message"]
    )


def test_torchtitan_gets_its_expert_degree():
    layout = plan(paper_nodes(), moe_job("mixtral", pipeline=2))
    par = titan_config(fw.torchtitan_args(layout)).parallelism
    assert par.expert_parallel_degree == layout.expert * layout.tensor
    assert (par.data_parallel_shard_degree * par.tensor_parallel_degree) % par.expert_parallel_degree == 0


def test_an_expert_group_across_clusters_is_refused_by_name():
    m = moe_render_job(expert=2)
    del m["spec"]["nodes"]["clusterLabel"]  # the two Ethernet nodes sit in two clusters
    w, d = launched(m)
    msg = w.condition("Stalled")["message"]
    assert not d.create_pods and "expert group on eth-0, eth-1 would span islands" in msg
    assert "no layout keeps every expert group on one island" in msg
