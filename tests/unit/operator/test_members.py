"""One HolmesJob across member clusters, as data: the union view, islands kept inside members,
rank 0 first and its IP as the rendezvous, routing writes per member, an unreachable member,
and deleting a job's children in every member (members.py, reconcile.py)."""

from __future__ import annotations

import copy

import pytest

from holmes.contract.layout import Layout
from holmes.operator.core import child_names, members
from holmes.operator.core.members import MemberState
from holmes.operator.core.reconcile import Decision
from holmes.plan import PlanError, plan
from tests.helpers.operator.opfixtures import FakeWorld, default_nodes, manifest, with_link_layers

UID = "uid-1"


def split(nodes: list[dict]) -> dict[str, list[dict]]:
    """The default topology's islands as two member clusters named after them."""
    out: dict[str, list[dict]] = {}
    for n in nodes:
        out.setdefault(n["metadata"]["labels"]["holmes.dev/cluster"], []).append(n)
    return out


def up(*names_: str) -> dict[str, MemberState]:
    return {m: MemberState(m, True) for m in names_}


def multi_world(count: int = 4, **spec) -> FakeWorld:
    nodes, _ = members.union_nodes(split(with_link_layers(default_nodes())), ["east", "west"])
    w = FakeWorld(manifest(count=count, **spec), nodes)
    w.members = up("east", "west")
    return w


def member_pods(w: FakeWorld) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, p in sorted(w.pods.items()):
        out.setdefault(members.member_of(p), []).append(name)
    return out


def give_ip(w: FakeWorld, pod: str, ip: str = "127.40.0.1") -> None:
    w.pods[pod].setdefault("status", {}).update({"podIP": ip, "phase": "Pending"})


def env(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def launch(w: FakeWorld) -> None:
    w.step()
    give_ip(w, f"tiny-{w.status['attempt']}-0")
    w.step()
    assert w.status["launched"]


# ---- the union view and islands ------------------------------------------------------------


def test_union_tags_each_node_with_its_member_and_defaults_the_cluster_label():
    east = copy.deepcopy(split(default_nodes())["east"])
    for n in east:
        del n["metadata"]["labels"]["holmes.dev/cluster"]
    nodes, problems = members.union_nodes({"a": east, "b": split(default_nodes())["west"]}, ["a", "b"])
    assert not problems
    by = {n["metadata"]["name"]: n for n in nodes}
    assert members.member_of(by["ib-0"]) == "a"
    assert by["ib-0"]["metadata"]["labels"]["holmes.dev/cluster"] == "a"
    assert by["roce-0"]["metadata"]["labels"]["holmes.dev/cluster"] == "west"
    # only usable members; a node name in two members is left out everywhere, with a message
    nodes, problems = members.union_nodes({"a": east, "b": east[:1]}, ["a"])
    assert "ib-0" not in {n["metadata"]["name"] for n in nodes} and "ib-0" in problems[0]


def test_an_island_label_found_in_two_members_is_qualified_so_islands_never_span_members():
    both = copy.deepcopy(default_nodes())
    for n in both:
        n["metadata"]["labels"]["holmes.dev/cluster"] = "dc"
    halves = {"a": both[:3], "b": both[3:]}
    nodes, _ = members.union_nodes(halves, ["a", "b"])
    labelled = members.island_labels(nodes, "holmes.dev/cluster")
    assert {n["metadata"]["labels"]["holmes.dev/cluster"] for n in labelled} == {"a-dc", "b-dc"}


def test_a_layout_whose_data_parallel_group_spans_members_is_refused():
    # one member per node: any stage of two nodes spans two members
    per = {n["metadata"]["name"]: [n] for n in with_link_layers(default_nodes())}
    nodes, _ = members.union_nodes(per, list(per))
    from holmes.contract import load_job

    layout = plan(with_link_layers(default_nodes()), load_job(manifest(count=4, parallelism={"pipeline": 2})))
    with pytest.raises(PlanError, match="across member clusters"):
        members.within_members(layout, nodes)


# ---- launching across members ----------------------------------------------------------------


def test_rank_0_first_then_the_others_with_its_ip_as_the_rendezvous_address():
    w = multi_world()
    d = w.step()
    assert [p["metadata"]["name"] for p in d.create_pods] == ["tiny-1-0"]
    assert not w.status["launched"] and w.status["phase"] == "Pending"
    assert w.condition("Reconciling")["reason"] == "WaitingForRendezvous"
    assert not w.step().create_pods  # no IP yet: nothing more
    give_ip(w, "tiny-1-0", "127.40.0.7")
    d = w.step()
    assert sorted(p["metadata"]["name"] for p in d.create_pods) == ["tiny-1-1", "tiny-1-2", "tiny-1-3"]
    assert w.status["launched"]
    for p in d.create_pods:
        e = env(p)
        assert e["MASTER_ADDR"] == e["PET_MASTER_ADDR"] == "127.40.0.7"
        assert "--master-addr=127.40.0.7" in p["spec"]["containers"][0]["command"]
    rank0 = env(w.pods["tiny-1-0"])
    assert rank0["MASTER_ADDR"] == child_names.master_addr("tiny", "ns", 1)  # its own, by name
    # the plan keeps each stage in one member; pods went to their node's member
    layout = Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE])
    where = {n["metadata"]["name"]: members.member_of(n) for n in w.nodes}
    assert not members.spanning_stages(layout, where)
    assert set(member_pods(w)) == {"east", "west"}
    st = w.status["members"]
    assert st["east"]["nodes"] + st["west"]["nodes"] == 4 and st["east"]["reachable"]
    assert w.condition("MembersReachable")["status"] == "True"


def test_a_pod_failure_in_one_member_restarts_the_gang_in_both():
    w = multi_world()
    launch(w)
    w.set_phase("Running")
    w.step()
    before = member_pods(w)
    where = {n: members.member_of(p) for n, p in w.pods.items()}
    w.set_phase("Failed", before["west"][0])
    d = w.step()
    assert w.status["restarts"] == 1 and w.status["phase"] == "Restarting"
    node_member = {n["metadata"]["name"]: members.member_of(n) for n in w.nodes}
    routed = members.route(d, UID, where, node_member)
    assert {m: sorted(x.delete_pods) for m, x in routed.items()} == before  # the whole gang, both members


def test_an_unreachable_member_restarts_the_gang_on_the_capacity_left_and_says_so():
    w = multi_world(count=2, nodes={"count": 4, "minCount": 2, "gpusPerNode": 1})
    launch(w)
    w.set_phase("Running")
    w.step()
    assert set(member_pods(w)) == {"east", "west"}
    w.members = {"east": MemberState("east", True), "west": MemberState("west", False, "connection refused")}
    w.nodes = [n for n in w.nodes if members.member_of(n) != "west"]  # the runtime drops its nodes
    w.step()
    assert w.status["restartsByReason"] == {"disruption": 1}
    assert "MemberUnreachable" in w.reasons()
    assert w.status["members"]["west"] == {
        "reachable": False,
        "message": "connection refused",
        "nodes": 0,
        "pending": 0,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
    }
    c = w.condition("MembersReachable")
    assert c["status"] == "False" and "west: connection refused" in c["message"]
    # the elastic job runs on east alone; west's stale pods are not waited for
    w.step()
    give_ip(w, "tiny-2-0")
    w.step()
    assert w.status["launched"] and w.status["size"]["current"] == 3  # east has 3 nodes
    assert {members.member_of(p) for n, p in w.pods.items() if n.startswith("tiny-2-")} == {"east"}


def test_host_network_puts_pods_on_the_node_network():
    w = multi_world(network="hostNetwork")
    d = w.step()
    spec = d.create_pods[0]["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_a_job_without_members_is_a_single_cluster_job():
    w = FakeWorld(manifest(count=4))
    d = w.step()
    assert len(d.create_pods) == 4 and "members" not in w.status
    assert all(c["type"] != "MembersReachable" for c in w.status["conditions"])
    assert all("hostNetwork" not in p["spec"] for p in d.create_pods)


# ---- routing and cleanup -------------------------------------------------------------------------


def test_route_sends_each_pod_to_its_node_member_and_the_configmap_where_ranks_are():
    w = multi_world()
    d = w.step()
    give_ip(w, "tiny-1-0")
    d2 = w.step()
    node_member = {n["metadata"]["name"]: members.member_of(n) for n in w.nodes}
    merged = Decision(
        status={},
        configmap=d.configmap,
        service=d.service,
        create_pods=d2.create_pods,
        delete_pods=["old-pod"],
    )
    routed = members.route(merged, UID, {"old-pod": "east"}, node_member)
    assert set(routed) == {"east", "west"}
    assert routed["east"].delete_pods == ["old-pod"] and routed["west"].delete_pods == []
    for m, writes in routed.items():
        assert writes.configmap["metadata"]["annotations"][members.ANN_JOB_UID] == UID
        assert writes.service["metadata"]["annotations"][members.ANN_MEMBER] == m
        for p in writes.create_pods:
            assert node_member[p["metadata"]["annotations"][child_names.ANN_NODE]] == m
            assert "ownerReferences" not in p["metadata"]


def test_cleanup_deletes_children_everywhere_and_waits_for_unreachable_members_only_while_registered():
    def child(name, deleting=False):
        meta = {"name": name, "annotations": {members.ANN_JOB_UID: UID}}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta}

    foreign = {"metadata": {"name": "other", "annotations": {members.ANN_JOB_UID: "uid-2"}}}
    children = {
        "east": [("Pod", child("tiny-1-0")), ("ConfigMap", child("tiny-layout")), ("Pod", foreign)],
        "west": [("Pod", child("tiny-1-1", deleting=True))],
    }
    c = members.cleanup(UID, up("east", "west"), children)
    assert c.deletes == {"east": [("Pod", "tiny-1-0"), ("ConfigMap", "tiny-layout")]}
    assert not c.done and "member west: 1 child" in c.message()
    assert members.cleanup(UID, up("east", "west"), {"east": [("Pod", foreign)]}).done
    down = {"east": MemberState("east", True), "west": MemberState("west", False, "timed out")}
    c = members.cleanup(UID, down, {})
    assert not c.done and "delete its Secret" in c.message()
    assert members.cleanup(UID, up("east"), {"west": children["west"]}).done  # west deregistered
