"""A fake world for the real reconcile pipeline (operator/holmes/operator/pipeline.py): the real
caches, the real decision and the real placement lock, with the API server's part played by
``WorldIO``, which stores each write in the caches as the informers would (after ``delay``
seconds: slow writes), so that many jobs can be reconciled from many threads at once."""

from __future__ import annotations

import copy
import itertools
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from holmes.contract.names import KIND
from holmes.operator import placement_facts
from holmes.operator.core import child_names, queueing
from holmes.operator.core.reconcile import ChildRefusal, Decision, RestartBackoff
from holmes.operator.core.render import RenderSettings
from holmes.operator.kube import Caches
from holmes.operator.pipeline import Pipeline
from holmes.operator.progress import ProgressReader
from localkube.operatorproc import fake_gpu_node
from tests.helpers.operator.opfixtures import T0, manifest


class WorldIO:
    """KubeIO's writes as the API server and the informers would make them: each object stored
    with a fresh resourceVersion and uid; ``delay()`` seconds before each write lands."""

    kueue_version = queueing.V1BETA2

    def __init__(self, caches: Caches, delay: Callable[[], float] = lambda: 0.0) -> None:
        self.caches, self.delay = caches, delay
        self._rv = itertools.count(1000)
        self._lock = threading.Lock()  # a leaf: the counter only
        self.created: list[str] = []  # every pod name created, in order (duplicates show here)

    def stamp(self, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        with self._lock:
            n = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(n)
        obj["metadata"].setdefault("uid", f"uid-{n}")
        return obj

    def apply(self, d: Decision, owner: dict, adopt: bool = True) -> tuple[int, list[ChildRefusal]]:
        time.sleep(self.delay())
        ns = owner["metadata"]["namespace"]
        ref = {"kind": KIND, "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}

        def stamp(obj: dict) -> dict:  # adopted, as kopf.adopt makes it
            obj = self.stamp(obj)
            obj["metadata"]["ownerReferences"] = [dict(ref, controller=True)]
            return obj

        for name in d.delete_pods:
            self.caches.pods.remove_name(ns, name)
        if d.configmap is not None:
            self.caches.configmaps.put(stamp(d.configmap))
        if d.service is not None:
            self.caches.services.put(stamp(d.service))
        made = 0
        for pod in d.create_pods:
            if self.caches.pods.get(ns, pod["metadata"]["name"]) is not None:
                continue  # 409: already there
            self.caches.pods.put(stamp(pod))
            with self._lock:
                self.created.append(f"{ns}/{pod['metadata']['name']}")
            made += 1
        return made, []

    def apply_queueing(self, d: Decision, owner: dict) -> None:
        pass  # no Kueue, no Volcano in this world

    def patch_status(self, job: dict, old: dict, new: dict) -> bool:
        if old == new:
            return False
        time.sleep(self.delay())
        fresh = self.caches.jobs.get(job["metadata"]["namespace"], job["metadata"]["name"]) or job
        fresh = self.stamp(fresh)
        fresh["status"] = copy.deepcopy(new)
        self.caches.jobs.put(fresh)
        return True

    def log_tail(self, pod: dict, lines: int = 20) -> str:
        return ""


class NoWatches:
    """A cluster without Kueue, Volcano or member clusters."""

    members = None
    volcano = False

    def flavors(self) -> None:
        return None

    def priority_classes(self) -> dict[str, int]:
        return {}

    def workload_priority_classes(self) -> None:  # Kueue's, not served here
        return None

    def queue_topology(self, job: dict) -> None:  # no Kueue, no topology
        return None

    def namespace_labels(self, ns: str) -> None:  # not known: defaults as for an unlabelled one
        return None


def pipeline(caches: Caches, io: WorldIO) -> Pipeline:
    return Pipeline(
        caches,
        io,  # type: ignore[arg-type]
        NoWatches(),  # type: ignore[arg-type]
        placement_facts.builtin_cost_model(),
        RenderSettings(),
        RestartBackoff(0),
        ProgressReader(RenderSettings.metrics_port, RenderSettings.progress_interval),
        lambda key, message: False,
    )


def gpus_per_node(caches: Caches) -> dict[str, int]:
    """GPUs the cached pods request on each node (the node annotation the pods are pinned by)."""
    out: dict[str, int] = {}
    for pod in caches.pods.values():
        node = pod["metadata"]["annotations"][child_names.ANN_NODE]
        for c in pod["spec"]["containers"]:
            limits = (c.get("resources") or {}).get("limits") or {}
            out[node] = out.get(node, 0) + int(limits.get("nvidia.com/gpu", 0))
    return out


# ---- jobs and nodes of the placement tests (test_commit.py, test_placement_concurrency.py) ----
def claiming(name: str) -> Decision:
    pod = {"metadata": {"name": f"{name}-1-0", "namespace": "ns"}, "spec": {}}
    return Decision(status={"launched": True}, create_pods=[pod])


def waiting_job(name: str, created: int, **spec) -> dict:
    m = manifest(name, **spec)
    m["metadata"]["uid"] = f"uid-{name}"
    m["metadata"]["creationTimestamp"] = (T0 + timedelta(seconds=created)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return m


POOL = "holmes.dev/pool"


def fake_nodes(n: int, pool: str, first: int) -> list[dict]:
    out = []
    for i in range(first, first + n):
        node = fake_gpu_node(i)
        node["metadata"]["labels"][POOL] = pool
        out.append(node)
    return out


def pool_job(name: str, count: int, created: int, pool: str, layers: int) -> dict:
    return waiting_job(
        name,
        created,
        count=count,
        gpus=8,
        model={
            "layers": layers,
            "hiddenSize": 1024,
            "attentionHeads": 16,
            "seqLength": 2048,
            "vocabSize": 50257,
        },
        training={"globalBatchSize": 16 * count, "microBatchSize": 1, "iterations": 5, "learningRate": 1e-4},
        template={
            "spec": {
                "nodeSelector": {POOL: pool},
                "tolerations": [{"key": "holmes.dev/fake", "operator": "Exists"}],
                "containers": [{"name": child_names.TRAINER_CONTAINER}],
            }
        },
    )
