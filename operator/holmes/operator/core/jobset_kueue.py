"""A labelled JobSet that Kueue manages (label ``kueue.x-k8s.io/queue-name``): where its
admission lets Holmes place its pods, and when Holmes may plan. Pure.

What Kueue v0.17.1 does to such a JobSet (pkg/controller/jobs/jobset, pkg/podset,
pkg/controller/tas), read from its sources:

- its webhook suspends the JobSet, so JobSet makes no pods until Kueue admits its Workload (one
  PodSet per replicatedJob, named after it; the Workload carries label ``kueue.x-k8s.io/job-uid``);
- on admission (RunWithPodSetsInfo) it merges each admitted flavor's ``nodeLabels`` into the
  replicatedJob's pod template's nodeSelector and appends the flavor's tolerations, then
  unsuspends the JobSet; under Topology Aware Scheduling it also adds its scheduling gate
  ``kueue.x-k8s.io/topology`` to the template;
- its topology ungater then removes only its own gate from each pod and copies the assigned
  domain's level labels into the pod's nodeSelector (overwriting a key already there).

A gated pod may only gain nodeSelector keys, not change one: had Holmes pinned a pod's
``kubernetes.io/hostname`` before Kueue's ungater writes its domain, the ungater's patch would
fail whenever the two differ and the pod would stay gated. So the rule (the topology issue's:
Holmes requires islands, Kueue picks nodes): Holmes plans only once the Workload is admitted and
no pod carries Kueue's gate, and only on nodes the admission allows each pod: its PodSet's
flavors' node labels (and, under TAS, one of its topology assignment's domains) with their
tolerations (queueing.flavor_choices, as for HolmesJobs), inside the pod's own node selector.
Holmes never removes Kueue's gate; its own stays until Holmes pins the pod.

A TrainJob's JobSet (Kubeflow Trainer's, its controller owner) is queued through its TrainJob:
Kueue's TrainJob integration (pkg/controller/jobs/trainjob) labels the Workload with the
TrainJob's uid (not the JobSet's), names its PodSets after the JobSet's replicatedJobs and writes
the admission into the TrainJob's runtimePatches, which Trainer renders into the JobSet's pod
templates. So such a JobSet is Kueue's when it carries the queue label (Trainer copies it from the
TrainJob) or a Workload carries its TrainJob's uid, and the rule above holds for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from holmes.contract.names import LABEL_KUEUE_QUEUE

from . import queueing, tolerations

KUEUE_GATE = "kueue.x-k8s.io/topology"  # apis/kueue/v1beta2 TopologySchedulingGate
LABEL_JOB_UID = "kueue.x-k8s.io/job-uid"  # pkg/controller/constants JobUIDLabel, on the Workload
TRAINJOB_GROUP = "trainer.kubeflow.org"  # Kubeflow Trainer v2's TrainJob, a JobSet's controller owner
LABEL_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"  # on JobSet's pods: the PodSet
WAITING_FOR_ADMISSION = "WaitingForAdmission"

Choices = tuple[tuple[dict, tuple[dict, ...]], ...]  # queueing.flavor_choices' (labels, tolerations)


def queue(jobset: Mapping[str, Any]) -> str | None:
    """The LocalQueue the JobSet is queued in (None: Kueue does not manage it)."""
    return ((jobset.get("metadata") or {}).get("labels") or {}).get(LABEL_KUEUE_QUEUE) or None


def trainjob(jobset: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference of the TrainJob whose JobSet this is (None: no TrainJob's)."""
    for ref in (jobset.get("metadata") or {}).get("ownerReferences") or []:
        group = str(ref.get("apiVersion", "")).split("/")[0]
        if ref.get("controller") and ref.get("kind") == "TrainJob" and group == TRAINJOB_GROUP:
            return ref
    return None


def job_uids(jobset: Mapping[str, Any]) -> list[str]:
    """The uids Kueue may label the JobSet's Workload with: its own, and its TrainJob's."""
    owner = trainjob(jobset)
    own = str((jobset.get("metadata") or {}).get("uid", ""))
    return [own] + ([str(owner.get("uid", ""))] if owner else [])


def workload_selector(jobset: Mapping[str, Any]) -> str:
    """The label selector of the JobSet's Workload (Kueue labels it with the job's uid)."""
    uids = job_uids(jobset)
    return f"{LABEL_JOB_UID}={uids[0]}" if len(uids) == 1 else f"{LABEL_JOB_UID} in ({','.join(uids)})"


def queued_where(jobset: Mapping[str, Any]) -> str:
    """Where the JobSet waits, for messages: its LocalQueue, or its TrainJob's."""
    q, owner = queue(jobset), trainjob(jobset)
    return f"LocalQueue {q}" if q or not owner else f"TrainJob {owner.get('name')}'s LocalQueue"


def kueue_gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == KUEUE_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


@dataclass(frozen=True)
class Admitted:
    """Where Kueue's admission lets the JobSet's pods go, per PodSet (= replicatedJob)."""

    workload: str
    choices: Mapping[str, Choices]
    topology: bool  # admitted by TAS: Kueue's ungater has written each pod's domain

    def allows(self, podset: str, node: Mapping[str, Any], pod_tolerations: Sequence[Mapping]) -> bool:
        """The node carries one of the PodSet's admitted choices' labels and its taints are
        tolerated by the pod's tolerations with that choice's (tolerations.flavor_choice)."""
        ch = self.choices.get(podset)
        if not ch:
            return False  # a PodSet Kueue did not admit: no node is inside the admission
        labels, tols = [c for c, _ in ch], [t for _, t in ch]
        return tolerations.flavor_choice(node, pod_tolerations, labels, tols) is not None


def admission(
    jobset: Mapping[str, Any],
    workloads: Iterable[Mapping[str, Any]] | None,
    flavors: Mapping[str, Mapping] | None,
    pods: Sequence[Mapping[str, Any]],
) -> Admitted | str:
    """Admitted, or why Holmes waits (a message naming what it waits for). ``workloads``: the
    Workloads labelled with the JobSet's uid (None: Kueue's API is not served); ``flavors``:
    the ResourceFlavors by name."""
    q, where = queue(jobset), queued_where(jobset)
    if workloads is None or flavors is None:
        return (
            f"label {LABEL_KUEUE_QUEUE}={q} asks Kueue to admit this JobSet, but Kueue's API "
            f"({queueing.KUEUE_GROUP}) is not served: install Kueue, or remove the label"
        )
    uids = job_uids(jobset)
    own = [w for w in workloads if ((w.get("metadata") or {}).get("labels") or {}).get(LABEL_JOB_UID) in uids]
    if not own:
        return f"Kueue has made no Workload for this JobSet yet ({where}): waiting for it"
    wl = max(own, key=lambda w: (w.get("metadata") or {}).get("creationTimestamp") or "")
    name = (wl.get("metadata") or {}).get("name", "")
    state, why = queueing.admission(wl)
    if state != queueing.ADMITTED:
        return f"Workload {name} in {where} is not admitted: {why}"
    adm = (wl.get("status") or {}).get("admission") or {}
    choices: dict[str, Choices] = {}
    for psa in adm.get("podSetAssignments") or []:
        one = {**wl, "status": {**(wl.get("status") or {}), "admission": {**adm, "podSetAssignments": [psa]}}}
        ch, missing = queueing.flavor_choices(one, flavors)
        if missing:
            return (
                f"Workload {name} is admitted with ResourceFlavor(s) {', '.join(sorted(set(missing)))}, "
                "which do not exist (yet): their node labels say where the JobSet may run"
            )
        choices[str(psa.get("name"))] = ch
    gated = sorted((p.get("metadata") or {}).get("name", "") for p in pods if kueue_gated(p))
    if gated:
        shown = ", ".join(gated[:3]) + (f" and {len(gated) - 3} more" if len(gated) > 3 else "")
        return (
            f"Workload {name} is admitted by topology: Kueue's gate {KUEUE_GATE} is still on pod(s) "
            f"{shown}; Holmes plans once Kueue has written each pod's domain into its node selector"
        )
    tas = any(psa.get("topologyAssignment") for psa in adm.get("podSetAssignments") or [])
    return Admitted(workload=name, choices=choices, topology=tas)
