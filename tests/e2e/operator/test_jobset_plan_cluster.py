"""Issue 53's labelled JobSet on the real JobSet controller (``real_jobset``) and the testbed's
islands (hack/topologies/default.yaml: east's 2 InfiniBand nodes, west's 2 RoCE nodes, an
Ethernet node in each): nothing plays JobSet's or Holmes' part.

- A JobSet without the label runs as it would without Holmes: no plan, no node selector added,
  Completed, under a running operator.
- The operator stopped, a JobSet labelled ``holmes.dev/plan: enabled`` (pipeline 2 x data 2,
  four pods gated by their template, the launcher's init container and the plan volume as
  docs/jobset.md says) is applied: its pods wait at the gate and say who removes it. The operator
  restarted picks them up: the plan ConfigMap is written, each pod is pinned so every stage's
  pods are on one island, ranks stage by stage; the JobSet reaches Completed running a plain torchrun
  program (``init_process_group()`` without a backend) whose groups log their network: every
  data-parallel group on its island's IB, the world on sockets.
- Under the real Kueue (``real_kueue``, its JobSet integration on): a labelled JobSet queued in a
  LocalQueue that does not exist yet is suspended by Kueue and Holmes says it waits for Kueue's
  admission (Event and the JobSet's ``holmes.dev/plan-status``); once the LocalQueue exists Kueue
  admits it to a flavor of west's nodes, and Holmes plans it there (without Kueue it would take
  east's InfiniBand island, the larger name first), leaving Kueue's node selector in place; the
  JobSet Completes and its status annotation says Planned.
- Under the real Kueue's Topology Aware Scheduling over Holmes' islands (tas_helpers): a labelled
  JobSet of two replicatedJobs (one per stage, each requiring the island level, each pod a whole
  node's 2 GPUs) carries Kueue's gate and Holmes' gate; Kueue's ungater removes its own and pins
  each pod's node, Holmes then keeps those nodes, numbers the ranks stage by stage (stage 0 on
  one island, stage 1 on the other) and removes only its own gate; the JobSet Completes.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from holmes.contract.names import LABEL_KUEUE_QUEUE
from holmes.operator.core import jobset_plan as jp
from holmes.operator.core import jobset_status
from localkube.operatorproc import OperatorProcess, install_crd
from tests.helpers.frameworks.cluster_jobs import PROGRAMS_MOUNT, json_lines, mount_programs
from tests.helpers.operator.cluster_helpers import apply, wait_for
from tests.helpers.operator.tas_helpers import (
    ISLANDS,
    assert_pinned_inside_west,
    delete_kueue_objects,
    published,
    west_flavor_queue,
)
from tests.helpers.operator.tas_helpers import kueue_objects as tas_objects

pytestmark = [
    pytest.mark.timeout(420),
    pytest.mark.skipif(os.geteuid() != 0, reason="pod network namespaces need root"),
]

LAUNCH = "/holmes-launch"


def jobset(ns: str, name: str, image: str, labelled: bool, replicas: int = 2, pipeline: str = "2") -> dict:
    """2 Jobs x 2 pods (Indexed) of ``image`` (one with torch and Holmes' launcher: the trainer
    image); labelled, the trainer runs plain_groups.py (a volume) under the launcher (unlabelled
    there is no rendezvous for it: a one-line program stands in)."""
    program = ["python", f"{PROGRAMS_MOUNT}/plain_groups.py"]
    if not labelled:
        program = ["python", "-c", "print('plain')"]
    pod: dict = {
        "metadata": {"annotations": {}},
        "spec": {
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "trainer",
                    "image": image,
                    "command": program,
                    "resources": {"requests": {"cpu": "100m"}},
                }
            ],
        },
    }
    meta: dict = {"name": name, "namespace": ns}
    if labelled:
        meta["labels"] = {jp.LABEL_PLAN: jp.PLAN_ENABLED}
        meta["annotations"] = {jp.ANN_PIPELINE: pipeline, jp.ANN_DATA: "2"}
        spec = pod["spec"]
        pod["metadata"]["annotations"][jp.ANN_GATED_BY] = "Holmes operator: it removes the gate once planned"
        spec["schedulingGates"] = [{"name": jp.GATE}]
        spec["initContainers"] = [
            {
                "name": "holmes-launch",
                "image": image,
                "command": ["python", "-m", "holmes.launch.install", LAUNCH],
                "volumeMounts": [{"name": "holmes-launch", "mountPath": LAUNCH}],
            }
        ]
        c = spec["containers"][0]
        c["command"] = ["python", f"{LAUNCH}/launch.py", "--", *program]
        c["env"] = [{"name": "HOLMES_PLAN", "value": "/etc/holmes/plan.json"}]
        c["volumeMounts"] = [
            {"name": "holmes-launch", "mountPath": LAUNCH},
            {"name": "holmes-plan", "mountPath": "/etc/holmes", "readOnly": True},
        ]
        spec["volumes"] = [
            {"name": "holmes-launch", "emptyDir": {}},
            {"name": "holmes-plan", "configMap": {"name": jp.plan_name(name), "optional": True}},
        ]
        mount_programs(spec)
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": meta,
        "spec": {
            "replicatedJobs": [
                {
                    "name": "w",
                    "replicas": replicas,
                    "template": {
                        "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0, "template": pod}
                    },
                }
            ]
        },
    }


def pods_of(cluster, ns, name) -> list[dict]:
    return cluster.get_json("pods", "-n", ns, "-l", f"{jp.JS_NAME}={name}")["items"]


def completed(cluster, ns, name):
    js = cluster.get_json("jobsets.jobset.x-k8s.io", name, "-n", ns)
    conds = {c["type"]: c for c in (js.get("status") or {}).get("conditions") or []}
    failed = conds.get("Failed", {})
    assert failed.get("status") != "True", failed
    return js if conds.get("Completed", {}).get("status") == "True" else None


def test_a_labelled_jobset_is_planned_by_island_and_the_unlabelled_one_runs_as_before(
    cluster, real_jobset, namespace, tmp_path
):
    install_crd(cluster.kubeconfig)
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log").start()
    try:
        # unlabelled: Holmes leaves it alone (no plan, no node selector), JobSet runs it
        apply(cluster, jobset(namespace, "plain", cluster.trainer_image, labelled=False))
        wait_for("the plain JobSet Completed", lambda: completed(cluster, namespace, "plain"), 90, 1, op)
        plain = pods_of(cluster, namespace, "plain")
        assert len(plain) == 4 and {p["status"]["phase"] for p in plain} == {"Succeeded"}
        assert all("kubernetes.io/hostname" not in (p["spec"].get("nodeSelector") or {}) for p in plain)
        r = cluster.kubectl("get", "configmap", jp.plan_name("plain"), "-n", namespace, check=False)
        assert r.returncode != 0  # Holmes made no plan for it
        op.stop()

        # the operator stopped: the labelled JobSet's pods wait at the gate and say who removes it
        apply(cluster, jobset(namespace, "planned", cluster.trainer_image, labelled=True))

        def gated():
            ps = pods_of(cluster, namespace, "planned")
            return ps if len(ps) == 4 and all(jp.gated(p) for p in ps) else None

        for p in wait_for("the four pods gated", gated, timeout=60):
            assert p["metadata"]["annotations"][jp.ANN_GATED_BY].startswith("Holmes operator")
            cond = next(c for c in p["status"]["conditions"] if c["type"] == "PodScheduled")
            assert cond["reason"] == "SchedulingGated", cond
            assert not p["spec"].get("nodeName")

        op.start()  # restarted: it finds the gated pods
        wait_for(
            "the labelled JobSet Completed", lambda: completed(cluster, namespace, "planned"), 180, 1, op
        )
    finally:
        op.stop()
        print(op.tail(60))

    cm = cluster.get_json("configmap", jp.plan_name("planned"), "-n", namespace)
    assert cm["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
    doc = jp.read_plan(cm)
    assert (doc["pipeline"], doc["data"], doc["layersPerStage"]) == (2, 2, None)
    pods = pods_of(cluster, namespace, "planned")
    stage_islands: dict[int, set[str]] = {}
    for p in pods:
        entry = doc["pods"][p["spec"]["hostname"]]
        node = p["spec"]["nodeName"]
        assert node == entry["node"] == p["spec"]["nodeSelector"]["kubernetes.io/hostname"], p["spec"]
        assert not p["spec"].get("schedulingGates")
        stage_islands.setdefault(entry["stage"], set()).add(ISLANDS[node])
        labels = p["metadata"]["labels"]
        index = (int(labels[jp.JS_GLOBAL_INDEX]), int(labels[jp.COMPLETION_INDEX]))
        assert entry["nodeRank"] == index[0] * 2 + index[1]  # the JobSet's order, stage by stage
    assert sorted(len(s) for s in stage_islands.values()) == [1, 1], stage_islands
    assert {i for s in stage_islands.values() for i in s} == {"east.infiniband", "west.roce"}

    groups = []
    for p in pods:
        log = cluster.pod_log(namespace, p["metadata"]["name"], "trainer")
        assert json_lines(log, "plainTorchrun"), log[-3000:]
        groups += json_lines(log, "holmesGroup")
    nets = {tuple(g["ranks"]): g["net"] for g in groups}
    assert nets[(0, 1)] == nets[(2, 3)] == "IB", groups  # each stage's DP group: its island's IB
    assert nets.get((0, 1, 2, 3), "Socket") == "Socket", groups  # the world spans both islands
    cluster.kubectl(
        "delete", "jobsets.jobset.x-k8s.io", "--all", "-n", namespace, "--timeout=60s", check=False
    )


def plan_status(cluster, ns, name) -> dict:
    js = cluster.get_json("jobsets.jobset.x-k8s.io", name, "-n", ns)
    return jobset_status.current(js)


def test_a_queued_labelled_jobset_waits_for_kueue_and_is_planned_inside_the_admitted_flavor(
    cluster, real_jobset, real_kueue, namespace, tmp_path
):
    install_crd(cluster.kubeconfig)
    objs = west_flavor_queue(namespace)
    apply(cluster, {"apiVersion": "v1", "kind": "List", "items": objs})
    # 2 pods: data 2
    js = jobset(namespace, "queued", cluster.trainer_image, labelled=True, replicas=1, pipeline="1")
    js["metadata"]["labels"][LABEL_KUEUE_QUEUE] = "user-queue"
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log").start()
    try:
        apply(cluster, js)  # its LocalQueue does not exist yet: Kueue keeps it suspended

        def waiting():
            st = plan_status(cluster, namespace, "queued")
            return st if st.get("reason") == "WaitingForAdmission" else None

        st = wait_for("Holmes saying the JobSet waits for Kueue", waiting, 90, 0.5, op)
        assert st["state"] == "Waiting" and "user-queue" in st["message"], st
        got = cluster.get_json("jobsets.jobset.x-k8s.io", "queued", "-n", namespace)
        assert got["spec"]["suspend"] is True and not pods_of(cluster, namespace, "queued")
        events = cluster.get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=queued")
        assert "WaitingForAdmission" in {e["reason"] for e in events["items"]}

        t0 = time.monotonic()
        lq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue"}
        apply(
            cluster,
            {
                **lq,
                "metadata": {"name": "user-queue", "namespace": namespace},
                "spec": {"clusterQueue": f"cq-{namespace}"},
            },
        )
        wait_for("the queued JobSet Completed", lambda: completed(cluster, namespace, "queued"), 180, 1, op)
        print(f"LocalQueue applied -> JobSet Completed: {time.monotonic() - t0:.1f}s")
    finally:
        op.stop()
        print(op.tail(60))
    wl = cluster.get_json("workloads.kueue.x-k8s.io", "-n", namespace)["items"]
    assert len(wl) == 1, [w["metadata"]["name"] for w in wl]
    psa = wl[0]["status"]["admission"]["podSetAssignments"]
    assert [a["flavors"] for a in psa] == [{"cpu": f"west-{namespace}"}]
    doc = jp.read_plan(cluster.get_json("configmap", jp.plan_name("queued"), "-n", namespace))
    assert (doc["pipeline"], doc["data"]) == (1, 2)
    pods = pods_of(cluster, namespace, "queued")
    assert len(pods) == 2
    assert_pinned_inside_west(pods, doc)
    st = plan_status(cluster, namespace, "queued")
    assert (st["state"], st["reason"]) == ("Planned", "PlanWritten"), st
    print("plan status:", json.dumps(st))
    cluster.kubectl(
        "delete", "jobsets.jobset.x-k8s.io", "--all", "-n", namespace, "--timeout=60s", check=False
    )
    cluster.kubectl("delete", "localqueue", "user-queue", "-n", namespace, "--wait=false", check=False)
    for o in reversed(objs):
        cluster.kubectl(
            "delete",
            o["kind"].lower() + "s.kueue.x-k8s.io",
            o["metadata"]["name"],
            "--wait=false",
            check=False,
        )


def tas_jobset(ns: str, name: str, image: str) -> dict:
    """Two replicatedJobs s0, s1 of 2 pods (2 GPUs each: a node each), each PodSet requiring
    Holmes' island level, in the TAS LocalQueue; gated by Holmes; the pods print their plan."""
    rjobs = []
    for rj in ("s0", "s1"):
        pod = {
            "metadata": {
                "annotations": {
                    jp.ANN_GATED_BY: "Holmes operator: it removes the gate once planned",
                    "kueue.x-k8s.io/podset-required-topology": "topology.holmes.dev/island",
                }
            },
            "spec": {
                "automountServiceAccountToken": False,
                "restartPolicy": "Never",
                "schedulingGates": [{"name": jp.GATE}],
                "containers": [
                    {
                        "name": "trainer",
                        "image": image,
                        "command": ["sh", "-c", "cat /etc/holmes/plan.json >/dev/null && echo planned"],
                        "resources": {
                            "requests": {"cpu": "100m", "nvidia.com/gpu": "2"},
                            "limits": {"nvidia.com/gpu": "2"},
                        },
                        "volumeMounts": [
                            {"name": "holmes-plan", "mountPath": "/etc/holmes", "readOnly": True}
                        ],
                    }
                ],
                "volumes": [
                    {"name": "holmes-plan", "configMap": {"name": jp.plan_name(name), "optional": True}}
                ],
            },
        }
        spec = {"parallelism": 2, "completions": 2, "backoffLimit": 0, "template": pod}
        rjobs.append({"name": rj, "replicas": 1, "template": {"spec": spec}})
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {jp.LABEL_PLAN: jp.PLAN_ENABLED, LABEL_KUEUE_QUEUE: "tas"},
            "annotations": {jp.ANN_PIPELINE: "2", jp.ANN_DATA: "2"},
        },
        "spec": {"replicatedJobs": rjobs},
    }


def test_under_tas_kueue_picks_each_pods_node_and_holmes_numbers_the_stages_by_island(
    cluster, real_jobset, real_kueue, namespace, tmp_path
):
    install_crd(cluster.kubeconfig)
    objs = tas_objects(namespace)
    apply(cluster, {"apiVersion": "v1", "kind": "List", "items": objs})
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log").start()
    try:
        wait_for("the operator's island labels on every node", lambda: published(cluster), 60, 0.5, op)
        apply(cluster, tas_jobset(namespace, "tas", cluster.trainer_image))
        wait_for("the TAS JobSet Completed", lambda: completed(cluster, namespace, "tas"), 240, 1, op)
    finally:
        op.stop()
        print(op.tail(60))
    doc = jp.read_plan(cluster.get_json("configmap", jp.plan_name("tas"), "-n", namespace))
    assert (doc["pipeline"], doc["data"], doc["nprocPerNode"]) == (2, 2, 2)
    pods = pods_of(cluster, namespace, "tas")
    stage_islands: dict[int, set[str]] = {}
    for p in pods:
        entry = doc["pods"][p["spec"]["hostname"]]
        node = p["spec"]["nodeName"]
        assert node == entry["node"] == p["spec"]["nodeSelector"]["kubernetes.io/hostname"], p["spec"]
        assert not p["spec"].get("schedulingGates") and p["status"]["phase"] == "Succeeded"
        stage_islands.setdefault(entry["stage"], set()).add(ISLANDS[node])
        assert entry["stage"] == int(p["metadata"]["labels"][jp.JS_GLOBAL_INDEX])  # s0 is stage 0
    assert sorted(len(s) for s in stage_islands.values()) == [1, 1], stage_islands
    assert {i for s in stage_islands.values() for i in s} == {"east.infiniband", "west.roce"}
    st = plan_status(cluster, namespace, "tas")
    assert (st["state"], st["reason"]) == ("Planned", "PlanWritten"), st
    cluster.kubectl(
        "delete", "jobsets.jobset.x-k8s.io", "--all", "-n", namespace, "--timeout=60s", check=False
    )
    delete_kueue_objects(cluster, namespace, objs)
