"""The reconcile state machine as data: observed objects in, status + actions out."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from holmes.contract.layout import Layout
from holmes.operator.core import child_names
from holmes.operator.core.reconcile import ChildRefusal, RestartBackoff
from holmes.operator.core.render import RenderSettings
from holmes.operator.core.summary import iso
from tests.helpers.operator.opfixtures import FakeWorld, default_nodes, manifest, true_nic, with_link_layers


def launched(world: FakeWorld) -> FakeWorld:
    world.step()
    assert world.status["launched"] and len(world.pods) == world.job["spec"]["nodes"]["count"]
    return world


def test_first_reconcile_plans_writes_layout_and_creates_one_pod_per_planned_node():
    w = FakeWorld(manifest(count=4))
    d = w.step()
    layout = Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE])
    assert [p["metadata"]["name"] for p in d.create_pods] == [f"tiny-1-{r}" for r in range(4)]
    placed = [
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ][0]["matchExpressions"][0]["values"][0]
        for p in d.create_pods
    ]
    assert placed == list(layout.nodes)
    assert w.service["spec"]["clusterIP"] == "None"
    assert w.status["phase"] == "Pending" and w.status["attempt"] == 1 and w.status["restarts"] == 0
    assert w.status["layout"]["shape"] == f"{layout.pipeline}x{layout.data}x{layout.tensor}"
    assert {"Planned", "Launched"} <= set(w.reasons())
    assert w.condition("Reconciling")["status"] == "True" and w.condition("Ready")["status"] == "False"


def test_dp_groups_in_status_each_span_one_nic_kind():
    nodes = with_link_layers(default_nodes())
    w = FakeWorld(
        manifest(
            count=6,
            gpus=2,
            training={"globalBatchSize": 12, "microBatchSize": 1, "iterations": 5, "learningRate": 1.0e-3},
        ),
        nodes,
    )
    w.step()
    truth = true_nic(nodes)
    for g in w.status["layout"]["dpGroups"]:
        stage = w.status["layout"]["stages"][g["stage"]]
        assert len(g["nics"]) == 1, g
        assert {truth[n] for n in stage["nodes"]} == set(g["nics"])
        assert g["net"] == ("Socket" if g["nics"] == ["ethernet"] else "IB")


def test_running_then_succeeded_with_progress():
    w = launched(FakeWorld(manifest()))
    w.set_phase("Running")
    w.step(progress={"iteration": 3, "loss": 4.2, "tokensPerSecond": 100.0, "tflopsPerGpu": 0.01})
    assert w.status["phase"] == "Running" and w.condition("Ready")["status"] == "True"
    assert w.status["progress"]["iteration"] == 3
    w.set_phase("Succeeded")
    w.step()
    assert w.status["phase"] == "Succeeded" and w.status["completionTime"]
    assert w.condition("Succeeded")["status"] == "True"
    assert w.status["progress"]["loss"] == 4.2  # kept from the last read
    assert len(w.pods) == 4  # finished pods stay for inspection


def test_a_steady_running_job_has_nothing_to_patch_until_its_numbers_change():
    """The status is patched only when it changes: reads with the same numbers (or none) leave
    it equal, updateTime included; new numbers move updateTime."""
    w = launched(FakeWorld(manifest()))
    w.set_phase("Running")
    numbers = {"iteration": 3, "loss": 4.2, "tokensPerSecond": 100.0}
    w.step(progress=numbers)
    before = copy.deepcopy(w.status)
    w.step(seconds=10, progress=dict(numbers))
    w.step(seconds=10)
    assert w.status == before
    d = w.step(seconds=10, progress={"iteration": 4, "loss": 4.1, "tokensPerSecond": 100.0})
    assert w.status["progress"]["updateTime"] > before["progress"]["updateTime"]
    assert {k: v for k, v in w.status.items() if k != "progress"} == {
        k: v for k, v in before.items() if k != "progress"
    }
    assert d.requeue_after == RenderSettings().progress_interval and not d.events


def test_fabric_warnings_land_in_progress_with_one_event_per_distinct_set():
    w = launched(FakeWorld(manifest()))
    w.set_phase("Running")
    bad = ["rank 1 on node node-1: dp group (2 ranks) expects IB, found NCCL using Socket"]
    d = w.step(progress={"iteration": 1, "loss": 4.0, "fabricWarnings": bad})
    assert w.status["progress"]["fabricWarnings"] == bad
    (e,) = [e for e in d.events if e.reason == "FabricMismatch"]
    assert e.type == "Warning" and e.message == bad[0]
    d = w.step(progress={"iteration": 2, "loss": 3.9, "fabricWarnings": bad})
    assert not [e for e in d.events if e.reason == "FabricMismatch"]


def test_pod_failure_restarts_the_whole_gang_and_counts_it():
    w = launched(FakeWorld(manifest()))
    w.set_phase("Running")
    w.step()
    w.set_phase("Failed", "tiny-1-2", exit_code=137)
    d = w.step()
    assert w.status["phase"] == "Restarting" and w.status["restarts"] == 1 and w.status["attempt"] == 2
    assert sorted(d.delete_pods) == [f"tiny-1-{r}" for r in range(4)]
    assert any(e.reason == "PodFailed" and "exit code 137" in e.message for e in d.events)
    d = w.step()  # plans again, new pod names
    assert sorted(w.pods) == [f"tiny-2-{r}" for r in range(4)] and w.status["launched"]


def test_backoff_limit_exhausted_fails_the_job():
    w = FakeWorld(manifest(runPolicy={"backoffLimit": 1}))
    for _ in range(2):
        launched(w)
        w.set_phase("Failed", next(iter(w.pods)))
        w.step()
    assert w.status["phase"] == "Failed" and w.status["restarts"] == 1
    failed = w.condition("Failed")
    assert failed["status"] == "True" and failed["reason"] == "BackoffLimitExceeded"
    assert "backoffLimit=1" in failed["message"]
    assert not [p for p in w.pods.values() if p.get("status", {}).get("phase") not in ("Failed", "Succeeded")]


def test_a_deleted_pod_of_a_running_attempt_restarts_the_gang():
    w = launched(FakeWorld(manifest()))
    w.set_phase("Running")
    w.step()
    del w.pods["tiny-1-1"]
    w.step()
    assert w.status["restarts"] == 1 and w.status["phase"] == "Restarting"


def test_suspend_deletes_pods_and_resume_plans_again():
    w = launched(FakeWorld(manifest()))
    w.set_phase("Running")
    w.step()
    w.edit_spec(runPolicy={"backoffLimit": 2, "suspend": True})
    w.step()
    assert w.status["phase"] == "Suspended" and not w.pods
    assert w.condition("Suspended")["status"] == "True" and w.status["restarts"] == 0
    w.step()
    assert w.status["phase"] == "Suspended" and not w.pods
    w.edit_spec(runPolicy={"backoffLimit": 2, "suspend": False})
    w.step()
    assert w.status["phase"] == "Pending" and len(w.pods) == 4
    assert all(n.startswith(f"tiny-{w.status['attempt']}-") for n in w.pods) and w.status["restarts"] == 0
    assert "Resumed" in w.reasons()


def test_waits_with_a_condition_naming_what_is_missing_then_starts_when_nodes_appear():
    nodes = with_link_layers(default_nodes())
    w = FakeWorld(
        manifest(
            count=7,
            training={"globalBatchSize": 14, "microBatchSize": 1, "iterations": 5, "learningRate": 1.0e-3},
        ),
        nodes,
    )
    d = w.step()
    assert not d.create_pods and d.requeue_after == 30
    rec = w.condition("Reconciling")
    assert (
        rec["reason"] == "WaitingForNodes"
        and "needs 7 nodes" in rec["message"]
        and "have 6" in rec["message"]
    )
    assert w.reasons().count("WaitingForNodes") == 1
    w.step()
    assert w.reasons().count("WaitingForNodes") == 1  # no repeated Event for the same wait
    extra = with_link_layers(default_nodes())[0]
    extra["metadata"]["name"] = "ib-9"
    nodes.append(extra)
    w.step()
    assert len(w.pods) == 7


@pytest.mark.parametrize(
    "bad, fragment",
    [
        (
            {
                "model": {
                    "layers": 4,
                    "hiddenSize": 66,
                    "attentionHeads": 4,
                    "seqLength": 32,
                    "vocabSize": 128,
                }
            },
            "spec.model.hiddenSize",
        ),
        (
            {
                "training": {
                    "globalBatchSize": 7,
                    "microBatchSize": 2,
                    "iterations": 5,
                    "learningRate": 1.0e-3,
                }
            },
            "spec.training.globalBatchSize",
        ),
        ({"parallelism": {"partition": [1, 1]}}, "spec.parallelism.partition"),
    ],
)
def test_bad_input_stalls_with_the_field_and_creates_nothing(bad, fragment):
    w = FakeWorld(manifest(**bad))
    d = w.step()
    stalled = w.condition("Stalled")
    assert (
        stalled["status"] == "True" and stalled["reason"] == "InvalidSpec" and fragment in stalled["message"]
    )
    assert not d.create_pods and d.configmap is None
    assert [e.type for e in d.events] == ["Warning"]
    d = w.step()
    assert not d.events  # the same problem is reported once


def test_a_name_too_long_for_pod_hostnames_stalls():
    job = manifest(name="x" * 51)
    w = FakeWorld(job)
    w.step()
    assert w.condition("Stalled")["reason"] == "InvalidName"


def test_model_is_immutable_once_started_and_the_attempt_keeps_running():
    w = launched(FakeWorld(manifest()))
    w.set_phase("Running")
    w.step()
    model = dict(w.job["spec"]["model"], layers=8)
    w.edit_spec(model=model)
    d = w.step()
    assert w.condition("Stalled")["reason"] == "ImmutableField" and not d.delete_pods
    assert w.status["phase"] == "Running"


def test_other_spec_edits_relaunch_without_counting_a_restart():
    w = launched(FakeWorld(manifest()))
    w.set_phase("Running")
    w.step()
    w.edit_spec(
        training={"globalBatchSize": 16, "microBatchSize": 1, "iterations": 9, "learningRate": 1.0e-3}
    )
    d = w.step()
    assert "SpecChanged" in w.reasons() and w.status["restarts"] == 0 and w.status["attempt"] == 2
    assert sorted(d.delete_pods) == [f"tiny-1-{r}" for r in range(4)] and len(d.create_pods) == 4
    assert "iterations: 9" in w.configmap["data"][child_names.JOB_FILE]


def test_run_policy_edits_do_not_relaunch():
    w = launched(FakeWorld(manifest()))
    w.set_phase("Running")
    w.step()
    w.edit_spec(runPolicy={"backoffLimit": 5, "suspend": False})
    d = w.step()
    assert not d.delete_pods and not d.create_pods and w.status["attempt"] == 1


def test_crash_after_creating_some_pods_resumes_from_the_configmap_without_duplicates():
    w = FakeWorld(manifest())
    d = w.step()
    layout_before = w.configmap["data"][child_names.LAYOUT_FILE]
    # The operator died after the ConfigMap and two pods, before the status patch.
    w.job.pop("status")
    for n in ("tiny-1-2", "tiny-1-3"):
        w.pods.pop(n)
    d = w.step()
    assert sorted(p["metadata"]["name"] for p in d.create_pods) == ["tiny-1-2", "tiny-1-3"]
    assert w.configmap["data"][child_names.LAYOUT_FILE] == layout_before
    assert sorted(w.pods) == [f"tiny-1-{r}" for r in range(4)]


def test_active_deadline_fails_the_job():
    w = launched(FakeWorld(manifest(runPolicy={"backoffLimit": 2, "activeDeadlineSeconds": 30})))
    w.set_phase("Running")
    w.step(seconds=10)
    assert w.status["phase"] == "Running"
    running = sorted(w.pods)  # step() removes the deleted pods from w.pods
    d = w.step(seconds=30)
    assert w.status["phase"] == "Failed" and w.condition("Failed")["reason"] == "DeadlineExceeded"
    assert running and sorted(d.delete_pods) == running and not w.pods


def test_ttl_after_finished_deletes_the_job_when_due():
    w = launched(FakeWorld(manifest(runPolicy={"backoffLimit": 2, "ttlSecondsAfterFinished": 60})))
    w.set_phase("Succeeded")
    w.step()
    d = w.step(seconds=10)
    assert not d.delete_job and 45 <= d.requeue_after <= 55
    d = w.step(seconds=60)
    assert d.delete_job and "TTLExpired" in w.reasons()


def test_stale_pods_of_old_attempts_are_deleted():
    w = launched(FakeWorld(manifest()))
    stale = dict(next(iter(w.pods.values())))
    stale["metadata"] = dict(
        stale["metadata"],
        name="tiny-0-0",
        labels=dict(stale["metadata"]["labels"], **{child_names.LABEL_ATTEMPT: "0"}),
    )
    w.pods["tiny-0-0"] = stale
    d = w.step()
    assert d.delete_pods == ["tiny-0-0"]


def test_lost_planned_node_replans_an_unfinished_launch():
    nodes = with_link_layers(default_nodes())
    w = FakeWorld(manifest(count=4), nodes)
    w.step()
    first = Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE])
    w.job["status"]["launched"] = False  # the launch did not finish
    gone = first.nodes[0]
    nodes[:] = [n for n in nodes if n["metadata"]["name"] != gone]
    w.step()
    second = Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE])
    assert gone not in second.nodes and w.status["attempt"] == 2


def test_a_deleted_service_is_recreated():
    w = launched(FakeWorld(manifest()))
    w.service = None
    d = w.step()
    assert d.service is not None and d.service["spec"]["clusterIP"] == "None" and not d.delete_pods


def test_an_unschedulable_pod_is_named_in_the_ready_condition():
    w = launched(FakeWorld(manifest()))
    w.set_phase("Running", "tiny-1-0", "tiny-1-1", "tiny-1-2")
    w.pods["tiny-1-3"]["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/6 nodes are available: 1 Insufficient nvidia.com/gpu.",
            }
        ],
    }
    w.step()
    msg = w.condition("Ready")["message"]
    assert "3/4 pods running" in msg and "tiny-1-3" in msg and "Insufficient nvidia.com/gpu" in msg


# ---- restart back-off -------------------------------------------------------------------------


def fail_one(w: FakeWorld, seconds: float = 1.0):
    w.set_phase("Failed", sorted(w.pods)[0], exit_code=3)
    return w.step(seconds=seconds)


def test_restart_backoff_doubles_per_restart_up_to_the_cap():
    assert [RestartBackoff().delay(k) for k in (1, 2, 3, 5, 6, 40)] == [10, 20, 40, 160, 300, 300]
    assert RestartBackoff(0).delay(3) == 0 and RestartBackoff(10, 0).delay(1) == 0
    with pytest.raises(ValueError, match="negative"):
        RestartBackoff(-1)


def test_gang_restart_waits_out_the_backoff_before_relaunching():
    w = launched(FakeWorld(manifest(runPolicy={"backoffLimit": 5}), backoff=RestartBackoff(10, 25)))
    d = fail_one(w)
    assert w.status["phase"] == "Restarting" and w.status["restarts"] == 1 and d.requeue_after == 10
    assert w.status["nextAttemptTime"] == iso(w.now + timedelta(seconds=10)) and not w.pods
    assert "10s back-off" in w.condition("Reconciling")["message"]
    d = w.step(seconds=4)  # still waiting: nothing created
    rec = w.condition("Reconciling")
    assert not d.create_pods and d.requeue_after == 6 and w.status["phase"] == "Restarting"
    assert rec["status"] == "True" and rec["reason"] == "RestartBackoff"
    assert w.status["nextAttemptTime"] in rec["message"] and "restart 1" in rec["message"]
    assert not [e for e in d.events if e.reason == "PodFailed"]  # no repeated Events while waiting
    del w.job["status"]["nextAttemptTime"]  # pruned by a CRD schema without the field:
    assert not w.step(seconds=1).create_pods  # the Reconciling message still says when
    d = w.step(seconds=5)  # due: launch attempt 2
    assert len(d.create_pods) == 4 and w.status["attempt"] == 2 and "nextAttemptTime" not in w.status
    delays = []
    for _ in range(3):  # 20 s, then capped at 25 s
        w.set_phase("Running")
        w.step()
        delays.append(fail_one(w).requeue_after)
        w.step(seconds=30)
    assert delays == [20, 25, 25] and w.status["restarts"] == 4


def test_backoff_disabled_relaunches_at_once():
    w = launched(FakeWorld(manifest(), backoff=RestartBackoff(0)))
    d = fail_one(w)
    assert d.requeue_after == 0.5 and "nextAttemptTime" not in w.status
    assert len(w.step().create_pods) == 4


def test_suspend_during_the_backoff_and_resume_launches_at_once():
    w = launched(FakeWorld(manifest(), backoff=RestartBackoff(60)))
    fail_one(w)
    w.edit_spec(runPolicy={"backoffLimit": 2, "suspend": True})
    w.step()
    assert w.status["phase"] == "Suspended" and "nextAttemptTime" not in w.status
    w.edit_spec(runPolicy={"backoffLimit": 2, "suspend": False})
    d = w.step()
    assert len(d.create_pods) == 4 and w.status["phase"] == "Pending" and w.status["restarts"] == 1


def test_a_spec_edit_during_the_backoff_launches_at_once_but_a_run_policy_edit_does_not():
    w = launched(FakeWorld(manifest(), backoff=RestartBackoff(60)))
    fail_one(w)
    w.edit_spec(runPolicy={"backoffLimit": 4, "suspend": False})
    assert not w.step().create_pods and w.status["phase"] == "Restarting"
    w.edit_spec(training={"globalBatchSize": 8, "microBatchSize": 1, "iterations": 9, "learningRate": 1.0e-3})
    d = w.step()
    assert len(d.create_pods) == 4 and "SpecChanged" in w.reasons() and w.status["restarts"] == 1
    assert "iterations: 9" in w.configmap["data"][child_names.JOB_FILE]


def test_the_deadline_still_fails_a_job_waiting_out_its_backoff():
    w = launched(
        FakeWorld(
            manifest(runPolicy={"backoffLimit": 2, "activeDeadlineSeconds": 30}), backoff=RestartBackoff(100)
        )
    )
    assert fail_one(w).requeue_after == 30 - 1  # started at t=1, failed at t=2: wakes for the deadline
    d = w.step(seconds=3)
    assert w.status["phase"] == "Restarting" and d.requeue_after == 30 - 4
    w.step(seconds=d.requeue_after)
    assert w.status["phase"] == "Failed" and w.condition("Failed")["reason"] == "DeadlineExceeded"
    assert "nextAttemptTime" not in w.status


# ---- pods stuck on a lost node ------------------------------------------------------------------


def _lose(node: dict, how: str, nodes: list[dict]) -> None:
    if how == "deleted":
        nodes.remove(node)
    elif how == "NotReady":
        node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    else:
        node.setdefault("spec", {})["unschedulable"] = True


@pytest.mark.parametrize(
    "how, why", [("deleted", "was deleted"), ("NotReady", "not Ready"), ("cordoned", "cordoned")]
)
def test_a_pending_pod_on_a_lost_node_restarts_the_gang_on_the_nodes_left(how, why):
    nodes = with_link_layers(default_nodes())
    w = launched(FakeWorld(manifest(), nodes))
    planned = Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE]).nodes
    w.set_phase("Running", *[n for n in w.pods if not n.endswith("-2")])  # rank 2 never started
    lost = planned[2]
    _lose(next(n for n in nodes if n["metadata"]["name"] == lost), how, nodes)
    d = w.step()
    assert w.status["phase"] == "Restarting" and w.status["restarts"] == 1 and len(d.delete_pods) == 4
    warning = next(e for e in d.events if e.reason == "NodeLost")
    assert warning.type == "Warning" and lost in warning.message and why in warning.message
    assert "tiny-1-2" in warning.message
    w.step()
    assert w.status["attempt"] == 2 and len(w.pods) == 4
    assert lost not in Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE]).nodes


def _unschedulable(w: FakeWorld, pod: str, message: str) -> None:
    """The scheduler's verdict on a pod, as kube-scheduler writes it."""
    w.pods[pod].setdefault("status", {})["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": w.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    ]


def test_a_pod_the_scheduler_refuses_past_the_timeout_replans_without_its_node():
    # issue 50: a pinned pod the scheduler could not bind stayed Pending for ever, the rest of
    # the gang timed out at the rendezvous and the job failed with backoffLimit spent
    nodes = with_link_layers(default_nodes())
    job = manifest()
    job["spec"]["runPolicy"] = {"backoffLimit": 0, "schedulingTimeoutSeconds": 8}
    w = launched(FakeWorld(job, nodes))
    planned = Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE]).nodes
    w.set_phase("Running", *[n for n in w.pods if not n.endswith("-2")])
    why = "0/6 nodes are available: 1 Too many pods, 5 node(s) didn't match Pod's node affinity/selector."
    _unschedulable(w, "tiny-1-2", why)
    d = w.step(seconds=5)
    assert w.status["phase"] == "Pending" and w.status["restarts"] == 0 and not d.delete_pods
    assert d.requeue_after == 3  # woken when its timeout is up
    d = w.step(seconds=3)
    assert w.status["phase"] == "Restarting" and w.status["restartsByReason"] == {"disruption": 1}
    warning = next(e for e in d.events if e.reason == "PodUnschedulable")
    assert f"node {planned[2]}: pod tiny-1-2: {why}" in warning.message
    assert "runPolicy.schedulingTimeoutSeconds" in w.condition("Reconciling")["message"]
    assert why in w.condition("Reconciling")["message"]
    refused = w.status["unschedulableNodes"]
    assert refused == {
        planned[2]: {"message": f"pod tiny-1-2: {why}", "until": iso(w.now + timedelta(seconds=8))}
    }
    w.step()
    again = Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE]).nodes
    assert w.status["attempt"] == 2 and planned[2] not in again and len(again) == 4
    w.set_phase("Running")
    w.step()
    w.set_phase("Succeeded")
    w.step()
    assert w.status["phase"] == "Succeeded"  # backoffLimit 0: the restart was no failure


def test_a_job_that_cannot_plan_without_the_refused_node_waits_then_tries_it_again():
    nodes = with_link_layers(default_nodes())
    job = manifest(count=6)  # every node
    job["spec"]["training"]["globalBatchSize"] = 12
    job["spec"]["runPolicy"] = {"schedulingTimeoutSeconds": 30}
    w = launched(FakeWorld(job, nodes))
    planned = Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE]).nodes
    _unschedulable(w, "tiny-1-0", "0/6 nodes are available: 1 node(s) didn't match pod anti-affinity rules.")
    w.step(seconds=30)
    assert w.status["phase"] == "Restarting"
    w.step()
    msg = w.condition("Reconciling")["message"]
    assert (
        w.status["phase"] == "Pending"
        and f"left out after the scheduler refused pods there: {planned[0]}" in msg
    )
    assert not w.pods
    w.step(seconds=30)  # the exclusion is over: the job plans on every node again
    assert len(w.pods) == 6 and "unschedulableNodes" not in w.status


def test_kueues_wait_for_pods_ready_is_the_deadline_of_a_job_kueue_admits():
    from holmes.operator.core import queueing as q

    nodes = with_link_layers(default_nodes())
    job = manifest()
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    job["spec"]["runPolicy"] = {"schedulingTimeoutSeconds": 5}
    w = FakeWorld(job, nodes)
    w.flavors = {}
    w.step()
    w.workload["status"] = {
        "admission": {"clusterQueue": "cq", "podSetAssignments": []},
        "conditions": [
            {"type": "QuotaReserved", "status": "True"},
            {"type": "Admitted", "status": "True"},
        ],
    }
    w.step()
    assert w.status.get("launched") and q.queue_name(w.job)
    _unschedulable(w, "tiny-1-0", "0/6 nodes are available: 1 Too many pods.")
    w.step(seconds=60)
    assert w.status["phase"] == "Pending" and w.status["restarts"] == 0  # Kueue's to evict


def test_running_pods_on_a_node_gone_not_ready_are_left_to_kubernetes():
    nodes = with_link_layers(default_nodes())
    w = launched(FakeWorld(manifest(), nodes))
    w.set_phase("Running")
    w.step()
    lost = Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE]).nodes[1]
    _lose(next(n for n in nodes if n["metadata"]["name"] == lost), "NotReady", nodes)
    d = w.step()
    assert not d.delete_pods and w.status["phase"] == "Running" and w.status["restarts"] == 0


def _quota_refusal(rank_limit: int):
    def refuse(pod):
        if int(pod["metadata"]["labels"][child_names.LABEL_NODE_RANK]) >= rank_limit:
            msg = f'pods "{pod["metadata"]["name"]}" is forbidden: exceeded quota: gpus, requested: 1'
            return ChildRefusal("Pod", pod["metadata"]["name"], 403, "Forbidden", msg)
        return None

    return refuse


def test_a_quota_that_refuses_part_of_the_gang_deletes_it_and_retries_with_back_off():
    w = FakeWorld(manifest(), backoff=RestartBackoff(10, 300))
    w.refuse = _quota_refusal(2)  # room for two of the four pods
    d = w.step()
    assert w.pods == {}  # the two created pods were deleted: no partial gang keeps GPUs
    assert w.status["phase"] == "Pending" and w.status["createFailures"] == 1
    rec = w.condition("Reconciling")
    assert rec["status"] == "True" and rec["reason"] == "ChildCreateFailed"
    assert "403 Forbidden" in rec["message"] and "exceeded quota" in rec["message"]
    assert w.condition("Stalled")["status"] == "False"
    assert [e.reason for e in w.events].count("ChildCreateFailed") == 1
    assert d.requeue_after == pytest.approx(10)
    w.step(seconds=5)  # inside the back-off: nothing is created
    assert w.pods == {}
    w.step(seconds=6)  # due: tries again, refused again: the back-off doubles
    assert w.status["createFailures"] == 2 and w.pods == {}
    assert [e.reason for e in w.events].count("ChildCreateFailed") == 1  # one Event, not one per try
    w.refuse = None  # the quota was raised
    w.step(seconds=25)
    assert len(w.pods) == 4
    w.step()
    assert "createFailures" not in w.status and w.condition("Reconciling")["reason"] == "PodsStarting"
    assert w.status["restarts"] == 0  # refusals are not restarts


def test_an_admission_denial_stalls_until_the_spec_changes():
    w = FakeWorld(manifest())
    msg = 'pods "x" is forbidden: violates PodSecurity "restricted:latest": privileged'
    w.refuse = lambda pod: ChildRefusal("Pod", pod["metadata"]["name"], 403, "Forbidden", msg)
    w.step()
    stalled = w.condition("Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "ChildRejected"
    assert "violates PodSecurity" in stalled["message"] and "spec.template" in stalled["message"]
    assert w.pods == {}
    for _ in range(3):  # no retry loop while nothing changed
        w.step(seconds=10)
    assert w.reasons().count("ChildRejected") == 1 and w.pods == {}
    w.refuse = None
    w.edit_spec(template={"metadata": {"labels": {"fixed": "yes"}}})
    w.step()
    assert len(w.pods) == 4 and w.condition("Stalled")["status"] == "False"


def test_a_recreated_job_does_not_adopt_the_old_jobs_pods():
    w = launched(FakeWorld(manifest()))
    w.set_phase("Running")
    old_pods = dict(w.pods)
    # the job is deleted and created again under the same name: a new object, a new uid, no
    # status; the old pods are still there while the garbage collector removes them
    w.job["metadata"]["uid"] = "uid-2"
    w.job.pop("status")
    d = w.step()
    new = [p for p in d.create_pods]
    assert len(new) == 4 and not set(p["metadata"]["name"] for p in new) & set(old_pods)
    assert w.status["attempt"] == 2 and w.status["restarts"] == 0
    assert w.status["pods"]["running"] == 0  # the old job's running pods are not counted


# ---- disruptions, the failure policy, elastic size (issue 11) ---------------------------------


def _running(job: dict, nodes: list[dict] | None = None) -> FakeWorld:
    w = launched(FakeWorld(job, nodes))
    w.set_phase("Running")
    w.step()
    return w


@pytest.mark.parametrize(
    "disrupt, expect",
    [
        (lambda p: p["status"].update(reason="Evicted", message="low on memory"), "Evicted"),
        (
            lambda p: p["status"].update(
                conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
            ),
            "PreemptionByScheduler",
        ),
        (
            lambda p: p["status"]["containerStatuses"][0]["state"]["terminated"].update(exitCode=83),
            "exit code 83",
        ),
    ],
)
def test_disruptions_restart_without_using_the_backoff_limit(disrupt, expect):
    w = _running(manifest(runPolicy={"backoffLimit": 0}))
    w.set_phase("Failed", "tiny-1-1")
    disrupt(w.pods["tiny-1-1"])
    d = w.step()
    assert w.status["phase"] == "Restarting", w.condition("Failed")
    assert w.status["restartsByReason"] == {"disruption": 1} and w.status["restarts"] == 1
    assert any(e.reason == "PodDisrupted" and expect in e.message for e in d.events)
    assert d.requeue_after == 0.5  # no back-off after a disruption


def test_a_pod_deleted_by_someone_else_is_a_disruption():
    w = _running(manifest(runPolicy={"backoffLimit": 0}))
    del w.pods["tiny-1-1"]
    w.step()
    assert w.status["phase"] == "Restarting" and w.status["restartsByReason"] == {"disruption": 1}
    w.step()
    assert len(w.pods) == 4 and w.status["attempt"] == 2


def test_the_disruption_limit_fails_the_job_when_set():
    w = _running(manifest(runPolicy={"disruptionLimit": 1}))
    for _ in range(2):
        w.set_phase("Failed", next(iter(w.pods)), exit_code=83)
        w.step()
        if w.status["phase"] != "Failed":
            launched(w)
    assert w.status["phase"] == "Failed" and w.condition("Failed")["reason"] == "DisruptionLimitExceeded"
    assert w.status["restartsByReason"] == {"disruption": 1}


def _policy(*rules):
    return {
        "backoffLimit": 1,
        "failurePolicy": {
            "rules": [{"action": a, "onExitCodes": {"operator": op, "values": list(v)}} for a, op, v in rules]
        },
    }


def test_failure_policy_fail_job_ends_at_once():
    w = _running(manifest(runPolicy=_policy(("FailJob", "In", [42]), ("Ignore", "In", [42]))))
    w.set_phase("Failed", "tiny-1-0", exit_code=42)
    w.step()
    failed = w.condition("Failed")
    assert w.status["phase"] == "Failed" and failed["reason"] == "PodFailurePolicy"
    assert "exit code 42" in failed["message"] and "FailJob" in failed["message"]
    assert w.status["restarts"] == 0


def test_failure_policy_ignore_restarts_without_counting_and_count_counts():
    w = _running(manifest(runPolicy=_policy(("Ignore", "In", [3]), ("Count", "NotIn", [3]))))
    for _ in range(3):  # three ignored failures with backoffLimit 1
        w.set_phase("Failed", f"tiny-{w.status['attempt']}-0", exit_code=3)
        w.step()
        assert w.status["phase"] == "Restarting"
        launched(w)
    assert w.status["restartsByReason"] == {"ignored": 3}
    for _ in range(2):
        w.set_phase("Failed", f"tiny-{w.status['attempt']}-0", exit_code=1)
        w.step()
        if w.status["phase"] == "Restarting":
            launched(w)
    assert w.status["phase"] == "Failed" and w.condition("Failed")["reason"] == "BackoffLimitExceeded"
    assert w.status["restartsByReason"] == {"ignored": 3, "failure": 1} and w.status["restarts"] == 4


def test_a_status_from_before_the_breakdown_counts_its_restarts_as_failures():
    w = _running(manifest(runPolicy={"backoffLimit": 2}))
    w.job["status"]["restarts"] = 2
    w.job["status"].pop("restartsByReason", None)
    w.set_phase("Failed", "tiny-1-0")
    w.step()
    assert w.status["phase"] == "Failed" and w.condition("Failed")["reason"] == "BackoffLimitExceeded"


def test_the_next_attempt_waits_for_the_old_pods_to_stop():
    w = _running(manifest())
    for p in w.pods.values():
        p["spec"]["nodeName"] = p["metadata"]["annotations"][child_names.ANN_NODE]
    w.set_phase("Failed", "tiny-1-3", exit_code=83)
    d = w.step()
    assert len(d.delete_pods) == 4 and not w.pods  # FakeWorld deletes at once
    # a pod still terminating (a graceful stop writing a checkpoint) holds the next attempt back
    w.pods["tiny-1-0"] = {
        "metadata": {
            "name": "tiny-1-0",
            "labels": {child_names.LABEL_ATTEMPT: "1", child_names.LABEL_NODE_RANK: "0"},
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"uid": "uid-1"}],
        },
        "spec": {"nodeName": "ib-1"},
        "status": {"phase": "Running"},
    }
    d = w.step()
    assert not d.create_pods and w.condition("Reconciling")["reason"] == "WaitingForPodsToStop"
    assert "tiny-1-0" in w.condition("Reconciling")["message"]
    del w.pods["tiny-1-0"]
    d = w.step()
    assert len(d.create_pods) == 4


def _elastic(**run_policy) -> dict:
    return manifest(
        count=6,
        nodes={"count": 6, "gpusPerNode": 1, "minCount": 3},
        training={
            "globalBatchSize": 60,  # divisible by every data degree from 1 to 6
            "microBatchSize": 1,
            "iterations": 50,
            "learningRate": 1.0e-3,
            "checkpoint": {"path": "/ckpt", "intervalIterations": 5},
        },
        runPolicy={"backoffLimit": 2, **run_policy},
    )


def _node(nodes: list[dict], name: str) -> dict:
    return next(n for n in nodes if n["metadata"]["name"] == name)


def test_an_elastic_job_waits_then_runs_on_fewer_nodes():
    nodes = with_link_layers(default_nodes())
    gone = nodes.pop()
    w = FakeWorld(_elastic(waitForNodesSeconds=60), nodes)
    w.step()
    assert not w.pods and w.condition("Reconciling")["reason"] == "WaitingForNodes"
    assert "waitForNodesSeconds=60" in w.condition("Reconciling")["message"]
    assert w.status["size"] == {"desired": 6, "minimum": 3}
    w.step(seconds=30)
    assert not w.pods
    d = w.step(seconds=31)
    assert len(w.pods) == 5 and w.status["size"] == {"current": 5, "desired": 6, "minimum": 3}
    assert any(e.reason == "ScaledDown" for e in d.events) and "waitingSince" not in w.status
    assert (
        gone["metadata"]["name"] not in Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE]).nodes
    )


def test_a_node_deleted_under_an_elastic_job_continues_smaller_at_once_and_grows_back_after_a_checkpoint():
    nodes = with_link_layers(default_nodes())
    job = _elastic()
    job["spec"]["training"]["checkpoint"]["onPreemption"] = False  # only periodic checkpoints
    w = _running(job, nodes)
    layout = Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE])
    for p in w.pods.values():
        p["spec"]["nodeName"] = p["metadata"]["annotations"][child_names.ANN_NODE]
    lost = _node(nodes, layout.nodes[2])
    nodes.remove(lost)
    d = w.step(progress={"iteration": 7, "loss": 3.0, "checkpointIteration": 5})
    assert w.status["phase"] == "Restarting" and w.status["restartsByReason"] == {"disruption": 1}
    assert any(e.reason == "NodeLost" and lost["metadata"]["name"] in e.message for e in d.events)
    w.step()  # no wait: runs on what is left
    assert len(w.pods) == 5 and w.status["size"]["current"] == 5
    w.set_phase("Running")
    w.step()
    nodes.append(lost)  # the node returns
    d = w.step(progress={"iteration": 8, "checkpointIteration": 5})
    assert any(e.reason == "ScaleUpPending" for e in d.events) and w.status["scaleUpAfter"] == 5
    w.step(progress={"iteration": 9, "checkpointIteration": 5})
    assert w.status["phase"] == "Running" and len(w.pods) == 5
    w.step(progress={"iteration": 10, "checkpointIteration": 10})
    assert w.status["phase"] == "Restarting" and w.condition("Reconciling")["reason"] == "ScaleUp"
    assert w.status["restartsByReason"] == {"disruption": 1, "scaleUp": 1}
    w.step()
    assert len(w.pods) == 6 and w.status["size"]["current"] == 6 and "scaleUpAfter" not in w.status


def test_scale_up_never_keeps_the_smaller_size():
    nodes = with_link_layers(default_nodes())
    job = _elastic()
    job["spec"]["nodes"]["scaleUp"] = "never"
    w = _running(job, nodes)
    lost = _node(nodes, Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE]).nodes[0])
    for p in w.pods.values():
        p["spec"]["nodeName"] = p["metadata"]["annotations"][child_names.ANN_NODE]
    nodes.remove(lost)
    w.step()
    w.step()
    w.set_phase("Running")
    nodes.append(lost)
    for it in (10, 15):
        w.step(progress={"iteration": it, "checkpointIteration": it})
    assert w.status["phase"] == "Running" and len(w.pods) == 5 and "scaleUpAfter" not in w.status


def test_below_min_count_the_elastic_job_waits():
    nodes = with_link_layers(default_nodes())[:2]
    w = FakeWorld(_elastic(waitForNodesSeconds=0), nodes)
    w.step()
    assert not w.pods and "minCount=3" in w.condition("Reconciling")["message"]


def test_pods_get_the_grace_period_in_their_environment():
    tmpl = {"spec": {"terminationGracePeriodSeconds": 120}}
    w = FakeWorld(manifest(template=tmpl))
    d = w.step()
    env = {e["name"]: e.get("value") for e in d.create_pods[0]["spec"]["containers"][0]["env"]}
    assert env["HOLMES_GRACE_SECONDS"] == "120"
    assert d.create_pods[0]["spec"]["terminationGracePeriodSeconds"] == 120
    d = FakeWorld(manifest()).step()
    env = {e["name"]: e.get("value") for e in d.create_pods[0]["spec"]["containers"][0]["env"]}
    assert env["HOLMES_GRACE_SECONDS"] == "30"


def test_peers_failing_after_a_pod_was_evicted_count_as_the_disruption():
    w = _running(manifest(runPolicy={"backoffLimit": 0}))
    w.pods["tiny-1-0"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z"  # being evicted
    w.set_phase("Failed", "tiny-1-1", "tiny-1-2", exit_code=1)  # their collectives broke
    d = w.step()
    assert w.status["phase"] == "Restarting" and w.status["restartsByReason"] == {"disruption": 1}
    assert any(e.reason == "PodDeleted" and "tiny-1-0" in e.message for e in d.events)


def test_with_saves_on_preemption_an_elastic_job_grows_back_as_soon_as_its_nodes_return():
    nodes = with_link_layers(default_nodes())
    w = _running(_elastic(), nodes)
    for p in w.pods.values():
        p["spec"]["nodeName"] = p["metadata"]["annotations"][child_names.ANN_NODE]
    lost = _node(nodes, Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE]).nodes[1])
    nodes.remove(lost)
    w.step()
    w.step()
    w.set_phase("Running")
    w.step(progress={"iteration": 12, "checkpointIteration": 10})
    assert len(w.pods) == 5 and w.status["phase"] == "Running"
    nodes.append(lost)
    w.step(progress={"iteration": 13, "checkpointIteration": 10})
    assert w.status["phase"] == "Restarting" and w.condition("Reconciling")["reason"] == "ScaleUp"
    assert "onPreemption" in w.condition("Reconciling")["message"]
    assert w.status["restartsByReason"] == {"disruption": 1, "scaleUp": 1}
    w.step()
    assert len(w.pods) == 6 and w.status["size"]["current"] == 6


def test_a_pod_failing_while_its_node_is_not_ready_is_a_disruption():
    nodes = with_link_layers(default_nodes())
    w = _running(manifest(runPolicy={"backoffLimit": 0}), nodes)
    for p in w.pods.values():
        p["spec"]["nodeName"] = p["metadata"]["annotations"][child_names.ANN_NODE]
    node = w.pods["tiny-1-2"]["spec"]["nodeName"]
    _lose(_node(nodes, node), "NotReady", nodes)
    w.set_phase("Failed", "tiny-1-0", exit_code=1)  # a peer's collective broke
    d = w.step()
    assert w.status["phase"] == "Restarting" and w.status["restartsByReason"] == {"disruption": 1}
    assert any(e.reason == "PodDisrupted" and f"{node} is not Ready" in e.message for e in d.events)


def test_an_elastic_job_kueue_admits_is_ready_once_the_pods_it_launched_are():
    """Kueue's waitForPodsReady: an elastic job launched on fewer nodes than nodes.count (one is
    gone) says PodsReady once the pods of its attempt are ready; counting nodes.count it never
    did, and Kueue evicted it at every timeout."""
    nodes = with_link_layers(default_nodes())
    nodes.pop()
    job = _elastic(waitForNodesSeconds=60)
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    w = FakeWorld(job, nodes)
    w.flavors = {}
    w.step()
    w.workload["status"] = {
        "admission": {"clusterQueue": "cq", "podSetAssignments": []},
        "conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}],
    }
    w.step()
    w.step(seconds=61)
    assert len(w.pods) == 5 and w.status["size"]["current"] == 5
    for p in w.pods.values():
        p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    w.step()
    ready = next(c for c in w.workload["status"]["conditions"] if c["type"] == "PodsReady")
    assert (ready["status"], ready["reason"]) == ("True", "Started"), ready
