"""Shared clusters as data: the capacity view (what pods hold, taints, selectors, affinity,
CPU/memory), the queue (priority, creation time, head-of-line protection), several HolmesJobs
reconciled against one cluster, Kueue admission and the Volcano PodGroup."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from holmes.contract import load_job
from holmes.contract.names import LABEL_KUEUE_QUEUE
from holmes.operator import placement_facts
from holmes.operator.core import capacity, child_names, kueue_pod_sets, node_selection, queueing, tolerations
from holmes.operator.core.capacity import Ledger, WaitingForCapacity, Workloads, free_view, pod_shape
from holmes.operator.core.placement import Placement, on_free_capacity
from holmes.operator.core.render import RenderSettings
from holmes.plan import InsufficientNodes, NicMapping, classify_nodes
from tests.helpers.operator import kueue_standin as kueue
from tests.helpers.operator.opfixtures import T0, FakeWorld, default_nodes, manifest, with_link_layers


def nodes():
    return with_link_layers(default_nodes())


def job(name, count, gpus=2, created=0, **spec):
    m = manifest(name, count=count, gpus=gpus, **spec)
    m["metadata"]["uid"] = f"uid-{name}"
    m["metadata"]["creationTimestamp"] = (T0 + timedelta(seconds=created)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return m


def template(**pod_spec):
    return {"spec": {"containers": [{"name": "trainer", "command": ["sleep", "1"]}], **pod_spec}}


# ---- quantities, requests, placement rules ------------------------------------------------------


def test_quantities_parse_as_the_api_writes_them():
    assert capacity.quantity("500m") == 0.5
    assert capacity.quantity("2") == 2.0
    assert capacity.quantity("8Gi") == 8 * 2**30
    assert capacity.quantity("1e3") == 1000.0
    assert capacity.quantity("1.5k") == 1500.0
    assert capacity.quantity("lots") is None
    assert capacity.quantity(True) is None


def test_pod_requests_count_limits_alone_and_init_containers_at_most():
    spec = {
        "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": 2, "cpu": "4"}, "requests": {"cpu": "1"}}},
            {"resources": {"requests": {"memory": "1Gi"}}},
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "3"}}}],
    }
    assert capacity.pod_requests(spec) == {"nvidia.com/gpu": 2.0, "cpu": 3.0, "memory": 2.0**30}


def shape_of(**pod_spec):
    return pod_shape(load_job(job("a", 1, template=template(**pod_spec))))


def test_a_taint_the_template_does_not_tolerate_rules_the_node_out():
    node = nodes()[0]
    node["spec"]["taints"] = [{"key": "team", "value": "vision", "effect": "NoSchedule"}]
    assert "taint team=vision:NoSchedule is not tolerated" in capacity.placement_problem(node, shape_of())
    tol = [{"key": "team", "operator": "Equal", "value": "vision", "effect": "NoSchedule"}]
    assert capacity.placement_problem(node, shape_of(tolerations=tol)) == ""
    assert capacity.placement_problem(node, shape_of(tolerations=[{"operator": "Exists"}])) == ""
    node["spec"]["taints"] = [{"key": "soft", "effect": "PreferNoSchedule"}]
    assert capacity.placement_problem(node, shape_of()) == ""
    # condition taints are the Ready condition's and the cordon's, which the planner reads itself
    node["spec"]["taints"] = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    assert capacity.placement_problem(node, shape_of()) == ""


def test_node_selector_and_required_affinity_are_respected():
    east, west = nodes()[0], nodes()[3]
    assert capacity.placement_problem(west, shape_of(nodeSelector={"holmes.dev/cluster": "east"}))
    assert not capacity.placement_problem(east, shape_of(nodeSelector={"holmes.dev/cluster": "east"}))
    aff = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "holmes.dev/cluster", "operator": "NotIn", "values": ["east"]}
                        ]
                    }
                ]
            }
        }
    }
    assert "affinity" in capacity.placement_problem(east, shape_of(affinity=aff))
    assert capacity.placement_problem(west, shape_of(affinity=aff)) == ""


def test_cpu_and_memory_requests_beyond_a_nodes_allocatable_rule_it_out():
    node = nodes()[0]
    big = shape_of(
        containers=[{"name": "trainer", "resources": {"requests": {"cpu": "64", "memory": "1Gi"}}}]
    )
    assert "allocatable cpu 32 is less than the 64" in capacity.placement_problem(node, big)
    huge = shape_of(containers=[{"name": "trainer", "resources": {"requests": {"memory": "300Gi"}}}])
    assert "allocatable memory 256Gi" in capacity.placement_problem(node, huge)


def test_every_resource_a_pod_requests_must_be_in_the_nodes_allocatable():
    # issue 50: only CPU, memory and GPUs were counted, so a pod pinned to a node without the
    # resource stayed Pending for ever (the scheduler's NodeResourcesFit refuses it)
    node = nodes()[0]
    widget = shape_of(containers=[{"name": "trainer", "resources": {"limits": {"example.com/widget": 1}}}])
    assert capacity.placement_problem(node, widget) == (
        "the node has no example.com/widget (allocatable), which a pod requests (1)"
    )
    node["status"]["allocatable"]["example.com/widget"] = "1"
    assert capacity.placement_problem(node, widget) == ""
    pages = shape_of(containers=[{"name": "trainer", "resources": {"requests": {"hugepages-2Mi": "1Gi"}}}])
    assert "no hugepages-2Mi" in capacity.placement_problem(node, pages)
    node["status"]["allocatable"]["hugepages-2Mi"] = "512Mi"
    assert capacity.placement_problem(node, pages) == (
        "allocatable hugepages-2Mi 512Mi is less than the 1Gi a pod requests"
    )
    disk = shape_of(containers=[{"name": "trainer", "resources": {"requests": {"ephemeral-storage": "2Ti"}}}])
    assert "allocatable ephemeral-storage 1Ti is less than the 2Ti" in capacity.placement_problem(node, disk)
    node["status"]["allocatable"]["pods"] = "0"
    assert "allocatable pods 0 is less than the 1" in capacity.placement_problem(node, shape_of())


def test_the_free_view_counts_extended_resources_and_pod_slots_pods_hold():
    given = nodes()
    for n in given:
        n["status"]["allocatable"]["example.com/widget"] = "2"
    given[0]["status"]["allocatable"]["pods"] = "1"  # ib-0 admits one pod
    widget = shape_of(containers=[{"name": "trainer", "resources": {"limits": {"example.com/widget": 1}}}])
    holder = pod("w", "ib-1", gpus=0)
    holder["spec"]["containers"][0]["resources"]["requests"]["example.com/widget"] = "2"
    led = Ledger.of([pod("a", "ib-0", gpus=0), holder, pod("c", "roce-0", gpus=0)])
    view, out = free_view(given, widget, led)
    assert out == {"ib-0": "0 pods free", "ib-1": "0 example.com/widget free"}
    assert {n["metadata"]["name"] for n in view} == {"eth-0", "roce-0", "roce-1", "eth-1"}


def test_the_rdma_devices_a_route_requests_are_counted_on_their_node():
    # a node's RDMA devices or SR-IOV VFs are a pool like any other: a pod of the job takes
    # one there (its route, routes.py), so a node whose pool other pods hold is left out
    given = [n for n in nodes() if n["metadata"]["name"] in ("ib-0", "ib-1")]
    ib0 = given[0]
    ib0["status"]["allocatable"]["rdma/rdma_shared_device_a"] = "1"
    other = pod("x", "ib-0", gpus=0)
    other["spec"]["containers"][0]["resources"]["requests"]["rdma/rdma_shared_device_a"] = "1"
    a = job("a", 2)
    facts = placement_facts.gather(placement_facts.builtin_cost_model(), Workloads(pods=[other]))
    with pytest.raises(WaitingForCapacity):  # both nodes, and ib-0 has no RDMA device free
        on_free_capacity(given, load_job(a), Placement(facts, given, a))
    ib0["status"]["allocatable"]["rdma/rdma_shared_device_a"] = "2"
    assert "ib-0" in on_free_capacity(given, load_job(a), Placement(facts, given, a)).nodes


def pod(name, node=None, gpus=1, phase="Running", nominated=None, holmes_job=None, cpu=None, ns="other"):
    requests = {"nvidia.com/gpu": str(gpus)}
    if cpu:
        requests["cpu"] = cpu
    meta = {"name": name, "namespace": ns, "uid": name}
    if holmes_job:
        meta["labels"] = {
            child_names.LABEL_JOB: holmes_job,
            child_names.LABEL_MANAGED_BY: child_names.MANAGED_BY,
        }
        meta["annotations"] = {child_names.ANN_NODE: node}
    return {
        "metadata": meta,
        "spec": {
            "nodeName": None if holmes_job or nominated else node,
            "containers": [{"name": "c", "resources": {"requests": requests}}],
        },
        "status": {"phase": phase, "nominatedNodeName": nominated},
    }


def test_the_ledger_counts_bound_nominated_and_pinned_pods_not_ended_ones():
    led = Ledger.of(
        [
            pod("a", "ib-0"),
            pod("b", nominated="ib-1", gpus=2),
            pod("c", "eth-0", phase="Succeeded"),
            pod("d", "roce-0", holmes_job="j"),  # pinned by Holmes, not bound yet
        ]
    )
    assert led.used["ib-0"]["nvidia.com/gpu"] == 1
    assert led.used["ib-1"]["nvidia.com/gpu"] == 2
    assert "eth-0" not in led.used
    assert led.used["roce-0"]["nvidia.com/gpu"] == 1 and led.holders["roce-0"] == {"other/j"}
    # the job being planned does not count its own pods
    assert "roce-0" not in Ledger.of([pod("d", "roce-0", holmes_job="j")], skip_job="other/j").used


def test_launched_ranks_without_their_pod_yet_hold_their_planned_nodes():
    shape = shape_of()
    lj = capacity.Launched("ns/j", 1, ("ib-0", "ib-1"), shape)
    have = [pod("j-1-0", "ib-0", gpus=2, holmes_job="j", ns="ns")]
    led = Ledger.of(have, [lj])
    assert led.used["ib-0"]["nvidia.com/gpu"] == 2  # the pod, not twice
    assert led.used["ib-1"]["nvidia.com/gpu"] == 2  # rank 1's pod is not created yet


def test_the_free_view_lowers_allocatable_gpus_and_leaves_out_full_nodes():
    view, out = free_view(
        nodes(),
        shape_of(containers=[{"name": "trainer", "resources": {"requests": {"cpu": "20"}}}]),
        Ledger.of([pod("a", "ib-0"), pod("b", "ib-1", cpu="16", gpus=0)]),
    )
    by = {n["metadata"]["name"]: n for n in view}
    assert classify_nodes([by["ib-0"]])[0].gpus == 1  # of 2: the planner sees what is free
    assert "ib-1" not in by and out["ib-1"] == "16 cpu free"


def test_the_free_view_copies_only_what_it_lowers():
    # seen at scale (bench/operator_scale.py): a deep copy of every partly used node, for every
    # job ahead in the queue on every placement, was a sixth of the operator's CPU
    given = nodes()
    before = copy.deepcopy(given)
    view, _ = free_view(given, shape_of(), Ledger.of([pod("a", "ib-0")]))
    by = {n["metadata"]["name"]: n for n in view}
    ib0 = next(n for n in given if n["metadata"]["name"] == "ib-0")
    assert classify_nodes([by["ib-0"]])[0].gpus == 1
    assert by["ib-0"]["metadata"] is ib0["metadata"] and given == before  # shared, untouched


def test_holmes_pods_already_in_the_shared_cache_are_not_slimmed_again(monkeypatch):
    from holmes.operator.kube import Caches
    from holmes.operator.pipeline import HubChildren

    caches = Caches()
    for i in range(50):
        p = pod(f"p{i}", f"n{i}", holmes_job="j", ns="ns")
        p["metadata"]["resourceVersion"] = "7"
        caches.pods.put(p)
        caches.cluster_pods.put(capacity.slim_pod(p))
    new = pod("new", "n0", holmes_job="j", ns="ns")  # just created: the watch has not said so yet
    new["metadata"]["resourceVersion"] = "8"
    caches.pods.put(new)
    ended = pod("p1", "n1", holmes_job="j", ns="ns", phase="Succeeded")
    ended["metadata"]["resourceVersion"] = "9"
    caches.pods.put(ended)
    calls = []
    real = capacity.slim_pod
    monkeypatch.setattr(capacity, "slim_pod", lambda p: calls.append(p["metadata"]["name"]) or real(p))
    pods, _ = HubChildren(caches, None).capacity_view()  # type: ignore[arg-type]
    assert calls == ["new"]  # per reconcile: only what the shared cache does not hold yet
    names = {p["metadata"]["name"] for p in pods}
    assert "new" in names and "p1" not in names and len(names) == 50
    # nothing changed since: the next reconcile's view is the same, made no anew
    again, _ = HubChildren(caches, None).capacity_view()  # type: ignore[arg-type]
    assert again is pods and calls == ["new"]
    # a pod changed: made anew
    newer = copy.deepcopy(new)
    newer["metadata"]["resourceVersion"] = "10"
    caches.pods.put(newer)
    third, _ = HubChildren(caches, None).capacity_view()  # type: ignore[arg-type]
    assert third is not pods and calls == ["new", "new"]
    # another pod changed (issue 46: during a launch burst, many times a second): made anew, but
    # a pod the shared cache does not hold yet is not slimmed again at the same version
    other = pod("other", "n2", ns="ns2")
    other["metadata"]["resourceVersion"] = "11"
    caches.cluster_pods.put(real(other))
    fourth, _ = HubChildren(caches, None).capacity_view()  # type: ignore[arg-type]
    assert fourth is not third and calls == ["new", "new"]
    assert {p["metadata"]["name"] for p in fourth} == names | {"other"}


# ---- several jobs on one cluster ---------------------------------------------------------------


class SharedWorld:
    """Several FakeWorlds on one set of nodes; each places its job on what the others' objects
    hold, observed as the operator observes them from its caches (pipeline.Pipeline.workloads)."""

    def __init__(self, *jobs, classes=None):
        self.nodes = nodes()
        self.worlds = {}
        self.classes = classes or {}
        for m in jobs:
            self.add(m)

    def add(self, m):
        w = FakeWorld(m, nodes=self.nodes)
        w.workloads = self.workloads
        self.worlds[m["metadata"]["name"]] = w
        return w

    def workloads(self):
        pods = [p for w in self.worlds.values() for p in w.pods.values()]
        layouts = {
            (w.job["metadata"]["namespace"], n): w.configmap
            for n, w in self.worlds.items()
            if w.configmap is not None
        }
        return Workloads(pods=pods, jobs=[w.job for w in self.worlds.values()], layouts=layouts)

    def step(self, *names_):
        for n in names_ or list(self.worlds):
            self.worlds[n].priority_classes = self.classes or None
            self.worlds[n].step()

    def bind(self, name, phase="Running"):
        """The scheduler binds a job's pods to their pinned nodes; the kubelet runs them."""
        w = self.worlds[name]
        for p in w.pods.values():
            p["spec"]["nodeName"] = p["metadata"]["annotations"][child_names.ANN_NODE]
            p.setdefault("status", {})["phase"] = phase

    def nodes_of(self, name):
        w = self.worlds[name]
        return sorted(
            p["spec"].get("nodeName") or p["metadata"]["annotations"][child_names.ANN_NODE]
            for p in w.pods.values()
        )

    def reason(self, name):
        return self.worlds[name].condition("Reconciling")["reason"]


def test_two_half_cluster_jobs_run_at_once_on_disjoint_nodes_and_a_third_waits_then_starts():
    sw = SharedWorld(job("a", 3, created=0), job("b", 3, created=1), job("c", 3, created=2))
    sw.step()
    assert sw.worlds["a"].status["launched"] and sw.worlds["b"].status["launched"]
    a, b = sw.nodes_of("a"), sw.nodes_of("b")
    assert len(a) == len(b) == 3 and not set(a) & set(b)
    c = sw.worlds["c"]
    assert not c.status["launched"] and c.status["phase"] == "Pending"
    msg = c.condition("Reconciling")["message"]
    assert sw.reason("c") == "WaitingForCapacity"
    assert "needs 3 node(s) with 2 nvidia.com/gpu free per pod; 0 node(s) have that free now" in msg
    assert "ns/a (3 nodes)" in msg and "ns/b (3 nodes)" in msg
    assert "WaitingForCapacity" in c.reasons()
    sw.bind("a")
    sw.bind("b")
    sw.step("a", "b", "c")
    assert sw.reason("c") == "WaitingForCapacity"
    sw.worlds["a"].set_phase("Succeeded")  # a's pods end: their GPUs are free
    sw.step("a", "c")
    assert sw.worlds["a"].status["phase"] == "Succeeded"
    assert c.status["launched"] and sw.nodes_of("c") == a


def test_gpus_are_shared_per_gpu_not_per_node():
    sw = SharedWorld(*(job(f"j{i}", 3, gpus=1, created=i) for i in range(5)))
    sw.step()
    launched = [n for n, w in sw.worlds.items() if w.status.get("launched")]
    assert launched == ["j0", "j1", "j2", "j3"]  # 12 GPUs: four 3-GPU jobs
    per_node = {}
    for n in launched:
        for node in sw.nodes_of(n):
            per_node[node] = per_node.get(node, 0) + 1
    assert max(per_node.values()) <= 2  # never more GPUs than a node has
    assert sw.reason("j4") == "WaitingForCapacity"


def test_other_workloads_pods_hold_their_gpus():
    sw = SharedWorld(job("a", 3, created=0))
    foreign = [pod(f"x{i}", n, gpus=2) for i, n in enumerate(["ib-0", "ib-1", "roce-0", "roce-1"])]
    seen = sw.workloads
    sw.worlds["a"].workloads = lambda: Workloads([*seen().pods, *foreign], seen().jobs, seen().layouts)
    sw.step()
    assert sw.reason("a") == "WaitingForCapacity"
    assert "other pods (4 nodes)" in sw.worlds["a"].condition("Reconciling")["message"]


def test_the_queue_keeps_free_nodes_for_its_head_and_a_small_job_backfills_only_elsewhere():
    # big needs 4 whole nodes of cluster east... the east island has 3: all 6 with a selector-free job
    sw = SharedWorld(job("run", 3, created=0))
    sw.step()
    sw.bind("run")
    head = sw.add(job("head", 4, created=1))  # needs 4 nodes: only 3 are free
    small = sw.add(job("small", 1, created=2))
    sw.step("head", "small")
    assert sw.reason("head") == "WaitingForCapacity"
    assert sw.reason("small") == "WaitingForCapacity"
    assert "kept for ns/head ahead in the queue" in small.condition("Reconciling")["message"]
    # a node the head cannot use (its template does not tolerate the taint) is free to backfill
    assert head and not small.status["launched"]


def test_backfill_onto_nodes_the_head_cannot_use():
    sw = SharedWorld(job("run", 3, created=0))
    sw.step()
    sw.bind("run")
    free = sorted({n["metadata"]["name"] for n in sw.nodes} - set(sw.nodes_of("run")))
    for n in sw.nodes:
        if n["metadata"]["name"] == free[0]:
            n["spec"]["taints"] = [{"key": "team", "value": "small", "effect": "NoSchedule"}]
    sw.add(job("head", 4, created=1))
    tol = [{"key": "team", "operator": "Exists"}]
    small = sw.add(job("small", 1, created=2, template=template(tolerations=tol)))
    sw.step("head", "small")
    assert sw.reason("head") == "WaitingForCapacity"
    assert small.status["launched"] and sw.nodes_of("small") == [free[0]]


def test_the_head_keeps_only_nodes_its_selector_matches():
    # seen at scale (bench/operator_scale.py): a head waiting for its one island kept every free
    # node of the cluster, so jobs behind it that could run on the other island waited with it
    sw = SharedWorld(job("run", 2, created=0, nodes=east(2)))
    sw.step()
    sw.bind("run")
    head = sw.add(job("head", 3, created=1, nodes=east(3)))  # east has 3 nodes, 2 held
    small = sw.add(job("small", 2, created=2))
    sw.step("head", "small")
    assert sw.reason("head") == "WaitingForCapacity" and not head.status["launched"]
    east_nodes = {n["metadata"]["name"] for n in node_selection.selected(sw.nodes, load_job(head.job))}
    free_east = sorted(east_nodes - set(sw.nodes_of("run")))
    # the nodes it could take now are named, not free ones its selector rules out
    assert f"1 node(s) have that free now ({free_east[0]})" in head.condition("Reconciling")["message"]
    assert small.status["launched"], small.condition("Reconciling")["message"]
    assert all(n.startswith(("roce-", "eth-1")) for n in sw.nodes_of("small")), sw.nodes_of("small")


def east(count):
    return {"count": count, "gpusPerNode": 2, "selector": {"matchLabels": {"holmes.dev/cluster": "east"}}}


def test_a_job_ahead_that_fits_now_is_searched_once(monkeypatch):
    # seen at scale (bench/operator_scale.py, 1,000 nodes): each placement searched every job
    # ahead twice (could it ever run, then on what is free), under the placement lock
    from holmes.operator.core import placement

    sw = SharedWorld(job("a", 2, created=0), job("b", 2, created=1))
    calls = []
    real = placement.plan
    monkeypatch.setattr(
        placement, "plan", lambda nodes, spec, *a: calls.append(spec.nodes.count) or real(nodes, spec, *a)
    )
    sw.step("b")  # a was created first and not placed yet: b plans around it
    assert sw.worlds["b"].status["launched"]
    assert len(calls) == 3, calls  # a's on the free nodes; b's own two (ever, then now)
    assert not set(sw.nodes_of("b")) & {"ib-0", "ib-1"}  # a, ahead, would take the InfiniBand pair


def test_priority_then_creation_time_orders_the_queue():
    sw = SharedWorld(job("run", 3, created=0))
    sw.step()
    sw.bind("run")
    early = sw.add(job("early", 3, created=1))
    rp = {"backoffLimit": 2, "priority": 100}
    urgent = sw.add(job("urgent", 3, created=2, runPolicy=rp))
    later = sw.add(job("later", 3, created=3, runPolicy={"priorityClassName": "high"}))
    sw.classes = {"high": 1000}
    for w in sw.worlds.values():  # the operator lets namespace ns set a raw runPolicy.priority
        w.settings = RenderSettings(raw_priority_namespaces=("ns",))
    sw.step("early", "urgent", "later")  # early reconciles first, yet later (priority 1000) goes
    assert later.status["launched"] and not urgent.status["launched"] and not early.status["launched"]
    sw.worlds["run"].set_phase("Succeeded")
    sw.step("run", "early", "urgent")
    assert urgent.status["launched"] and not early.status["launched"]


def in_namespace(m, ns):
    m["metadata"]["namespace"] = ns
    return m


def test_namespaces_take_turns_so_fifty_jobs_of_one_do_not_starve_anothers_one():
    sw = SharedWorld(job("r1", 3, created=0), job("r2", 3, created=0))
    sw.step()
    sw.bind("r1")
    sw.bind("r2")
    many = [sw.add(in_namespace(job(f"a{i:02}", 3, created=1 + i), "team-a")) for i in range(50)]
    one = sw.add(in_namespace(job("b", 3, created=100), "team-b"))
    sw.step()
    assert all(sw.reason(w.job["metadata"]["name"]) == "WaitingForCapacity" for w in [*many, one])
    sw.worlds["r1"].set_phase("Succeeded")  # room for two 3-node jobs: team-a's first, then team-b's
    sw.worlds["r2"].set_phase("Succeeded")
    sw.step()
    launched = sorted(n for n, w in sw.worlds.items() if n[0] != "r" and w.status.get("launched"))
    assert launched == ["a00", "b"]
    assert "kept for" not in one.condition("Reconciling")["message"]


def test_namespaces_take_turns_when_jobs_run_one_after_another():
    # each job needs 4 of the 6 nodes: one runs at a time
    sw = SharedWorld(*[in_namespace(job(f"a{i}", 4, created=0), "team-a") for i in range(4)])
    b = sw.add(in_namespace(job("b", 4, created=0), "team-b"))
    order = []
    for _ in range(5):
        sw.step()
        now = [n for n, w in sw.worlds.items() if w.status.get("launched") and n not in order]
        assert len(now) == 1, now
        order += now
        sw.worlds[now[0]].set_phase("Succeeded")
    # team-a's a0 was first (the oldest by name); then team-b's turn, though a1..a3 are as old
    assert order == ["a0", "b", "a1", "a2", "a3"] and b.status["launched"]


def test_the_queue_orders_by_priority_then_turns_between_namespaces_then_age():
    spec = load_job(job("x", 1))
    shape = pod_shape(spec)

    def w(key, created, priority=0):
        return capacity.Waiting(key, spec, shape, priority, f"2026-01-01T00:00:{created:02}Z")

    jobs = [w("a/1", 1), w("a/2", 2), w("a/3", 3), w("b/1", 4), w("c/1", 5), w("b/2", 6), w("c/0", 7, 9)]
    order = capacity.queue_order(jobs)
    assert [x.job for x in order] == ["c/0", "a/1", "b/1", "c/1", "a/2", "b/2", "a/3"]
    # a namespace with jobs running already waits behind those with none running
    order = capacity.queue_order(jobs, running={"a": 1, "b": 2})
    assert [x.job for x in order] == ["c/0", "c/1", "a/1", "a/2", "b/1", "a/3", "b/2"]


def test_an_unknown_priority_class_stalls_the_job_with_what_to_fix():
    w = FakeWorld(job("a", 1, runPolicy={"priorityClassName": "nope"}), nodes=nodes())
    w.priority_classes = {"high": 1000}
    w.step()
    stalled = w.condition("Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "InvalidSpec"
    assert "PriorityClass 'nope' does not exist" in stalled["message"]


def test_a_job_the_template_rules_out_everywhere_waits_for_nodes_saying_why():
    tol_missing = job("a", 2, template=template(nodeSelector={"pool": "llm"}))
    sw = SharedWorld(tol_missing)
    sw.step()
    assert sw.reason("a") == "WaitingForNodes"
    msg = sw.worlds["a"].condition("Reconciling")["message"]
    assert "the template rules out 6 node(s)" in msg and "nodeSelector pool=llm does not match" in msg


def test_the_view_is_rebuilt_from_objects_alone_after_a_restart():
    sw = SharedWorld(job("a", 3, created=0), job("b", 3, created=1))
    sw.step("a")
    # a's pods vanish from the cache before the operator restarts, its ConfigMap names its nodes
    a = sw.worlds["a"]
    planned = sw.nodes_of("a")
    a.pods.clear()
    sw.step("b")
    assert sw.worlds["b"].status["launched"] and not set(sw.nodes_of("b")) & set(planned)


# ---- Kueue --------------------------------------------------------------------------------------


FLAVORS = {
    "west-gpu": {"metadata": {"name": "west-gpu"}, "spec": {"nodeLabels": {"holmes.dev/cluster": "west"}}},
}


def kueue_job(name="k", count=2, **spec):
    m = job(name, count, **spec)
    m["metadata"]["labels"] = {LABEL_KUEUE_QUEUE: "team-a"}
    return m


def admit(w, flavor="west-gpu"):
    w.workload["status"] = {
        "admission": {
            "clusterQueue": "cq",
            "podSetAssignments": [{"name": "workers", "flavors": {"nvidia.com/gpu": flavor}, "count": 2}],
        },
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "ok"},
            {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "ok"},
        ],
    }


def test_kueue_admit_run_evict_readmit():
    w = FakeWorld(kueue_job(), nodes=nodes())
    w.flavors = FLAVORS
    w.step()
    assert w.status["phase"] == "Suspended" and not w.pods
    assert w.condition("Suspended")["reason"] == "WaitingForAdmission"
    wl = w.workload
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["kind"] == "Workload"
    assert wl["spec"]["queueName"] == "team-a"
    (ps,) = wl["spec"]["podSets"]
    assert ps["count"] == 2
    # every resource its pods will request: the GPUs and, planned on the InfiniBand nodes, their RDMA device
    requests = {"nvidia.com/gpu": "2", "rdma/rdma_shared_device_a": "1"}
    assert ps["template"]["spec"]["containers"][0]["resources"]["requests"] == requests
    w.step()
    assert not w.pods  # still not admitted
    admit(w)
    w.step()
    assert w.status["launched"] and "Resumed" in w.reasons()
    placed = sorted(p["metadata"]["annotations"][child_names.ANN_NODE] for p in w.pods.values())
    assert placed == ["roce-0", "roce-1"] or set(placed) <= {"roce-0", "roce-1", "eth-1"}
    assert all(n in {"roce-0", "roce-1", "eth-1"} for n in placed)  # the flavor's nodes only
    attempt = w.status["attempt"]
    w.set_phase("Running")
    w.step()
    assert w.status["phase"] == "Running"
    # Kueue evicts it (preempted by a higher-priority workload): Evicted=True, quota still held
    w.workload["status"] = kueue.evict(w.workload, "Preempted", "preempted by cq/urgent", "t1")
    w.step()
    assert w.status["phase"] == "Suspended" and not w.pods
    c = w.condition("Suspended")
    assert c["reason"] == "Requeued" and "Preempted: preempted by cq/urgent" in c["message"]
    # its pods gone, Holmes releases the quota (test_kueue_preemption.py); Kueue admits it again
    w.step()
    assert w.condition("Suspended")["reason"] == "Requeued" and not w.pods
    assert not queueing.holds_quota(w.workload)
    w.workload["status"] = kueue.reserve_quota(w.workload, "west-gpu", "t2")
    w.step()
    assert w.status["launched"] and w.status["attempt"] > attempt and len(w.pods) == 2
    assert w.status["restarts"] == 0  # a requeue is not a failure
    w.set_phase("Succeeded")
    w.step()
    assert w.status["phase"] == "Succeeded"
    w.step()
    fin = next(c for c in w.workload["status"]["conditions"] if c["type"] == "Finished")
    assert fin["status"] == "True" and fin["reason"] == "Succeeded"


def test_kueue_workload_names_the_priority_class_its_priority_comes_from():
    w = FakeWorld(kueue_job(runPolicy={"priorityClassName": "high"}), nodes=nodes())
    w.flavors, w.priority_classes = FLAVORS, {"high": 1000}
    w.step()
    spec = w.workload["spec"]
    assert spec["priority"] == 1000
    assert spec["priorityClassRef"] == {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "high"}
    # an explicit priority is no class's value
    w2 = FakeWorld(kueue_job("n", runPolicy={"priority": 7, "priorityClassName": "high"}), nodes=nodes())
    w2.flavors, w2.priority_classes = FLAVORS, {"high": 1000}
    w2.settings = RenderSettings(raw_priority_namespaces=("ns",))  # where a raw priority is allowed
    w2.step()
    assert w2.workload["spec"]["priority"] == 7 and "priorityClassRef" not in w2.workload["spec"]


def test_kueue_workload_priority_class_label_wins_as_in_kueue():
    """Kueue's own integrations take a job's kueue.x-k8s.io/priority-class first
    (jobframework.ExtractPriority): the Workload carries that WorkloadPriorityClass's value and
    reference, over the pods' PriorityClass; a class not there yet holds the job, saying so."""
    m = kueue_job(runPolicy={"priorityClassName": "high"})
    m["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = "urgent"
    w = FakeWorld(m, nodes=nodes())
    w.flavors, w.priority_classes, w.workload_priority_classes = FLAVORS, {"high": 1000}, {}
    w.step()
    assert w.workload is None and not w.pods
    c = w.condition("Suspended")
    assert c["reason"] == "WaitingForAdmission"
    assert "kueue.x-k8s.io/priority-class=urgent names a WorkloadPriorityClass" in c["message"]
    w.workload_priority_classes = {"urgent": 10000}
    w.step()
    spec = w.workload["spec"]
    assert spec["priority"] == 10000
    ref = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "urgent"}
    assert spec["priorityClassRef"] == ref
    v1 = queueing.workload_as("v1beta1", w.workload)["spec"]
    assert (v1["priorityClassSource"], v1["priorityClassName"]) == (
        "kueue.x-k8s.io/workloadpriorityclass",
        "urgent",
    )


def test_kueue_not_installed_stalls_with_what_to_do():
    w = FakeWorld(kueue_job(), nodes=nodes())
    w.step()  # flavors None: the API is not served
    s = w.condition("Stalled")
    assert s["status"] == "True" and s["reason"] == "KueueNotInstalled"
    assert "install Kueue, or remove the label" in s["message"]
    assert "kueue.x-k8s.io (Workload, v1beta2 or v1beta1) is not served" in s["message"]


def test_kueue_flavor_not_found_waits_and_a_changed_shape_recreates_the_workload():
    w = FakeWorld(kueue_job(), nodes=nodes())
    w.flavors = FLAVORS
    w.step()
    admit(w, flavor="missing")
    w.step()
    assert not w.pods and "ResourceFlavor(s) missing" in w.condition("Suspended")["message"]
    w.edit_spec(nodes={"count": 3, "gpusPerNode": 2})
    d = w.step()
    assert d.delete_workload == "holmesjob-k" and w.workload is None
    w.step()
    assert sum(ps["count"] for ps in w.workload["spec"]["podSets"]) == 3


def island_flavors():
    return {
        f: {"metadata": {"name": f}, "spec": {"nodeLabels": {"holmes.dev/cluster": f}}}
        for f in ("east", "west")
    }


def admit_each(w, flavor_of_pod_set):
    """Kueue's admission: each PodSet its flavor (by PodSet name)."""
    w.workload["status"] = {
        "admission": {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {
                    "name": ps["name"],
                    "flavors": {"nvidia.com/gpu": flavor_of_pod_set(ps)},
                    "count": ps["count"],
                }
                for ps in w.workload["spec"]["podSets"]
            ],
        },
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "ok"},
            {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "ok"},
        ],
    }


def test_a_job_across_islands_asks_kueue_for_a_pod_set_per_island_and_pod_shape():
    """Six nodes of 2 GPUs: every node, both islands. One PodSet per (island, requests): the
    InfiniBand nodes' pods ask for their RDMA device, the RoCE nodes' for theirs, the Ethernet
    nodes' for none, each PodSet selecting its island; the job's CPU and memory in each. Kept
    as it is across reconciles without planning again; admitted per PodSet on the flavor of its
    island, each pod goes where its PodSet's flavor says, with the flavor's labels in its node
    selector (as Kueue's job framework puts them)."""
    m = kueue_job(count=6, template=template())
    m["spec"]["training"]["globalBatchSize"] = 12  # 6 data-parallel ranks
    m["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2", "memory": "1Gi"}}
    w = FakeWorld(m, nodes=nodes())
    w.flavors = island_flavors()
    w.step()
    sets = w.workload["spec"]["podSets"]
    got = {
        ps["name"]: (
            ps["count"],
            ps["template"]["spec"]["nodeSelector"],
            ps["template"]["spec"]["containers"][0]["resources"]["requests"],
        )
        for ps in sets
    }
    base = {"cpu": "2", "memory": str(2**30), "nvidia.com/gpu": "2"}
    assert got == {
        "east": (1, {"holmes.dev/cluster": "east"}, base),
        "east-2": (2, {"holmes.dev/cluster": "east"}, {**base, "rdma/rdma_shared_device_a": "1"}),
        "west": (1, {"holmes.dev/cluster": "west"}, base),
        "west-2": (2, {"holmes.dev/cluster": "west"}, {**base, "rdma/rdma_shared_device_b": "1"}),
    }, got
    assert w.workload["metadata"]["annotations"][kueue_pod_sets.ANN_POD_SETS]
    before = copy.deepcopy(w.workload)
    d = w.step()  # waiting for Kueue: the same Workload, and no plan made for it
    assert w.workload == before and d.delete_workload is None and not d.placed
    admit_each(w, lambda ps: ps["template"]["spec"]["nodeSelector"]["holmes.dev/cluster"])
    w.step()
    assert w.status["launched"] and len(w.pods) == 6
    for p in w.pods.values():
        node = p["metadata"]["annotations"][child_names.ANN_NODE]
        island = "east" if node in ("ib-0", "ib-1", "eth-0") else "west"
        assert p["spec"]["nodeSelector"] == {"holmes.dev/cluster": island}, (
            node,
            p["spec"].get("nodeSelector"),
        )


def test_an_admitted_flavor_confines_the_pods_of_its_pod_set():
    """A job on one island's worth of nodes (one PodSet, no island of its own: Kueue picks the
    flavor); admitted on the west flavor, it plans on west's nodes only, and says so."""
    w = FakeWorld(kueue_job(count=2), nodes=nodes())
    w.flavors = island_flavors()
    w.step()
    (ps,) = w.workload["spec"]["podSets"]
    assert ps["name"] == "workers" and "nodeSelector" not in ps["template"]["spec"]
    admit_each(w, lambda ps: "west")
    w.step()
    placed = {p["metadata"]["annotations"][child_names.ANN_NODE] for p in w.pods.values()}
    assert placed <= {"roce-0", "roce-1", "eth-1"} and len(placed) == 2
    assert all(p["spec"]["nodeSelector"] == {"holmes.dev/cluster": "west"} for p in w.pods.values())


RESERVED = {"key": "holmes.dev/reserved", "value": "ml", "effect": "NoSchedule"}
TOLERATE_RESERVED = {"key": "holmes.dev/reserved", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}


def test_an_admitted_flavors_tolerations_let_its_pods_onto_its_tainted_nodes():
    """West's nodes carry a taint the template does not tolerate; the west flavor tolerates it
    (spec.tolerations; its nodeTaints say so to Kueue). Admitted on west, the job plans on
    west's tainted nodes and its pods get the flavor's tolerations appended to their own, with
    its node labels, as Kueue's job framework merges both into its pods (pkg/podset
    FromAssignment, Merge). It waited on them before: the template's tolerations alone ruled
    them out. On the east flavor (no tolerations) a tainted east stays ruled out, saying so."""
    ns = nodes()
    for n in ns:
        if n["metadata"]["labels"]["holmes.dev/cluster"] == "west":
            n["spec"]["taints"] = [dict(RESERVED)]
    own = {"key": "team", "operator": "Exists"}
    w = FakeWorld(kueue_job(count=2, template=template(tolerations=[own])), nodes=ns)
    w.flavors = island_flavors()
    w.flavors["west"]["spec"].update(nodeTaints=[dict(RESERVED)], tolerations=[dict(TOLERATE_RESERVED)])
    w.step()
    admit_each(w, lambda ps: "west")
    w.step()
    assert w.status["launched"] and len(w.pods) == 2, w.status.get("conditions")
    for p in w.pods.values():
        assert p["metadata"]["annotations"][child_names.ANN_NODE] in {"roce-0", "roce-1", "eth-1"}
        assert p["spec"]["nodeSelector"] == {"holmes.dev/cluster": "west"}
        assert p["spec"]["tolerations"] == [own, TOLERATE_RESERVED], p["spec"]["tolerations"]
    # the east flavor tolerates nothing: east's tainted nodes stay out, the message says why
    for n in ns:
        n["spec"]["taints"] = [dict(RESERVED)]
    shape = capacity.PodShape(
        {"nvidia.com/gpu": 2.0},
        flavor_labels=({"holmes.dev/cluster": "east"}, {"holmes.dev/cluster": "west"}),
        flavor_tolerations=((), (TOLERATE_RESERVED,)),
    )
    east = next(n for n in ns if n["metadata"]["name"] == "ib-0")
    west = next(n for n in ns if n["metadata"]["name"] == "roce-0")
    assert capacity.placement_problem(east, shape) == (
        "taint holmes.dev/reserved=ml:NoSchedule is not tolerated by the template nor by the "
        "admitted flavors' tolerations"
    )
    assert capacity.placement_problem(west, shape) == ""
    assert tolerations.flavor_choice(west, (), shape.flavor_labels, shape.flavor_tolerations) == 1


def test_the_flavor_choices_carry_each_flavors_tolerations():
    wl = {
        "spec": {
            "podSets": [{"name": "a", "template": {"spec": {}}}, {"name": "b", "template": {"spec": {}}}]
        },
        "status": {
            "admission": {
                "podSetAssignments": [
                    {"name": "a", "flavors": {"nvidia.com/gpu": "plain"}},
                    {"name": "b", "flavors": {"nvidia.com/gpu": "tainted", "cpu": "plain"}},
                ]
            }
        },
    }
    flavors = {
        "plain": {"spec": {}},
        "tainted": {"spec": {"nodeLabels": {"pool": "t"}, "tolerations": [TOLERATE_RESERVED]}},
    }
    choices, missing = queueing.flavor_choices(wl, flavors)
    assert not missing
    assert choices == (({}, ()), ({"pool": "t"}, (TOLERATE_RESERVED,)))  # not collapsed into "anywhere"
    assert queueing.flavor_node_labels(wl, flavors) == (({}, {"pool": "t"}), [])


def test_a_launch_holds_to_the_split_kueue_admitted():
    """Kueue reserves quota per PodSet and flavor. 4 pods of 2 GPUs (more than an island holds):
    planned 2 on east and 2 on west, admitted so. With roce-0 busy at launch, the plan on free
    capacity puts 3 on east: it would run on east quota Kueue did not reserve, so the job waits
    (it launched so before), its Workload kept; once roce-0 is free it launches 2 and 2. When
    the plan its pod sets came from changes (a node gone), the Workload is made again for
    Kueue from the plan now."""
    w = FakeWorld(kueue_job(count=4), nodes=nodes())
    w.flavors = island_flavors()
    w.step()
    sets = {ps["name"]: ps["count"] for ps in w.workload["spec"]["podSets"]}
    assert sets == {"east": 2, "west": 2}, sets
    admit_each(w, lambda ps: ps["template"]["spec"]["nodeSelector"]["holmes.dev/cluster"])
    busy = Workloads(pods=[pod("x0", "roce-0", gpus=2)])
    w.workloads = lambda: busy
    d = w.step()
    assert not w.pods and d.delete_workload is None, [p["metadata"]["annotations"] for p in w.pods.values()]
    c = w.condition("Reconciling")
    assert c["reason"] == "WaitingForCapacity", c
    assert c["message"].startswith(
        "the plan on free capacity puts 1 pod(s) (on node(s) eth-0) outside the pod sets Kueue "
        "admitted (east: 2 pod(s) on holmes.dev/cluster=east; west: 2 pod(s) on holmes.dev/cluster=west)"
    ), c["message"]
    assert c["message"].endswith("waiting for the nodes of the admitted split"), c["message"]
    assert "Planned" not in w.reasons()
    w.workloads = Workloads
    w.step()
    placed = [p["metadata"]["annotations"][child_names.ANN_NODE] for p in w.pods.values()]
    assert w.status["launched"] and len(placed) == 4, placed
    assert sorted(n in ("ib-0", "ib-1", "eth-0") for n in placed) == [False, False, True, True], placed
    # the plan the pod sets came from changed: roce-0 is gone
    w2 = FakeWorld(kueue_job(count=4), nodes=nodes())
    w2.flavors = island_flavors()
    w2.step()
    admit_each(w2, lambda ps: ps["template"]["spec"]["nodeSelector"]["holmes.dev/cluster"])
    w2.nodes = [n for n in w2.nodes if n["metadata"]["name"] != "roce-0"]
    d = w2.step()
    assert not w2.pods and d.delete_workload == "holmesjob-k"
    assert "re-creating Workload holmesjob-k for Kueue" in w2.condition("Reconciling")["message"]
    w2.step()
    sets = {ps["name"]: ps["count"] for ps in w2.workload["spec"]["podSets"]}
    assert sets == {"east": 1, "east-2": 2, "west": 1}, sets  # eth-0's pod asks no RDMA device


def test_pod_groups_merge_into_kueues_eight_pod_sets_never_asking_for_less():
    g = kueue_pod_sets.PodGroup
    same = [g("east", {"gpu": 1.0}), g("east", {"gpu": 1.0}), g("west", {"gpu": 1.0, "rdma/b": 1.0})]
    assert kueue_pod_sets.group_pods(same) == [
        g("east", {"gpu": 1.0}, 2),
        g("west", {"gpu": 1.0, "rdma/b": 1.0}),
    ]
    # 9 shapes on 3 islands: each island's pods merged, each resource at the most one asks
    many = [g(f"i{i % 3}", {"gpu": 1.0, f"r{i}": 1.0, "cpu": float(i)}) for i in range(9)]
    merged = kueue_pod_sets.group_pods(many)
    assert [(m.island, m.count) for m in merged] == [("i0", 3), ("i1", 3), ("i2", 3)]
    assert merged[0].requests == {"gpu": 1.0, "r0": 1.0, "r3": 1.0, "r6": 1.0, "cpu": 6.0}
    # 9 islands: one group, no island
    (one,) = kueue_pod_sets.group_pods([g(f"i{i}", {"gpu": 1.0}) for i in range(9)])
    assert (one.island, one.count) == ("", 9)
    names = kueue_pod_sets.pod_set_names([g("East_1.a", {}), g("East_1.a", {"x": 1.0}), g("", {"y": 1.0})])
    assert names == ["east-1-a", "east-1-a-2", "workers"]


# ---- Volcano ------------------------------------------------------------------------------------


def test_the_gpu_resource_is_the_cost_models_in_limits_capacity_and_the_podgroup():
    """nicMapping.gpuResource names the GPUs discovery counts; the pods' limits, the capacity
    ledger and the PodGroup use the same name (they used a fixed nvidia.com/gpu before)."""
    sw = SharedWorld(job("a", 3, template=template(schedulerName="volcano")), job("b", 3), job("c", 3))
    amd = placement_facts.builtin_cost_model(NicMapping(gpu_resource="amd.com/gpu"))
    for n in sw.nodes:
        alloc = n["status"]["allocatable"]
        alloc["amd.com/gpu"] = alloc.pop("nvidia.com/gpu")
    for w in sw.worlds.values():
        w.cost_model = amd
    sw.step("a")
    assert sw.worlds["a"].podgroup["spec"]["minResources"] == {"amd.com/gpu": "6"}
    sw.worlds["a"].volcano_sets("Inqueue")
    sw.step()
    for name in ("a", "b"):
        for p in sw.worlds[name].pods.values():
            limits = p["spec"]["containers"][0]["resources"]["limits"]
            assert limits["amd.com/gpu"] == 2 and "nvidia.com/gpu" not in limits
    # the ledger counts them: the third job waits for the same GPUs
    assert sw.reason("c") == "WaitingForCapacity" and not sw.worlds["c"].pods
    assert "2 amd.com/gpu free per pod" in sw.worlds["c"].condition("Reconciling")["message"]


def test_volcano_jobs_get_a_podgroup_of_the_gang_and_annotated_pods():
    m = job("v", 3, template=template(schedulerName="volcano"))
    m["spec"]["template"]["metadata"] = {"annotations": {queueing.ANN_VOLCANO_QUEUE: "research"}}
    w = FakeWorld(m, nodes=nodes())
    w.step()
    w.volcano_sets("Inqueue")
    w.step()
    pg = w.podgroup
    assert pg["apiVersion"] == "scheduling.volcano.sh/v1beta1" and pg["kind"] == "PodGroup"
    assert pg["spec"]["minMember"] == 3 and pg["spec"]["queue"] == "research"
    assert pg["spec"]["minResources"] == {"nvidia.com/gpu": "6"}
    for p in w.pods.values():
        assert p["metadata"]["annotations"][queueing.ANN_GROUP] == "v"
        assert p["spec"]["schedulerName"] == "volcano"


def volcano_job(name="v", count=3):
    return FakeWorld(job(name, count, template=template(schedulerName="volcano")), nodes=nodes())


def test_a_volcano_gangs_pods_wait_uncreated_until_volcano_admits_its_podgroup():
    w = volcano_job()
    w.step()  # the PodGroup is created first: no pod, no layout ConfigMap, nothing held
    assert w.podgroup["spec"]["minMember"] == 3 and not w.pods and w.configmap is None
    c = w.condition("Reconciling")
    assert c["reason"] == "WaitingForPodGroup" and "queue default (phase Inqueue)" in c["message"]
    w.volcano_sets("Pending")  # the queue cannot hold minResources yet
    w.step()
    assert not w.pods and "PodGroup v is Pending" in w.condition("Reconciling")["message"]
    w.volcano_sets("Inqueue")  # the enqueue action admitted it: Volcano's controller creates pods now
    w.step()
    assert len(w.pods) == 3 and w.status["launched"]
    w.volcano_sets("Running")
    w.set_phase("Running")
    w.step()
    assert w.status["phase"] == "Running"


def test_a_preempted_volcano_gang_waits_for_its_podgroup_to_be_enqueued_again():
    w = volcano_job()
    w.step()
    w.volcano_sets("Inqueue")
    w.step()
    w.volcano_sets("Running")
    w.set_phase("Running")
    w.step()
    victim = sorted(w.pods)[0]  # Volcano's preempt action evicts a pod
    w.pods[victim]["status"] = {"phase": "Failed", "reason": "Evicted", "message": "preempted"}
    w.step()  # a gang restart, counted as a disruption
    assert w.status["restartsByReason"].get("disruption") == 1
    w.step()
    # the group still reads Running (the old attempt's) until Volcano's next session: no new pods
    assert not [p for p in w.pods.values() if p["metadata"]["labels"]["holmes.dev/attempt"] == "2"]
    assert "still Running from the last attempt" in w.condition("Reconciling")["message"]
    w.volcano_sets("Pending")  # below minMember and not Inqueue: Volcano sets it Pending
    w.step()
    assert w.condition("Reconciling")["reason"] == "WaitingForPodGroup"
    w.volcano_sets("Inqueue")
    w.step()
    assert len([p for p in w.pods.values() if p["metadata"]["labels"]["holmes.dev/attempt"] == "2"]) == 3


def test_completed_is_not_success_the_pods_say_how_a_volcano_gang_ended():
    w = volcano_job(count=2)
    w.step()
    w.volcano_sets("Inqueue")
    w.step()
    w.set_phase("Failed", exit_code=1)
    w.volcano_sets("Completed")  # every allocated pod Succeeded *or Failed*
    w.job["spec"]["runPolicy"]["backoffLimit"] = 0
    w.step()
    assert w.status["phase"] == "Failed"


def test_a_volcano_job_where_volcano_is_not_installed_stalls_saying_so():
    w = volcano_job()
    w.volcano = False
    w.step()
    stalled = w.condition("Stalled")
    assert stalled["reason"] == "VolcanoNotInstalled" and not w.pods and w.podgroup is None


def test_plain_jobs_get_no_podgroup():
    w = FakeWorld(job("p", 1), nodes=nodes())
    w.step()
    assert w.podgroup is None and w.workload is None


def test_the_capacity_step_alone_places_a_job():
    a = job("a", 3)
    where = Placement(placement_facts.gather(placement_facts.builtin_cost_model()), nodes(), a)
    spec = load_job(a)
    assert len(on_free_capacity(nodes(), spec, where).nodes) == 3
    with pytest.raises(InsufficientNodes) as e:
        on_free_capacity(nodes(), load_job(job("b", 7)), where)
    assert not isinstance(e.value, WaitingForCapacity)
    full = copy.deepcopy(nodes())
    held = Workloads(pods=[pod(f"x{i}", n["metadata"]["name"], gpus=2) for i, n in enumerate(full)])
    facts = placement_facts.gather(placement_facts.builtin_cost_model(), held)
    with pytest.raises(WaitingForCapacity):
        on_free_capacity(full, spec, Placement(facts, full, a))


def test_a_nodes_placement_problem_is_judged_once_per_version_and_a_new_taint_is_seen(monkeypatch):
    # seen at scale (bench/operator_scale.py, 2,000 nodes): every placement parsed every node's
    # allocatable and taints anew, for the job and each job ahead, a fifth of a placement
    from holmes.operator.watches import slim_node

    calls = []
    real = capacity.placement_problem
    monkeypatch.setattr(capacity, "placement_problem", lambda n, s: calls.append(1) or real(n, s))
    cached = [slim_node(n) for n in nodes()]  # as the node informer keeps them
    for _ in range(3):
        view, out = free_view(cached, shape_of(), Ledger())
    assert len(calls) == len(cached) and not out
    tainted = copy.deepcopy(nodes()[0])  # a new version of the node: a taint, nothing else
    tainted["spec"]["taints"] = [{"key": "maintenance", "effect": "NoSchedule"}]
    name = tainted["metadata"]["name"]
    view, out = free_view([slim_node(tainted)] + cached[1:], shape_of(), Ledger())
    assert out == {name: "taint maintenance:NoSchedule is not tolerated by the template"}
    other = shape_of(containers=[{"name": "trainer", "resources": {"requests": {"cpu": "10000"}}}])
    assert len(free_view(cached, other, Ledger())[1]) == len(cached)  # another shape: judged anew


def test_running_jobs_reconciles_reuse_the_node_index_and_the_launched_layouts(monkeypatch):
    # seen at 2,000 nodes x 150 jobs: every reconcile of a running job indexed every node and
    # looked every launched job's layout up, most of its CPU
    from holmes.operator.core import state
    from holmes.operator.kube import Caches
    from holmes.operator.pipeline import HubChildren

    caches = Caches()
    for n in nodes():
        caches.nodes.put(n)
    listed = caches.nodes.snapshot()
    assert caches.nodes.snapshot() is listed and state.node_index(listed) is state.node_index(listed)
    changed = copy.deepcopy(nodes()[0])
    changed["metadata"]["labels"]["x"] = "1"
    caches.nodes.put(changed)
    again = caches.nodes.snapshot()
    assert again is not listed and state.node_index(again)[changed["metadata"]["name"]] is changed

    from tests.helpers.operator.pipeline_world import WorldIO, pipeline

    pl = pipeline(caches, WorldIO(caches))
    launched = job("a", 1)
    launched["status"] = {"launched": True}
    caches.jobs.put(launched)
    first = pl.workloads(HubChildren(caches, None)).layouts  # type: ignore[arg-type]
    assert first == {}
    cm = {"metadata": {"name": child_names.layout_configmap_name("a"), "namespace": "ns"}, "data": {}}
    caches.configmaps.put(cm)  # its layout lands: a new version of the store, read anew
    assert pl.workloads(HubChildren(caches, None)).layouts == {("ns", "a"): cm}  # type: ignore[arg-type]


def island(count, *clusters):
    sel = {"matchExpressions": [{"key": "holmes.dev/cluster", "operator": "In", "values": list(clusters)}]}
    return {"count": count, "gpusPerNode": 2, "selector": sel}


def test_a_placement_weighs_only_the_jobs_ahead_whose_nodes_reach_its_own(monkeypatch):
    # seen at scale (bench/operator_scale.py, 2,000 nodes in 8 islands): each placement weighed
    # every job ahead in the queue on every node, though most could never touch its island
    from holmes.operator.core import placement

    sw = SharedWorld(job("east-only", 3, created=0, nodes=island(3, "east")))
    calls = []
    real = placement.plan
    monkeypatch.setattr(
        placement, "plan", lambda nodes, spec, *a: calls.append(spec.nodes.count) or real(nodes, spec, *a)
    )
    sw.add(job("west", 2, created=1, nodes=island(2, "west")))
    sw.step("west")  # east-only, ahead, cannot take a west node: not weighed
    assert sw.worlds["west"].status["launched"] and calls == [2, 2], calls


def test_a_job_ahead_that_reaches_its_nodes_only_through_another_is_still_weighed():
    # east-only takes all of east; so either-island, behind it, can only go west, where it takes
    # two of the three nodes the last job needs: the last job waits. Weighing either-island
    # without east-only ahead of it would send it east and launch the last job on west wrongly.
    sw = SharedWorld(
        job("east-only", 3, created=0, nodes=island(3, "east")),
        job("either", 2, created=1, nodes=island(2, "east", "west")),
        job("west", 3, created=2, nodes=island(3, "west")),
    )
    sw.step("west")
    assert not sw.worlds["west"].status["launched"]
    assert sw.reason("west") == "WaitingForCapacity", sw.worlds["west"].condition("Reconciling")


def test_a_workload_from_before_the_pod_sets_per_group_is_kept_until_the_pods_change():
    """A Workload an earlier operator wrote (one shape, no digest of its inputs) is kept as it
    is, not planned for; a change of the job's pods re-creates it with pod sets per group."""
    w = FakeWorld(kueue_job(), nodes=nodes())
    w.flavors = FLAVORS
    w.step()
    spec = load_job(w.job["spec"])
    w.workload["metadata"].pop("annotations")
    w.workload["spec"]["podSets"] = kueue_pod_sets.one_pod_set(2, pod_shape(spec), spec.template)
    d = w.step()
    assert d.delete_workload is None and not d.placed and w.workload is not None
    w.edit_spec(nodes={"count": 2, "gpusPerNode": 1})
    d = w.step()
    assert d.delete_workload == "holmesjob-k"
    w.step()
    assert w.workload["metadata"]["annotations"][kueue_pod_sets.ANN_POD_SETS]
