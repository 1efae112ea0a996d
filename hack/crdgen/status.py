"""The HolmesJob's status as the operator writes it, declared for the CRD's schema (and
``kubectl explain hj.status``). The operator builds it as plain mappings (operator/status.py,
progress.py); the keys here are the camelCase of the field names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from holmes.contract.schema import Field, documented


@documented
@dataclass(frozen=True)
class Condition:
    type: Annotated[
        str,
        Field("Ready, Reconciling, Stalled, Succeeded, Failed, Suspended, MembersReachable or Replanned."),
    ]
    status: Annotated[str, Field("Whether the condition holds.", enum=("True", "False", "Unknown"))]
    reason: Annotated[
        str | None,
        Field("A CamelCase word for why (e.g. WaitingForNodes, InvalidSpec, BackoffLimitExceeded)."),
    ] = None
    message: Annotated[str | None, Field("What happened and, for problems, what to fix.")] = None
    last_transition_time: Annotated[str | None, Field("When status last changed.", format="date-time")] = None
    observed_generation: Annotated[
        int | None, Field("The metadata.generation this condition was computed from.")
    ] = None


@documented
@dataclass(frozen=True)
class LayoutStage:
    index: Annotated[int | None, Field("Stage number.")] = None
    island: Annotated[str | None, Field("Cluster and NIC kind of the stage's nodes.")] = None
    nic: Annotated[str | None, Field("infiniband, roce or ethernet.")] = None
    gpu: Annotated[
        str | None,
        Field(
            "GPU type of the stage's nodes (GPU Feature Discovery's nvidia.com/gpu.product "
            'without "NVIDIA-"; "unlabelled" without it; types joined by "+" where a stage mixes '
            "them)."
        ),
    ] = None
    layers: Annotated[
        tuple[int, ...] | None, Field("Half-open range [start, end) of transformer layers.")
    ] = None
    nodes: Annotated[tuple[str, ...] | None, Field("Nodes hosting the stage.")] = None


@documented
@dataclass(frozen=True)
class DpGroupFamily:
    stage: Annotated[int | None, Field("Stage whose replicas the groups join.")] = None
    size: Annotated[int | None, Field("Ranks per group (the data-parallel degree).")] = None
    nics: Annotated[
        tuple[str, ...] | None,
        Field("NIC kinds of the group's nodes; one kind means the group stays on one fabric."),
    ] = None
    net: Annotated[str | None, Field("NCCL network of the groups, IB (InfiniBand or RoCE) or Socket.")] = None


@documented
@dataclass(frozen=True)
class LayoutStatus:
    shape: Annotated[str | None, Field("pipeline x data x tensor, e.g. 2x4x1.")] = None
    pipeline: Annotated[int | None, Field("Pipeline stages.")] = None
    data: Annotated[int | None, Field("Data-parallel degree.")] = None
    tensor: Annotated[int | None, Field("Tensor-parallel degree.")] = None
    world_size: Annotated[int | None, Field("Processes (GPUs) in total.")] = None
    nodes: Annotated[int | None, Field("Nodes (pods) of the attempt.")] = None
    config_map: Annotated[str | None, Field("The ConfigMap holding layout.json and job.yaml.")] = None
    stages: Annotated[tuple[LayoutStage, ...] | None, Field("Pipeline stages in order.")] = None
    dp_groups: Annotated[
        tuple[DpGroupFamily, ...] | None,
        Field(
            "Data-parallel group families, one per stage, with the NIC kinds they span and the "
            "NCCL network used."
        ),
    ] = None
    estimate: Annotated[
        dict[str, Any] | None,
        Field("The planner's cost-model estimate (iterationSeconds, tokensPerSecond, tflopsPerGpu)."),
    ] = None


@documented
@dataclass(frozen=True)
class Adaptation:
    replans: Annotated[int | None, Field("Re-plans done (at most parallelism.replan.maxReplans).")] = None
    measured_tflops: Annotated[
        dict[str, float] | None,
        Field(
            "Achieved TFLOP/s per GPU by node, calibrated from the measured stage times; every "
            "later plan of the job prices these nodes with them."
        ),
    ] = None
    tried: Annotated[
        tuple[str, ...] | None,
        Field("Layouts run so far (node order, layers, degrees); a re-plan never returns to one."),
    ] = None
    judged_iteration: Annotated[
        int | None, Field("The iteration of the last verdict (the next one comes a few iterations later).")
    ] = None
    pending_after_checkpoint: Annotated[
        int | None,
        Field(
            "A re-plan waits for a checkpoint newer than this iteration (without "
            "training.checkpoint.onPreemption)."
        ),
    ] = None
    last: Annotated[
        dict[str, Any] | None,
        Field(
            "The last re-plan: iteration, from and to (layers and islands), estimatedBefore, "
            "measuredBefore and estimatedAfter (seconds per iteration), stageTflops."
        ),
    ] = None


@documented
@dataclass(frozen=True)
class RestartsByReason:
    failure: Annotated[int | None, Field("Failures counted against runPolicy.backoffLimit.")] = None
    disruption: Annotated[
        int | None,
        Field("Evictions, preemptions, deleted pods and lost nodes (against runPolicy.disruptionLimit)."),
    ] = None
    ignored: Annotated[int | None, Field("Failures a failurePolicy Ignore rule matched.")] = None
    scale_up: Annotated[int | None, Field("Relaunches on more nodes after a checkpoint (elastic size).")] = (
        None
    )
    replan: Annotated[
        int | None,
        Field("Relaunches in a layout re-planned from measured stage speeds (parallelism.replan)."),
    ] = None


@documented
@dataclass(frozen=True)
class SizeStatus:
    current: Annotated[int | None, Field("Nodes of the current attempt.")] = None
    desired: Annotated[int | None, Field("spec.nodes.count.")] = None
    minimum: Annotated[int | None, Field("spec.nodes.minCount (count when not elastic).")] = None


@documented
@dataclass(frozen=True)
class PodCounts:
    pending: Annotated[int | None, Field("Pods not yet running.")] = None
    running: Annotated[int | None, Field("Pods running.")] = None
    succeeded: Annotated[int | None, Field("Pods that finished successfully.")] = None
    failed: Annotated[int | None, Field("Pods that failed.")] = None


@documented
@dataclass(frozen=True)
class MemberStatus(PodCounts):
    """The member's reachability and its share of the attempt: nodes, and pods by phase."""

    reachable: Annotated[bool | None, Field("Whether the member's API server answered recently.")] = None
    message: Annotated[str | None, Field("Why it is not reachable (the last error), when it is not.")] = None
    nodes: Annotated[int | None, Field("Nodes of the current attempt in this member.")] = None


@documented
@dataclass(frozen=True)
class UnschedulableNode:
    """A planned node the scheduler refused a pod of the job (runPolicy.schedulingTimeoutSeconds)."""

    message: Annotated[
        str | None, Field("The pod and the scheduler's reason (its PodScheduled condition).")
    ] = None
    until: Annotated[
        str | None, Field("Planning leaves the node out until this time.", format="date-time")
    ] = None


@documented
@dataclass(frozen=True)
class ReplicaStatus:
    replica: Annotated[int | None, Field("Replica number (HOLMES_REPLICA of its pods).")] = None
    cluster: Annotated[str | None, Field("The cluster (island) the replica trains on.")] = None
    nodes: Annotated[int | None, Field("Nodes of the replica (its pods are one torch world).")] = None
    iteration: Annotated[int | None, Field("The replica's last completed iteration.")] = None
    outer_step: Annotated[
        int | None, Field("The last outer step (synchronization with the other replicas) it took part in.")
    ] = None
    checkpoint_iteration: Annotated[
        int | None, Field("The iteration of the replica's newest checkpoint (its own directory).")
    ] = None


@documented
@dataclass(frozen=True)
class StageProgress:
    stage: Annotated[int | None, Field("Stage number.")] = None
    layers: Annotated[int | None, Field("Transformer layers of the stage.")] = None
    samples: Annotated[int | None, Field("Iterations behind the medians.")] = None
    compute_seconds: Annotated[
        float | None, Field("Measured forward and backward compute of all micro-batches.")
    ] = None
    layer_seconds: Annotated[
        float | None,
        Field(
            "Measured forward+backward per layer and micro-batch (the LM head's share included on"
            " the last stage)."
        ),
    ] = None
    p2p_wait_seconds: Annotated[
        float | None,
        Field("Measured time in pipeline p2p (transfers and waiting on the neighbouring stages)."),
    ] = None
    dp_exposed_seconds: Annotated[
        float | None, Field("Measured data-parallel communication not hidden behind compute.")
    ] = None
    planned_compute_seconds: Annotated[float | None, Field("The plan's estimate of computeSeconds.")] = None
    planned_p2p_seconds: Annotated[
        float | None, Field("The plan's p2p plus pipeline-bubble time (what p2pWaitSeconds measures).")
    ] = None
    planned_dp_exposed_seconds: Annotated[float | None, Field("The plan's estimate of dpExposedSeconds.")] = (
        None
    )


@documented
@dataclass(frozen=True)
class RateBasis:
    attempt: Annotated[int | None, Field("The attempt the rate is measured in.")] = None
    iteration: Annotated[int | None, Field("The iteration of the attempt's first progress report.")] = None
    time: Annotated[str | None, Field("When the operator read it.", format="date-time")] = None


@documented
@dataclass(frozen=True)
class Progress:
    iteration: Annotated[int | None, Field("Last completed iteration.")] = None
    checkpoint_iteration: Annotated[
        int | None, Field("Iteration of the newest checkpoint the trainer wrote in this attempt.")
    ] = None
    iterations: Annotated[int | None, Field("Iterations to run in total (spec.training.iterations).")] = None
    percent_complete: Annotated[
        int | None, Field("Percent of the iterations done (iteration / iterations, rounded down).")
    ] = None
    iterations_per_second: Annotated[
        float | None,
        Field(
            "Measured rate: iterations since rateFrom over the time since (checkpoints and evaluations"
            " included); the trainer's last iteration time until this attempt has two reports."
        ),
    ] = None
    estimated_remaining_seconds: Annotated[
        int | None, Field("Estimated seconds until the last iteration: what is left at iterationsPerSecond.")
    ] = None
    estimated_remaining: Annotated[
        str | None, Field("estimatedRemainingSeconds for people (45s, 12m30s, 3h05m, 2d04h).")
    ] = None
    rate_from: Annotated[
        RateBasis | None,
        Field(
            "Where the measured rate counts from: the current attempt's first progress report (a "
            "restart, resume or re-plan starts a new one)."
        ),
    ] = None
    loss: Annotated[float | None, Field("Training loss of the last iteration.")] = None
    eval_loss: Annotated[float | None, Field("Loss on training.eval's data at the last evaluation.")] = None
    tokens_per_second: Annotated[float | None, Field("Training throughput in tokens per second.")] = None
    tflops_per_gpu: Annotated[float | None, Field("Model TFLOPS per GPU.")] = None
    iteration_seconds: Annotated[float | None, Field("Wall time of the last iteration.")] = None
    outer_step: Annotated[
        int | None,
        Field(
            "With acrossIslands replicas: the outer steps (synchronizations over the slow link) "
            "replica 0 has taken; 0 before the first, and in a synchronous job."
        ),
    ] = None
    stages: Annotated[
        tuple[StageProgress, ...] | None,
        Field(
            "Per pipeline stage, measured next to planned (seconds per iteration; measured values"
            " are medians over the iterations after the trainer's warm-up, mean over the stage's "
            "ranks)."
        ),
    ] = None
    fabric_warnings: Annotated[
        tuple[str, ...] | None,
        Field(
            "Ranks whose fabric is not what the layout planned (training.fabricCheck: warn), e.g."
            " an IB data-parallel group that NCCL runs over sockets. Empty or absent when all is "
            "as planned."
        ),
    ] = None
    update_time: Annotated[str | None, Field("When the operator read these numbers.", format="date-time")] = (
        None
    )


@documented
@dataclass(frozen=True)
class JobStatus:
    phase: Annotated[
        str | None,
        Field(
            (
                "Pending (planning, waiting for nodes or pods starting), Running (all pods running), "
                "Restarting (a pod failed; the gang is being recreated), Succeeded, Failed, "
                "Suspended."
            ),
            enum=("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"),
        ),
    ] = None
    observed_generation: Annotated[
        int | None, Field("The metadata.generation the operator last acted on.")
    ] = None
    conditions: Annotated[
        tuple[Condition, ...] | None,
        Field(
            "Ready, Reconciling, Stalled, Succeeded, Failed and Suspended (and MembersReachable "
            "for a job across member clusters; Replanned with parallelism.replan: True after a "
            "re-plan, False with why not), in the shape kstatus, Argo CD and Flux read. "
            "Stalled=True means the operator needs the user to act (see its message)."
        ),
    ] = None
    layout: Annotated[
        LayoutStatus | None,
        Field("The layout of the current attempt (the full Layout JSON is in the ConfigMap <name>-layout)."),
    ] = None
    restarts: Annotated[
        int | None, Field("Gang restarts, all reasons together (restartsByReason breaks them down).")
    ] = None
    adaptation: Annotated[
        Adaptation | None, Field("Re-planning from measured stage speeds (spec.parallelism.replan).")
    ] = None
    restarts_by_reason: Annotated[
        RestartsByReason | None,
        Field(
            "Gang restarts by reason: failure (counted against runPolicy.backoffLimit), "
            "disruption (evicted, preempted, deleted, node lost; against disruptionLimit), "
            "ignored (a failurePolicy Ignore rule), scaleUp (relaunched on more nodes after a "
            "checkpoint), replan (relaunched in a layout re-planned from measured stage speeds)."
        ),
    ] = None
    waiting_since: Annotated[
        str | None,
        Field(
            ("When the job began waiting for nodes (runPolicy.waitForNodesSeconds counts from here)."),
            format="date-time",
        ),
    ] = None
    scale_up_after: Annotated[
        int | None,
        Field(
            "An elastic job running below nodes.count whose nodes are back: the trainer's "
            "checkpoint iteration at that time; the job relaunches on more nodes once a newer "
            "checkpoint exists."
        ),
    ] = None
    size: Annotated[
        SizeStatus | None,
        Field(
            "Nodes of the current attempt (current), of spec.nodes.count (desired) and minCount (minimum)."
        ),
    ] = None
    attempt: Annotated[
        int | None,
        Field(
            "Launches so far (first launch, restarts, resumes and spec-change relaunches); pods "
            "carry it in their name."
        ),
    ] = None
    launched: Annotated[bool | None, Field("Whether all pods of the current attempt have been created.")] = (
        None
    )
    pods: Annotated[PodCounts | None, Field("Pods of the current attempt by phase.")] = None
    members: Annotated[
        dict[str, MemberStatus] | None,
        Field(
            "Multi-cluster jobs (member clusters registered with the operator): per member "
            "cluster, whether its API server is reachable and the current attempt's pods there by"
            " phase."
        ),
    ] = None
    unschedulable_nodes: Annotated[
        dict[str, UnschedulableNode] | None,
        Field(
            "Planned nodes on which the scheduler left a pod of an attempt unschedulable for "
            "runPolicy.schedulingTimeoutSeconds: the attempt was given back and the job plans "
            "without them until the time given."
        ),
    ] = None
    replicas: Annotated[
        tuple[ReplicaStatus, ...] | None,
        Field(
            "With spec.training.acrossIslands replicas: one per cluster, each a torch world of its "
            "own, with its progress (each replica's rank 0 reports its own)."
        ),
    ] = None
    start_time: Annotated[
        str | None,
        Field(
            ("When the current run started (reset on resume; activeDeadlineSeconds counts from here)."),
            format="date-time",
        ),
    ] = None
    completion_time: Annotated[str | None, Field("When the job Succeeded or Failed.", format="date-time")] = (
        None
    )
    next_attempt_time: Annotated[
        str | None,
        Field(
            (
                "During a restart back-off, or after the API server refused a child (createFailures),"
                " when the next attempt will be launched (the delay doubles with each restart or "
                "refusal, capped; see the operator's --restart-backoff-seconds)."
            ),
            format="date-time",
        ),
    ] = None
    create_failures: Annotated[
        int | None,
        Field(
            "Consecutive launches in which the API server refused a pod, ConfigMap or Service (a "
            "full ResourceQuota, an admission denial); reset once an attempt's children are all "
            "created. The Reconciling (ChildCreateFailed) or Stalled (ChildRejected; "
            "TemplateRejected when its dry run of the pods refused them) condition carries the "
            "API server's reason and message."
        ),
    ] = None
    progress: Annotated[Progress | None, Field("Training progress reported by the rank-0 trainer.")] = None
