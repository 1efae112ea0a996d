"""The HolmesJob spec read and checked: :class:`JobSpec` joins the sections (declared in
:mod:`holmes.contract.spec_sections`, with network.py's islands and podtemplate.py's pod
template), reads them from a manifest and checks them across fields. Pure Python, no
third-party import.

Parse with :func:`load_job` (a manifest, its ``spec`` or a file of either),
:meth:`JobSpec.from_manifest` (a whole HolmesJob object) or :meth:`JobSpec.from_spec` (its
``spec``); turn back into camelCase with :meth:`JobSpec.to_spec`. Bad input raises
:class:`SpecError`, whose message lists *every* problem with its field path and what to do, e.g.
``spec.training.microBatchSize: must be a positive integer, got 'four'``. Unknown fields are
rejected by name. Types are strict (a YAML string "8" is not the integer 8; booleans are not
numbers), like the API server's schema validation.

Cross-field checks done here are the ones that need no cluster facts (hiddenSize divisible by
attentionHeads, globalBatchSize divisible by microBatchSize, tensor dividing gpusPerNode and
what tensor parallelism splits (:func:`tensor_parallel_problems`), fixed degrees matching the
GPU count, an explicit partition summing to the layers, ...). Checks that need the nodes (enough
GPUs, NIC kinds) belong to the planner.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, ClassVar

from .frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, framework_problems
from .names import API_VERSION, KIND, NETWORKS, POD_NETWORK
from .network import IslandNetwork, read_islands
from .pipeline_schedules import AUTO as AUTO_SCHEDULE
from .pipeline_schedules import virtual_choices
from .podtemplate import PodTemplate, shape_problems
from .schema import ABSENT, INVALID, Field, Reader, Rule, show
from .spec_sections import ModelSpec, NodesSpec, ParallelismSpec, RunPolicy, TrainingSpec, to_camel


class SpecError(ValueError):
    """A HolmesJob spec that cannot be used. ``problems`` holds one line per problem, each
    starting with the field path; ``str()`` lists them all."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        n = len(self.problems)
        head = "HolmesJob spec is invalid" + (f" ({n} problems)" if n > 1 else "")
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in self.problems))


def _template(r: Reader, v: Any, path: str, _: Mapping[str, Any]) -> Any:
    if v is None:
        return ABSENT
    if not isinstance(v, Mapping):
        r.add(path, f"must be a mapping (a PodTemplateSpec-like object), got {show(v)}")
        return INVALID
    problems = shape_problems(v)
    r.problems += problems
    return INVALID if problems else dict(v)


@dataclass(frozen=True, eq=True)
class JobSpec:
    # CEL rules across sections the API server checks (Kubernetes 1.25+); cross_check,
    # tensor_parallel_problems and moe_problems make the same checks. A degree is an int or "auto"
    # (parallelism has no server default: absent, every degree is 1 or auto); a degree below 1 is
    # refused by its own rule, and skipped here rather than divided by.
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "!has(self.parallelism) || type(self.parallelism.tensor) != int || "
            "self.parallelism.tensor < 1 || "
            "self.nodes.gpusPerNode % self.parallelism.tensor == 0 || "
            "self.parallelism.tensor % self.nodes.gpusPerNode == 0",
            "parallelism.tensor must divide nodes.gpusPerNode, or be a multiple of it: a tensor group "
            "wider than a node spans nodes of one NVLink domain (the planner checks the domain)",
        ),
        Rule(
            "!has(self.parallelism) || type(self.parallelism.tensor) != int || "
            "self.parallelism.tensor < 1 || "
            "(self.model.attentionHeads % self.parallelism.tensor == 0 && "
            "self.model.vocabSize % self.parallelism.tensor == 0)",
            "parallelism.tensor must divide model.attentionHeads and model.vocabSize (pad the vocabulary "
            "to a multiple of it)",
        ),
        Rule(
            "!has(self.parallelism) || type(self.parallelism.pipeline) != int || "
            "self.parallelism.pipeline <= self.model.layers",
            "parallelism.pipeline must be at most model.layers (every stage needs a layer)",
        ),
        Rule(
            "!has(self.parallelism) || type(self.parallelism.data) != int || self.parallelism.data < 1 || "
            "self.training.globalBatchSize % (self.parallelism.data * self.training.microBatchSize) == 0",
            "training.globalBatchSize must be a multiple of parallelism.data x training.microBatchSize",
        ),
        Rule(
            "!has(self.model.moe) || !has(self.parallelism) || type(self.parallelism.expert) != int || "
            "self.parallelism.expert < 1 || "
            "self.model.moe.experts % self.parallelism.expert == 0",
            "parallelism.expert must divide model.moe.experts",
        ),
    )

    model: Annotated[
        ModelSpec,
        Field(
            "The decoder to train (architecture gpt or llama). Immutable once the job has started "
            "(checkpoints hold this model's weights): create a new HolmesJob instead. API servers "
            "that run CEL rules (1.25+) refuse any edit of it; older ones leave it to the operator.",
            rules=(
                Rule(
                    "self == oldSelf",
                    "model is immutable (a job's checkpoints hold this model): create a new HolmesJob",
                ),
            ),
        ),
    ]
    training: Annotated[
        TrainingSpec, Field("The optimisation run. Editing it on an active job relaunches the job.")
    ]
    nodes: Annotated[
        NodesSpec,
        Field("Which nodes to run on. Editing it on an active job relaunches the job with a new plan."),
    ]
    parallelism: Annotated[
        ParallelismSpec,
        Field(
            'How the model is split. The planner fills in what is "auto" so that data-parallel '
            "groups use one NIC kind and pipeline stages carry layers in proportion to their speed. "
            "Editing it on an active job relaunches the job with a new plan.",
            server_default=False,
        ),
    ] = field(default_factory=ParallelismSpec)
    template: Annotated[
        dict[str, Any],
        Field(
            'A PodTemplateSpec applied to every pod of the job. The container named "trainer" (or '
            "the first container) runs the trainer; Holmes adds to it the rank and rendezvous env, "
            "NCCL settings for the node's NIC kind, GPU and RDMA resources, "
            "/dev/shm in memory and the layout at /etc/holmes. Env, volumes, resources, "
            "tolerations, schedulerName, labels and annotations given here are kept; env set here "
            "wins over Holmes' defaults of the same name.",
            read=_template,
            schema=PodTemplate,
        ),
    ] = field(default_factory=dict, hash=False)
    run_policy: Annotated[
        RunPolicy,
        Field("Lifecycle of the job; every field may be edited at any time and takes effect at once."),
    ] = field(default_factory=RunPolicy)
    network: Annotated[  # the parser applies the default (to_spec leaves it out)
        str,
        Field(
            "How the job's pods reach each other, also across member clusters "
            "(docs/multicluster.md): podNetwork (the default) uses the pods' own IPs, which must be "
            "routable between the member clusters for a job that spans them; hostNetwork runs the "
            "pods in their node's network namespace (the usual choice on RDMA nodes; Pod Security "
            "baseline refuses it: the namespace must be privileged). Across members the rendezvous "
            "address is rank 0's IP.",
            enum=NETWORKS,
            server_default=False,
        ),
    ] = POD_NETWORK
    islands: Annotated[
        tuple[IslandNetwork, ...],
        Field(
            "Per-island network settings (docs/install.md#network-routes): how an island's pods get "
            "RDMA devices (the shared RDMA device plugin, one device or one per rail; SR-IOV VFs "
            "through Multus), the fabric's traffic class and service level, or a vendor NCCL net "
            "plugin. An entry names its island by cluster and/or nic; the first match wins.",
            read=read_islands,
        ),
    ] = ()
    framework: Annotated[  # which program trains the layout: Holmes' engine or the user's (frameworks.py)
        str,
        Field(
            "Which program trains the planned layout (docs/frameworks.md). holmes (the default) "
            "runs Holmes' own engine. megatron, torchtitan and deepspeed run your own image and "
            'command (the template\'s container "trainer", which must set both) under torchrun '
            "with the Layout's node ranks; Holmes appends the plan as the framework's own "
            "arguments (tensor and pipeline sizes, layers per stage, micro and global batch) and "
            "gives every process group the NCCL network of its members' island. torchrun does the "
            "same for any other torch.distributed program, which may read the Layout at "
            "/etc/holmes. An argument of yours that contradicts the plan stalls the job with "
            "InvalidSpec.",
            enum=FRAMEWORKS,
            server_default=False,
        ),
    ] = DEFAULT_FRAMEWORK

    # unhashable (template is a dict); typeshed spells an unhashable class the same way
    __hash__: ClassVar[None] = None  # type: ignore[assignment]

    @property
    def world_size(self) -> int:
        return self.nodes.count * self.nodes.gpus_per_node

    @property
    def tokens_per_iteration(self) -> int:
        return self.training.global_batch_size * self.model.seq_length

    # ---- parsing --------------------------------------------------------------------
    @classmethod
    def from_manifest(cls, obj: Any) -> JobSpec:
        """Parse a whole HolmesJob object (apiVersion, kind, metadata, spec, status)."""
        if not isinstance(obj, Mapping):
            raise SpecError(
                [f"HolmesJob manifest: must be a mapping (apiVersion, kind, spec), got {show(obj)}"]
            )
        problems = []
        if obj.get("apiVersion") != API_VERSION:
            problems.append(f"apiVersion: must be {API_VERSION}, got {show(obj.get('apiVersion'))}")
        if obj.get("kind") != KIND:
            problems.append(f"kind: must be {KIND}, got {show(obj.get('kind'))}")
        if "spec" not in obj:
            raise SpecError(
                problems + ["spec: missing; a HolmesJob needs spec.model, spec.training and spec.nodes"]
            )
        try:
            spec = cls.from_spec(obj["spec"])
        except SpecError as e:
            raise SpecError(problems + e.problems) from None
        if problems:
            raise SpecError(problems)
        return spec

    @classmethod
    def from_spec(cls, spec: Any) -> JobSpec:
        """Parse the ``spec`` of a HolmesJob; raise SpecError listing every problem."""
        r = Reader()
        job = r.object(cls, spec, "spec")
        if job is INVALID or r.problems:
            raise SpecError(r.problems)
        problems = cross_check(job) + framework_problems(job)
        if problems:
            raise SpecError(problems)
        out: JobSpec = job
        return out

    def to_spec(self) -> dict[str, Any]:
        """The spec back in camelCase; ``JobSpec.from_spec(job.to_spec()) == job``."""
        return {
            "model": to_camel(self.model),
            "training": to_camel(self.training),
            "parallelism": to_camel(self.parallelism),
            "nodes": to_camel(self.nodes),
            "template": dict(self.template),
            "runPolicy": to_camel(self.run_policy),
            **({"network": self.network} if self.network != JobSpec.network else {}),
            **({"islands": to_camel(self.islands)} if self.islands else {}),
            **({"framework": self.framework} if self.framework != JobSpec.framework else {}),
        }

    def replace(self, **sections: Any) -> JobSpec:
        """A copy with whole sections swapped (``job.replace(parallelism=...)``)."""
        return replace(self, **sections)


def load_job(source: Any) -> JobSpec:
    """The one entry to a job spec: a HolmesJob manifest (a mapping with ``kind``/``apiVersion``),
    just its ``spec`` (a mapping with ``model``), or the path of a YAML/JSON file holding either
    (a multi-document file must hold exactly one HolmesJob). Raises SpecError, with the file's
    name in front of each problem when read from a file."""
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
        from .documents import DocumentError, load_documents

        path = str(source if not isinstance(source, bytes) else source.decode())
        try:
            docs = load_documents(path, "job file")
        except DocumentError as e:
            raise SpecError([str(e)]) from None
        jobs = [d for d in docs if isinstance(d, Mapping) and d.get("kind") == KIND] or docs
        if len(jobs) != 1:
            raise SpecError(
                [f"job file {path}: must hold exactly one HolmesJob, found {len(jobs)} documents"]
            )
        try:
            return load_job(jobs[0])
        except SpecError as e:
            raise SpecError([f"{path}: {p}" for p in e.problems]) from None
    if isinstance(source, Mapping) and ("kind" in source or "apiVersion" in source):
        return JobSpec.from_manifest(source)
    if isinstance(source, Mapping) and "spec" in source and "model" not in source:
        raise SpecError(
            [
                "apiVersion, kind: missing; a HolmesJob manifest needs apiVersion "
                f"{API_VERSION} and kind {KIND} (or give just its spec)"
            ]
        )
    return JobSpec.from_spec(source)


# ---- cross-field checks -------------------------------------------------------------------


def _schedule_problems(job: JobSpec) -> list[str]:
    """training.pipelineSchedule and virtualStages: chunks only where the schedule has a choice,
    and virtual stages only on Holmes' engine (an external framework runs one stage per GPU)."""
    t, out = job.training, []
    name, v = t.pipeline_schedule, t.virtual_stages
    if v is not None and name != AUTO_SCHEDULE and v not in virtual_choices(name):
        choices = " or ".join(map(str, virtual_choices(name)))
        out.append(
            f"spec.training.virtualStages: {name} runs {choices} chunk(s) per GPU, got {v}; "
            "leave virtualStages out or pick Interleaved1F1B / InterleavedZeroBubble"
        )
    if job.framework != DEFAULT_FRAMEWORK and name not in (AUTO_SCHEDULE, "1F1B"):
        out.append(
            f"spec.training.pipelineSchedule: {name} runs on Holmes' engine only; framework "
            f"{job.framework} is launched with one stage per GPU (1F1B): use auto or 1F1B"
        )
    return out


def cross_check(job: JobSpec) -> list[str]:
    """Pure consistency checks across fields; one message per problem, with the fix."""
    m, t, n, p = job.model, job.training, job.nodes, job.parallelism
    out: list[str] = []
    if m.hidden_size % m.attention_heads:
        out.append(
            f"spec.model.hiddenSize: {m.hidden_size} is not divisible by attentionHeads "
            f"{m.attention_heads}; pick a head count that divides it"
        )
    if t.global_batch_size % t.micro_batch_size:
        out.append(
            f"spec.training.globalBatchSize: {t.global_batch_size} is not divisible by microBatchSize "
            f"{t.micro_batch_size}; use a multiple of {t.micro_batch_size}"
        )
    if t.warmup_iterations > t.iterations:
        out.append(f"spec.training.warmupIterations: {t.warmup_iterations} exceeds iterations {t.iterations}")
    if t.min_learning_rate > t.learning_rate:
        out.append(
            f"spec.training.minLearningRate: {t.min_learning_rate} exceeds learningRate {t.learning_rate}; "
            "the schedule decays from learningRate down to minLearningRate"
        )
    out += _architecture_checks(m)
    out += moe_problems(job)
    a = t.across_islands
    if a.inner_steps % a.fragments:
        out.append(
            f"spec.training.acrossIslands.fragments: {a.fragments} does not divide innerSteps "
            f"{a.inner_steps}; pick a divisor so every fragment is synchronized once per innerSteps"
        )
    elif a.overlap_steps > a.inner_steps // a.fragments:
        out.append(
            f"spec.training.acrossIslands.overlapSteps: {a.overlap_steps} exceeds innerSteps / fragments "
            f"= {a.inner_steps // a.fragments}; one exchange is in flight at a time, so the next fragment "
            f"due must find the last one applied: make it at most {a.inner_steps // a.fragments}"
        )
    out += _schedule_problems(job)
    world = job.world_size
    T = p.tensor
    if isinstance(T, int):
        if n.gpus_per_node % T and T % n.gpus_per_node:
            out.append(
                f"spec.parallelism.tensor: {T} must divide nodes.gpusPerNode {n.gpus_per_node} (a group "
                f"inside a node) or be a multiple of it (a group over whole nodes of one NVLink domain): "
                f"use a divisor of {n.gpus_per_node} or a multiple such as {2 * n.gpus_per_node}"
            )
        problems = tensor_parallel_problems(m, T, p.sequence_parallel)
        out += [f"spec.parallelism.tensor: {why}" for why in problems]
    elif p.sequence_parallel and m.seq_length % 2:
        out.append(
            f"spec.parallelism.sequenceParallel: model.seqLength {m.seq_length} is odd, so no tensor "
            "degree above 1 can split it; use an even seqLength or sequenceParallel: false"
        )
    parts = p.explicit_partition
    P = p.pipeline
    if parts is not None:
        if isinstance(P, int) and len(parts) != P:
            out.append(
                f"spec.parallelism.partition: lists {len(parts)} stages but pipeline is {P}; "
                f"give {P} layer counts or set pipeline: auto"
            )
        if sum(parts) != m.layers:
            out.append(
                f"spec.parallelism.partition: layer counts sum to {sum(parts)} but model.layers is "
                f"{m.layers}; make them add up to {m.layers}"
            )
        P = len(parts)
    if isinstance(P, int) and P > m.layers:
        out.append(
            f"spec.parallelism.pipeline: {P} stages but only {m.layers} layers; every stage needs "
            f"at least one layer, use pipeline <= {m.layers}"
        )
    fixed = [
        (name, v) for name, v in (("tensor", T), ("pipeline", P), ("data", p.data)) if isinstance(v, int)
    ]
    prod = math.prod(v for _, v in fixed)
    names = "*".join(name for name, _ in fixed)
    if fixed and len(fixed) == 3 and prod != world:
        out.append(
            f"spec.parallelism: tensor*pipeline*data = {prod} but the job has nodes.count*gpusPerNode = "
            f"{world} GPUs; make the product equal {world} or set one degree to auto"
        )
    elif fixed and world % prod:
        out.append(
            f"spec.parallelism: {names} = {prod} does not divide the job's {world} GPUs "
            f"(nodes.count*gpusPerNode)"
        )
    if n.min_count is not None and n.min_count > n.count:
        out.append(
            f"spec.nodes.minCount: {n.min_count} exceeds count {n.count}; the job runs on at most "
            f"count nodes and at least minCount"
        )
    elif n.min_count is not None and n.min_count < n.count:
        pinned = [name for name, v in (("pipeline", P), ("data", p.data)) if isinstance(v, int)]
        if len(pinned) == 2:
            out.append(
                f"spec.nodes.minCount: {n.min_count} below count {n.count} changes the GPU count, but "
                "parallelism.pipeline and data are both fixed; set one of them to auto"
            )
    D = p.data
    if isinstance(D, int) and t.global_batch_size % (D * t.micro_batch_size):
        out.append(
            f"spec.training.globalBatchSize: {t.global_batch_size} is not divisible by "
            f"data*microBatchSize = {D}*{t.micro_batch_size}; use a multiple of {D * t.micro_batch_size}"
        )
    return out


def moe_problems(job: JobSpec) -> list[str]:
    """A mixture of experts against the degrees and the engine (the planner checks the rest)."""
    moe, p = job.model.moe, job.parallelism
    E = p.expert
    if moe is None:
        if isinstance(E, int) and E > 1:
            return [
                f"spec.parallelism.expert: {E} but the model has no experts (model.moe); remove it or "
                "describe the experts in model.moe"
            ]
        return []
    out = []
    if moe.experts_per_token > moe.experts:
        out.append(
            f"spec.model.moe.expertsPerToken: {moe.experts_per_token} exceeds experts {moe.experts}; a "
            "token is routed to at most every expert"
        )
    if isinstance(E, int) and moe.experts % E:
        out.append(f"spec.parallelism.expert: {E} must divide model.moe.experts {moe.experts}")
    if isinstance(E, int) and isinstance(p.data, int) and p.data % E:
        out.append(
            f"spec.parallelism.expert: {E} must divide parallelism.data {p.data} (expert groups are "
            "formed of a stage's data-parallel ranks)"
        )
    if isinstance(p.tensor, int) and p.tensor > 1 and not p.sequence_parallel:
        out.append(
            f"spec.parallelism.sequenceParallel: a mixture of experts with tensor {p.tensor} needs it "
            "(Megatron-core's MoE layer refuses to train tensor parallel without it); set "
            "sequenceParallel: true or tensor: 1"
        )
    if job.framework == DEFAULT_FRAMEWORK:
        out.append(
            "spec.model.moe: Holmes' own engine (framework holmes) trains dense models only; run a "
            "mixture of experts with framework megatron or torchtitan, which Holmes plans the same way"
        )
    return out


def tensor_parallel_problems(m: ModelSpec, tensor: int, sequence_parallel: bool = False) -> list[str]:
    """Why the trainer cannot split ``m`` over ``tensor`` GPUs (empty when it can). One rule for
    the spec, the planner's ``tensor: auto`` and the trainer: attention splits by heads (and by KV
    heads), the MLP by its width, the embedding and LM head by vocabulary rows, and sequence
    parallelism splits the sequence."""
    if tensor == 1:
        return []
    needs = [("model.attentionHeads", m.attention_heads, "")]
    if m.kv_heads != m.attention_heads:  # else one message for both
        needs.append(("model.kvHeads", m.kv_heads, ""))
    needs += [
        ("model.ffnHiddenSize", m.ffn_hidden_size, ""),
        (
            "model.vocabSize",
            m.vocab_size,
            f"; pad the vocabulary to a multiple of {tensor} (e.g. {-(-m.vocab_size // 128) * 128})",
        ),
    ]
    if sequence_parallel:
        needs.append(("model.seqLength (sequenceParallel)", m.seq_length, ""))
    return [f"{tensor} must divide {name} {value}{hint}" for name, value, hint in needs if value % tensor]


def _architecture_checks(m: ModelSpec) -> list[str]:
    out: list[str] = []
    if m.architecture == "gpt":
        if m.kv_heads != m.attention_heads:
            out.append(
                f"spec.model.kvHeads: {m.kv_heads} differs from attentionHeads {m.attention_heads}, but "
                "architecture gpt has no grouped-query attention; remove kvHeads or use architecture: llama"
            )
        if m.rope_theta is not None:
            out.append(
                "spec.model.ropeTheta: architecture gpt learns its positions and has no rotary "
                "embedding; remove ropeTheta or use architecture: llama"
            )
        if m.init is not None:
            out.append(
                "spec.model.init.huggingface: only architecture llama loads Hugging Face weights "
                "(GPT-2 checkpoints can be exported, not imported); use architecture: llama or remove init"
            )
        return out
    if m.kv_heads > m.attention_heads or m.attention_heads % m.kv_heads:
        out.append(
            f"spec.model.kvHeads: {m.kv_heads} must divide attentionHeads {m.attention_heads} "
            "(each key/value head serves attentionHeads/kvHeads query heads)"
        )
    if m.hidden_size % m.attention_heads == 0 and m.head_dim % 2:
        out.append(
            f"spec.model.hiddenSize: the head size hiddenSize/attentionHeads = {m.head_dim} must be even "
            "for rotary embeddings (they rotate pairs of features)"
        )
    return out
