"""HolmesJobs under the real Kueue (``sigs.k8s.io/kueue``, the ``real_kueue`` fixture: built from
its module, installed from its own manifests, its manager a host process of the test cluster).
Nothing here plays Kueue's part: Kueue admits, preempts and evicts; the operator does what
Kueue's job framework leaves to an integration (stop the job, release the quota, requeue).

- a job in a LocalQueue is admitted within its ClusterQueue's quota, counted once (no Workload of
  Kueue's own per pod), and the next one waits for the quota with Kueue's own message;
- a job's own runPolicy.priority, outside the namespaces the operator allows one, gets no
  Workload (Stalled, PolicyViolation): it preempts nothing;
- the Workload's priority comes from the job's ``kueue.x-k8s.io/priority-class`` (a
  WorkloadPriorityClass), so a ``high`` job preempts a ``low`` one: the preempted job's pods stop
  (its trainer checkpoints), its quota is released, its Workload requeued; the preemptor runs;
  the first job is admitted again and resumes from its checkpoint to Succeeded. Never more GPUs
  in running pods than the quota.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from holmes_dev.jobs import tiny_job

from tests.helpers.operator.cluster_helpers import (
    HOLD,
    SLEEP,
    apply,
    condition,
    get_job,
    hold,
    pods_of,
    running_operator,
    wait_for,
    wait_phase,
)
from tests.helpers.operator.kueue_real import (
    GPU,
    RDMA,
    GpuWatch,
    iterations_logged,
    kueue_objects,
    queued,
    training_job,
    workload,
)

pytestmark = pytest.mark.timeout(420)

EAST = ("ib-0", "ib-1", "eth-0")


@pytest.fixture
def queues(cluster, real_kueue, namespace):
    """Kueue's objects for a ClusterQueue of 4 GPUs (a test may patch the quota)."""
    objs = kueue_objects(namespace, 4)
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    yield f"cq-{namespace}"
    cluster.kubectl(
        "delete", "holmesjob", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
    )
    for o in reversed(objs[:3]):
        kind = o["kind"].lower() + "s.kueue.x-k8s.io"
        args = ["-n", namespace] if o["kind"] == "LocalQueue" else []
        cluster.kubectl("delete", kind, o["metadata"]["name"], *args, "--wait=false", check=False)


@pytest.fixture
def operator(cluster, real_kueue, namespace, tmp_path):
    from localkube.operatorproc import install_crd

    install_crd(cluster.kubeconfig)
    extra = ["--restart-backoff-seconds=1", "--progress-interval=1"]
    yield from running_operator(cluster, namespace, tmp_path, extra=extra, tail=80)


def workloads(cluster, ns) -> list[dict]:
    return cluster.get_json("workloads.kueue.x-k8s.io", "-n", ns)["items"]


def wl_condition(wl, type_) -> dict:
    return next((c for c in (wl or {}).get("status", {}).get("conditions") or [] if c["type"] == type_), {})


def reserved_gpus(cluster, cq) -> int:
    st = cluster.get_json("clusterqueue", cq).get("status") or {}
    return sum(
        int(r["total"])
        for f in st.get("flavorsReservation") or []
        for r in f.get("resources") or []
        if r["name"] == GPU
    )


def test_a_queued_job_is_admitted_within_quota_counted_once_and_the_next_waits(
    cluster, queues, operator, namespace, shared_dir
):
    """Two 4-GPU jobs (2 pods x 2 GPUs) in a LocalQueue whose ClusterQueue holds 4 GPUs: Kueue
    admits the first, whose quota is counted once (its Workload is the job's only one: Kueue's
    pod integration makes none per pod); the second waits with Kueue's own message until the
    first ends and its Workload is Finished."""
    first = tiny_job("first", namespace, count=2, gpus=2, command=HOLD)
    go = hold(first, shared_dir)  # the first job's pods run until this file exists
    apply(cluster, queued(first))
    wait_phase(cluster, namespace, "first", "Running", timeout=120, op=operator)
    time.sleep(1.0)
    apply(cluster, queued(tiny_job("second", namespace, count=2, gpus=2, command=["sleep", "1"])))

    def waiting():
        j = get_job(cluster, namespace, "second")
        c = condition(j or {}, "Suspended")
        return j if "insufficient unused quota" in c.get("message", "") else None

    job = wait_for("the second job waiting for quota", waiting, timeout=60, op=operator)
    assert condition(job, "Suspended")["reason"] == "WaitingForAdmission"
    assert f"for {GPU} in flavor gpu-{namespace}" in condition(job, "Suspended")["message"]
    # Kueue 0.17 serves v1beta2 and v1beta1: the operator speaks v1beta2 (no conversion webhook
    # call on its writes)
    assert "serves Workloads in v1beta2, v1beta1: using v1beta2" in operator.tail(200)
    r = cluster.kubectl(
        "get",
        "workloads.kueue.x-k8s.io",
        "holmesjob-first",
        "-n",
        namespace,
        "-o",
        "json",
        "--show-managed-fields",
    )
    managers = {(f["manager"], f["apiVersion"]) for f in json.loads(r.stdout)["metadata"]["managedFields"]}
    assert {v for _, v in managers} == {"kueue.x-k8s.io/v1beta2"}, managers
    # admitted by Kueue itself, counted once: the job's Workload is the namespace's only one
    wl = workload(cluster, namespace, "first")
    assert wl_condition(wl, "Admitted")["status"] == "True"
    assert wl["status"]["admission"]["clusterQueue"] == queues
    names = sorted(w["metadata"]["name"] for w in workloads(cluster, namespace))
    assert names == ["holmesjob-first", "holmesjob-second"], names
    assert reserved_gpus(cluster, queues) == 4
    # its pods ready: PodsReady for Kueue's waitForPodsReady (without it Kueue evicts the job
    # once the timeout passes)
    ready = wait_for(
        "PodsReady",
        lambda: (lambda c: c if c.get("status") == "True" else None)(
            wl_condition(workload(cluster, namespace, "first"), "PodsReady")
        ),
        op=operator,
    )
    assert ready["reason"] == "Started", ready
    assert not pods_of(cluster, namespace, "second")
    for p in pods_of(cluster, namespace, "first"):
        assert not p["spec"].get("schedulingGates"), p["spec"]["schedulingGates"]  # not gated by Kueue
        assert "kueue.x-k8s.io/managed" not in p["metadata"].get("labels", {})

    go.touch()
    wait_phase(cluster, namespace, "first", "Succeeded", timeout=90, op=operator)
    fin = wait_for(
        "the first Workload Finished",
        lambda: wl_condition(workload(cluster, namespace, "first"), "Finished") or None,
        op=operator,
    )
    assert fin["status"] == "True" and fin["reason"] == "Succeeded"
    wait_phase(cluster, namespace, "second", "Succeeded", timeout=120, op=operator)


def test_the_priority_class_label_names_the_workloads_priority(cluster, queues, operator, namespace):
    """kueue.x-k8s.io/priority-class: the Workload carries the WorkloadPriorityClass's value and
    reference, as Kueue's own integrations write them (it had priority 0 and no reference)."""
    apply(cluster, queued(tiny_job("urgent", namespace, count=1, gpus=1, command=["sleep", "1"]), "high"))
    wl = wait_for("the Workload", lambda: workload(cluster, namespace, "urgent"), op=operator)
    assert wl["spec"]["priority"] == 10000
    assert wl["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    wait_phase(cluster, namespace, "urgent", "Succeeded", timeout=120, op=operator)


def test_a_raw_priority_gets_no_workload_and_preempts_nothing(cluster, queues, operator, namespace):
    """A tenant's runPolicy.priority (the highest int32; its namespace not in the operator's
    --raw-priority-namespaces) would be the Workload's spec.priority, above every
    WorkloadPriorityClass, and Kueue would preempt the running ``low`` job for it. The job is
    Stalled instead (PolicyViolation) and gets no Workload; ``low`` runs on. With the fix the
    message names (a WorkloadPriorityClass) it queues at that class's value, behind ``low``."""
    apply(cluster, queued(tiny_job("low", namespace, count=2, gpus=2, command=SLEEP), "low"))
    wait_phase(cluster, namespace, "low", "Running", timeout=120, op=operator)
    before = {p["metadata"]["uid"] for p in pods_of(cluster, namespace, "low")}
    greedy = tiny_job(
        "greedy",
        namespace,
        count=2,
        gpus=2,
        command=SLEEP,
        run_policy={"backoffLimit": 0, "priority": 2**31 - 1},
    )
    apply(cluster, queued(greedy))

    def stalled():
        c = condition(get_job(cluster, namespace, "greedy") or {}, "Stalled")
        return c if c.get("status") == "True" else None

    c = wait_for("greedy stalled", stalled, op=operator)
    assert c["reason"] == "PolicyViolation" and "kueue.x-k8s.io/priority-class" in c["message"], c
    time.sleep(3)  # what Kueue would have preempted by now, had it a Workload
    assert workload(cluster, namespace, "greedy") is None
    assert wl_condition(workload(cluster, namespace, "low"), "Evicted").get("status") != "True"
    assert {p["metadata"]["uid"] for p in pods_of(cluster, namespace, "low")} == before
    assert get_job(cluster, namespace, "low")["status"]["phase"] == "Running"

    # the fix: the class admins made for the team
    del greedy["spec"]["runPolicy"]["priority"]
    apply(cluster, queued(greedy, "low"))  # kubectl apply: the field removed, the label added
    wl = wait_for("greedy's Workload", lambda: workload(cluster, namespace, "greedy"), op=operator)
    assert wl["spec"]["priority"] == 100
    waiting = wait_phase(cluster, namespace, "greedy", "Suspended", op=operator)
    assert condition(waiting, "Suspended")["reason"] == "WaitingForAdmission"
    assert {p["metadata"]["uid"] for p in pods_of(cluster, namespace, "low")} == before


def test_a_higher_priority_job_preempts_the_preempted_resumes_from_its_checkpoint(
    cluster, queues, operator, namespace, tmp_path
):
    """The issue's scenario against the real Kueue, in a ClusterQueue of 2 GPUs: ``low`` trains
    on both; ``high`` (WorkloadPriorityClass 10000 over 100) preempts it: Kueue evicts low's
    Workload, the operator stops low's pods (the trainers checkpoint on SIGTERM), then releases
    the quota and Kueue requeues it; high runs to Succeeded; Kueue admits low again and it
    resumes from its checkpoint to Succeeded. Never more GPUs in running pods than the quota."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    cluster.kubectl(
        "patch",
        "clusterqueue",
        queues,
        "--type=json",
        "-p",
        json.dumps(
            [
                {
                    "op": "replace",
                    "path": "/spec/resourceGroups/0/flavors/0/resources/2/nominalQuota",
                    "value": "2",
                }
            ]
        ),
    )
    with GpuWatch(cluster, namespace) as gpus:
        apply(cluster, queued(training_job(namespace, "low", shared, iterations=40), "low"))
        metrics = shared / "low.jsonl"

        wait_for("low training", iterations_logged(metrics), timeout=180, op=operator)
        apply(cluster, queued(tiny_job("high", namespace, count=2, gpus=1, command=["sleep", "3"]), "high"))

        # Kueue evicts low (Preempted); the operator stops it and releases the quota
        def evicted():
            ev = wl_condition(workload(cluster, namespace, "low"), "Evicted")
            return ev if ev.get("status") == "True" else None

        ev = wait_for("low's Workload evicted", evicted, timeout=60, op=operator)
        assert ev["reason"] == "Preempted", ev
        job = wait_phase(cluster, namespace, "low", "Suspended", timeout=60, op=operator)
        assert condition(job, "Suspended")["reason"] == "Requeued"
        wait_phase(cluster, namespace, "high", "Succeeded", timeout=180, op=operator)
        requeued = wl_condition(workload(cluster, namespace, "low"), "Requeued")
        assert (
            requeued.get("status") == "True"
            or wl_condition(workload(cluster, namespace, "low"), "Admitted").get("status") == "True"
        )
        done = wait_phase(cluster, namespace, "low", "Succeeded", timeout=300, op=operator)
    assert done["status"]["restarts"] == 0  # a requeue is not a failure
    assert gpus.samples > 10 and gpus.most <= 2, f"{gpus.most} GPUs held at once by running pods; quota 2"
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    preempted = next(x for x in lines if x["holmes"] == "preempted")
    resume = next(x for x in lines if x["holmes"] == "resume")
    assert preempted["saved"] and resume["iteration"] == preempted["iteration"], (preempted, resume)
    its = {x["iteration"] for x in lines if x["holmes"] == "iteration"}
    assert its == set(range(1, 41))


def local_queue(namespace: str, name: str, cq: str) -> dict:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cq},
    }


def test_with_kueues_default_integrations_the_job_says_how_to_configure_kueue(
    cluster, real_kueue, queues, operator, namespace
):
    """Kueue's own default configuration (its pod integration on, HolmesJob not an external
    framework) takes a queued HolmesJob's pods for workloads of their own, in a namespace with a
    LocalQueue named default: each pod gets a Workload beside the job's (the quota counted
    twice) and is gated until it is admitted. The job stalls saying what to configure (it sat in
    PodsStarting before); with HolmesJob an external framework (Kueue's pod integration still
    on) the pods are the job's only and it runs."""
    from localkube.kueue import HOLMESJOB, default_integrations

    defaults = default_integrations()
    assert "pod" in defaults["frameworks"] and not defaults.get("externalFrameworks")
    cluster.kubectl("apply", "-f", "-", input=json.dumps(local_queue(namespace, "default", queues)))
    try:
        real_kueue.up(integrations=defaults, log=lambda m: None)
        apply(cluster, queued(tiny_job("taken", namespace, count=2, gpus=1, command=["sleep", "2"])))

        def stalled():
            j = get_job(cluster, namespace, "taken")
            c = condition(j or {}, "Stalled")
            return c if c.get("status") == "True" else None

        c = wait_for("the job stalled", stalled, timeout=90, op=operator)
        assert c["reason"] == "KueueManagesPods"
        assert f"Add {HOLMESJOB} to Kueue's configuration, integrations.externalFrameworks" in c["message"]

        def pod_workloads():  # Kueue makes one per pod as it sees each: the job may stall first
            names = [w["metadata"]["name"] for w in workloads(cluster, namespace)]
            pods = [n for n in names if n.startswith("pod-")]
            return pods if len(pods) == 2 else None

        # what the job's quota would be counted twice by
        wait_for("Kueue's Workload for each of the 2 pods", pod_workloads, timeout=60, op=operator)
        cluster.kubectl("delete", "holmesjob", "taken", "-n", namespace, "--wait=true", "--timeout=60s")

        real_kueue.up(integrations={**defaults, "externalFrameworks": [HOLMESJOB]}, log=lambda m: None)
        apply(cluster, queued(tiny_job("kept", namespace, count=2, gpus=1, command=["sleep", "2"])))
        wait_phase(cluster, namespace, "kept", "Succeeded", timeout=120, op=operator)
        names = [w["metadata"]["name"] for w in workloads(cluster, namespace)]
        assert names == ["holmesjob-kept"], names
    finally:
        real_kueue.up(log=lambda m: None)  # Holmes' configuration again, for the tests after


# ---- pod sets per island, flavors per island, waitForPodsReady's timeout -------------------------


def island_objects(
    namespace: str, order=("east", "west"), east_cpu: str = "16", west: dict | None = None
) -> list[dict]:
    """A flavor per island (its nodes' holmes.dev/cluster label; ``west``: more of west's
    spec) and a ClusterQueue over both, in ``order`` (Kueue tries them so): 4 GPUs and 16 CPUs
    each (east ``east_cpu``), each island's RDMA device only in its own flavor; the
    namespace's LocalQueue ``islands``."""
    flavor = {
        i: {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": f"{i}-{namespace}"},
            "spec": {"nodeLabels": {"holmes.dev/cluster": i}},
        }
        for i in ("east", "west")
    }
    flavor["west"]["spec"].update(west or {})

    def quota(i: str) -> dict:
        rdma = dict(zip(RDMA, ("8", "0") if i == "east" else ("0", "8")))
        cpu = east_cpu if i == "east" else "16"
        amounts = {"cpu": cpu, "memory": "64Gi", GPU: "4", **rdma}
        return {
            "name": f"{i}-{namespace}",
            "resources": [{"name": k, "nominalQuota": v} for k, v in amounts.items()],
        }

    cq = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": f"islands-{namespace}"},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [
                {"coveredResources": ["cpu", "memory", GPU, *RDMA], "flavors": [quota(i) for i in order]}
            ],
        },
    }
    return [*flavor.values(), cq, local_queue(namespace, "islands", f"islands-{namespace}")]


@pytest.fixture
def islands(cluster, real_kueue, namespace):
    """Applies island_objects(namespace, ...) for the test; all taken away after it."""
    made: list[dict] = []

    def make(**kw) -> str:
        objs = island_objects(namespace, **kw)
        cluster.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
        )
        made[:] = objs
        return objs[2]["metadata"]["name"]

    yield make
    cluster.kubectl(
        "delete", "holmesjob", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
    )
    for o in reversed(made):
        kind = o["kind"].lower() + "s.kueue.x-k8s.io"
        args = ["-n", namespace] if o["kind"] == "LocalQueue" else []
        cluster.kubectl("delete", kind, o["metadata"]["name"], *args, "--wait=false", check=False)


def in_queue(job: dict, queue: str) -> dict:
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    return job


def test_a_job_across_islands_gets_a_pod_set_per_island_counted_and_placed_by_its_flavor(
    cluster, islands, operator, namespace
):
    """4 pods x 2 GPUs (8 GPUs: more than an island's 6) asking 2 CPUs and 1Gi each, in a
    ClusterQueue with a flavor per island. The Workload has one PodSet per island (it had one
    for all, which no flavor of 4 GPUs could hold), each selecting its island and asking for
    what its pods request: CPU, memory, GPUs, the island's RDMA device. East's 3 CPUs cannot
    hold its PodSet's 4: the job waits with Kueue's message though the GPUs fit; with 8 CPUs
    Kueue admits each PodSet on its island's flavor and each pod runs there, the flavor's node
    labels in its node selector."""
    islands(east_cpu="3")
    job = tiny_job("wide", namespace, count=4, gpus=2, command=["sleep", "1"])
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "2", "memory": "1Gi"}
    }
    apply(cluster, in_queue(job, "islands"))

    def waiting_for_cpu():
        c = condition(get_job(cluster, namespace, "wide") or {}, "Suspended")
        return (
            c
            if re.search(
                rf"insufficient (unused )?quota for cpu in flavor east-{namespace}", c.get("message", "")
            )
            else None
        )

    c = wait_for("the job waiting for east's CPU quota", waiting_for_cpu, timeout=60, op=operator)
    assert c["reason"] == "WaitingForAdmission", c
    wl = workload(cluster, namespace, "wide")
    sets = {
        ps["name"]: (
            ps["count"],
            ps["template"]["spec"].get("nodeSelector"),
            ps["template"]["spec"]["containers"][0]["resources"]["requests"],
        )
        for ps in wl["spec"]["podSets"]
    }
    asks = {"cpu": "2", "memory": str(2**30), GPU: "2"}
    assert sets == {
        "east": (2, {"holmes.dev/cluster": "east"}, {**asks, RDMA[0]: "1"}),
        "west": (2, {"holmes.dev/cluster": "west"}, {**asks, RDMA[1]: "1"}),
    }, sets

    cluster.kubectl(
        "patch",
        "clusterqueue",
        f"islands-{namespace}",
        "--type=json",
        "-p",
        json.dumps(
            [
                {
                    "op": "replace",
                    "path": "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota",
                    "value": "8",
                }
            ]
        ),
    )
    wait_phase(cluster, namespace, "wide", "Succeeded", timeout=120, op=operator)
    wl = workload(cluster, namespace, "wide")
    assert wl_condition(wl, "Finished")["status"] == "True"
    pods = pods_of(cluster, namespace, "wide")
    assert len(pods) == 4
    for p in pods:
        island = "east" if p["spec"]["nodeName"] in EAST else "west"
        assert p["spec"].get("nodeSelector") == {"holmes.dev/cluster": island}, (
            p["spec"]["nodeName"],
            p["spec"],
        )
        asked = p["spec"]["containers"][0]["resources"]
        assert asked["limits"][RDMA[island == "west"]] in (1, "1"), asked
    assert sorted(p["spec"]["nodeName"] in EAST for p in pods) == [False, False, True, True]


def test_a_job_runs_only_on_the_nodes_of_the_flavor_kueue_admitted_it_to(
    cluster, islands, operator, namespace
):
    """One pod that could run on either island's Ethernet node (east's, which the planner
    would take first, or west's): one PodSet, no island of its own, so Kueue picks the flavor,
    west here (first in the ClusterQueue). The pod runs on west's node, the flavor's node labels
    in its node selector, as Kueue's job framework puts them into its jobs' pods."""
    islands(order=("west", "east"))
    job = tiny_job("either", namespace, count=1, gpus=1, command=["sleep", "1"])
    on_ethernet_nodes(job)
    apply(cluster, in_queue(job, "islands"))
    wait_phase(cluster, namespace, "either", "Succeeded", timeout=120, op=operator)
    wl = workload(cluster, namespace, "either")
    (ps,) = wl["spec"]["podSets"]
    assert ps["name"] == "workers" and not ps["template"]["spec"].get("nodeSelector"), ps
    (pod,) = pods_of(cluster, namespace, "either")
    assert pod["spec"]["nodeName"] == "eth-1", pod["spec"]["nodeName"]
    assert pod["spec"]["nodeSelector"] == {"holmes.dev/cluster": "west"}, pod["spec"].get("nodeSelector")


WEST = ("roce-0", "roce-1", "eth-1")


def on_ethernet_nodes(job: dict) -> None:
    """Keep the job's pods to the two Ethernet nodes (no RDMA device to count), one per cluster."""
    job["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["eth-0", "eth-1"]}
                        ]
                    }
                ]
            }
        }
    }


@pytest.fixture
def tainted_west(cluster, namespace):
    """West's nodes tainted holmes.dev/reserved=<namespace>:NoSchedule for the test."""
    taint = f"holmes.dev/reserved={namespace}:NoSchedule"
    cluster.kubectl("taint", "nodes", *WEST, taint, "--overwrite")
    yield {"key": "holmes.dev/reserved", "value": namespace, "effect": "NoSchedule"}
    cluster.kubectl("taint", "nodes", *WEST, f"{taint}-", check=False)


def test_a_flavors_tolerations_let_the_job_onto_its_tainted_nodes(
    cluster, islands, tainted_west, operator, namespace
):
    """West's nodes are tainted; west's flavor says so (nodeTaints) and tolerates the taint
    (tolerations), the template does not. Kueue admits the job on west (first in the
    ClusterQueue): the job runs on a west node, the flavor's toleration appended to its pod's
    tolerations and its node labels in the node selector, as Kueue's job framework does for
    its own kinds. Before, Holmes planned with the template's tolerations only: west's nodes
    were ruled out and the admitted job waited for nodes."""
    toleration = {**tainted_west, "operator": "Equal"}
    islands(order=("west", "east"), west={"nodeTaints": [tainted_west], "tolerations": [toleration]})
    job = tiny_job("tolerated", namespace, count=1, gpus=1, command=["sleep", "1"])
    # the Ethernet nodes (no RDMA device to count): planned in the queue on east's, the untainted
    on_ethernet_nodes(job)
    apply(cluster, in_queue(job, "islands"))
    wait_phase(cluster, namespace, "tolerated", "Succeeded", timeout=90, op=operator)
    wl = workload(cluster, namespace, "tolerated")
    (psa,) = wl["status"]["admission"]["podSetAssignments"]
    assert set(psa["flavors"].values()) == {f"west-{namespace}"}, psa
    (pod,) = pods_of(cluster, namespace, "tolerated")
    assert pod["spec"]["nodeName"] == "eth-1", pod["spec"]["nodeName"]
    assert pod["spec"]["nodeSelector"] == {"holmes.dev/cluster": "west"}, pod["spec"].get("nodeSelector")
    assert toleration in pod["spec"]["tolerations"], pod["spec"]["tolerations"]


def test_kueue_evicts_a_job_whose_pods_are_not_ready_in_time_and_it_runs_later(
    cluster, real_kueue, queues, operator, namespace, shared_dir
):
    """Kueue's waitForPodsReady, its timeout made short (15 s) for this test: a job whose pod
    waits in its init container past it is evicted by Kueue (PodsReadyTimeout); the operator
    stops its pod and releases the quota, the Workload requeued as Kueue's job framework writes
    it (Requeued False, PodsReadyTimeout, until Kueue's back-off ends); Kueue admits it again
    and, its pods now able to start, it runs to Succeeded."""
    real_kueue.up(pods_ready_timeout="15s", log=lambda m: None)
    try:
        job = tiny_job("slow", namespace, count=1, gpus=1, command=["sleep", "1"])
        # an image every node has
        init = {"name": "hold", "image": cluster.trainer_image, "command": HOLD}
        job["spec"]["template"]["spec"]["initContainers"] = [init]
        go = hold(job, shared_dir)
        apply(cluster, queued(job))

        def evicted():
            ev = wl_condition(workload(cluster, namespace, "slow"), "Evicted")
            return ev if ev.get("status") == "True" else None

        ev = wait_for("the Workload evicted", evicted, timeout=90, op=operator)
        assert ev["reason"] == "PodsReadyTimeout", ev

        def released():
            wl = workload(cluster, namespace, "slow")
            if wl_condition(wl, "QuotaReserved").get("status") != "False":
                return None
            live = [
                p for p in pods_of(cluster, namespace, "slow") if not p["metadata"].get("deletionTimestamp")
            ]
            return None if live else wl

        wl = wait_for("the pod stopped and the quota released", released, timeout=60, op=operator)
        assert "admission" not in wl["status"]
        requeued = wl_condition(wl, "Requeued")
        # False until Kueue's back-off ends (then True, BackoffFinished)
        assert requeued["reason"] in ("PodsReadyTimeout", "BackoffFinished"), requeued
        assert wl["status"]["requeueState"]["count"] == 1
        # the ClusterQueue's status follows (Kueue writes it after the Workload's; before its
        # back-off of 10 s ends and it admits the job again)
        wait_for(
            "the ClusterQueue's GPUs released", lambda: reserved_gpus(cluster, queues) == 0 or None, timeout=8
        )
        job_now = get_job(cluster, namespace, "slow")
        assert job_now["status"]["phase"] == "Suspended", job_now["status"]
        assert condition(job_now, "Suspended")["reason"] == "Requeued"

        go.touch()  # the next attempt's pods can start
        done = wait_phase(cluster, namespace, "slow", "Succeeded", timeout=120, op=operator)
        assert done["status"]["restarts"] == 0  # a requeue is not a failure
        wl = workload(cluster, namespace, "slow")
        assert wl_condition(wl, "Finished")["status"] == "True"
    finally:
        real_kueue.up(log=lambda m: None)  # the default timeout again, for the tests after
