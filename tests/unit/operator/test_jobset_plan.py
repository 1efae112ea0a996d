"""Holmes' plan for a labelled JobSet (core/jobset_plan.py, issue 53): degrees from the
annotations, stages each on one island, ranks in the JobSet's own order, the ConfigMap, the
patch a gated pod may take, and each refusal naming the field and the fix."""

from __future__ import annotations

import json

import pytest

from holmes.contract import Layout
from holmes.operator.core import jobset_plan as jp
from tests.helpers.operator.jobset_plans import NODES, jobset, node, plan, pod, pods


def test_only_the_label_opts_in():
    assert jp.opted_in(jobset())
    js = jobset()
    del js["metadata"]["labels"][jp.LABEL_PLAN]
    assert not jp.opted_in(js)


def test_stage_by_stage_each_stage_on_one_island_in_the_jobsets_rank_order():
    p = plan(jobset(**{jp.ANN_PIPELINE: "2", jp.ANN_DATA: "2"}))
    lay = p.layout
    assert (lay.pipeline, lay.data, lay.tensor) == (2, 2, 1)
    for s in range(2):
        isl = {p.entries[h]["island"] for h, e in p.entries.items() if e["stage"] == s}
        assert len(isl) == 1
        assert {n.split("-")[0] for n in lay.stage_nodes(s)} == {lay.stages[s].island[0]}
    ranks = {h: e["nodeRank"] for h, e in p.entries.items()}
    assert ranks == {"js-w-0-0": 0, "js-w-0-1": 1, "js-w-1-0": 2, "js-w-1-1": 3}
    assert p.entries["js-w-0-0"]["node"] == lay.nodes[0]
    assert p.master_addr == "js-w-0-0.js.ns.svc" and p.master_port == 29500


def test_no_data_parallel_group_crosses_nic_kinds_and_rdma_stages_use_ib():
    lay = plan(jobset(**{jp.ANN_PIPELINE: "2", jp.ANN_DATA: "2"})).layout
    for s in lay.stages:
        assert s.nic in ("infiniband", "roce") and s.dp_net == "IB"
    assert lay.world_net == "Socket"  # two islands
    assert [g.net for g in lay.groups if g.kind == "p2p"] == ["Socket"]


def test_auto_takes_the_widest_data_degree_whose_stages_fit_an_island():
    p = plan(jobset())  # 4 pods, islands of 2: D=4 or 3 cannot fit, D=2 can
    assert (p.layout.pipeline, p.layout.data) == (2, 2)
    p = plan(jobset(replicas=1, parallelism=2), pods(1, 2))
    assert (p.layout.pipeline, p.layout.data) == (1, 2)
    p = plan(jobset(**{jp.ANN_DATA: "1"}))
    assert (p.layout.pipeline, p.layout.data) == (4, 1)


def test_pods_other_than_p_times_d_are_refused_naming_both_annotations():
    with pytest.raises(jp.PlanRefused) as e:
        plan(jobset(**{jp.ANN_PIPELINE: "3", jp.ANN_DATA: "2"}))
    assert e.value.reason == jp.INVALID
    assert jp.ANN_PIPELINE in e.value.message and "4 pods" in e.value.message and "auto" in e.value.message
    with pytest.raises(jp.PlanRefused, match="does not divide"):
        plan(jobset(**{jp.ANN_DATA: "3"}))
    with pytest.raises(jp.PlanRefused, match="positive integer or auto"):
        plan(jobset(**{jp.ANN_DATA: "two"}))


def test_no_island_large_enough_waits_for_nodes_naming_the_islands():
    with pytest.raises(jp.PlanRefused) as e:
        plan(jobset(**{jp.ANN_PIPELINE: "1", jp.ANN_DATA: "4"}))
    assert e.value.reason == jp.WAITING_FOR_NODES
    assert "a/infiniband: 2" in e.value.message and jp.ANN_DATA in e.value.message


def test_an_unready_node_is_not_planned_on():
    nodes = [*NODES[:1], node("a-1", "a", "infiniband", ready=False), *NODES[2:]]
    with pytest.raises(jp.PlanRefused) as e:
        plan(jobset(**{jp.ANN_PIPELINE: "2", jp.ANN_DATA: "2"}), nodes=nodes)
    assert e.value.reason == jp.WAITING_FOR_NODES


def test_the_plan_waits_until_every_pod_exists():
    assert not jp.all_pods_exist(jobset(), pods()[:3]) and jp.all_pods_exist(jobset(), pods())
    with pytest.raises(jp.PlanRefused, match="3 of the JobSet's 4 pods"):
        plan(jobset(), pods()[:3])


def test_a_template_pinning_a_hostname_is_refused():
    ps = pods()
    ps[0]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "a-0"}
    with pytest.raises(jp.PlanRefused, match="Holmes picks the node"):
        plan(jobset(), ps)


def test_the_pods_own_node_selector_narrows_the_nodes():
    ps = [pod(0, i, nodeSelector={"holmes.dev/nic": "roce"}) for i in range(2)]
    p = plan(jobset(replicas=1), ps)
    assert set(p.layout.nodes) == {"b-0", "b-1"}


def test_without_subdomain_rank_0_has_no_name_and_the_fix_is_named():
    ps = pods()
    for x in ps:
        del x["spec"]["subdomain"]
    with pytest.raises(jp.PlanRefused, match="enableDNSHostnames"):
        plan(jobset(), ps)


def test_without_model_layers_are_left_to_the_program_with_it_split_evenly():
    p = plan(jobset(**{jp.ANN_DATA: "2"}))
    doc = p.document()
    assert doc["layersPerStage"] is None and "left to the program" in doc["note"]
    p = plan(jobset(**{jp.ANN_DATA: "2", jp.ANN_MODEL: json.dumps({"layers": 7})}))
    assert p.document()["layersPerStage"] == [4, 3]
    with pytest.raises(jp.PlanRefused, match="layers"):
        plan(jobset(**{jp.ANN_MODEL: "{not json"}))


def test_the_configmap_is_owned_by_the_jobset_and_holds_a_valid_layout():
    js = jobset(**{jp.ANN_DATA: "2"})
    p = plan(js)
    cm = jp.configmap(js, p)
    assert cm["metadata"]["name"] == "js-holmes-plan" and cm["metadata"]["namespace"] == "ns"
    owner = cm["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("JobSet", "js", "u-1")
    assert Layout.from_json(cm["data"][jp.LAYOUT_FILE]) == p.layout
    assert jp.read_plan(cm)["pods"]["js-w-1-1"]["nodeRank"] == 3


def test_the_patch_removes_only_the_gate_and_adds_a_node_selector():
    x = pod(0, 0, nodeSelector={"zone": "z"})
    x["spec"]["schedulingGates"].append({"name": "other"})
    assert jp.ungate_patch(x, "a-0") == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {"op": "add", "path": "/spec/nodeSelector/kubernetes.io~1hostname", "value": "a-0"},
        {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": "other"}]},
    ]
    assert jp.ungate_patch(pod(0, 1), "a-1")[1:] == [
        {"op": "add", "path": "/spec/nodeSelector", "value": {"kubernetes.io/hostname": "a-1"}},
        {"op": "remove", "path": "/spec/schedulingGates"},
    ]


def test_the_patch_gives_the_pod_its_own_entry_and_the_layout_as_annotations():
    # a TrainJob's runtime cannot name the JobSet's ConfigMap: its downwardAPI volume shows
    # these two annotations as plan.json and layout.json, which the launcher reads the same way
    js = jobset(**{jp.ANN_DATA: "2"})
    cm = jp.configmap(js, plan(js))
    doc = jp.read_plan(cm)
    notes = jp.pod_annotations(doc, "js-w-0-1", cm["data"][jp.LAYOUT_FILE])
    own = json.loads(notes[jp.ANN_PLAN])
    assert own["pods"] == {"js-w-0-1": doc["pods"]["js-w-0-1"]}
    assert {k: v for k, v in own.items() if k != "pods"} == {k: v for k, v in doc.items() if k != "pods"}
    assert json.loads(notes[jp.ANN_LAYOUT]) == json.loads(cm["data"][jp.LAYOUT_FILE])
    x = pod(0, 1)
    x["metadata"]["annotations"] = {"a": "b"}
    assert jp.ungate_patch(x, "a-1", notes)[1:3] == [
        {"op": "add", "path": "/metadata/annotations/holmes.dev~1layout", "value": notes[jp.ANN_LAYOUT]},
        {"op": "add", "path": "/metadata/annotations/holmes.dev~1plan", "value": notes[jp.ANN_PLAN]},
    ]
    x["metadata"]["annotations"] = {}
    assert jp.ungate_patch(x, "a-1", notes)[1] == {
        "op": "add",
        "path": "/metadata/annotations",
        "value": notes,
    }
    # a Layout too large for the pod's annotations is left to the ConfigMap
    assert jp.pod_annotations(doc, "js-w-0-1", json.dumps({"x": "y" * jp.MAX_ANNOTATED})) == {}


def test_a_restarted_jobsets_pods_keep_the_plan_while_its_nodes_stay_usable():
    js = jobset(**{jp.ANN_DATA: "2"})
    doc = jp.read_plan(jp.configmap(js, plan(js)))
    usable = {n["metadata"]["name"] for n in NODES}
    assert jp.plan_matches(doc, pods(), usable)
    assert not jp.plan_matches(doc, pods(), usable - {doc["pods"]["js-w-0-0"]["node"]})
    assert not jp.plan_matches(doc, pods(1, 2), usable)


def test_processes_per_pod_are_its_gpus():
    x = pod(0, 0, containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}])
    assert jp.pod_gpus(x) == 8 and jp.pod_gpus(pod(0, 0)) == 1


def test_pods_asking_for_different_gpu_counts_are_refused():
    ps = pods()
    ps[0]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    with pytest.raises(jp.PlanRefused, match="same GPU limit"):
        plan(jobset(), ps)
