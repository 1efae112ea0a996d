"""ResourceQuota before creating a gang (issue 50): what a pod counts against a quota, scopes, and
the state machine creating no pod of a gang its namespace's quota would refuse, then starting
when the quota frees. The API server's own accounting (status.used) is what is compared."""

from __future__ import annotations

from holmes.operator.core import quota
from tests.helpers.operator.opfixtures import FakeWorld, default_nodes, manifest, with_link_layers


def rq(name, hard, used=None, scopes=None, selector=None):
    spec = {"hard": dict(hard)}
    if scopes:
        spec["scopes"] = scopes
    if selector:
        spec["scopeSelector"] = {"matchExpressions": selector}
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": spec,
        "status": {"hard": dict(hard), "used": dict(used or {})},
    }


def pod(limits=None, requests=None, init=None, **spec):
    c = {"name": "trainer", "resources": {}}
    if limits:
        c["resources"]["limits"] = limits
    if requests:
        c["resources"]["requests"] = requests
    body = {"containers": [c], **spec}
    if init:
        body["initContainers"] = [{"name": "init", "resources": {"requests": init}}]
    return {"metadata": {"name": "p"}, "spec": body}


def test_a_pod_counts_as_the_pod_evaluator_counts_it():
    p = pod(limits={"nvidia.com/gpu": "2", "cpu": "4"}, requests={"memory": "1Gi"}, init={"cpu": "8"})
    assert quota.pod_usage(p) == {
        "pods": 1.0,
        "count/pods": 1.0,
        "requests.nvidia.com/gpu": 2.0,
        "requests.cpu": 8.0,  # at least the init container's
        "cpu": 8.0,
        "requests.memory": 2.0**30,
        "memory": 2.0**30,
        "limits.cpu": 4.0,  # extended resources have no limits.* in a quota
    }


def test_the_gang_together_against_what_the_api_server_says_is_used():
    gang = [pod(limits={"nvidia.com/gpu": "1"}) for _ in range(2)]
    gpus = rq("gpus", {"requests.nvidia.com/gpu": "1"})
    msg = quota.refusal([gpus], gang)
    assert msg.startswith(
        "ResourceQuota gpus: the gang's 2 pod(s) need requests.nvidia.com/gpu 2, 0 of 1 used"
    )
    assert "more than the quota allows at all: raise its hard limit or shrink the job" in msg
    roomy = rq("gpus", {"requests.nvidia.com/gpu": "4"}, {"requests.nvidia.com/gpu": "3"})
    assert "3 of 4 used; starts when the quota frees" in quota.refusal([roomy], gang)
    roomy["status"]["used"]["requests.nvidia.com/gpu"] = "2"
    assert quota.refusal([roomy], gang) == ""
    pods = rq("pods", {"count/pods": "3"}, {"count/pods": "2"})
    assert quota.refusal([pods], gang).startswith("ResourceQuota pods: the gang's 2 pod(s) need count/pods 2")
    cpu = rq("cpu", {"limits.cpu": "1"})
    assert quota.refusal([cpu], gang) == ""  # the pods ask no CPU: the API server's to refuse


def test_scopes_decide_which_pods_a_quota_counts():
    gang = [pod(limits={"nvidia.com/gpu": "1"}, priorityClassName="low") for _ in range(2)]
    high = rq(
        "high", {"pods": "0"}, selector=[{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]
    )
    assert quota.refusal([high], gang) == ""
    low = rq(
        "low", {"pods": "1"}, selector=[{"scopeName": "PriorityClass", "operator": "In", "values": ["low"]}]
    )
    assert "ResourceQuota low" in quota.refusal([low], gang)
    assert quota.refusal([rq("t", {"pods": "0"}, scopes=["Terminating"])], gang) == ""
    assert "ResourceQuota nt" in quota.refusal([rq("nt", {"pods": "0"}, scopes=["NotTerminating"])], gang)
    # QoS looks at CPU and memory only: a pod asking for GPUs alone is BestEffort
    be = rq("be", {"pods": "0"}, scopes=["BestEffort"])
    assert "ResourceQuota be" in quota.refusal([be], gang)
    assert quota.refusal([be], [pod(requests={"cpu": "1"})]) == ""
    assert "ResourceQuota nbe" in quota.refusal(
        [rq("nbe", {"pods": "0"}, scopes=["NotBestEffort"])], [pod(requests={"cpu": "1"})]
    )
    # a scope it does not judge, a quota not synced yet: left to the API server
    assert quota.refusal([rq("x", {"pods": "0"}, scopes=["CrossNamespacePodAffinity"])], gang) == ""
    unsynced = rq("u", {"pods": "0"})
    unsynced["status"] = {}
    assert quota.refusal([unsynced], gang) == ""


def gpu_quota(used):
    return rq("team-gpus", {"requests.nvidia.com/gpu": "4"}, {"requests.nvidia.com/gpu": str(used)})


def test_a_gang_over_quota_creates_no_pod_names_the_quota_and_starts_when_it_frees():
    # issue 50: a 2-pod gang under a 1-GPU quota was created in parallel, refused part-way,
    # torn down and tried again (createFailures: 4 in 90 s, a pod created and deleted each time)
    w = FakeWorld(manifest(count=2, gpus=2), with_link_layers(default_nodes()))
    w.quotas = [gpu_quota(1)]
    d = w.step()
    assert not d.create_pods and not w.pods and d.configmap is None
    ready = w.condition("Reconciling")
    assert ready["reason"] == "WaitingForQuota" and w.status["phase"] == "Pending"
    assert (
        "ResourceQuota team-gpus: the gang's 2 pod(s) need requests.nvidia.com/gpu 4, 1 of 4 used"
        in (ready["message"])
    )
    assert [e.reason for e in d.events] == ["WaitingForQuota"]  # once, with no Planned Event
    d = w.step(seconds=30)
    assert not d.create_pods and not d.events and "createFailures" not in w.status
    w.quotas = [gpu_quota(0)]  # the other pod ended: the quota controller says so
    d = w.step()
    assert len(d.create_pods) == 2 and w.status["launched"]


def test_a_job_waiting_for_its_quota_keeps_no_capacity_in_the_queue():
    from holmes.operator.core import capacity

    waiting = manifest("q", count=2, gpus=2)
    waiting["status"] = {
        "conditions": [{"type": "Reconciling", "status": "True", "reason": "WaitingForQuota"}]
    }
    waiting["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    me = manifest("later", count=2, gpus=2)
    me["metadata"]["uid"], me["metadata"]["creationTimestamp"] = "uid-2", "2026-01-01T00:01:00Z"
    state = capacity.shared_state(me, capacity.Workloads(jobs=[waiting, me]), {})
    assert state.ahead == []
