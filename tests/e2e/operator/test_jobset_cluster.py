"""The real JobSet controller (``sigs.k8s.io/jobset``, the ``real_jobset`` fixture) on the test bed,
alone and under the real Kueue's Topology Aware Scheduling over Holmes' islands (issue 51: "a
JobSet the same way"). Nothing here plays JobSet's or Kueue's part:

- a JobSet runs to Completed: JobSet's webhooks default it (reached by the API server as Kueue's
  are), its controller creates a Job per replica, the Jobs' pods run on the nodes;
- a JobSet in a TAS LocalQueue whose replicated job's pod template requires Holmes' island level
  (``kueue.x-k8s.io/podset-required-topology: topology.holmes.dev/island``) is admitted by Kueue
  with its PodSet inside one island, and every pod runs there.
"""

from __future__ import annotations

import json

import pytest

from holmes.operator.core import island_topology as topo
from tests.helpers.operator.cluster_helpers import apply, running_operator, wait_for
from tests.helpers.operator.tas_helpers import (
    GPU,
    ISLAND,
    ISLANDS,
    assigned_hosts,
    delete_kueue_objects,
    kueue_objects,
    published,
)

pytestmark = pytest.mark.timeout(420)

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"


def jobset(
    namespace: str, name: str, replicas: int, image: str, gpus: int = 0, annotations: dict | None = None
) -> dict:
    """A JobSet of one replicated job ``workers``: ``replicas`` Jobs of one pod each (1 CPU,
    ``gpus`` GPUs) that sleeps a second in ``image`` (one every node has). No completion mode,
    restart policy or network: JobSet's webhook defaults them."""
    res: dict = {"requests": {"cpu": "1"}}
    if gpus:
        res = {"requests": {"cpu": "1", GPU: str(gpus)}, "limits": {GPU: str(gpus)}}
    pod = {
        "metadata": {"annotations": annotations or {}},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": image, "command": ["sleep", "1"], "resources": res}],
        },
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": replicas,
                    "template": {"spec": {"backoffLimit": 0, "template": pod}},
                }
            ]
        },
    }


def get_jobset(cluster, ns, name) -> dict:
    return cluster.get_json("jobsets.jobset.x-k8s.io", name, "-n", ns)


def completed(cluster, ns, name):
    js = get_jobset(cluster, ns, name)
    conds = {c["type"]: c["status"] for c in (js.get("status") or {}).get("conditions") or []}
    assert conds.get("Failed") != "True", json.dumps(js.get("status"), indent=1)
    return js if conds.get("Completed") == "True" else None


def jobset_pods(cluster, ns, name) -> list[dict]:
    return cluster.get_json("pods", "-n", ns, "-l", f"{JOBSET_NAME}={name}")["items"]


def test_a_jobset_runs_to_completion_on_the_real_jobset_controller(cluster, real_jobset, namespace):
    """A JobSet of 2 replicas: defaulted by JobSet's webhook (Indexed Jobs, DNS hostnames), a
    Job per replica, both pods Succeeded on the nodes, the JobSet Completed."""
    apply(cluster, jobset(namespace, "pair", 2, cluster.trainer_image))
    js = get_jobset(cluster, namespace, "pair")
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["completionMode"] == "Indexed"
    assert js["spec"]["network"]["enableDNSHostnames"] is True

    js = wait_for("the JobSet Completed", lambda: completed(cluster, namespace, "pair"), timeout=120)
    (status,) = js["status"]["replicatedJobsStatus"]
    assert status["name"] == "workers" and status["succeeded"] == 2, status
    pods = jobset_pods(cluster, namespace, "pair")
    assert len(pods) == 2 and {p["status"]["phase"] for p in pods} == {"Succeeded"}, pods
    assert all(p["spec"].get("nodeName") and p["spec"].get("subdomain") == "pair" for p in pods)


@pytest.fixture
def tas(cluster, real_jobset, real_kueue, namespace, tmp_path):
    """Holmes' Topology, flavors, ClusterQueue and the LocalQueue ``tas`` (tas_helpers), with an
    operator running to publish each node's island (JobSet before Kueue: see real_jobset)."""
    from localkube.operatorproc import install_crd

    install_crd(cluster.kubeconfig)
    objs = kueue_objects(namespace)
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    for op in running_operator(cluster, namespace, tmp_path, extra=["--progress-interval=1"], tail=60):
        yield op
        cluster.kubectl(
            "delete", "jobsets.jobset.x-k8s.io", "--all", "-n", namespace, "--timeout=60s", check=False
        )
        delete_kueue_objects(cluster, namespace, objs)


def jobset_workload(cluster, ns, name) -> dict | None:
    for w in cluster.get_json("workloads.kueue.x-k8s.io", "-n", ns)["items"]:
        if any(
            o.get("kind") == "JobSet" and o.get("name") == name
            for o in w["metadata"].get("ownerReferences") or []
        ):
            return w
    return None


def test_a_jobset_asking_for_holmes_island_level_lands_inside_one_island(cluster, tas, namespace):
    """A JobSet of 2 replicas x 2 GPUs in the TAS LocalQueue whose pod template requires Holmes'
    island level: Kueue suspends it, admits its one PodSet (2 pods) with a topology assignment
    inside one island (east's or west's RDMA nodes: no Ethernet island holds 4 GPUs), and both
    pods run on the nodes assigned, the JobSet Completed."""
    wait_for("the operator's island labels on every node", lambda: published(cluster), timeout=60, op=tas)
    js = jobset(
        namespace,
        "tas-pair",
        2,
        cluster.trainer_image,
        gpus=2,
        annotations={topo.ANN_REQUIRED_TOPOLOGY: ISLAND},
    )
    js["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "tas"}
    # the object as admitted (Kueue's webhook suspends it): a read after it may already find it
    # admitted and unsuspended by Kueue (it was, once in a full run)
    created = json.loads(cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(js)).stdout)
    assert created["spec"].get("suspend") is True

    wait_for("the JobSet Completed", lambda: completed(cluster, namespace, "tas-pair"), timeout=180, op=tas)
    wl = jobset_workload(cluster, namespace, "tas-pair")
    assert wl, "Kueue made no Workload for the JobSet"
    (ps,) = wl["spec"]["podSets"]
    assert ps["count"] == 2 and ps["topologyRequest"]["required"] == ISLAND, ps
    (psa,) = wl["status"]["admission"]["podSetAssignments"]
    hosts = assigned_hosts(psa)
    pods = jobset_pods(cluster, namespace, "tas-pair")
    nodes = sorted(p["spec"]["nodeName"] for p in pods)
    assert nodes == hosts, (nodes, hosts)
    assert len({ISLANDS[n] for n in nodes}) == 1 and ISLANDS[nodes[0]] in ("east.infiniband", "west.roce"), (
        nodes
    )
    for p in pods:
        assert p["spec"]["nodeSelector"]["kubernetes.io/hostname"] == p["spec"]["nodeName"], p["spec"]
        assert p["metadata"]["annotations"][topo.ANN_WORKLOAD] == wl["metadata"]["name"]
