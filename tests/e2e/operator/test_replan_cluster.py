"""Re-planning on the real local control plane: one node's trainer runs genuinely slower (a
test-only sitecustomize sleeps before each of its transformer blocks), the operator reads the
measured stage times from the trainer, re-plans exactly once, the gang resumes in the new layout
from the checkpoint the stopping trainers wrote, the loss follows the single-process reference
through both layouts, and no second re-plan follows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from holmes_dev.jobs import holmes_job

from holmes.trainer.config import TrainConfig
from tests.helpers.operator.cluster_helpers import (
    apply,
    condition,
    events_of,
    get_job,
    slow_trainers,
    wait_for,
    wait_phase,
)
from tests.helpers.trainer.trainer_harness import reference

pytestmark = pytest.mark.timeout(420)

ITERATIONS = 20
SLOW_NODE = "roce-0"
# 0.3 s of sleep before each of its blocks' forwards makes roce-0 several times slower than ib-0
# however loaded the machine is, so the first calibration already finds the best split (the
# slow node down to one layer) and a second re-plan has nothing left to gain


def manifest(ns: str, shared: Path) -> dict:
    spec = {
        "model": {"layers": 6, "hiddenSize": 32, "attentionHeads": 4, "seqLength": 16, "vocabSize": 64},
        "training": {
            "globalBatchSize": 2,  # two micro-batches of one: the least 1F1B over two stages takes
            "microBatchSize": 1,
            "iterations": ITERATIONS,
            "learningRate": 1.0e-3,
            "activationRecompute": False,
            "data": {"synthetic": {}},
            "checkpoint": {"path": "/ckpt", "intervalIterations": 1000},  # only the stop's own
        },
        "parallelism": {"pipeline": 2},  # replan: on by default (partition adaptive)
        "nodes": {
            "count": 2,
            "gpusPerNode": 1,
            "selector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["ib-0", SLOW_NODE]}
                ]
            },
        },
        "runPolicy": {"backoffLimit": 0},
        "template": {
            "spec": {
                "terminationGracePeriodSeconds": 30,
                "containers": [
                    {
                        "name": "trainer",
                        "args": ["--metrics-file", "/ckpt/metrics.jsonl"],
                        "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
                    }
                ],
                "volumes": [{"name": "ckpt", "hostPath": {"path": str(shared)}}],
            }
        },
    }
    slow_trainers(spec["template"]["spec"], [SLOW_NODE], 0.3)
    return holmes_job("adapt", spec, ns)


def test_a_slow_island_is_replanned_once_and_the_loss_follows_the_reference(
    cluster, namespace, host_path_operator, shared_dir
):
    op, shared = host_path_operator, shared_dir
    job = manifest(namespace, shared)
    apply(cluster, job)
    first = wait_for(
        "the first layout",
        lambda: (get_job(cluster, namespace, "adapt") or {}).get("status", {}).get("layout"),
        op=op,
    )
    slow_before = next(s for s in first["stages"] if SLOW_NODE in s["nodes"])
    before = slow_before["layers"][1] - slow_before["layers"][0]
    done = wait_phase(cluster, namespace, "adapt", "Succeeded", timeout=360, op=op)
    st = done["status"]
    # exactly one re-plan, a restart of its own kind (backoffLimit 0 was never touched)
    assert st["restartsByReason"] == {"replan": 1}, st
    assert st["adaptation"]["replans"] == 1 and len(st["adaptation"]["tried"]) == 2
    slow_after = next(s for s in st["layout"]["stages"] if SLOW_NODE in s["nodes"])
    assert slow_after["layers"][1] - slow_after["layers"][0] < before  # the slow node gave layers away
    # one decision (its Event with the numbers; the phase change Running -> Restarting has its own)
    replanned = [
        e
        for e in events_of(cluster, namespace, "adapt")
        if e["reason"] == "Replanned" and "re-planned to" in e["message"]
    ]
    assert len(replanned) == 1 and "estimated" in replanned[0]["message"], replanned
    cond = condition(done, "Replanned")
    assert cond["status"] == "False" and cond["reason"] == "PlanHolds", cond  # judged again: holds

    # the trainer's own lines, both attempts: a resume in the new layout from the stop's checkpoint
    lines = [json.loads(x) for x in (shared / "metrics.jsonl").read_text().splitlines()]
    starts = [x for x in lines if x["holmes"] == "start"]
    assert len(starts) == 2 and starts[0]["layout"]["stageLayers"] != starts[1]["layout"]["stageLayers"]
    preempted = next(x for x in lines if x["holmes"] == "preempted")
    resume = next(x for x in lines if x["holmes"] == "resume")
    assert preempted["saved"] and resume["iteration"] == preempted["iteration"] and resume["layoutChanged"]
    # layout-independent resume: every iteration's loss, in either layout, is the reference's
    ref_losses = reference(TrainConfig.from_job(job))[0]
    its = [x for x in lines if x["holmes"] == "iteration"]
    assert {x["iteration"] for x in its} == set(range(1, ITERATIONS + 1))
    for x in its:
        assert x["loss"] == pytest.approx(ref_losses[x["iteration"] - 1], abs=2e-4), x["iteration"]
