"""Holmes' islands as the topology of the real Kueue's Topology Aware Scheduling (TAS; Kueue
v0.17.1, the ``real_kueue`` fixture, TopologyAwareScheduling on). Nothing here plays Kueue's part:

- the operator publishes its levels on the nodes (topology.holmes.dev/cluster, /island: cluster
  x NIC kind, as it classifies each node, whatever label scheme the node advertises its NIC by);
- Holmes' Topology (core/island_topology.kueue_topology) is accepted by Kueue's CRD (its CEL
  rules) and a flavor per cluster names it; Kueue admits a HolmesJob of that ClusterQueue with
  each PodSet inside one island (a topology assignment per PodSet), and its pods run on the
  nodes Kueue picked;
- a plain batch/v1 Job that asks for Holmes' island level (kueue.x-k8s.io/podset-required-topology)
  lands inside one island, and one no island can hold is not admitted though the quota fits;
- a HolmesJob preempted on the TAS queue by a higher WorkloadPriorityClass is stopped, its quota
  released, requeued, and resumes from its checkpoint inside one island.
"""

from __future__ import annotations

import json

import pytest
from holmes_dev.jobs import tiny_job

from holmes.operator.core import island_topology as topo
from tests.helpers.operator.cluster_helpers import (
    apply,
    condition,
    pods_of,
    running_operator,
    wait_for,
    wait_phase,
)
from tests.helpers.operator.kueue_real import GpuWatch, iterations_logged, training_job
from tests.helpers.operator.kueue_real import kueue_objects as real_objects
from tests.helpers.operator.tas_helpers import (
    GPU,
    ISLAND,
    ISLANDS,
    assigned_hosts,
    delete_kueue_objects,
    kueue_objects,
    published,
)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def operator(cluster, real_kueue, namespace, tmp_path):
    from localkube.operatorproc import install_crd

    install_crd(cluster.kubeconfig)
    yield from running_operator(cluster, namespace, tmp_path, extra=["--progress-interval=1"], tail=120)


@pytest.fixture
def tas(cluster, real_kueue, namespace):
    objs = kueue_objects(namespace)
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    yield objs
    cluster.kubectl(
        "delete", "holmesjob", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
    )
    cluster.kubectl(
        "delete", "jobs.batch", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
    )
    delete_kueue_objects(cluster, namespace, objs)


def workload(cluster, ns, name) -> dict | None:
    r = cluster.kubectl("get", "workloads.kueue.x-k8s.io", name, "-n", ns, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def test_a_holmesjob_is_admitted_by_topology_each_pod_set_inside_one_island(
    cluster, tas, operator, namespace
):
    """The operator labels every node with its island (before: none had one). A job of 4 pods
    x 2 GPUs (more than any island's 4 GPUs) in the TAS ClusterQueue: its Workload has a PodSet
    per island Holmes planned, each selecting that island and requiring the island level; Kueue
    admits each with a topology assignment inside it, and each pod runs on a node Kueue
    assigned to its PodSet, selected by hostname as Kueue's TAS gives it (no node affinity of
    Holmes' own), annotated as the Workload's TAS pod."""
    got = wait_for(
        "the operator's island labels on every node", lambda: published(cluster), timeout=60, op=operator
    )
    assert {n: got[n] for n in ISLANDS} == ISLANDS
    clusters = {
        n["metadata"]["name"]: n["metadata"]["labels"].get(topo.LABEL_CLUSTER)
        for n in cluster.get_json("nodes")["items"]
    }
    assert {clusters[n] for n in ISLANDS} == {"east", "west"}

    job = tiny_job("wide", namespace, count=4, gpus=2, command=["sleep", "2"])
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "tas"}
    apply(cluster, job)
    wait_phase(cluster, namespace, "wide", "Succeeded", timeout=180, op=operator)

    wl = workload(cluster, namespace, "holmesjob-wide")
    sets = {p["name"]: p for p in wl["spec"]["podSets"]}
    assert len(sets) >= 2, sets  # no island holds the job: a PodSet per island
    for p in sets.values():
        assert p["topologyRequest"]["required"] == ISLAND, p
        assert p["template"]["spec"]["nodeSelector"][ISLAND] in set(ISLANDS.values())
    psas = {a["name"]: a for a in wl["status"]["admission"]["podSetAssignments"]}
    assert set(psas) == set(sets)
    by_pod_set: dict[str, list[str]] = {}
    for name, a in psas.items():
        island = sets[name]["template"]["spec"]["nodeSelector"][ISLAND]
        hosts = assigned_hosts(a)
        assert len(hosts) == sets[name]["count"] and {ISLANDS[h] for h in hosts} == {island}, (name, a)
        by_pod_set[name] = hosts
    pods = pods_of(cluster, namespace, "wide")
    assert len(pods) == 4
    ran = sorted(p["spec"]["nodeName"] for p in pods)
    assert ran == sorted(h for hs in by_pod_set.values() for h in hs), (ran, by_pod_set)
    for p in pods:
        sel, node = p["spec"]["nodeSelector"], p["spec"]["nodeName"]
        assert sel["kubernetes.io/hostname"] == node and sel[ISLAND] == ISLANDS[node], sel
        assert "nodeAffinity" not in (p["spec"].get("affinity") or {}), p["spec"]["affinity"]
        ann = p["metadata"]["annotations"]
        assert ann[topo.ANN_REQUIRED_TOPOLOGY] == ISLAND and ann[topo.ANN_WORKLOAD] == "holmesjob-wide"


def batch_job(namespace: str, name: str, pods: int, image: str) -> dict:
    """A plain Job of ``pods`` pods x 2 GPUs in the TAS LocalQueue, asking Kueue for one domain
    of Holmes' island level, as any workload may; ``image`` one every node has."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {"kueue.x-k8s.io/queue-name": "tas"}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "suspend": True,
            "template": {
                "metadata": {"annotations": {topo.ANN_REQUIRED_TOPOLOGY: ISLAND}},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "c",
                            "image": image,
                            "command": ["sleep", "2"],
                            "resources": {"requests": {"cpu": "1", GPU: "2"}, "limits": {GPU: "2"}},
                        }
                    ],
                },
            },
        },
    }


def job_workload(cluster, ns, job) -> dict | None:
    for w in cluster.get_json("workloads.kueue.x-k8s.io", "-n", ns)["items"]:
        if any(
            o.get("name") == job and o.get("kind") == "Job"
            for o in w["metadata"].get("ownerReferences") or []
        ):
            return w
    return None


def test_a_plain_job_asking_for_holmes_island_level_lands_inside_one_island(
    cluster, tas, operator, namespace
):
    """A batch/v1 Job of 2 pods x 2 GPUs requiring Holmes' island level: Kueue admits it inside
    one island (east's or west's RDMA nodes: no Ethernet island holds 4 GPUs) and both pods run
    there. One of 3 pods x 2 GPUs fits the ClusterQueue's quota (12 GPUs) but no island (4 GPUs
    each): Kueue does not admit it, saying so."""
    wait_for(
        "the operator's island labels on every node", lambda: published(cluster), timeout=60, op=operator
    )
    apply(cluster, batch_job(namespace, "pair", 2, cluster.trainer_image))

    def done():
        j = cluster.get_json("jobs.batch", "pair", "-n", namespace)
        return j if (j.get("status") or {}).get("succeeded") == 2 else None

    wait_for("the Job's 2 pods succeeded", done, timeout=150, op=operator)
    wl = job_workload(cluster, namespace, "pair")
    (ps,) = wl["spec"]["podSets"]
    assert ps["topologyRequest"]["required"] == ISLAND, ps
    (psa,) = wl["status"]["admission"]["podSetAssignments"]
    hosts = assigned_hosts(psa)
    pods = cluster.get_json("pods", "-n", namespace, "-l", "job-name=pair")["items"]
    nodes = sorted(p["spec"]["nodeName"] for p in pods)
    assert nodes == hosts, (nodes, hosts)
    assert len({ISLANDS[n] for n in nodes}) == 1 and ISLANDS[nodes[0]] in ("east.infiniband", "west.roce"), (
        nodes
    )

    apply(cluster, batch_job(namespace, "three", 3, cluster.trainer_image))

    def refused():
        w = job_workload(cluster, namespace, "three")
        c = next(
            (
                c
                for c in ((w or {}).get("status") or {}).get("conditions") or []
                if c["type"] == "QuotaReserved"
            ),
            {},
        )
        return c if c.get("status") == "False" and c.get("message") else None

    c = wait_for("Kueue's word on the 3-pod Job", refused, timeout=60, op=operator)
    assert "topology" in c["message"].lower() or "domain" in c["message"].lower(), c
    assert not [
        p
        for p in cluster.get_json("pods", "-n", namespace, "-l", "job-name=three")["items"]
        if p["spec"].get("nodeName")
    ]


def test_a_preempted_job_under_tas_is_stopped_released_requeued_and_resumes_inside_one_island(
    cluster, real_kueue, operator, namespace, tmp_path
):
    """Preemption under TAS (issue 51's "a preempted HolmesJob is stopped, released, requeued and
    later resumes", on a topology-aware queue): 4 GPUs in the TAS ClusterQueue (east's flavor),
    lower priorities preempted within it. ``low`` trains on 2 whole nodes (2 GPUs each: with
    fewer per pod Kueue's TAS may put both pods on one node, and Holmes plans one pod per node)
    of one island; ``high``
    preempts it: Kueue evicts low's Workload, the operator stops its pods (the trainers
    checkpoint on SIGTERM) and releases the quota, Kueue requeues it; high runs to Succeeded;
    Kueue admits low again with a new topology assignment and it resumes from its checkpoint to
    Succeeded. Each admission's pods inside one island; never more GPUs in running pods than
    the quota."""
    objs = kueue_objects(namespace)
    cq = next(o for o in objs if o["kind"] == "ClusterQueue")
    cq["spec"]["preemption"] = {"withinClusterQueue": "LowerPriority"}
    for f in cq["spec"]["resourceGroups"][0]["flavors"]:
        for r in f["resources"]:
            if r["name"] == GPU:
                r["nominalQuota"] = "4" if f["name"].startswith("east") else "0"
    priorities = [o for o in real_objects(namespace, 4) if o["kind"] == "WorkloadPriorityClass"]
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs + priorities})
    )
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)

    def in_queue(job: dict, priority: str) -> dict:
        job["metadata"]["labels"] = {
            "kueue.x-k8s.io/queue-name": "tas",
            "kueue.x-k8s.io/priority-class": priority,
        }
        return job

    def islands_of_running() -> set[str] | None:
        pods = [p for p in pods_of(cluster, namespace, "low") if p["status"].get("phase") == "Running"]
        return {ISLANDS[p["spec"]["nodeName"]] for p in pods} if len(pods) == 2 else None

    try:
        wait_for("the operator's island labels", lambda: published(cluster), timeout=60, op=operator)
        with GpuWatch(cluster, namespace) as gpus:
            apply(cluster, in_queue(training_job(namespace, "low", shared, iterations=40, gpus=2), "low"))
            metrics = shared / "low.jsonl"

            wait_for("low training", iterations_logged(metrics), timeout=180, op=operator)
            first = islands_of_running()
            assert first is not None and len(first) == 1, first  # TAS kept it inside one island
            apply(
                cluster,
                in_queue(tiny_job("high", namespace, count=2, gpus=2, command=["sleep", "3"]), "high"),
            )

            def evicted():
                ev = wl_condition(workload(cluster, namespace, "holmesjob-low"), "Evicted")
                return ev if ev.get("status") == "True" else None

            assert (
                wait_for("low's Workload evicted", evicted, timeout=60, op=operator)["reason"] == "Preempted"
            )
            job = wait_phase(cluster, namespace, "low", "Suspended", timeout=60, op=operator)
            assert condition(job, "Suspended")["reason"] == "Requeued"
            wait_phase(cluster, namespace, "high", "Succeeded", timeout=180, op=operator)
            again = wait_for("low running again", islands_of_running, timeout=180, op=operator)
            assert len(again) == 1, again
            wl = workload(cluster, namespace, "holmesjob-low")
            (psa,) = wl["status"]["admission"]["podSetAssignments"]
            assert {ISLANDS[h] for h in assigned_hosts(psa)} == again  # where Kueue's TAS put it
            done = wait_phase(cluster, namespace, "low", "Succeeded", timeout=300, op=operator)
        assert done["status"]["restarts"] == 0  # a requeue is not a failure
        assert gpus.samples > 10 and gpus.most <= 4, f"{gpus.most} GPUs held at once by running pods; quota 4"
        lines = [json.loads(x) for x in metrics.read_text().splitlines()]
        preempted = next(x for x in lines if x["holmes"] == "preempted")
        resume = next(x for x in lines if x["holmes"] == "resume")
        assert preempted["saved"] and resume["iteration"] == preempted["iteration"], (preempted, resume)
        assert {x["iteration"] for x in lines if x["holmes"] == "iteration"} == set(range(1, 41))
    finally:
        cluster.kubectl(
            "delete", "holmesjob", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
        )
        delete_kueue_objects(cluster, namespace, objs)


def wl_condition(wl: dict | None, type_: str) -> dict:
    return next(
        (c for c in ((wl or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), {}
    )
