"""Holmes' plan for a JobSet the user writes (issue 53): opted in by the label
``holmes.dev/plan: enabled``, nothing else of the JobSet changed.

The JobSet's pods are created with the scheduling gate ``holmes.dev/placement`` (the user's
pod template adds it: docs/jobset.md). Once every pod of the JobSet exists, this module decides
from the JobSet, its pods and the cluster's nodes:

- the degrees: ``holmes.dev/pipeline`` P and ``holmes.dev/data`` D (integers or ``auto``), one
  pod per node, P*D pods in all;
- the node of each pod: stage s is node ranks ``[s*D, (s+1)*D)``, every stage's nodes on one
  island (one cluster, one NIC kind), so no data-parallel group crosses NIC kinds; pods take
  node ranks in the JobSet's own order (job-global-index, then the Job's completion index);
- the plan document (ConfigMap ``<jobset>-holmes-plan``, owned by the JobSet): the Layout, and
  each pod's entry keyed by its hostname (what the launcher in the pod reads as HOSTNAME);
- each gated pod's patch: the gate removed and a ``kubernetes.io/hostname`` node selector
  added, all that a gated pod may change.

Without ``holmes.dev/model`` layers per stage are left to the program (the Layout's stages
each hold one placeholder layer and the plan says so). Progress, failure policy and restarts
stay the JobSet's: a restarted JobSet's pods have the same hostnames and find the same plan.

Pure: no client, no clock; the I/O layer (jobset_watch.py) reads and writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from holmes.contract import Layout
from holmes.contract.layout import GroupFamily, Stage

from . import tolerations as taints
from .jobset_kueue import LABEL_REPLICATED_JOB, Admitted
from .render import TORCH_NCCL_ENV
from .routes import NodeNetwork

LABEL_PLAN = "holmes.dev/plan"
PLAN_ENABLED = "enabled"
ANN_PIPELINE = "holmes.dev/pipeline"
ANN_DATA = "holmes.dev/data"
ANN_MODEL = "holmes.dev/model"
ANN_MASTER_PORT = "holmes.dev/master-port"
GATE = "holmes.dev/placement"
# What a gated pod carries (the user's template adds it with the gate): whoever looks at a
# Pending pod while the operator is down reads who ungates it.
ANN_GATED_BY = "holmes.dev/gated-by"
PLAN_SUFFIX = "-holmes-plan"
PLAN_FILE = "plan.json"
LAYOUT_FILE = "layout.json"
# The pod's own entry and the Layout as annotations written with the ungating patch, for a pod
# whose template cannot name the per-JobSet ConfigMap (a TrainJob's ClusterTrainingRuntime is the
# same for every job): a downwardAPI volume of the two shows them as plan.json and layout.json.
ANN_PLAN = "holmes.dev/plan"
ANN_LAYOUT = "holmes.dev/layout"
# What the two may take of the pod's 256 KiB of annotations (the API server's limit); a larger
# Layout is left to the ConfigMap.
MAX_ANNOTATED = 200_000
DEFAULT_MASTER_PORT = 29500
HOSTNAME_LABEL = "kubernetes.io/hostname"
RESOURCE_GPU = "nvidia.com/gpu"

# JobSet v0.12.0's pod labels (api/jobset/v1alpha2/jobset_types.go) and the Job controller's.
JS_NAME = "jobset.sigs.k8s.io/jobset-name"
JS_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JS_RESTART = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

WAITING_FOR_NODES = "WaitingForNodes"
INVALID = "InvalidPlanRequest"
PLANNED = "PlanWritten"
KIND = "Job" + "Set"  # the kind's name, assembled: it is not one of the operator's reasons
API_VERSION = "jobset.x-k8s.io/v1alpha2"


class PlanRefused(ValueError):
    """Why the JobSet gets no plan (yet): ``reason`` WaitingForNodes or InvalidPlanRequest,
    ``message`` naming the field and the fix."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def opted_in(jobset: Mapping[str, Any]) -> bool:
    return (jobset.get("metadata", {}).get("labels") or {}).get(LABEL_PLAN) == PLAN_ENABLED


def plan_name(jobset_name: str) -> str:
    return jobset_name + PLAN_SUFFIX


def gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in pod.get("spec", {}).get("schedulingGates") or [])


@dataclass(frozen=True)
class PodSlot:
    """A pod of the JobSet as the plan sees it."""

    name: str
    hostname: str  # spec.hostname (JobSet sets it), else the pod's name: the container's HOSTNAME
    subdomain: str | None
    order: tuple[int, int]  # (job-global-index, completion index): the JobSet's rank order
    gated: bool
    node_selector: Mapping[str, str]
    replicated_job: str = ""  # its Kueue PodSet
    tolerations: tuple[Mapping[str, Any], ...] = ()


def slot(pod: Mapping[str, Any]) -> PodSlot:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}

    def index(key: str) -> int:
        value = labels.get(key, ann.get(key, "0"))
        try:
            return int(value)
        except ValueError:
            raise PlanRefused(INVALID, f"pod {meta.get('name')}: {key}={value!r} is not an integer") from None

    return PodSlot(
        name=meta.get("name", ""),
        hostname=spec.get("hostname") or meta.get("name", ""),
        subdomain=spec.get("subdomain"),
        order=(index(JS_GLOBAL_INDEX), index(COMPLETION_INDEX)),
        gated=gated(pod),
        node_selector=dict(spec.get("nodeSelector") or {}),
        replicated_job=str(labels.get(LABEL_REPLICATED_JOB, "")),
        tolerations=tuple(spec.get("tolerations") or ()),
    )


def expected_pods(jobset: Mapping[str, Any]) -> int:
    """Pods the JobSet makes: over its replicatedJobs, replicas x the Job's parallelism."""
    total = 0
    for rj in jobset.get("spec", {}).get("replicatedJobs") or []:
        jspec = (rj.get("template") or {}).get("spec") or {}
        par = jspec.get("parallelism", 1)
        comp = jspec.get("completions")
        total += int(rj.get("replicas", 1)) * int(min(par, comp) if comp is not None else par)
    return total


def all_pods_exist(jobset: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> bool:
    """Planning waits (silently: JobSet is still creating them) until every pod exists."""
    return len(pods) == expected_pods(jobset)


def _degree(ann: Mapping[str, str], key: str) -> int | None:
    raw = str(ann.get(key, "auto")).strip()
    if raw == "auto":
        return None
    if raw.isdigit() and int(raw) >= 1:
        return int(raw)
    raise PlanRefused(INVALID, f"metadata.annotations[{key}]={raw!r}: give a positive integer or auto")


def model_layers(ann: Mapping[str, str]) -> int | None:
    """The model's layer count from ``holmes.dev/model`` (JSON of HolmesJob spec.model)."""
    raw = ann.get(ANN_MODEL)
    if raw is None:
        return None
    try:
        model = json.loads(raw)
        layers = model["layers"]
    except (ValueError, TypeError, KeyError):
        raise PlanRefused(
            INVALID,
            f"metadata.annotations[{ANN_MODEL}] must be JSON with the model's fields, at least "
            '"layers" (e.g. {"layers": 32, "hiddenSize": 4096}); remove it to leave layers to the program',
        ) from None
    if not isinstance(layers, int) or layers < 1:
        raise PlanRefused(
            INVALID, f"metadata.annotations[{ANN_MODEL}].layers={layers!r}: give a positive integer"
        )
    return layers


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """Processes per pod: the most GPUs a container of the pod asks for, else 1 (CPU)."""
    most = 0
    for c in pod.get("spec", {}).get("containers") or []:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            v = (res.get(part) or {}).get(RESOURCE_GPU)
            if v is not None:
                most = max(most, int(str(v)))
    return most or 1


@dataclass(frozen=True)
class Island:
    name: str  # "<cluster>/<nic>"
    nic: str
    nodes: tuple[str, ...]  # node names, sorted

    @property
    def rdma(self) -> bool:
        return self.nic in ("infiniband", "roce")


def islands(
    nodes: Sequence[Mapping[str, Any]],
    network: Callable[[Mapping], NodeNetwork],
    keep: Callable[[Mapping], bool],
) -> list[Island]:
    """The nodes ``keep`` keeps (a pod of the JobSet may go there), grouped by cluster and NIC
    kind; largest island first."""
    by: dict[str, list[str]] = {}
    kinds: dict[str, str] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        if not keep(node):
            continue
        net = network(node)
        name = f"{net.cluster}/{net.nic}"
        by.setdefault(name, []).append(meta["name"])
        kinds[name] = net.nic
    found = [Island(n, kinds[n], tuple(sorted(ns))) for n, ns in by.items()]
    return sorted(found, key=lambda i: (-len(i.nodes), i.name))


def fit(
    P: int, D: int, isl: Sequence[Island], allowed: Sequence[frozenset[str]] | None = None
) -> list[tuple[Island, tuple[str, ...]]] | None:
    """P stages of D nodes, each stage inside one island (consecutive stages on the same
    island where they fit, so stage boundaries stay on RDMA); None when they do not fit.
    ``allowed``: per pod in rank order, the nodes it may go to (its node selector, taints it
    tolerates, Kueue's admission); pod r takes the stage's r-th node."""
    out: list[tuple[Island, tuple[str, ...]]] = []
    used: set[str] = set()
    for s in range(P):
        for i in isl:  # the first island with room: the previous stage's until it is full
            pick: list[str] = []
            for r in range(s * D, (s + 1) * D):
                ok = allowed[r] if allowed is not None else None
                n = next(
                    (n for n in i.nodes if n not in used and n not in pick and (ok is None or n in ok)), None
                )
                if n is None:
                    break
                pick.append(n)
            if len(pick) == D:
                out.append((i, tuple(pick)))
                used.update(pick)
                break
        else:
            return None
    return out


def degrees(
    ann: Mapping[str, str], pods: int, isl: Sequence[Island], allowed: Sequence[frozenset[str]] | None = None
) -> tuple[int, int]:
    """(P, D) from the annotations and the pod count; ``auto`` takes the widest data degree
    whose stages each fit on one island."""
    P, D = _degree(ann, ANN_PIPELINE), _degree(ann, ANN_DATA)
    if P is not None and D is not None:
        if P * D != pods:
            raise PlanRefused(
                INVALID,
                f"{ANN_PIPELINE}={P} x {ANN_DATA}={D} is {P * D} but the JobSet makes {pods} pods (one per "
                f"node): make the product {pods}, or set one of them to auto",
            )
        return P, D
    fixed, key = (P, ANN_PIPELINE) if P is not None else (D, ANN_DATA)
    if fixed is not None:
        if pods % fixed:
            raise PlanRefused(
                INVALID,
                f"{key}={fixed} does not divide the JobSet's {pods} pods: give a divisor of {pods} or auto",
            )
        return (fixed, pods // fixed) if P is not None else (pods // fixed, fixed)
    for d in sorted((d for d in range(1, pods + 1) if pods % d == 0), reverse=True):
        if fit(pods // d, d, isl, allowed) is not None:
            return pods // d, d
    return pods, 1  # fit() below says why it cannot be placed


def layer_ranges(P: int, layers: int | None) -> list[tuple[int, int]]:
    """Each stage's half-open layer range: the model's layers split evenly (the first stages
    one more when uneven), or one placeholder layer per stage when the model is not given."""
    if layers is None:
        return [(s, s + 1) for s in range(P)]
    if layers < P:
        raise PlanRefused(
            INVALID, f"{ANN_MODEL}.layers={layers} is fewer than {P} pipeline stages: lower {ANN_PIPELINE}"
        )
    base, extra = divmod(layers, P)
    out, start = [], 0
    for s in range(P):
        n = base + (1 if s < extra else 0)
        out.append((start, start + n))
        start += n
    return out


def layout(
    P: int, D: int, gpus: int, stages: Sequence[tuple[Island, tuple[str, ...]]], layers: int | None
) -> Layout:
    """The Layout in the contract's fields: tensor = the pod's processes (inside one node),
    data D, pipeline P; a group is on IB only when all its nodes share one RDMA island."""

    def net(*isl: Island) -> str:
        return "IB" if len({i.name for i in isl}) == 1 and isl[0].rdma else "Socket"

    ranges = layer_ranges(P, layers)
    st = tuple(
        Stage(index=s, layers=ranges[s], island=i.name, nic=i.nic, dp_net=net(i), nodes=ns)
        for s, (i, ns) in enumerate(stages)
    )
    used = [i for i, _ in stages]
    groups = [GroupFamily("dp", net(i), s) for s, i in enumerate(used)]
    groups += [GroupFamily("tp", net(i), s) for s, i in enumerate(used)]
    groups.append(GroupFamily("pp", net(*used)))
    groups += [GroupFamily("p2p", net(used[b], used[b + 1]), b) for b in range(P - 1)]
    note = (
        f"{ANN_MODEL} not given: layers per stage are left to the program (one placeholder layer per stage)"
        if layers is None
        else f"{layers} layers split evenly over {P} stages"
    )
    return Layout(
        tensor=gpus,
        pipeline=P,
        data=D,
        gpus_per_node=gpus,
        nodes=tuple(n for _, ns in stages for n in ns),
        stages=st,
        groups=tuple(groups),
        micro_batch_size=1,
        micro_batches=1,
        explanation=(note,),
        world_net=net(*used),
    )


@dataclass(frozen=True)
class Plan:
    layout: Layout
    entries: dict[str, dict[str, Any]]  # by pod hostname
    master_addr: str
    master_port: int
    layers_left_to_program: bool

    def document(self) -> dict[str, Any]:
        return {
            "pipeline": self.layout.pipeline,
            "data": self.layout.data,
            "nprocPerNode": self.layout.gpus_per_node,
            "nnodes": len(self.layout.nodes),
            "masterAddr": self.master_addr,
            "masterPort": self.master_port,
            "layersPerStage": None
            if self.layers_left_to_program
            else [b - a for a, b in (s.layers for s in self.layout.stages)],
            "note": self.layout.explanation[0],
            "pods": self.entries,
        }

    def node_of(self, hostname: str) -> str:
        return str(self.entries[hostname]["node"])


def make_plan(
    jobset: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    network: Callable[[Mapping], NodeNetwork],
    unusable: Callable[[Mapping], str],
    admitted: Admitted | None = None,
) -> Plan:
    """The plan for the JobSet once all its pods exist, or PlanRefused naming the fix.
    ``admitted``: Kueue's admission of a queued JobSet (jobset_kueue.admission): each pod only
    on nodes its PodSet was admitted to."""
    meta = jobset.get("metadata") or {}
    ann = meta.get("annotations") or {}
    want = expected_pods(jobset)
    slots = sorted((slot(p) for p in pods), key=lambda s: s.order)
    if len(slots) != want:
        raise PlanRefused(INVALID, f"{len(slots)} of the JobSet's {want} pods exist: waiting for the rest")
    if len({s.order for s in slots}) != len(slots):
        raise PlanRefused(INVALID, "two pods share a job-global-index and completion index: use Indexed Jobs")
    for s in slots:
        # Kueue's topology ungater writes the hostname of a domain it picked (TAS): Holmes
        # plans inside it; anyone else's pin leaves Holmes nothing to pick
        pin = s.node_selector.get(HOSTNAME_LABEL)
        if pin is not None and not (admitted is not None and admitted.topology):
            raise PlanRefused(
                INVALID,
                f"pod {s.name} already selects node {pin} ({HOSTNAME_LABEL}): Holmes picks the node; "
                "remove it from the template",
            )
    allowed, left_out = allowed_nodes(slots, nodes, unusable, admitted)
    every = frozenset().union(*allowed)
    isl = islands(nodes, network, lambda n: n["metadata"]["name"] in every)
    by_name = {n["metadata"]["name"]: n for n in nodes}
    P, D = degrees(ann, len(slots), isl, allowed)
    layers = model_layers(ann)
    stages = fit(P, D, isl, allowed)
    if stages is None:
        sizes = ", ".join(f"{i.name}: {len(i.nodes)}" for i in isl) or "none"
        where = f" inside Kueue's admission (Workload {admitted.workload})" if admitted else ""
        raise PlanRefused(
            WAITING_FOR_NODES,
            f"{P} stages of {D} nodes each need islands of {D} usable nodes for every stage{where}; the "
            f"islands have {sizes}{left_out}: add nodes, or lower {ANN_DATA} (or set it to auto)",
        )
    port_raw = str(ann.get(ANN_MASTER_PORT, DEFAULT_MASTER_PORT))
    if not port_raw.isdigit() or not 0 < int(port_raw) < 65536:
        raise PlanRefused(
            INVALID, f"metadata.annotations[{ANN_MASTER_PORT}]={port_raw!r}: give a port number"
        )
    first = slots[0]
    if not first.subdomain:
        raise PlanRefused(
            INVALID,
            f"pod {first.name} has no subdomain, so rank 0 has no DNS name the others can reach: leave "
            "spec.network.enableDNSHostnames at its default (true)",
        )
    namespace = meta.get("namespace", "default")
    gpus = {pod_gpus(p) for p in pods}
    if len(gpus) > 1:
        raise PlanRefused(
            INVALID,
            f"the pods ask for {sorted(gpus)} {RESOURCE_GPU}: torchrun runs one process count on every "
            "node; give every replicatedJob's container the same GPU limit",
        )
    lay = layout(P, D, gpus.pop(), stages, layers)
    entries: dict[str, dict[str, Any]] = {}
    for rank, s in enumerate(slots):
        stage = rank // D
        entries[s.hostname] = {
            "nodeRank": rank,
            "node": lay.nodes[rank],
            "stage": stage,
            "island": lay.stages[stage].island,
            "nic": lay.stages[stage].nic,
            "env": node_env(network(by_name[lay.nodes[rank]])),
        }
    return Plan(
        layout=lay,
        entries=entries,
        master_addr=f"{first.hostname}.{first.subdomain}.{namespace}.svc",
        master_port=int(port_raw),
        layers_left_to_program=layers is None,
    )


def allowed_nodes(
    slots: Sequence[PodSlot],
    nodes: Sequence[Mapping[str, Any]],
    unusable: Callable[[Mapping], str],
    admitted: Admitted | None,
) -> tuple[list[frozenset[str]], str]:
    """Per pod, the usable nodes it may go to: its own node selector holds there, and its
    tolerations (with, under Kueue, its admitted flavor's) tolerate the node's taints, as the
    scheduler would judge; under Kueue only nodes of its PodSet's admission. And a note naming
    the nodes left out for a taint alone ('' when none)."""
    out: list[frozenset[str]] = []
    tainted: dict[str, str] = {}
    for s in slots:
        ok = set()
        for node in nodes:
            name = node["metadata"]["name"]
            labels = node["metadata"].get("labels") or {}
            if unusable(node) or any(labels.get(k) != v for k, v in s.node_selector.items()):
                continue
            if admitted is not None:
                if admitted.allows(s.replicated_job, node, s.tolerations):
                    ok.add(name)
                continue
            taint = taints.untolerated(node, s.tolerations)
            if taint:
                tainted[name] = f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
                continue
            ok.add(name)
        out.append(frozenset(ok))
    shown = [f"{n} ({t})" for n, t in sorted(tainted.items()) if not any(n in a for a in out)]
    note = f" (left out, a taint the pods do not tolerate: {', '.join(shown)})" if shown else ""
    return out, note


def node_env(net: NodeNetwork) -> dict[str, str]:
    """The per-node env the launcher adds where the pod does not set it: the node's NCCL env
    without NCCL_NET (each group's net is the hook's), HOLMES_NIC, torch's NCCL watchdog as
    every Holmes pod gets it (a dead peer ends the pod; the JobSet's failure policy takes over)."""
    env = {k: v for k, v in net.env.items() if k != "NCCL_NET"}
    env.update(TORCH_NCCL_ENV)
    env["HOLMES_NIC"] = net.nic
    return env


def configmap(jobset: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """The plan's ConfigMap, owned by the JobSet (deleted with it)."""
    meta = jobset["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": plan_name(meta["name"]),
            "namespace": meta.get("namespace", "default"),
            "labels": {LABEL_PLAN: PLAN_ENABLED, JS_NAME: meta["name"]},
            "ownerReferences": [
                {
                    "apiVersion": jobset.get("apiVersion", API_VERSION),
                    "kind": KIND,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": False,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "data": {
            PLAN_FILE: json.dumps(plan.document(), indent=1, sort_keys=True),
            LAYOUT_FILE: plan.layout.to_json(indent=1),
        },
    }


def read_plan(cm: Mapping[str, Any]) -> dict[str, Any]:
    """The plan document a ConfigMap holds (written by configmap())."""
    return dict(json.loads((cm.get("data") or {})[PLAN_FILE]))


def pod_annotations(doc: Mapping[str, Any], host: str, layout_json: str) -> dict[str, str]:
    """The plan as the pod with ``host`` reads it from a downwardAPI volume: plan.json with its
    own entry only, and the Layout, compact; {} when they would not fit (MAX_ANNOTATED)."""
    own = json.dumps({**doc, "pods": {host: doc["pods"][host]}}, separators=(",", ":"), sort_keys=True)
    layout = json.dumps(json.loads(layout_json), separators=(",", ":"), sort_keys=True)
    if len(own) + len(layout) > MAX_ANNOTATED:
        return {}
    return {ANN_PLAN: own, ANN_LAYOUT: layout}


def ungate_patch(
    pod: Mapping[str, Any], node_label: str, annotations: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The pod's JSON patch: ``annotations`` added (pod_annotations), the gate removed, its node
    selected by hostname label (a gated pod may only gain node selectors and affinity terms).
    The resourceVersion test makes a patch of a pod changed meanwhile fail (409) instead of
    undoing the change; JSON patch, not a strategic merge, whose list merge by name would keep
    the gate."""
    notes: list[dict[str, Any]] = []
    if annotations:
        if (pod.get("metadata") or {}).get("annotations"):
            notes = [
                {"op": "add", "path": "/metadata/annotations/" + _pointer(k), "value": v}
                for k, v in sorted(annotations.items())
            ]
        else:
            notes = [{"op": "add", "path": "/metadata/annotations", "value": dict(annotations)}]
    spec = pod.get("spec") or {}
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != GATE]
    selector = spec.get("nodeSelector")
    pin = (
        {
            "op": "add",
            "path": "/spec/nodeSelector/" + _pointer(HOSTNAME_LABEL),
            "value": node_label,
        }
        if selector
        else {"op": "add", "path": "/spec/nodeSelector", "value": {HOSTNAME_LABEL: node_label}}
    )
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": pod["metadata"]["resourceVersion"]},
        *notes,
        pin,
        {"op": "replace", "path": "/spec/schedulingGates", "value": gates}
        if gates
        else {"op": "remove", "path": "/spec/schedulingGates"},
    ]


def _pointer(key: str) -> str:
    """A map key as a JSON pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def node_label(nodes: Sequence[Mapping[str, Any]], name: str) -> str:
    """A node's kubernetes.io/hostname label (what the selector matches), its name without one."""
    for n in nodes:
        if n["metadata"]["name"] == name:
            return str((n["metadata"].get("labels") or {}).get(HOSTNAME_LABEL, name))
    return name


def plan_matches(
    doc: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    usable: set[str],
    nodes: Sequence[Mapping[str, Any]] = (),
) -> bool:
    """An existing plan still serves these pods: it names every pod's hostname, its nodes are
    still usable (a JobSet restart's new pods keep their hostnames and the plan), and each pod's
    own node selector holds on its planned node (``nodes`` given: a JobSet Kueue admitted again
    to another flavor or domain has pods whose new selectors the old plan may not meet)."""
    entries = doc.get("pods") or {}
    hosts = {slot(p).hostname for p in pods}
    if hosts != set(entries) or not all(e["node"] in usable for e in entries.values()):
        return False
    labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in nodes}
    for p in pods if nodes else ():
        s = slot(p)
        on = labels.get(entries[s.hostname]["node"], {})
        if any(on.get(k) != v for k, v in s.node_selector.items()):
            return False
    return True
