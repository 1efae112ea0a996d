"""A labelled JobSet, its pods and the nodes of the testbed's shape, as the JobSet plan's unit
tests share them (core/jobset_plan.py, jobset_watch.py, the launcher's JobSet mode)."""

from __future__ import annotations

from holmes.operator.core import jobset_plan as jp
from holmes.operator.placement_facts import NodeFacts, builtin_cost_model


def node(name: str, cluster: str, nic: str, ready: bool = True) -> dict:
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "holmes.dev/cluster": cluster, "holmes.dev/nic": nic},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


# the testbed's shape: two IB islands of 2 and a RoCE island of 2, plus one Ethernet node
NODES = [
    node("a-0", "a", "infiniband"),
    node("a-1", "a", "infiniband"),
    node("b-0", "b", "roce"),
    node("b-1", "b", "roce"),
    node("c-0", "c", "ethernet"),
]
FACTS = NodeFacts(builtin_cost_model())


def jobset(replicas: int = 2, parallelism: int = 2, **ann: str) -> dict:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "js",
            "namespace": "ns",
            "uid": "u-1",
            "labels": {jp.LABEL_PLAN: jp.PLAN_ENABLED},
            "annotations": ann,
        },
        "spec": {
            "replicatedJobs": [
                {"name": "w", "replicas": replicas, "template": {"spec": {"parallelism": parallelism}}}
            ]
        },
    }


def pod(job: int, index: int, **spec: object) -> dict:
    host = f"js-w-{job}-{index}"
    return {
        "metadata": {
            "name": f"{host}-xyz",
            "resourceVersion": "7",
            "labels": {jp.JS_GLOBAL_INDEX: str(job), jp.COMPLETION_INDEX: str(index)},
        },
        "spec": {
            "hostname": host,
            "subdomain": "js",
            "schedulingGates": [{"name": jp.GATE}],
            "containers": [{"name": "c"}],
            **spec,
        },
    }


def pods(jobs: int = 2, per: int = 2) -> list[dict]:
    return [pod(j, i) for j in reversed(range(jobs)) for i in range(per)]  # any order in


def plan(
    js: dict, ps: list[dict] | None = None, nodes: list[dict] = NODES, admitted: object = None
) -> jp.Plan:
    return jp.make_plan(js, pods() if ps is None else ps, nodes, FACTS.network, FACTS.unusable, admitted)  # type: ignore[arg-type]
