"""acrossIslands replicas, rendered: one replica per cluster of the local testbed's nodes (east,
west), each its own torch world with its own rendezvous, the outer group's address, the layout
ConfigMap holding every replica's layout, and status.replicas from each replica's progress."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from holmes.contract import JobSpec, Layout
from holmes.contract.names import ENV_OUTER_ADDR, ENV_REPLICA, ENV_REPLICAS
from holmes.operator.core import child_names, replicas
from holmes.operator.core.routes import job_routes
from holmes.plan import PlanError
from tests.helpers.operator.opfixtures import default_nodes, manifest, with_link_layers
from tests.helpers.operator.render_helpers import FACTS, REF, SETTINGS

NODES = with_link_layers(default_nodes())
BY_NAME = {n["metadata"]["name"]: n for n in NODES}
CFG = FACTS.cost_model


def spec(count=6, mode="replicas", **across):
    m = manifest(count=count, gpus=2)
    m["spec"]["training"]["globalBatchSize"] = 12  # 6 per replica
    m["spec"]["training"]["acrossIslands"] = {"mode": mode, **across}
    return JobSpec.from_manifest(m)


def env_of(pod):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def rendered(settings=SETTINGS):
    s = spec()
    plan = replicas.plan_replicas(s, NODES, CFG)
    nets = {n: FACTS.network(BY_NAME[n]) for n in plan.nodes}
    routes = {}
    for lay in plan.layouts:
        routes.update(job_routes(s, lay, {n: nets[n] for n in lay.nodes}))
    pods = replicas.build_pods(
        REF, plan, routes=routes, template=None, settings=settings, hostname_labels={n: n for n in plan.nodes}
    )
    return s, plan, pods


def test_one_replica_per_cluster_each_on_its_own_clusters_nodes_and_with_its_share_of_the_batch():
    s, plan, _ = rendered()
    assert plan.clusters == ("east", "west")
    for cluster, lay in zip(plan.clusters, plan.layouts):
        assert {BY_NAME[n]["metadata"]["labels"]["holmes.dev/cluster"] for n in lay.nodes} == {cluster}
        assert lay.data * lay.micro_batches * lay.micro_batch_size == s.training.global_batch_size // 2
    assert len(set(plan.nodes)) == len(plan.nodes) == 6


def test_each_replica_is_a_world_of_its_own_with_its_rendezvous_and_the_outer_groups_address():
    _, plan, pods = rendered()
    assert [p["metadata"]["name"] for p in pods] == [f"tiny-3-{i}" for i in range(6)]
    first_of = {r: plan.first(r) for r in range(2)}
    outer = {env_of(p)[ENV_OUTER_ADDR] for p in pods}
    assert outer == {f"tiny-3-0.tiny.ns.svc:{SETTINGS.master_port + 1}"}  # replica 0's first pod
    for p in pods:
        env = env_of(p)
        r = int(env[ENV_REPLICA])
        lay = plan.layouts[r]
        assert env[ENV_REPLICAS] == "2" and p["metadata"]["labels"][child_names.LABEL_REPLICA] == str(r)
        assert env["MASTER_ADDR"] == f"tiny-3-{first_of[r]}.tiny.ns.svc"  # the replica's own rank 0
        assert env["WORLD_SIZE"] == str(lay.world_size) and env["NNODES"] == str(len(lay.nodes))
        local = int(p["metadata"]["labels"][child_names.LABEL_NODE_RANK]) - first_of[r]
        assert env["NODE_RANK"] == str(local)
        assert lay.nodes[local] == p["metadata"]["annotations"]["holmes.dev/node"]
        assert env["HOLMES_LAYOUT"] == f"/etc/holmes/layout-{r}.json"
        command = p["spec"]["containers"][0]["command"]
        assert command[command.index("--layout") + 1] == f"/etc/holmes/layout-{r}.json"


def test_pods_on_one_host_network_get_distinct_ports_per_replica_and_for_the_outer_store():
    ranged = replace(SETTINGS, port_range=(20000, 20099))
    _, plan, pods = rendered(ranged)
    ports = {}
    for p in pods:
        env = env_of(p)
        ports[int(env[ENV_REPLICA])] = (int(env["MASTER_PORT"]), int(env["HOLMES_METRICS_PORT"]))
    outer = int(env_of(pods[0])[ENV_OUTER_ADDR].rsplit(":", 1)[1])
    used = [*ports[0], *ports[1], outer]
    assert len(set(used)) == 5 and all(20000 <= x <= 20099 for x in used)


def test_the_configmap_holds_every_replicas_layout_and_the_table_reads_back():
    s, plan, _ = rendered()
    cm = replicas.build_configmap(REF, plan, s)
    for r, lay in enumerate(plan.layouts):
        assert Layout.from_json(cm["data"][f"layout-{r}.json"]) == lay
    assert Layout.from_json(cm["data"]["layout.json"]) == plan.layouts[0]
    assert [row["cluster"] for row in json.loads(cm["data"]["replicas.json"])] == ["east", "west"]
    assert replicas.read_plan(cm["data"]) == plan
    assert replicas.read_plan({"layout.json": "{}"}) is None
    # each replica's trainer reads its own world's job: its share of the batch (12 over 2)
    share = JobSpec.from_spec(yaml.safe_load(cm["data"]["job.yaml"])["spec"])
    assert share.training.global_batch_size == 6 and share.model == s.model
    assert all(lay.micro_batch_size * lay.micro_batches * lay.data == 6 for lay in plan.layouts)


def test_auto_follows_the_planners_verdict_and_one_cluster_is_the_pipeline():
    slow = replace(CFG, fabric=replace(CFG.fabric, cross_cluster_gbps=0.01, cross_cluster_latency_ms=50))
    assert replicas.choose(spec(mode="auto"), NODES, slow) == "replicas"
    east = [n for n in NODES if n["metadata"]["labels"]["holmes.dev/cluster"] == "east"]
    assert replicas.choose(spec(count=3, mode="auto"), east, slow) == "pipeline"
    assert replicas.choose(spec(mode="pipeline"), NODES, slow) == "pipeline"
    assert replicas.choose(spec(mode="replicas"), east, CFG) == "replicas"


def test_a_batch_that_does_not_split_into_the_replicas_is_refused_naming_the_fix():
    m = manifest(count=6, gpus=2)
    m["spec"]["training"]["globalBatchSize"] = 7
    m["spec"]["training"]["acrossIslands"] = {"mode": "replicas"}
    with pytest.raises(PlanError, match="globalBatchSize 7 does not split into 2 replicas.*multiple of 2"):
        replicas.plan_replicas(JobSpec.from_manifest(m), NODES, CFG)


def test_status_shows_each_replicas_iteration_and_last_outer_step():
    _, plan, _ = rendered()
    rows = replicas.replica_status(plan, {0: {"iteration": 12, "outerStep": 3, "loss": 1.0}, 1: {}})
    assert rows == [
        {"replica": 0, "cluster": "east", "nodes": 3, "iteration": 12, "outerStep": 3},
        {"replica": 1, "cluster": "west", "nodes": 3},
    ]


def test_nodes_count_is_the_whole_jobs_and_each_replica_takes_its_share():
    plan = replicas.plan_replicas(spec(count=4), NODES, CFG)
    assert [len(lay.nodes) for lay in plan.layouts] == [2, 2]
    with pytest.raises(PlanError, match="spec.nodes.count 1 gives no node to each of 2 replicas"):
        replicas.plan_replicas(spec(count=1), NODES, CFG)
