"""Issue 41's operator step on the real local control plane: a job with
``acrossIslands.mode: replicas`` on two islands (ib-0 in cluster east, roce-0 in west) runs one
replica per island, each its own torch world meeting the other every innerSteps steps in the
outer group; one island's pod is deleted mid-run; the gang restarts, each replica resumes from
its own checkpoint (the one the stopping trainers wrote on SIGTERM, else its last interval's),
the replicas agree on the furthest one's weights, and the job trains to Succeeded with
status.replicas showing both replicas' last iteration and outer step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from holmes_dev.jobs import holmes_job

from tests.helpers.operator.cluster_helpers import apply, pods_of, slow_trainers, wait_for, wait_phase

pytestmark = pytest.mark.timeout(480)

ITERATIONS, INNER, INTERVAL = 32, 4, 8
ISLANDS = {"east": "ib-0", "west": "roce-0"}


def manifest(ns: str, shared: Path, grace: int = 30) -> dict:
    spec = {
        "model": {"layers": 2, "hiddenSize": 32, "attentionHeads": 4, "seqLength": 16, "vocabSize": 64},
        "training": {
            "globalBatchSize": 2,  # one sequence per replica and iteration
            "microBatchSize": 1,
            "iterations": ITERATIONS,
            "learningRate": 1.0e-3,
            "data": {"synthetic": {}},
            "checkpoint": {"path": "/ckpt", "intervalIterations": INTERVAL},
            "acrossIslands": {"mode": "replicas", "innerSteps": INNER},
        },
        "nodes": {
            "count": 2,
            "gpusPerNode": 1,
            "selector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": list(ISLANDS.values())}
                ]
            },
        },
        "runPolicy": {"backoffLimit": 0},  # a deletion is a disruption, never a counted failure
        "template": {
            "spec": {
                "terminationGracePeriodSeconds": grace,
                "containers": [
                    {
                        "name": "trainer",
                        # the node agent expands $(VAR) as the kubelet does: one file per replica
                        "args": ["--metrics-file", "/ckpt/metrics-$(HOLMES_REPLICA).jsonl"],
                        "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
                    }
                ],
                "volumes": [{"name": "ckpt", "hostPath": {"path": str(shared)}}],
            }
        },
    }
    slow_trainers(spec["template"]["spec"], list(ISLANDS.values()), 0.1)  # the deletion lands mid-run
    return holmes_job("diloco", spec, ns)


def lines(shared: Path, replica: int) -> list[dict]:
    path = shared / f"metrics-{replica}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


@pytest.mark.parametrize("force", [False, True], ids=["graceful", "forced"])
def test_replicas_on_two_islands_survive_a_lost_pod_and_resume_from_their_checkpoints(
    cluster, namespace, host_path_operator, shared_dir, force
):
    """graceful: the deleted pod and the gang's others stop on SIGTERM and save where they are, so
    no iteration is trained twice. forced (grace 0): the deleted replica resumes from its last
    interval checkpoint, the other from its SIGTERM save; at start the replicas take the weights
    of the one furthest on, so both go on from there and neither loses more than that."""
    op, shared = host_path_operator, shared_dir
    # forced: the other replica is by then blocked in the outer all-reduce with the killed one
    # and stops only at its grace period's SIGKILL (it resumes from its interval checkpoint,
    # which the assertions allow), so a long grace there is only waiting
    apply(cluster, manifest(namespace, shared, grace=10 if force else 30))

    def both_checkpointed():  # each replica's rank 0 has saved at least once
        saved = [[x for x in lines(shared, r) if x["holmes"] == "checkpoint"] for r in (0, 1)]
        return saved if all(saved) else None

    wait_for("a checkpoint of each replica", both_checkpointed, timeout=240, op=op)
    pods = pods_of(cluster, namespace, "diloco")
    assert {p["metadata"]["labels"]["holmes.dev/replica"] for p in pods} == {"0", "1"}
    west = next(p for p in pods if p["metadata"]["labels"]["holmes.dev/replica"] == "1")
    assert west["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"][0]["values"] == [ISLANDS["west"]]
    before = {r: max(x["iteration"] for x in lines(shared, r) if x["holmes"] == "iteration") for r in (0, 1)}
    how = ["--grace-period=0", "--force"] if force else []
    cluster.kubectl("delete", "pod", "-n", namespace, west["metadata"]["name"], "--wait=false", *how)
    done = wait_phase(cluster, namespace, "diloco", "Succeeded", timeout=300, op=op)
    st = done["status"]
    assert st["restartsByReason"] == {"disruption": 1}, st
    assert st["progress"]["iteration"] == ITERATIONS and st["progress"]["outerStep"] == ITERATIONS // INNER
    assert [(r["cluster"], r["iteration"], r["outerStep"]) for r in st["replicas"]] == [
        ("east", ITERATIONS, ITERATIONS // INNER),
        ("west", ITERATIONS, ITERATIONS // INNER),
    ], st["replicas"]

    report, went_on = {}, set()
    for r in (0, 1):
        got = lines(shared, r)
        starts = [i for i, x in enumerate(got) if x["holmes"] == "start"]
        assert len(starts) == 2, [x["holmes"] for x in got]
        at = next(i for i, x in enumerate(got) if x["holmes"] == "resume")  # the second attempt's first
        assert starts[0] < at < starts[1]
        first, second = got[:at], got[at:]
        ran_to = max(x["iteration"] for x in first if x["holmes"] == "iteration")
        resume = second[0]
        again = [x["iteration"] for x in second if x["holmes"] == "iteration"]
        assert again == list(range(again[0], ITERATIONS + 1))
        # a checkpoint of this replica's own (SIGTERM's where it was, else the last interval's)
        assert resume["iteration"] == ran_to or resume["iteration"] % INTERVAL == 0, (r, ran_to, resume)
        assert ran_to - resume["iteration"] <= INTERVAL
        went_on.add(again[0] - 1)
        report[r] = {
            "deletedAt": before[r],
            "ranTo": ran_to,
            "resumedFrom": resume["iteration"],
            "wentOnFrom": again[0] - 1,
        }
    # both replicas went on from the furthest checkpoint: at most the iterations since it are redone
    (start,) = went_on
    assert start == max(v["resumedFrom"] for v in report.values())
    assert max(v["ranTo"] for v in report.values()) - start <= INTERVAL
    print(f"replicas across a lost pod ({'forced' if force else 'graceful'}):", json.dumps(report))
