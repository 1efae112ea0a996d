"""Shared clusters on the real local control plane: jobs placed on free capacity (disjoint GPUs,
a queue), the template's placement rules, Kueue's admit -> run -> evict -> re-admit -> finish
cycle played by the test as Kueue's controller for a Kueue before 0.15 (v1beta1 only), and
Volcano's PodGroup. Kueue and Volcano are stand-in CRDs here (hack/thirdparty-crds): the same
cycle in v1beta2 runs against the real Kueue in test_kueue_real.py. What stays on the stand-ins:
speaking v1beta1 (a Kueue 0.14, which serves nothing else) and moving from v1beta1 to v1beta2
while the operator runs (Kueue upgraded in place), which the real Kueue 0.17 (serving both) cannot
show."""

from __future__ import annotations

import json
import time

import pytest
from holmes_dev.jobs import tiny_job
from holmes_dev.kubectl import require_established
from kubernetes import client

from holmes.operator.core import queueing
from localkube.controlplane import binary
from localkube.operatorproc import REPO, OperatorProcess, install_crd
from tests.helpers.operator import kueue_standin
from tests.helpers.operator.cluster_helpers import (
    HOLD,
    apply,
    condition,
    get_job,
    hold,
    pods_of,
    running_operator,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.timeout(300)
THIRDPARTY = REPO / "hack" / "thirdparty-crds"


KUEUE_CRDS = ("workloads.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io")
# the Workload version Holmes must choose -> the stand-in that serves it (see hack/thirdparty-crds)
KUEUE_STANDINS = {"v1beta2": "kueue-v1beta2.yaml", "v1beta1": "kueue-v1beta1.yaml"}
# v1beta2 (Kueue 0.15 on) runs against the real Kueue (test_kueue_real.py); v1beta1 only here
STANDIN_RUNS = ["v1beta1"]


@pytest.fixture(scope="module")
def crds(cluster):
    install_crd(cluster.kubeconfig)
    cluster.kubectl("apply", "-f", str(THIRDPARTY / "volcano-v1beta1.yaml"))
    require_established(binary("kubectl"), cluster.kubeconfig, "podgroups.scheduling.volcano.sh")
    return cluster


def remove_kueue(cluster):
    cluster.kubectl("delete", "crd", *KUEUE_CRDS, "--ignore-not-found", "--wait=true", "--timeout=60s")


def install_kueue(cluster, version, upgrade=False):
    """The stand-in whose newest version is ``version``; in place of the one installed when
    ``upgrade`` (as upgrading Kueue does), else after removing it."""
    if not upgrade:
        remove_kueue(cluster)
    cluster.kubectl("apply", "-f", str(THIRDPARTY / KUEUE_STANDINS[version]))
    require_established(binary("kubectl"), cluster.kubeconfig, *KUEUE_CRDS)


@pytest.fixture(scope="module", params=STANDIN_RUNS)
def kueue(request, crds):
    """The Kueue stand-in of one version, installed for every Kueue test of that version."""
    install_kueue(crds, request.param)
    yield request.param
    remove_kueue(crds)


@pytest.fixture
def operator(crds, namespace, tmp_path):
    yield from running_operator(crds, namespace, tmp_path, tail=60)


def placed(pod):
    return pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"][0]["values"][0]


def reconciling(cluster, ns, name):
    job = get_job(cluster, ns, name)
    return condition(job, "Reconciling") if job and job.get("status") else {}


def test_two_half_cluster_jobs_run_together_and_a_third_waits_then_runs(crds, namespace, operator):
    sleep = ["sh", "-c", "sleep 8"]
    for name in ("half-a", "half-b"):
        apply(crds, tiny_job(name, namespace, count=3, gpus=2, command=sleep))
    time.sleep(1.0)  # created after the first two: last in the queue
    apply(crds, tiny_job("half-c", namespace, count=3, gpus=2, command=sleep))

    def both_running():
        a, b = pods_of(crds, namespace, "half-a"), pods_of(crds, namespace, "half-b")
        phases = [p.get("status", {}).get("phase") for p in a + b]
        return (a, b) if len(a) == len(b) == 3 and set(phases) == {"Running"} else None

    a, b = wait_for("both jobs' pods running at once", both_running, timeout=60, op=operator)
    nodes_a = {p["spec"]["nodeName"] for p in a}
    nodes_b = {p["spec"]["nodeName"] for p in b}
    assert len(nodes_a) == len(nodes_b) == 3 and not nodes_a & nodes_b
    assert {placed(p) for p in a} == nodes_a  # bound where the layout pinned them
    c = wait_for(
        "half-c waiting for capacity",
        lambda: (lambda r: r if r.get("reason") == "WaitingForCapacity" else None)(
            reconciling(crds, namespace, "half-c")
        ),
        op=operator,
    )
    assert "needs 3 node(s) with 2 nvidia.com/gpu free per pod; 0 node(s) have that free now" in c["message"]
    assert not pods_of(crds, namespace, "half-c")  # no part of its gang holds anything
    wait_phase(crds, namespace, "half-a", "Succeeded", op=operator)
    wait_phase(crds, namespace, "half-b", "Succeeded", op=operator)
    job = wait_phase(crds, namespace, "half-c", "Succeeded", timeout=90, op=operator)
    assert job["status"]["restarts"] == 0


def test_taints_node_selectors_and_cpu_requests_rule_nodes_out(crds, namespace, operator):
    crds.kubectl("taint", "node", "ib-0", "holmes.dev/test=shared:NoSchedule", "--overwrite")
    try:
        whole = tiny_job("tainted", namespace, count=6, gpus=1, command=["sh", "-c", "sleep 600"])
        whole["spec"]["training"]["globalBatchSize"] = 12  # 6 data-parallel ranks
        apply(crds, whole)
        sel = tiny_job("selector", namespace, count=4, gpus=1, command=["sleep", "1"])
        sel["spec"]["template"]["spec"]["nodeSelector"] = {"holmes.dev/cluster": "east"}
        apply(crds, sel)
        cpu = tiny_job("cpu", namespace, count=1, gpus=1, command=["sleep", "1"])
        cpu["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "40"}}
        apply(crds, cpu)

        def waiting(name, text):
            r = reconciling(crds, namespace, name)
            return r if r.get("reason") == "WaitingForNodes" and text in r.get("message", "") else None

        wait_for("taint", lambda: waiting("tainted", "taint holmes.dev/test=shared:NoSchedule"), op=operator)
        wait_for("selector", lambda: waiting("selector", "nodeSelector holmes.dev/cluster=east"), op=operator)
        # the topology's cpu on the agent's nodes (32), the host's on real nodes: one value either way
        (have,) = {crds.get_json("node", n)["status"]["allocatable"]["cpu"] for n in crds.topology.names}
        wait_for("cpu", lambda: waiting("cpu", f"allocatable cpu {have} is less than the 40"), op=operator)
        # tolerating the taint makes the whole cluster usable again
        whole["spec"]["template"]["spec"]["tolerations"] = [{"key": "holmes.dev/test", "operator": "Exists"}]
        apply(crds, whole)
        wait_for("launched", lambda: len(pods_of(crds, namespace, "tainted")) == 6 or None, op=operator)
        assert "ib-0" in {placed(p) for p in pods_of(crds, namespace, "tainted")}
    finally:
        crds.kubectl("taint", "node", "ib-0", "holmes.dev/test-", check=False)
        crds.kubectl("delete", "holmesjob", "--all", "-n", namespace, "--wait=false")


def patch_workload_status(cluster, version, ns, name, status):
    from kubernetes import client

    api = client.CustomObjectsApi(cluster.api_client())
    api.patch_namespaced_custom_object_status(
        "kueue.x-k8s.io", version, ns, "workloads", name, {"status": status}
    )


def get_workload(cluster, version, ns, name):
    r = cluster.kubectl(
        "get",
        f"workloads.{version}.kueue.x-k8s.io",
        name,
        "-n",
        ns,
        "-o",
        "json",
        "--show-managed-fields",  # kubectl leaves them out of -o json otherwise (1.21+)
        check=False,
    )
    return json.loads(r.stdout) if r.returncode == 0 else None


def written_in(workload):
    """The API versions the Workload's writers used (its managed fields say)."""
    return {f["apiVersion"] for f in workload["metadata"]["managedFields"]}


def version_in_use(op):
    """The version holmes_kueue_api_info names (None: Kueue's API is not served)."""
    for line in op.metrics().splitlines():
        if line.startswith("holmes_kueue_api_info{"):
            version = line.split('version="')[1].split('"')[0]
            return None if version == "none" else version
    return None


def admitted(flavor):
    return {
        "admission": {
            "clusterQueue": "cluster-queue",
            "podSetAssignments": [{"name": "workers", "count": 2, "flavors": {"nvidia.com/gpu": flavor}}],
        },
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "True",
                "reason": "QuotaReserved",
                "message": "reserved",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
            {
                "type": "Admitted",
                "status": "True",
                "reason": "Admitted",
                "message": "admitted",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
            {
                "type": "Evicted",
                "status": "False",
                "reason": "QuotaReserved",
                "message": "quota reserved",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
        ],
    }


def flavor_of(version, name):
    return {
        "apiVersion": f"kueue.x-k8s.io/{version}",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": {"holmes.dev/cluster": "west"}},
    }


def queued_job(namespace, name, command):
    run_policy = {"backoffLimit": 2, "priorityClassName": "holmes-test-high"}
    m = tiny_job(name, namespace, count=2, gpus=2, command=command, run_policy=run_policy)
    m["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "user-queue"}
    return m


@pytest.fixture(scope="module")
def priority_class(crds):
    pc = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "holmes-test-high"},
    }
    crds.kubectl("apply", "-f", "-", input=json.dumps({**pc, "value": 1000}))
    yield "holmes-test-high"
    crds.kubectl("delete", "priorityclass", "holmes-test-high", check=False)


def test_kueue_admit_run_evict_readmit_finish(crds, kueue, priority_class, namespace, operator, shared_dir):
    """Holmes speaks the version the stand-in serves newest; Kueue (played here, its status
    writes as v0.19's code makes them: kueue_standin) admits and evicts the Workload in that
    version; Holmes stops the job and releases the quota; Kueue re-admits it; the job's end marks
    it Finished."""
    flavor = f"west-{namespace}"
    crds.kubectl("apply", "-f", "-", input=json.dumps(flavor_of(kueue, flavor)))
    job = queued_job(namespace, "queued", HOLD)
    go = hold(job, shared_dir)  # the pods run until this file exists
    try:
        apply(crds, job)
        wl = wait_for(
            "the Workload", lambda: get_workload(crds, kueue, namespace, "holmesjob-queued"), op=operator
        )
        assert written_in(wl) == {f"kueue.x-k8s.io/{kueue}"}  # written in that version, not converted
        assert version_in_use(operator) == kueue
        assert (
            f"serves Workloads in {'v1beta2, v1beta1' if kueue == 'v1beta2' else 'v1beta1'}: using {kueue}"
            in (operator.tail(200))
        )
        assert wl["spec"]["queueName"] == "user-queue" and wl["spec"]["priority"] == 1000
        if kueue == "v1beta2":
            ref = {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": priority_class}
            assert wl["spec"]["priorityClassRef"] == ref
        else:
            assert wl["spec"]["priorityClassSource"] == "scheduling.k8s.io/priorityclass"
            assert wl["spec"]["priorityClassName"] == priority_class
        (ps,) = wl["spec"]["podSets"]
        # every resource its pods request: planned on the InfiniBand nodes, their RDMA device too
        assert ps["count"] == 2 and ps["template"]["spec"]["containers"][0]["resources"]["requests"] == {
            "nvidia.com/gpu": "2",
            "rdma/rdma_shared_device_a": "1",
        }
        assert wl["metadata"]["ownerReferences"][0]["kind"] == "HolmesJob"
        job = wait_phase(crds, namespace, "queued", "Suspended", op=operator)
        assert condition(job, "Suspended")["reason"] == "WaitingForAdmission"
        time.sleep(1)
        assert not pods_of(crds, namespace, "queued")

        patch_workload_status(crds, kueue, namespace, "holmesjob-queued", admitted(flavor))  # Kueue admits
        wait_phase(crds, namespace, "queued", "Running", op=operator)
        pods = pods_of(crds, namespace, "queued")
        assert {p["spec"]["nodeName"] for p in pods} <= {"roce-0", "roce-1", "eth-1"}  # the flavor's nodes
        assert all(p["spec"]["nodeSelector"] == {"holmes.dev/cluster": "west"} for p in pods)  # its labels

        # Kueue evicts it as v0.19's code does (kueue_standin.evict): Evicted=True, the quota still
        # reserved; Holmes stops the pods (Suspended, reason Requeued), then releases the quota
        # as Kueue's job framework does: QuotaReserved=False, admission cleared, Requeued=True
        wl = get_workload(crds, kueue, namespace, "holmesjob-queued")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        evicted = kueue_standin.evict(wl, "Preempted", "preempted by urgent", now)
        patch_workload_status(crds, kueue, namespace, "holmesjob-queued", evicted)
        job = wait_phase(crds, namespace, "queued", "Suspended", op=operator)
        c = condition(job, "Suspended")
        assert c["reason"] == "Requeued" and "preempted by urgent" in c["message"]
        wait_for("pods gone", lambda: not pods_of(crds, namespace, "queued") or None, timeout=60, op=operator)

        def released():
            w = get_workload(crds, kueue, namespace, "holmesjob-queued")
            return None if queueing.holds_quota(w) else w

        wl = wait_for("the quota released", released, timeout=60, op=operator)
        assert "admission" not in wl["status"]
        assert kueue_standin.condition(wl, "Requeued")["status"] == "True"
        assert kueue_standin.condition(wl, "Evicted")["status"] == "True"  # until Kueue reserves again
        assert kueue_standin.admissible(wl)  # Kueue may now admit the preemptor, then this job again

        def waiting_for_kueue():
            j = get_job(crds, namespace, "queued")
            return j if "waiting for Kueue to admit" in condition(j, "Suspended")["message"] else None

        job = wait_for("the job waiting for Kueue", waiting_for_kueue, op=operator)
        assert job["status"]["phase"] == "Suspended" and condition(job, "Suspended")["reason"] == "Requeued"
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        readmitted = kueue_standin.reserve_quota(wl, flavor, now)
        patch_workload_status(crds, kueue, namespace, "holmesjob-queued", readmitted)
        job = wait_phase(crds, namespace, "queued", "Running", op=operator)
        assert job["status"]["restarts"] == 0 and job["status"]["attempt"] >= 2
        assert len(pods_of(crds, namespace, "queued")) == 2

        # the job ends: its Workload is Finished, so Kueue releases the quota
        go.touch()
        wait_phase(crds, namespace, "queued", "Succeeded", op=operator)

        def finished():
            w = get_workload(crds, kueue, namespace, "holmesjob-queued")
            return next((c for c in w["status"]["conditions"] if c["type"] == "Finished"), None)

        fin = wait_for("the Workload Finished", finished, op=operator)
        assert fin["status"] == "True" and fin["reason"] == "Succeeded"
    finally:
        crds.kubectl("delete", "resourceflavors.kueue.x-k8s.io", flavor, check=False)


@pytest.mark.parametrize("kueue", ["v1beta1"], indirect=True)  # once: it goes through both
def test_kueue_installed_after_the_operator_started_then_upgraded(
    crds, kueue, priority_class, namespace, tmp_path, monkeypatch
):
    """Kueue comes after the operator: a queued job stalls, then gets its Workload in v1beta1 (a
    Kueue before 0.15); Kueue is then upgraded in place to serve v1beta2 (as upgrading to 0.16
    does) and the operator moves to v1beta2 without a restart: the Workload it wrote in v1beta1
    is admitted in v1beta2 and the job runs."""
    remove_kueue(crds)
    monkeypatch.setenv("HOLMES_KUEUE_DISCOVERY_SECONDS", "1")
    op = OperatorProcess(crds.kubeconfig, [namespace], tmp_path / "operator.log").start()
    try:
        apply(crds, queued_job(namespace, "late", ["sleep", "600"]))
        stalled = wait_for(
            "KueueNotInstalled",
            lambda: (
                lambda j: j if j and condition(j, "Stalled").get("reason") == "KueueNotInstalled" else None
            )(get_job(crds, namespace, "late")),
            op=op,
        )
        assert (
            "kueue.x-k8s.io (Workload, v1beta2 or v1beta1) is not served"
            in condition(stalled, "Stalled")["message"]
        )
        assert version_in_use(op) is None
        install_kueue(crds, kueue)
        wl = wait_for("the Workload", lambda: get_workload(crds, kueue, namespace, "holmesjob-late"), op=op)
        assert written_in(wl) == {f"kueue.x-k8s.io/{kueue}"} and version_in_use(op) == kueue
        job = wait_phase(crds, namespace, "late", "Suspended", op=op)
        assert condition(job, "Suspended")["reason"] == "WaitingForAdmission"
        install_kueue(crds, "v1beta2", upgrade=True)
        wait_for("v1beta2 in use", lambda: version_in_use(op) == "v1beta2" or None, op=op)
        assert "serves Workloads in v1beta2, v1beta1: using v1beta2" in op.tail(200)
        flavor = f"west-{namespace}"
        crds.kubectl("apply", "-f", "-", input=json.dumps(flavor_of("v1beta2", flavor)))
        try:
            patch_workload_status(crds, "v1beta2", namespace, "holmesjob-late", admitted(flavor))
            wait_phase(crds, namespace, "late", "Running", op=op)
        finally:
            crds.kubectl("delete", "resourceflavors.kueue.x-k8s.io", flavor, check=False)
    finally:
        crds.kubectl("delete", "holmesjob", "--all", "-n", namespace, "--wait=false", check=False)
        op.kill()  # nothing to clean up (SIGTERM costs the full 15 s stop timeout)
        print(op.tail(60))
        install_kueue(crds, kueue)  # as the other tests of this version expect it


def test_volcano_jobs_get_a_podgroup_then_once_admitted_annotated_pods(crds, namespace, operator):
    m = tiny_job("gang", namespace, count=3, gpus=1, command=["sleep", "1"])
    m["spec"]["template"]["spec"]["schedulerName"] = "volcano"
    apply(crds, m)
    pg = wait_for(
        "the PodGroup",
        lambda: (lambda r: json.loads(r.stdout) if r.returncode == 0 else None)(
            crds.kubectl(
                "get", "podgroups.scheduling.volcano.sh", "gang", "-n", namespace, "-o", "json", check=False
            )
        ),
        op=operator,
    )
    assert pg["spec"]["minMember"] == 3 and pg["spec"]["minResources"] == {"nvidia.com/gpu": "3"}
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "HolmesJob"
    # Volcano's job controller creates no pod before the queue admits the group: nor does Holmes
    wait_for(
        "WaitingForPodGroup",
        lambda: reconciling(crds, namespace, "gang").get("reason") == "WaitingForPodGroup",
        op=operator,
    )
    time.sleep(2)
    assert not pods_of(crds, namespace, "gang")
    client.CustomObjectsApi(crds.api_client()).patch_namespaced_custom_object_status(
        queueing.VOLCANO_GROUP,  # play Volcano's enqueue action: the group is admitted to its queue
        queueing.VOLCANO_VERSION,
        namespace,
        queueing.PODGROUPS,
        "gang",
        {"status": {"phase": queueing.PG_INQUEUE}},
    )
    pods = wait_for("pods", lambda: (lambda p: p if len(p) == 3 else None)(pods_of(crds, namespace, "gang")))
    for p in pods:  # no Volcano scheduler runs here: they stay Pending, in their group
        assert p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "gang"
        assert p["spec"]["schedulerName"] == "volcano"
