"""A labelled JobSet that Kueue manages (core/jobset_kueue.py with core/jobset_plan.py, issue 53):
Holmes waits for Kueue's admission and for Kueue's topology gate to leave every pod, then plans
each pod only on the nodes its PodSet was admitted to (the flavors' node labels and tolerations,
the topology assignment's domains), and never removes Kueue's gate; the pods' own tolerations
decide which tainted nodes a JobSet may use."""

from __future__ import annotations

import pytest

from holmes.contract.names import LABEL_KUEUE_QUEUE
from holmes.operator.core import jobset_kueue as jk
from holmes.operator.core import jobset_plan as jp
from tests.helpers.operator.jobset_plans import NODES, jobset, plan, pod

TAINT = {"key": "dedicated", "value": "train", "effect": "NoSchedule"}
TOLERATE = {"key": "dedicated", "operator": "Equal", "value": "train", "effect": "NoSchedule"}


def queued(replicas: int = 2, **ann: str) -> dict:
    js = jobset(replicas, **ann)
    js["metadata"]["labels"][LABEL_KUEUE_QUEUE] = "user-queue"
    return js


def kpods(jobs: int = 2, per: int = 2, **spec: object) -> list[dict]:
    out = []
    for j in range(jobs):
        for i in range(per):
            p = pod(j, i, **spec)
            p["metadata"]["labels"][jk.LABEL_REPLICATED_JOB] = "w"
            out.append(p)
    return out


def workload(admitted: bool = True, flavor: str = "f", topology: dict | None = None) -> dict:
    conds = [{"type": "QuotaReserved", "status": "True" if admitted else "False", "message": "no quota"}]
    conds.append({"type": "Admitted", "status": "True" if admitted else "False"})
    psa: dict = {"name": "w", "count": 4, "flavors": {"cpu": flavor}}
    if topology:
        psa["topologyAssignment"] = topology
    wl = {
        "metadata": {"name": "jobset-js-1", "labels": {jk.LABEL_JOB_UID: "u-1"}},
        "spec": {"podSets": [{"name": "w", "count": 4, "template": {"spec": {}}}]},
        "status": {"conditions": conds},
    }
    if admitted:
        wl["status"]["admission"] = {"clusterQueue": "cq", "podSetAssignments": [psa]}
    return wl


def flavor(labels: dict | None = None, tolerations: list | None = None) -> dict:
    return {
        "f": {
            "metadata": {"name": "f"},
            "spec": {"nodeLabels": labels or {}, "tolerations": tolerations or []},
        }
    }


def test_the_label_says_kueue_manages_it():
    assert jk.queue(queued()) == "user-queue" and jk.queue(jobset()) is None
    assert jk.workload_selector(queued()) == "kueue.x-k8s.io/job-uid=u-1"


def test_holmes_waits_for_the_workload_its_admission_and_the_flavors():
    ps = kpods()
    assert "not served" in jk.admission(queued(), None, {}, ps)
    assert "no Workload" in jk.admission(queued(), [], flavor(), ps)
    assert "no Workload" in jk.admission(queued(), [{**workload(), "metadata": {"labels": {}}}], flavor(), ps)
    why = jk.admission(queued(), [workload(admitted=False)], flavor(), ps)
    assert isinstance(why, str) and "jobset-js-1" in why and "user-queue" in why and "no quota" in why
    assert "ResourceFlavor(s) f" in jk.admission(queued(), [workload()], {}, ps)
    assert isinstance(jk.admission(queued(), [workload()], flavor(), ps), jk.Admitted)


def test_holmes_waits_while_kueues_topology_gate_is_on_a_pod():
    ps = kpods()
    ps[1]["spec"]["schedulingGates"].append({"name": jk.KUEUE_GATE})
    why = jk.admission(queued(), [workload()], flavor(), ps)
    assert isinstance(why, str) and jk.KUEUE_GATE in why and ps[1]["metadata"]["name"] in why


def test_the_plan_stays_on_the_admitted_flavors_nodes():
    ps = kpods()
    adm = jk.admission(queued(), [workload()], flavor({"holmes.dev/cluster": "b"}), ps)
    assert isinstance(adm, jk.Admitted) and not adm.topology
    with pytest.raises(jp.PlanRefused) as e:  # 4 pods, the flavor's island has 2 nodes
        plan(queued(**{jp.ANN_DATA: "2"}), ps, admitted=adm)
    assert e.value.reason == jp.WAITING_FOR_NODES and "jobset-js-1" in e.value.message
    p = plan(queued(1), kpods(1, 2), admitted=adm)
    assert set(p.layout.nodes) == {"b-0", "b-1"}  # without Kueue: east's IB island first
    assert set(plan(jobset(1), kpods(1, 2)).layout.nodes) == {"a-0", "a-1"}


def test_a_pod_set_kueue_did_not_admit_gets_no_node():
    ps = kpods(1, 2)
    for p in ps:
        p["metadata"]["labels"][jk.LABEL_REPLICATED_JOB] = "other"
    adm = jk.admission(queued(), [workload()], flavor(), ps)
    with pytest.raises(jp.PlanRefused, match="islands have none"):
        plan(queued(len(ps) // 2), ps, admitted=adm)


def test_a_flavors_tolerations_let_its_pods_onto_its_tainted_nodes():
    nodes = [
        {**n, "spec": {"taints": [TAINT]}} if n["metadata"]["name"].startswith("b") else n for n in NODES
    ]
    ps = kpods(1, 2)
    adm = jk.admission(queued(), [workload()], flavor({"holmes.dev/nic": "roce"}, [TOLERATE]), ps)
    assert set(plan(queued(1), ps, nodes=nodes, admitted=adm).layout.nodes) == {"b-0", "b-1"}
    adm = jk.admission(queued(), [workload()], flavor({"holmes.dev/nic": "roce"}), ps)
    with pytest.raises(jp.PlanRefused):
        plan(queued(1), ps, nodes=nodes, admitted=adm)


def test_an_untolerated_taint_keeps_the_pods_off_a_node_and_is_named():
    nodes = [{**n, "spec": {"taints": [TAINT]}} if n["metadata"]["name"] == "a-1" else n for n in NODES]
    p = plan(jobset(1), kpods(1, 2), nodes=nodes)
    assert "a-1" not in p.layout.nodes and set(p.layout.nodes) == {"b-0", "b-1"}
    with pytest.raises(jp.PlanRefused) as e:
        plan(jobset(**{jp.ANN_PIPELINE: "2", jp.ANN_DATA: "2"}), kpods(), nodes=nodes)
    assert e.value.reason == jp.WAITING_FOR_NODES
    assert "a-1 (dedicated=train:NoSchedule)" in e.value.message
    # the pods' own toleration lets them on it; a PreferNoSchedule taint keeps no pod off
    p = plan(jobset(**{jp.ANN_DATA: "2"}), kpods(tolerations=[TOLERATE]), nodes=nodes)
    assert "a-1" in p.layout.nodes
    soft = [{**n, "spec": {"taints": [{**TAINT, "effect": "PreferNoSchedule"}]}} for n in NODES]
    assert len(plan(jobset(**{jp.ANN_DATA: "2"}), kpods(), nodes=soft).layout.nodes) == 4


TOPOLOGY = {
    "levels": ["kubernetes.io/hostname"],
    "slices": [
        {
            "domainCount": 4,
            "valuesPerLevel": [{"individual": {"roots": ["a-0", "a-1", "b-0", "b-1"]}}],
            "podCounts": {"universal": 1},
        }
    ],
}


def test_under_tas_each_pod_stays_on_the_node_kueue_picked_holmes_numbers_the_ranks():
    hosts = {(0, 0): "a-1", (0, 1): "a-0", (1, 0): "b-0", (1, 1): "b-1"}
    ps = kpods()
    for p in ps:
        lab = p["metadata"]["labels"]
        p["spec"]["nodeSelector"] = {
            "kubernetes.io/hostname": hosts[int(lab[jp.JS_GLOBAL_INDEX]), int(lab[jp.COMPLETION_INDEX])]
        }
    adm = jk.admission(queued(), [workload(topology=TOPOLOGY)], flavor(), ps)
    assert isinstance(adm, jk.Admitted) and adm.topology
    p = plan(queued(**{jp.ANN_DATA: "2"}), ps, admitted=adm)
    assert {h: e["node"] for h, e in p.entries.items()} == {f"js-w-{j}-{i}": n for (j, i), n in hosts.items()}
    assert [s.island for s in p.layout.stages] == ["a/infiniband", "b/roce"]
    # Holmes' patch keeps Kueue's pin and removes only its own gate
    ps[0]["spec"]["schedulingGates"].append({"name": "other.example/gate"})
    patch = jp.ungate_patch(ps[0], p.node_of("js-w-0-0"))
    assert {
        "op": "replace",
        "path": "/spec/schedulingGates",
        "value": [{"name": "other.example/gate"}],
    } in patch
    # a stage Kueue spread over two islands cannot be planned: the fix is named
    hosts[(0, 1)] = "b-0"
    hosts[(1, 0)] = "a-0"
    for p_ in ps:
        lab = p_["metadata"]["labels"]
        p_["spec"]["nodeSelector"] = {
            "kubernetes.io/hostname": hosts[int(lab[jp.JS_GLOBAL_INDEX]), int(lab[jp.COMPLETION_INDEX])]
        }
    with pytest.raises(jp.PlanRefused) as e:
        plan(queued(**{jp.ANN_DATA: "2"}), ps, admitted=adm)
    assert e.value.reason == jp.WAITING_FOR_NODES


def test_a_hostname_pin_is_still_refused_without_kueues_topology():
    ps = kpods(nodeSelector={"kubernetes.io/hostname": "a-0"})
    adm = jk.admission(queued(), [workload()], flavor(), ps)
    with pytest.raises(jp.PlanRefused, match="Holmes picks the node"):
        plan(queued(len(ps) // 2), ps, admitted=adm)


def test_each_pod_keeps_its_own_selector_and_one_matching_no_node_leaves_the_jobset_waiting():
    ps = kpods(1, 2)
    ps[0]["spec"]["nodeSelector"] = {"holmes.dev/nic": "roce"}  # the other pod may go anywhere
    assert plan(jobset(1), ps).layout.nodes == ("b-0", "b-1")
    ps[1]["spec"]["nodeSelector"] = {"kubernetes.io/hostname-x": "y"}  # matches no node
    with pytest.raises(jp.PlanRefused, match="islands have"):
        plan(jobset(1), ps)


def test_a_kept_plan_must_meet_the_pods_new_selectors_after_kueue_admits_them_elsewhere():
    p = plan(jobset(1), kpods(1, 2))  # east's IB nodes
    doc = p.document()
    usable = {n["metadata"]["name"] for n in NODES}
    assert jp.plan_matches(doc, kpods(1, 2), usable, NODES)
    moved = kpods(1, 2, nodeSelector={"holmes.dev/cluster": "b"})  # readmitted to another flavor
    assert jp.plan_matches(doc, moved, usable)  # without the nodes: the old check only
    assert not jp.plan_matches(doc, moved, usable, NODES)


def trainjobs_jobset() -> dict:
    """A TrainJob's JobSet: Trainer's controller owner reference, no queue label (Kueue queues the
    TrainJob and labels the Workload with the TrainJob's uid)."""
    js = jobset()
    js["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": "tj",
            "uid": "tj-1",
            "controller": True,
        }
    ]
    return js


def test_a_trainjobs_jobset_is_kueues_through_the_workload_of_its_trainjob():
    js, ps = trainjobs_jobset(), kpods()
    assert jk.queue(js) is None and jk.trainjob(js)["uid"] == "tj-1"
    assert jk.workload_selector(js) == "kueue.x-k8s.io/job-uid in (u-1,tj-1)"
    of_trainjob = workload()
    of_trainjob["metadata"]["labels"][jk.LABEL_JOB_UID] = "tj-1"
    assert isinstance(jk.admission(js, [of_trainjob], flavor(), ps), jk.Admitted)
    why = jk.admission(js, [workload(admitted=False) | {"metadata": of_trainjob["metadata"]}], flavor(), ps)
    assert isinstance(why, str) and "TrainJob tj's LocalQueue" in why
    # another controller's JobSet, or an owner that is not Trainer's TrainJob, is not read so
    js["metadata"]["ownerReferences"][0]["apiVersion"] = "example.com/v1"
    assert jk.trainjob(js) is None and jk.workload_selector(js) == "kueue.x-k8s.io/job-uid=u-1"
