"""Shared clusters: what a job may plan on, given what every other pod holds, and the queue of
jobs waiting for capacity. Pure (no I/O): the runtime (pipeline.py) gathers pods, launched
layouts and jobs from its caches before deciding (``Workloads``), and places each job under one
lock against this view.

- ``PodShape``: what one pod of a job asks for (every resource, its route's RDMA devices and a
  pod slot: ``needs``) and where it may go (nodeSelector, required node affinity, tolerations).
- ``Ledger``: per node, what pods hold (``held``: GPUs count the same whether a pod asked for
  them as the device plugin's resource or through a DRA claim): every pod that has not ended,
  counted on its node (``spec.nodeName``, else ``status.nominatedNodeName``, else for Holmes'
  own pods the node its layout pinned it to), plus the ranks of launched Holmes attempts whose
  pods are not created yet (their ConfigMap's layout names the nodes), plus the GPUs allocated
  DRA ResourceClaims hold, whoever's they are (core.device_claims; a pod a claim is reserved
  for counts its GPUs through the claim, not twice). Rebuilt from the API's objects at every
  plan, so an operator restart loses nothing.
- Placement on that view (placement.on_free_capacity): a job first plans on the nodes that
  could ever run its pods (taints, selectors, affinity, resources): when that fails it waits for
  nodes (``InsufficientNodes``). Then the jobs ahead of it in the queue take their share (a job
  ahead that fits takes its plan's GPUs; one that does not fit holds every free node it could
  use, so nothing behind it takes what it waits for) and it plans on what is left; when that
  fails it waits for capacity (``WaitingForCapacity``, a message saying what it needs and what
  is free).
- Queue order: ``priority`` (runPolicy.priority, else the value of runPolicy.priorityClassName's
  PriorityClass, else 0; higher first); within one priority, namespaces take turns: a job's
  turn is the number of turns its namespace has taken (its launched jobs, and its jobs that ended
  since the oldest waiting job was created) plus its place among its namespace's waiting jobs
  of that priority, lower first (fifty jobs from one team do not starve another team's one,
  whether they run side by side or one after another); then creation time, then
  namespace/name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from holmes.contract import JobSpec, Layout, LayoutError, SpecError, load_job
from holmes.contract.names import LABEL_KUEUE_QUEUE, RESOURCE_GPU
from holmes.plan import InsufficientNodes
from holmes.plan.discovery import GPUS_TAKEN_KEY
from holmes.plan.quantity import quantity_or_none as quantity  # None where a value is no quantity

from . import child_names, managed_by, node_selection
from .device_claims import ClaimHold, reserved_pods
from .tolerations import flavor_choice, untolerated

CPU, MEMORY, PODS = "cpu", "memory", "pods"
ENDED = ("Succeeded", "Failed")


class WaitingForCapacity(InsufficientNodes):
    """The job could run on these nodes, but other pods (or jobs ahead in the queue) hold them."""

    reason = "WaitingForCapacity"


# ---- quantities (read by holmes.plan.quantity, the operator side's one parser) ------------------


def show(resource: str, amount: float) -> str:
    if resource in (MEMORY, "ephemeral-storage") or resource.startswith("hugepages-"):  # bytes
        for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if amount >= size:
                return f"{amount / size:.4g}{unit}"
        return f"{amount:.0f}"
    if resource == CPU and amount != int(amount):
        return f"{amount * 1000:.0f}m"
    return f"{amount:g}"


def _map(v: object) -> Mapping:
    """A field of an unvalidated object read as a mapping: empty where it is anything else."""
    return v if isinstance(v, Mapping) else {}


def _container_requests(c: Mapping) -> dict[str, float]:
    """A container's requests; a limit alone is its request too (as the API server defaults it)."""
    res = _map(c.get("resources"))
    out: dict[str, float] = {}
    for part in ("limits", "requests"):  # requests win
        for k, v in _map(res.get(part)).items():
            q = quantity(v)
            if q is not None:
                out[k] = q
    return out


def pod_requests(pod_spec: Mapping) -> dict[str, float]:
    """What a pod holds on its node: the containers' requests summed, at least each init
    container's (as the scheduler counts them)."""
    total: dict[str, float] = {}
    for c in pod_spec.get("containers") or []:
        if isinstance(c, Mapping):
            for k, v in _container_requests(c).items():
                total[k] = total.get(k, 0.0) + v
    for c in pod_spec.get("initContainers") or []:
        if isinstance(c, Mapping):
            for k, v in _container_requests(c).items():
                total[k] = max(total.get(k, 0.0), v)
    return total


# ---- a job's pods ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PodShape:
    requests: Mapping[str, float]
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity_terms: tuple = ()  # required nodeSelectorTerms (any one must match)
    tolerations: tuple = ()
    # Kueue's admitted flavors: a node must carry every label of one of them (queueing.flavor_node_labels)
    flavor_labels: tuple[Mapping[str, str], ...] = ()
    # each flavor_labels' tolerations, which Kueue's job framework appends to the pods' own
    flavor_tolerations: tuple[tuple[Mapping, ...], ...] = ()
    gpu_resource: str = RESOURCE_GPU  # the name its GPUs are requested by

    def describe(self) -> str:
        parts = [f"{show(k, v)} {k}" for k, v in sorted(self.requests.items()) if v]
        return ", ".join(parts) or "nothing"

    def needs(self, extra: Mapping[str, float] | None = None) -> dict[str, float]:
        """What one pod takes from its node: every resource it requests, its route's (``extra``:
        RDMA devices, VFs; the template's win), a pod slot. GPUs are discovery's (plugin or DRA)."""
        out = {k: v for k, v in {**(extra or {}), **self.requests}.items() if v and k != self.gpu_resource}
        out[PODS] = 1.0
        return out


def pod_shape(spec: JobSpec, gpu_resource: str = RESOURCE_GPU) -> PodShape:
    """One pod of the job: the template's requests plus gpusPerNode GPUs, and its placement rules."""
    tspec = _map((spec.template or {}).get("spec"))
    containers = [c for c in tspec.get("containers") or [] if isinstance(c, Mapping)]
    if not containers:
        containers = [{"name": child_names.TRAINER_CONTAINER}]
    idx = next((i for i, c in enumerate(containers) if c.get("name") == child_names.TRAINER_CONTAINER), 0)
    req = pod_requests({**tspec, "containers": containers})
    own = _container_requests(containers[idx])
    # the trainer container gets gpusPerNode GPUs unless its template says otherwise (render.py)
    if gpu_resource not in own:
        req[gpu_resource] = req.get(gpu_resource, 0.0) + spec.nodes.gpus_per_node
    na = _map(_map(tspec.get("affinity")).get("nodeAffinity"))
    required = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = tuple((required or {}).get("nodeSelectorTerms") or ()) if isinstance(required, Mapping) else ()
    sel = _map(tspec.get("nodeSelector"))
    tol = tuple(t for t in tspec.get("tolerations") or () if isinstance(t, Mapping))
    return PodShape(req, dict(sel), terms, tol, gpu_resource=gpu_resource)


def _expression_matches(expr: Mapping, labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), list(expr.get("values") or [])
    have = labels.get(key) if isinstance(key, str) else None  # labels' keys are strings
    if op == "In":
        return have is not None and have in values
    if op == "NotIn":
        return have is None or have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and values:
        try:
            a, b = int(have), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _term_matches(term: Mapping, node: Mapping) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    name = (node.get("metadata") or {}).get("name")
    fields = {"metadata.name": name} if isinstance(name, str) else {}
    exprs = list(term.get("matchExpressions") or [])
    fexprs = list(term.get("matchFields") or [])
    if not exprs and not fexprs:
        return False  # an empty term matches nothing (as the scheduler reads it)
    return all(_expression_matches(e, labels) for e in exprs) and all(
        _expression_matches(e, fields) for e in fexprs
    )


def placement_problem(node: Mapping, shape: PodShape, extra: Mapping[str, float] | None = None) -> str:
    """Why the job's pods can never go to this node, whatever runs there ('' if they can): the
    template's rules, or what a pod needs (``PodShape.needs``; ``extra``: its route's there)
    beyond the allocatable. Reads only what discovery.kept_key covers (node_selection.PROBLEMS)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    for k, v in shape.node_selector.items():
        if labels.get(k) != v:
            return f"template nodeSelector {k}={v} does not match"
    flavors = shape.flavor_labels
    if flavors and not any(all(labels.get(k) == v for k, v in c.items()) for c in flavors):
        shown = " or ".join(",".join(f"{k}={v}" for k, v in sorted(c.items())) for c in shape.flavor_labels)
        return f"not in the flavors Kueue admitted the job to ({shown})"
    if shape.affinity_terms and not any(_term_matches(t, node) for t in shape.affinity_terms):
        return "the template's required node affinity does not match"
    if flavor_choice(node, shape.tolerations, shape.flavor_labels, shape.flavor_tolerations) is None:
        taint = untolerated(node, shape.tolerations)
        value = f"={taint['value']}" if taint.get("value") else ""
        by = "the template" + (" nor by the admitted flavors' tolerations" if flavors else "")
        return f"taint {taint.get('key')}{value}:{taint.get('effect')} is not tolerated by {by}"
    alloc = (node.get("status") or {}).get("allocatable") or {}
    for res, want in sorted(shape.needs(extra).items()):
        have = quantity(alloc.get(res))
        if have is None:
            if res in (CPU, MEMORY, PODS):
                continue  # a node object that does not say: not judged
            return f"the node has no {res} (allocatable), which a pod requests ({show(res, want)})"
        if have < want:
            return f"allocatable {res} {show(res, have)} is less than the {show(res, want)} a pod requests"
    return ""


# ---- what pods hold ---------------------------------------------------------------------------


def pod_node(pod: Mapping) -> str | None:
    """The node a pod holds resources on: bound, nominated (preemption), or pinned by Holmes."""
    spec, st = pod.get("spec") or {}, pod.get("status") or {}
    meta = pod.get("metadata") or {}
    return (
        spec.get("nodeName")
        or st.get("nominatedNodeName")
        or ((meta.get("annotations") or {}).get(child_names.ANN_NODE) if _is_holmes(meta) else None)
        or None
    )


def _is_holmes(meta: Mapping) -> bool:
    labels = meta.get("labels") or {}
    return (
        labels.get(child_names.LABEL_MANAGED_BY) == child_names.MANAGED_BY and child_names.LABEL_JOB in labels
    )


def held(pod: Mapping, gpu_resource: str = RESOURCE_GPU, claim_allocated: bool = False) -> dict[str, float]:
    """What a pod (full or slim) holds on its node: its requests, with the GPUs of its DRA claim
    counted as ``gpu_resource`` too while that claim is not allocated (``claim_allocated``: the
    claim's allocation counts them, Ledger.of). A Holmes pod on DRA GPUs has no GPU limit (its
    claim holds them); render.py notes their number on it (``ANN_CLAIM_GPUS``) so the ledger
    counts GPUs the same way whichever route asked for them (as ``pod_shape`` does for ranks
    not created yet)."""
    spec = pod.get("spec") or {}
    out = dict(spec["requests"] if isinstance(spec.get("requests"), Mapping) else pod_requests(spec))
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    claimed = None if claim_allocated else quantity(ann.get(child_names.ANN_CLAIM_GPUS))
    if claimed:
        out[gpu_resource] = out.get(gpu_resource, 0.0) + claimed
    return out


def slim_pod(pod: Mapping) -> dict:
    """What capacity needs of a pod (the cluster-wide pod cache keeps only this)."""
    meta, spec, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    ann = meta.get("annotations") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": {
                k: v
                for k, v in (meta.get("labels") or {}).items()
                if k in (child_names.LABEL_JOB, child_names.LABEL_MANAGED_BY, child_names.LABEL_ATTEMPT)
            },
            "annotations": {
                k: v for k, v in ann.items() if k in (child_names.ANN_NODE, child_names.ANN_CLAIM_GPUS)
            },
        },
        "spec": {"nodeName": spec.get("nodeName"), "requests": pod_requests(spec)},
        "status": {"phase": st.get("phase"), "nominatedNodeName": st.get("nominatedNodeName")},
    }


def owner_of(pod: Mapping) -> str:
    meta = pod.get("metadata") or {}
    if _is_holmes(meta):
        return f"{meta.get('namespace')}/{meta['labels'][child_names.LABEL_JOB]}"
    return ""


@dataclass(frozen=True)
class Launched:
    """A launched Holmes attempt: its layout's nodes, the pods it has so far, one pod's shape."""

    job: str  # namespace/name
    attempt: int
    nodes: tuple[str, ...]
    shape: PodShape


@dataclass
class Ledger:
    used: dict[str, dict[str, float]] = field(default_factory=dict)  # node -> resource -> amount
    holders: dict[str, set[str]] = field(default_factory=dict)  # node -> jobs ("" for other pods)

    def add(self, node: str, requests: Mapping[str, float], holder: str, pods: int = 1) -> None:
        # pods: the node's pod slots it takes (a DRA claim takes none)
        u = self.used.setdefault(node, {})
        for k, v in requests.items():
            u[k] = u.get(k, 0.0) + v
        if pods:
            u[PODS] = u.get(PODS, 0.0) + pods
        self.holders.setdefault(node, set()).add(holder)

    @classmethod
    def of(
        cls,
        pods: Iterable[Mapping],
        launched: Iterable[Launched] = (),
        skip_job: str = "",
        gpu_resource: str = RESOURCE_GPU,
        claims: Sequence[ClaimHold] = (),
    ) -> Ledger:
        """What pods hold (``held``), plus the ranks of launched attempts not created yet, plus
        what allocated DRA claims hold (``claims``: device_claims.holds), each claim's GPUs
        held by the job of the Holmes pod it is reserved for (else by other pods); ``skip_job``
        (namespace/name) is the job being planned: its own pods and their claims are its to
        replace."""
        led = cls()
        have: set[tuple[str | None, str | None]] = set()  # (namespace, name)
        by_claim = reserved_pods(claims)
        owners: dict[str, str] = {}  # pod uid -> its Holmes job ("" for other pods)
        for p in pods:
            meta = p.get("metadata") or {}
            have.add((meta.get("namespace"), meta.get("name")))
            holder = owner_of(p)
            if meta.get("uid"):  # an ended pod's claim may not be freed yet: still its job's
                owners[str(meta["uid"])] = holder
            if (p.get("status") or {}).get("phase") in ENDED:
                continue
            if skip_job and holder == skip_job:
                continue
            node = pod_node(p)
            if node:
                led.add(node, held(p, gpu_resource, str(meta.get("uid")) in by_claim), holder)
        for c in claims:
            if c.node is None or c.gpus <= 0:
                continue
            holder = next((h for uid in sorted(c.consumers) if (h := owners.get(uid))), "")
            if skip_job and holder == skip_job:
                continue
            led.add(c.node, {gpu_resource: float(c.gpus)}, holder, pods=0)
        for lj in launched:
            if lj.job == skip_job:
                continue
            ns, job = lj.job.split("/", 1)
            for rank, node in enumerate(lj.nodes):
                if (ns, child_names.pod_name(job, lj.attempt, rank)) not in have:
                    led.add(node, lj.shape.requests, lj.job)
        return led


def free_view(
    nodes: Sequence[Mapping],
    shape: PodShape,
    led: Ledger,
    gpu_resource: str = RESOURCE_GPU,
    extra: Callable[[Mapping], Mapping[str, float]] | None = None,
) -> tuple[list[Mapping], dict[str, str]]:
    """The nodes as the planner should see them for this job: GPUs reduced to what is free (the
    GPUs pods hold as :data:`GPUS_TAKEN_KEY`, which discovery subtracts from the device plugin's
    or the DRA driver's count alike); nodes the pods cannot use, or where what a pod needs is
    not free (``PodShape.needs``; ``extra``: a node's route resources), left out, with why."""
    view: list[Mapping] = []
    out: dict[str, str] = {}
    problem = node_selection.PROBLEMS.of(shape, placement_problem)
    for n in nodes:
        name = (n.get("metadata") or {}).get("name") or ""
        more = extra(n) if extra is not None else {}
        why = problem(n) if not more else placement_problem(n, shape, more)
        if why:
            out[name] = why
            continue
        used = led.used.get(name)  # none: placement_problem compared the allocatable already
        if used:
            alloc = (n.get("status") or {}).get("allocatable") or {}
            short = []
            for res, want in sorted(shape.needs(more).items()):
                have = quantity(alloc.get(res))
                if have is None:
                    continue  # not advertised: placement_problem judged it
                free = have - used.get(res, 0.0)
                if free + 1e-9 * max(have, 1.0) < want:
                    short.append(f"{show(res, max(free, 0))} {res} free")
            if short:
                out[name] = ", ".join(short)
                continue
        taken = math.ceil(used.get(gpu_resource, 0.0)) if used else 0
        view.append({**n, GPUS_TAKEN_KEY: taken} if taken > 0 else n)  # a shallow copy: shared parts
    return view, out


def take(led: Ledger, nodes: Iterable[str], shape: PodShape, holder: str) -> None:
    for node in nodes:
        led.add(node, shape.requests, holder)


# ---- the queue --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Waiting:
    """A job waiting to launch, as the queue sees it."""

    job: str  # namespace/name
    spec: JobSpec
    shape: PodShape
    priority: int
    created: str  # metadata.creationTimestamp (RFC 3339 sorts as text)
    turn: int = 0  # its place among its namespace's waiting jobs of this priority (``with_turns``)

    @property
    def namespace(self) -> str:
        return self.job.split("/", 1)[0]

    @property
    def key(self) -> tuple:
        return (-self.priority, self.turn, self.created, self.job)


def with_turns(jobs: Iterable[Waiting], running: Mapping[str, int]) -> list[Waiting]:
    """Each job with its turn: its namespace's launched jobs (``running``, by namespace) plus
    its place among that namespace's waiting jobs of its priority (round-robin between
    namespaces within a priority, those running least first)."""
    seen: dict[tuple[str, int], int] = {}
    out = []
    for w in sorted(jobs, key=lambda w: (w.created, w.job)):
        at = (w.namespace, w.priority)
        out.append(replace(w, turn=running.get(w.namespace, 0) + seen.get(at, 0)))
        seen[at] = seen.get(at, 0) + 1
    return out


def queue_order(jobs: Iterable[Waiting], running: Mapping[str, int] | None = None) -> list[Waiting]:
    """Waiting jobs in the order they take capacity: priority, then namespaces' turns, then age."""
    return sorted(with_turns(jobs, running or {}), key=lambda w: w.key)


def priority_of(spec: JobSpec, classes: Mapping[str, int], raw_allowed: bool = False) -> tuple[int, str]:
    """(priority, problem): runPolicy.priority where the operator's policy lets the job's
    namespace set a raw number (``raw_allowed``; admitting.py refuses it elsewhere), else its
    PriorityClass's value, else 0."""
    rp = spec.run_policy
    if rp.priority is not None and raw_allowed:
        return rp.priority, ""
    if rp.priority_class_name:
        if rp.priority_class_name not in classes:
            return 0, (
                f"spec.runPolicy.priorityClassName: PriorityClass {rp.priority_class_name!r} does not "
                "exist -- create it (kubectl get priorityclasses lists them) or fix the name"
            )
        return int(classes[rp.priority_class_name]), ""
    return 0, ""


@dataclass(frozen=True)
class SharedState:
    """What the other workloads hold and want, for one job: derived from the observed
    ``Workloads`` by ``shared_state`` when the job is placed."""

    pods: Sequence[Mapping] = ()  # every pod that may hold resources (slim or full)
    launched: Sequence[Launched] = ()  # launched Holmes attempts (for ranks not created yet)
    ahead: Sequence[Waiting] = ()  # waiting jobs before this one, in queue order


def waiting_message(
    job: JobSpec, shape: PodShape, fitting: Sequence[Mapping], led: Ledger, blocked: Mapping[str, str]
) -> str:
    """Why a job that could run here waits: what it needs, the ``fitting`` nodes (usable, with
    enough GPUs free), who holds the rest, what is kept for the jobs ahead."""
    n = job.nodes.count
    fit = sorted(x["metadata"]["name"] for x in fitting)
    holders: dict[str, int] = {}
    for who in led.holders.values():
        for h in who:
            holders[h or "other pods"] = holders.get(h or "other pods", 0) + 1
    held = ", ".join(f"{h} ({c} node{'s' if c > 1 else ''})" for h, c in sorted(holders.items()))
    parts = [
        f"needs {n} node(s) with {shape.describe()} free per pod; "
        f"{len(fit)} node(s) have that free now" + (f" ({', '.join(fit[:8])})" if fit else "")
    ]
    if held:
        parts.append(f"held by {held}")
    if blocked:
        heads = sorted(set(blocked.values()))
        parts.append(f"{len(blocked)} free node(s) kept for {', '.join(heads[:3])} ahead in the queue")
    parts.append("starts when capacity frees")
    return "; ".join(parts)


@dataclass(frozen=True)
class Workloads:
    """What the runtime observed of the other workloads, before deciding: every pod that may
    hold resources (slim or full), every HolmesJob (the queue), the layout ConfigMap of each
    launched one by (namespace, name), the jobs whose launch is being written (their pods
    are among ``pods``; they are in no queue), and the DRA ResourceClaims (slim or full)."""

    pods: Sequence[Mapping] = ()
    jobs: Sequence[Mapping] = ()
    layouts: Mapping[tuple[str, str], Mapping] = field(default_factory=dict)
    launching: frozenset[str] = frozenset()  # namespace/name
    claims: Sequence[Mapping] = ()


# Every decision reads every other job's spec (the queue ahead) and every launched job's layout:
# each read once per version of its object (uid, resourceVersion), not once per decision. The
# values are frozen, so sharing them is safe; plain dicts (their reads and writes are atomic),
# bounded by clearing them, shared by the workers. An object without both is read each time.
_KEPT = 4096
_SPECS: dict[tuple[str, str], JobSpec | None] = {}
_PLANNED: dict[tuple[str, str], tuple[str, ...] | None] = {}
T = TypeVar("T")


def _per_version(
    kept: dict[tuple[str, str], T | None], obj: Mapping, read: Callable[[], T | None]
) -> T | None:
    meta = obj.get("metadata") or {}
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    if not (isinstance(uid, str) and isinstance(rv, str)):
        return read()
    key = (uid, rv)
    if key not in kept:
        if len(kept) >= _KEPT:
            kept.clear()
        kept[key] = read()
    return kept[key]


def _spec_of(job: Mapping) -> JobSpec | None:
    """``load_job(job)``, None for a bad spec."""

    def read() -> JobSpec | None:
        try:
            return load_job(job)
        except SpecError:
            return None

    return _per_version(_SPECS, job, read)


def _planned_nodes(cm: Mapping) -> tuple[str, ...] | None:
    """The nodes of a layout ConfigMap's Layout, None if it has none readable."""

    def read() -> tuple[str, ...] | None:
        try:
            return tuple(Layout.from_json(cm["data"][child_names.LAYOUT_FILE]).nodes)
        except (KeyError, TypeError, LayoutError):
            return None

    return _per_version(_PLANNED, cm, read)


def shared_state(
    me: Mapping,
    seen: Workloads,
    classes: Mapping[str, int],
    gpu_resource: str = RESOURCE_GPU,
    raw_priority: Collection[str] = (),
) -> SharedState:
    """The shared view for job ``me`` from the API's objects: the pods (every pod that has not
    ended), the HolmesJobs (launched ones with their layout ConfigMap, waiting ones in queue
    order: those ahead of ``me``). Nothing else: an operator restart rebuilds the same view.
    ``raw_priority``: the namespaces whose jobs' runPolicy.priority counts (priority_of)."""
    launched, waiting = [], []
    me_key: str | None = None
    running: dict[str, int] = {}  # turns taken, by namespace: launched jobs (and ended ones below)
    ended: list[tuple[str, str]] = []  # (namespace, completionTime)
    for job in seen.jobs:
        meta, st = job.get("metadata") or {}, job.get("status") or {}
        ns, name = meta.get("namespace") or "", meta.get("name") or ""
        if st.get("phase") in ENDED and st.get("completionTime"):
            ended.append((ns, st["completionTime"]))
        if meta.get("deletionTimestamp") or st.get("phase") in ENDED:
            continue
        spec = _spec_of(job)
        if spec is None or managed_by.elsewhere(job):  # another controller's: no pods here
            continue
        shape = pod_shape(spec, gpu_resource)
        if st.get("launched"):
            cm = seen.layouts.get((ns, name)) or {}
            ann = (cm.get("metadata") or {}).get("annotations") or {}
            if ann.get(child_names.ANN_ATTEMPT) != str(st.get("attempt")):
                continue
            planned = _planned_nodes(cm)
            if planned is None:
                continue
            launched.append(Launched(f"{ns}/{name}", int(st.get("attempt") or 0), planned, shape))
            running[ns] = running.get(ns, 0) + 1
            continue
        stalled = any(  # or waiting for its namespace's quota (quota.py): no share of the queue
            (c.get("type"), c.get("status")) == ("Stalled", "True") or c.get("reason") == "WaitingForQuota"
            for c in st.get("conditions") or []
        )
        queued = ((meta.get("labels") or {}).get(LABEL_KUEUE_QUEUE)) is not None
        unadmitted = queued and st.get("phase") in (None, "Suspended")  # Kueue's to order
        if spec.run_policy.suspend or st.get("phase") == "Suspended" or stalled or unadmitted:
            continue
        if f"{ns}/{name}" in seen.launching:  # its pods are being created: they hold its share
            running[ns] = running.get(ns, 0) + 1
            continue
        w = Waiting(
            f"{ns}/{name}",
            spec,
            shape,
            priority_of(spec, classes, ns in raw_priority)[0],
            meta.get("creationTimestamp") or "",
        )
        if meta.get("uid") == (me.get("metadata") or {}).get("uid"):
            me_key = w.job
        waiting.append(w)
    # a job that ended while the oldest of the waiting jobs waited took its turn too, so one
    # namespace's jobs running one after another do not each go before another's older wait
    since = min((w.created for w in waiting), default="")
    for ns, done in ended:
        if since and done >= since:
            running[ns] = running.get(ns, 0) + 1
    queue = queue_order(waiting, running)
    mine = next((w.key for w in queue if w.job == me_key), None)
    # not waiting itself (e.g. an elastic job growing back): nobody is ahead of it
    ahead = [] if mine is None else [w for w in queue if w.key < mine]
    return SharedState(pods=list(seen.pods), launched=launched, ahead=ahead)
