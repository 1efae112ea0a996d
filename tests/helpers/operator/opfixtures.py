"""Objects shared by the operator's pure tests: the default topology's nodes as the API would
return them, small HolmesJob manifests, and a pure 'cluster' that applies Decisions to dicts."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from pathlib import Path

from holmes.contract.documents import load_documents
from holmes.contract.names import API_VERSION, KIND
from holmes.operator import placement_facts
from holmes.operator.core import child_names, members
from holmes.operator.core.capacity import Workloads
from holmes.operator.core.reconcile import ChildRefusal, Observed, RestartBackoff, decide
from holmes.operator.core.render import RenderSettings

REPO = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def default_nodes(ready: bool = True) -> list[dict]:
    """The local cluster's default nodes as the API returns them (examples/nodes/default.yaml)."""
    out = load_documents(str(REPO / "examples" / "nodes" / "default.yaml"))[0]["items"]
    for obj in out:
        obj["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    return out


LINK_LAYER = {
    "infiniband": "InfiniBand",
    "roce": "Ethernet",
}  # what /sys/class/infiniband/*/ports/*/link_layer says


def with_link_layers(nodes: list[dict]) -> list[dict]:
    """Label the NFD-advertised nodes with their link layer, as the Holmes NIC labeller would:
    NFD alone says "RDMA" but not InfiniBand or RoCE, and the planner never guesses."""
    for n in nodes:
        labels = n["metadata"]["labels"]
        if labels.get("feature.node.kubernetes.io/rdma.capable") == "true":
            labels["holmes.dev/link-layer"] = LINK_LAYER[
                n["metadata"]["annotations"]["localkube.holmes.dev/true-nic"]
            ]
    return nodes


def true_nic(nodes: list[dict]) -> dict[str, str]:
    return {
        n["metadata"]["name"]: n["metadata"]["annotations"]["localkube.holmes.dev/true-nic"] for n in nodes
    }


def manifest(name: str = "tiny", count: int = 4, gpus: int = 1, **spec_overrides) -> dict:
    spec = {
        "model": {"layers": 4, "hiddenSize": 64, "attentionHeads": 4, "seqLength": 32, "vocabSize": 128},
        "training": {"globalBatchSize": 8, "microBatchSize": 1, "iterations": 5, "learningRate": 1.0e-3},
        "nodes": {"count": count, "gpusPerNode": gpus},
        "runPolicy": {"backoffLimit": 2, "suspend": False},
    }
    for k, v in spec_overrides.items():
        spec[k] = v
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": "ns", "uid": "uid-1", "generation": 1},
        "spec": spec,
    }


class FakeWorld:
    """The API objects of one job as plain dicts; applies Decisions like the API server would
    (create is a no-op when the name exists). Lets tests drive the state machine step by step."""

    def __init__(
        self, job: dict, nodes: list[dict] | None = None, backoff: RestartBackoff = RestartBackoff(0)
    ):
        self.job = copy.deepcopy(job)
        self.nodes = nodes if nodes is not None else default_nodes()
        self.pods: dict[str, dict] = {}
        self.configmap: dict | None = None
        self.service: dict | None = None
        self.now = T0
        self.events: list = []
        self.deleted_job = False
        self.cost_model = placement_facts.builtin_cost_model()
        self.workloads = Workloads  # what the other workloads hold (test_capacity's SharedWorld)
        self.settings = RenderSettings()
        self.backoff = backoff  # none unless a test is about it: restarts relaunch at once
        self.refuse = None  # pod -> ChildRefusal | None: what an admission step would refuse
        self.namespace_labels: dict | None = None  # the job's namespace's labels
        # shared clusters: the Kueue Workload, ResourceFlavors (None: Kueue not installed),
        # PriorityClasses, the Volcano PodGroup
        self.workload: dict | None = None
        self.flavors: dict | None = None
        self.queue_topology: str | None = None  # the Topology of the job's ClusterQueue's flavor
        self.priority_classes: dict | None = None
        self.workload_priority_classes: dict | None = None
        self.podgroup: dict | None = None
        self.volcano = True  # the API server serves PodGroups
        self.compute_domains = False  # ... and NVIDIA's ComputeDomains
        self.made_compute_domains: dict[str, dict] = {}  # the ComputeDomains created, by name
        # member clusters (members.py): name -> MemberState; None: a single-cluster job
        self.members: dict | None = None
        self.quotas: list | None = None  # the namespace's ResourceQuotas (quota.py)

    def step(self, seconds: float = 1.0, progress: dict | None = None, refused: list | None = None):
        self.now += timedelta(seconds=seconds)
        obs = Observed(
            job=copy.deepcopy(self.job),
            pods=[copy.deepcopy(p) for p in self.pods.values()],
            configmap=copy.deepcopy(self.configmap),
            service=self.service,
            nodes=self.nodes,
            now=self.now,
            progress=progress,
            refused=refused or [],
            workload=copy.deepcopy(self.workload),
            flavors=self.flavors,
            queue_topology=self.queue_topology,
            priority_classes=self.priority_classes,
            workload_priority_classes=self.workload_priority_classes,
            podgroup=copy.deepcopy(self.podgroup),
            volcano=self.volcano,
            compute_domains=self.compute_domains,
            members=self.members,
            quotas=copy.deepcopy(self.quotas),
            namespace_labels=self.namespace_labels,
        )
        facts = placement_facts.gather(self.cost_model, self.workloads())
        d = decide(obs, facts, self.settings, self.backoff)
        if d.delete_workload:
            self.workload = None
        if d.workload is not None and self.workload is None:
            self.workload = copy.deepcopy(d.workload)
            self.workload["metadata"]["ownerReferences"] = [{"uid": self.job["metadata"]["uid"]}]
        if d.adopt_workload is not None and self.workload is not None:  # a metadata merge patch
            meta = self.workload["metadata"]
            patch = d.adopt_workload["metadata"]
            meta["ownerReferences"] = copy.deepcopy(patch["ownerReferences"])
            meta["labels"] = {**(meta.get("labels") or {}), **patch["labels"]}
        if d.workload_status is not None and self.workload is not None:  # a merge patch
            status = self.workload.setdefault("status", {})
            for k, v in d.workload_status.items():
                if v is None:
                    status.pop(k, None)
                else:
                    status[k] = v
        if d.podgroup is not None:  # created, else its spec patched (Volcano owns the status)
            if self.podgroup is None:
                self.podgroup = copy.deepcopy(d.podgroup)
            else:
                self.podgroup["spec"] = copy.deepcopy(d.podgroup["spec"])
        for name in d.delete_pods:
            self.pods.pop(name, None)
        if d.configmap is not None:
            self.configmap = d.configmap
        if d.service is not None and self.service is None:
            self.service = d.service
        for cd in d.compute_domains:
            self.made_compute_domains.setdefault(cd["metadata"]["name"], cd)
        refusals: list[ChildRefusal] = []
        for p in d.create_pods:
            no = self.refuse(p) if self.refuse else None
            if no is not None:
                refusals.append(no)
            elif self.members is not None:  # in its node's member, owned through the annotation
                node = p["metadata"]["annotations"][child_names.ANN_NODE]
                where = {n["metadata"]["name"]: members.member_of(n) for n in self.nodes}
                pod = members.tag(p, where[node], self.job["metadata"]["uid"])
                self.pods.setdefault(p["metadata"]["name"], pod)
            else:  # owned by this job object, as kopf.adopt makes it
                pod = copy.deepcopy(p)
                ref = {
                    "kind": KIND,
                    "name": self.job["metadata"]["name"],
                    "uid": self.job["metadata"]["uid"],
                }
                pod["metadata"]["ownerReferences"] = [dict(ref, controller=True)]
                self.pods.setdefault(p["metadata"]["name"], pod)
        self.job["status"] = d.status
        self.events += d.events
        self.deleted_job = self.deleted_job or d.delete_job
        if refusals:  # as the operator's runtime does: decide again at once with them
            return self.step(0.0, refused=refusals)
        return d

    # ---- what the kubelet/scheduler would do ---------------------------------------------
    def volcano_sets(self, phase: str) -> None:
        """Volcano's scheduler writes the PodGroup's phase (queueing.py: what each means)."""
        self.podgroup.setdefault("status", {})["phase"] = phase

    def set_phase(self, phase: str, *names_: str, exit_code: int = 1) -> None:
        for n in names_ or list(self.pods):
            st = self.pods[n].setdefault("status", {})
            st["phase"] = phase
            if phase == "Failed":
                st["containerStatuses"] = [
                    {"name": "trainer", "state": {"terminated": {"exitCode": exit_code, "reason": "Error"}}}
                ]

    def edit_spec(self, **changes) -> None:
        self.job["spec"].update(changes)
        self.job["metadata"]["generation"] += 1

    @property
    def status(self) -> dict:
        return self.job.get("status") or {}

    def condition(self, type_: str) -> dict:
        return next(c for c in self.status["conditions"] if c["type"] == type_)

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


def refusing_api():
    """A kubernetes client for an API server that refuses connections (nothing listens there)."""
    from holmes_dev.ports import free_port
    from kubernetes import client

    conf = client.Configuration(host=f"https://127.0.0.1:{free_port()}")
    conf.verify_ssl = False
    return client.ApiClient(conf)
