"""spec.training.acrossIslands.mode replicas through the reconcile state machine (the fake world):
one replica per cluster launched as one gang, status.replicas from each replica's rank 0, a lost
pod of one replica restarts the gang (each replica resumes from its own checkpoint), and what
stays refused (member clusters, frameworks other than holmes)."""

from __future__ import annotations

from dataclasses import replace

from holmes.contract import JobSpec, load_job
from holmes.contract.names import ENV_REPLICA
from holmes.operator.core import child_names, queueing, replicas
from holmes.operator.core.template import TemplatePolicy
from holmes.operator.core.validation import refusal
from holmes.plan import CostModelConfig
from holmes.plan.across_plan import compare_across
from holmes.plan.costmodel_file import CostModelFile
from tests.helpers.contract.spec_helpers import minimal_spec
from tests.helpers.operator.opfixtures import FakeWorld, default_nodes, manifest, with_link_layers

TRAINING = {"globalBatchSize": 12, "microBatchSize": 1, "iterations": 20, "learningRate": 1.0e-3}


def replica_job(mode="replicas", **more):
    m = manifest(
        count=6, gpus=2, training=dict(TRAINING, acrossIslands={"mode": mode, "innerSteps": 5}), **more
    )
    return m


def world(mode="replicas", **more):
    return FakeWorld(replica_job(mode, **more), with_link_layers(default_nodes()))


def replica_of(pod):
    return int(pod["metadata"]["labels"][child_names.LABEL_REPLICA])


def test_one_gang_of_two_replicas_one_per_cluster_with_status_per_replica():
    w = world()
    d = w.step()
    assert sorted(p["metadata"]["name"] for p in d.create_pods) == [f"tiny-1-{i}" for i in range(6)]
    plan = replicas.read_plan(w.configmap["data"])
    assert plan is not None and plan.clusters == ("east", "west")
    clusters = {n["metadata"]["name"]: n["metadata"]["labels"]["holmes.dev/cluster"] for n in w.nodes}
    for p in w.pods.values():
        node = p["metadata"]["annotations"][child_names.ANN_NODE]
        assert clusters[node] == plan.clusters[replica_of(p)]
    assert w.status["layout"]["nodes"] == 6 and w.status["launched"]
    assert [r["cluster"] for r in w.status["replicas"]] == ["east", "west"]
    planned = next(e for e in w.events if e.reason == "Planned")
    assert "2 replicas, one per cluster" in planned.message

    w.set_phase("Running")
    w.step(
        progress={
            "iteration": 10,
            "outerStep": 2,
            "loss": 3.0,
            replicas.REPLICAS_READ: {
                0: {"iteration": 10, "outerStep": 2},
                1: {"iteration": 9, "outerStep": 1},
            },
        }
    )
    assert w.status["phase"] == "Running"
    assert w.status["progress"]["outerStep"] == 2 and "replicas" not in w.status["progress"]
    assert [(r["iteration"], r["outerStep"]) for r in w.status["replicas"]] == [(10, 2), (9, 1)]
    # a read that reaches only replica 0 keeps replica 1's last numbers
    w.step(seconds=10, progress={"iteration": 11, replicas.REPLICAS_READ: {0: {"iteration": 11}}})
    assert [r["iteration"] for r in w.status["replicas"]] == [11, 9]


def test_a_deleted_pod_of_one_replica_restarts_the_gang_in_the_same_replicas():
    w = world()
    w.step()
    w.set_phase("Running")
    w.step()
    victim = next(n for n, p in w.pods.items() if replica_of(p) == 1)
    del w.pods[victim]
    w.step()
    assert w.status["phase"] == "Restarting" and w.status["restarts"] == 1
    w.step()  # the previous attempt's pods are gone: the next one launches
    assert sorted(w.pods) == [f"tiny-2-{i}" for i in range(6)] and w.status["launched"]
    assert sorted({replica_of(p) for p in w.pods.values()}) == [0, 1]


def test_a_launch_cut_short_resumes_its_replicas_from_the_configmap_without_duplicates():
    w = world()
    w.step()
    before = dict(w.configmap["data"])
    # the operator died after the ConfigMap and three pods, before the status patch
    w.job.pop("status")
    for n in ("tiny-1-3", "tiny-1-4", "tiny-1-5"):
        w.pods.pop(n)
    d = w.step()
    assert sorted(p["metadata"]["name"] for p in d.create_pods) == ["tiny-1-3", "tiny-1-4", "tiny-1-5"]
    assert w.configmap["data"] == before
    assert {replica_of(w.pods[n]) for n in ("tiny-1-3", "tiny-1-4", "tiny-1-5")} == {1}


def link(gbps, latency_ms=0.0):
    cfg = CostModelConfig()
    return CostModelFile(
        base=replace(
            cfg, fabric=replace(cfg.fabric, cross_cluster_gbps=gbps, cross_cluster_latency_ms=latency_ms)
        )
    )


def replica_envs(w):
    return [any(e["name"] == ENV_REPLICA for e in p["spec"]["containers"][0]["env"]) for p in w.pods.values()]


BIGGER = {"layers": 8, "hiddenSize": 1024, "attentionHeads": 8, "seqLength": 512, "vocabSize": 1024}


def test_auto_follows_the_planners_verdict_replicas_or_the_pipeline():
    """On a 10 Mbit/s link the tiny model's exchange is cheap (replicas) and the bigger one's
    costs more than the pipeline's activations: the operator runs whichever holmes plan picks."""
    runs = {}
    for name, model in (("tiny", None), ("bigger", BIGGER)):
        w = world("auto", **({"model": BIGGER} if model else {}))
        w.cost_model = link(0.01, latency_ms=20)
        verdict = compare_across(w.nodes, JobSpec.from_manifest(w.job), w.cost_model.config)
        w.step()
        ran = "replicas" if replicas.read_plan(w.configmap["data"]) is not None else "pipeline"
        assert ran == verdict.pick and w.pods
        assert all(replica_envs(w)) if ran == "replicas" else not any(replica_envs(w))
        assert ("replicas" in w.status) == (ran == "replicas")
        runs[name] = ran
    assert runs == {"tiny": "replicas", "bigger": "pipeline"}  # both paths taken


def test_a_batch_the_replicas_cannot_share_stalls_naming_the_field():
    m = replica_job()
    m["spec"]["training"]["globalBatchSize"] = 7
    w = FakeWorld(m, with_link_layers(default_nodes()))
    w.step()
    stalled = w.condition("Stalled")
    assert (
        stalled["status"] == "True"
        and "globalBatchSize 7 does not split into 2 replicas" in stalled["message"]
    )
    assert not w.pods


def refused(mode, members=False, framework=None):
    spec = minimal_spec()
    spec["training"]["acrossIslands"] = {"mode": mode}
    if framework:
        spec["framework"] = framework
        container = {"name": "trainer", "image": "me/train:1", "command": ["python", "train.py"]}
        spec["template"] = {"spec": {"containers": [container]}}
    m = {"apiVersion": "holmes.dev/v1alpha1", "kind": "HolmesJob", "metadata": {"name": "j"}, "spec": spec}
    return refusal(m, load_job(m), TemplatePolicy(), members, False)


def test_replicas_are_refused_only_across_member_clusters_and_for_other_frameworks():
    assert refused("replicas") is None and refused("auto") is None and refused("pipeline") is None
    reason, message = refused("replicas", members=True)
    assert reason == "InvalidSpec" and "across member clusters" in message and "mode pipeline" in message
    reason, message = refused("replicas", framework="torchrun")
    assert reason == "InvalidSpec" and "spec.framework torchrun" in message
    assert refused("auto", members=True) is None  # auto runs the pipeline there


def test_replicas_under_volcano_wait_uncreated_until_their_one_podgroup_is_admitted():
    """Every replica's pods form one Volcano gang: none is created before Volcano admits it."""
    w = world(template={"spec": {"schedulerName": "volcano"}})
    w.step()
    assert not w.pods and w.podgroup["spec"]["minMember"] == 6
    assert w.condition("Reconciling")["reason"] == "WaitingForPodGroup"
    w.volcano_sets("Inqueue")
    w.step()
    assert len(w.pods) == 6 and w.status["launched"]
    group = w.podgroup["metadata"]["name"]
    assert all(p["metadata"]["annotations"][queueing.ANN_GROUP] == group for p in w.pods.values())


def test_a_queued_job_of_replicas_asks_kueue_for_each_replicas_pods_on_its_island():
    w = world()
    w.job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    w.flavors = {}
    w.step()
    sets = {
        ps["name"]: (ps["count"], ps["template"]["spec"]["nodeSelector"])
        for ps in w.workload["spec"]["podSets"]
    }
    assert sets == {
        "east": (1, {"holmes.dev/cluster": "east"}),  # the Ethernet node
        "east-2": (2, {"holmes.dev/cluster": "east"}),  # the RDMA nodes, with their device
        "west": (1, {"holmes.dev/cluster": "west"}),
        "west-2": (2, {"holmes.dev/cluster": "west"}),
    }
