"""The HolmesJob spec as frozen dataclasses: one config that flows from the manifest to the
planner, the operator and the trainer (torchtitan style). Pure Python, no third-party import.

Parse with :meth:`JobSpec.from_manifest` (a whole HolmesJob object) or :meth:`JobSpec.from_spec`
(its ``spec``); turn back into camelCase with :meth:`JobSpec.to_spec`. Bad input raises
:class:`SpecError`, whose message lists *every* problem with its field path and what to do, e.g.
``spec.training.microBatchSize: must be a positive integer, got 'four'``. Unknown fields are
rejected by name. Types are strict (a YAML string "8" is not the integer 8; booleans are not
numbers), like the API server's schema validation.

The fields (camelCase in the manifest, snake_case here) are described in docs/api.md and in the
CRD's schema (crds/holmesjob.yaml; tests/operator/test_crd.py keeps it and this parser in step).
Each default is stated once, on the dataclasses below: the reader takes it from there, and the
trainer's config (holmes.trainer.config) from them too.

``activationRecompute`` (full recomputation: each transformer block keeps only its input and
runs its forward again in backward) defaults to true because the paper's runs and Megatron-LM
at scale use it: the planner's memory model then fits billion-parameter models at the paper's
micro-batch sizes (without it, one layer keeps ``s b h (34 + 5 a s / h)`` bytes per in-flight
micro-batch: several GiB per layer at h=4096, s=2048), and the reported TFLOPS use the paper's
formula. The price is one extra forward (~33% more compute); small models that fit without it
(the demo) should set it false. The planner, the operator and the trainer all read it from here.

Cross-field checks done here are the ones that need no cluster facts (hiddenSize divisible by
attentionHeads, globalBatchSize divisible by microBatchSize, tensor dividing gpusPerNode and
what tensor parallelism splits (:func:`tensor_parallel_problems`), fixed degrees matching the
GPU count, an explicit partition summing to the
layers, ...). Checks that need the nodes (enough GPUs, NIC kinds) belong to the planner.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Union

from .frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, framework_problems
from .names import API_VERSION, KIND, LABEL_CLUSTER, NETWORKS, POD_NETWORK
from .network import IslandNetwork, read_islands

AUTO = "auto"
PARTITION_MODES = ("adaptive", "uniform")
NIC_SELECTION_MODES = ("auto", "off")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
FABRIC_CHECKS = ("fail", "warn", "off")
GRAD_REDUCE_BYTES = {"float32": 4, "bfloat16": 2}
ARCHITECTURES = ("gpt", "llama")
DECAYS = ("cosine", "linear", "constant")
DEFAULT_ROPE_THETA = 10000.0  # Llama 2's; Llama 3 uses 500000
SCALE_UP_MODES = ("atCheckpoint", "never")
FAILURE_ACTIONS = ("FailJob", "Ignore", "Count")  # as a Kubernetes Job's podFailurePolicy
EXIT_CODE_OPERATORS = ("In", "NotIn")


def llama_ffn_hidden_size(hidden: int) -> int:
    """Meta's default SwiGLU width: 2/3 of 4h (three matrices instead of two keep the
    parameters of a 4h GELU MLP), rounded up to a multiple of 256 (11008 for h=4096)."""
    return 256 * -(-int(8 * hidden / 3) // 256)


Degree = Union[int, str]  # an integer >= 1, or AUTO
Partition = Union[str, tuple[int, ...]]  # "adaptive" | "uniform" | tuple of layer counts


class SpecError(ValueError):
    """A HolmesJob spec that cannot be used. ``problems`` holds one line per problem, each
    starting with the field path; ``str()`` lists them all."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        n = len(self.problems)
        head = "HolmesJob spec is invalid" + (f" ({n} problems)" if n > 1 else "")
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in self.problems))


# ---- the dataclasses ----------------------------------------------------------------------


@dataclass(frozen=True)
class HuggingFaceSource:
    path: str  # a directory as transformers' save_pretrained writes it


@dataclass(frozen=True)
class ModelInit:
    """Where the weights start from (none: random, seeded by training.seed)."""

    huggingface: HuggingFaceSource


@dataclass(frozen=True)
class ModelSpec:
    layers: int
    hidden_size: int
    attention_heads: int
    seq_length: int
    vocab_size: int
    ffn_hidden_size: int = 0  # 0 (not given): the architecture's default, resolved here
    tied_embeddings: bool = False
    architecture: str = "gpt"  # gpt: GPT-2 style; llama: RoPE, RMSNorm, SwiGLU, GQA
    kv_heads: int = 0  # 0 (not given): attention_heads (no grouping)
    rope_theta: float | None = None  # llama only; None resolves to DEFAULT_ROPE_THETA there
    norm_eps: float = 1e-5
    init: ModelInit | None = None

    def __post_init__(self) -> None:
        if not self.ffn_hidden_size and isinstance(self.hidden_size, int):
            llama = self.architecture == "llama"
            ffn = llama_ffn_hidden_size(self.hidden_size) if llama else 4 * self.hidden_size
            object.__setattr__(self, "ffn_hidden_size", ffn)
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.attention_heads)
        if self.architecture == "llama" and self.rope_theta is None:
            object.__setattr__(self, "rope_theta", DEFAULT_ROPE_THETA)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.attention_heads

    def to_spec(self) -> dict[str, Any]:
        """spec.model in camelCase, defaults resolved."""
        return _camel_mapping(self)

    def shape(self) -> dict[str, Any]:
        """What a checkpoint's weights depend on (not init): the model identity a checkpoint
        records and is checked against."""
        spec = self.to_spec()
        spec.pop("init", None)
        return spec


@dataclass(frozen=True)
class BlendPart:
    path: str
    weight: float


@dataclass(frozen=True)
class DataSpec:
    synthetic: bool = True  # random tokens from the seed
    path: str | None = None  # a token file on a volume
    blend: tuple[BlendPart, ...] = ()  # several token files, each drawn in proportion to its weight


@dataclass(frozen=True)
class EvalSpec:
    path: str  # a token file (training.eval.data.path)
    interval_iterations: int
    windows: int | None = None  # evaluate the first N windows only; None: all of them


@dataclass(frozen=True)
class CheckpointSpec:
    path: str
    interval_iterations: int
    on_preemption: bool = True  # on SIGTERM, save before exiting when it fits in the grace period


@dataclass(frozen=True)
class TrainingSpec:
    global_batch_size: int
    micro_batch_size: int
    iterations: int
    learning_rate: float
    seed: int = 1234
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    warmup_iterations: int = 0
    activation_recompute: bool = True  # why: see the module docstring
    decay: str = "cosine"  # after warm-up: cosine | linear (to minLearningRate) | constant
    min_learning_rate: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    data: DataSpec = field(default_factory=DataSpec)
    eval: EvalSpec | None = None
    checkpoint: CheckpointSpec | None = None
    grad_reduce_dtype: str = "float32"  # float32 | bfloat16: the bytes of the DP reduce-scatter
    fabric_check: str = "warn"  # fail | warn | off: the trainer's start-up check of its pod's fabric

    @property
    def grad_reduce_bytes(self) -> int:
        return GRAD_REDUCE_BYTES[self.grad_reduce_dtype]


@dataclass(frozen=True)
class ReplanSpec:
    """Re-planning a running job from its measured stage speeds (operator core/replan.py)."""

    enabled: bool = True  # default: on for partition adaptive, off otherwise (see _replan)
    threshold: float = 0.1  # re-plan when another layout is estimated faster by more than this
    max_replans: int = 2  # per job; never counted against runPolicy.backoffLimit


@dataclass(frozen=True)
class ParallelismSpec:
    tensor: Degree = 1
    pipeline: Degree = AUTO
    data: Degree = AUTO
    partition: Partition = "adaptive"
    nic_selection: str = "auto"
    sequence_parallel: bool = False  # shard the norm regions' activations over the tensor group
    replan: ReplanSpec = field(default_factory=ReplanSpec)

    @property
    def explicit_partition(self) -> tuple[int, ...] | None:
        return self.partition if isinstance(self.partition, tuple) else None


@dataclass(frozen=True)
class SelectorRequirement:
    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        if self.operator == "Exists":
            return has
        if self.operator == "DoesNotExist":
            return not has
        if self.operator == "In":
            return has and labels[self.key] in self.values
        return not has or labels[self.key] not in self.values  # NotIn


@dataclass(frozen=True)
class LabelSelector:
    """A Kubernetes LabelSelector; all requirements must hold (an empty selector matches all)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[SelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            e.matches(labels) for e in self.match_expressions
        )

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.match_labels]
        for e in self.match_expressions:
            if e.operator == "Exists":
                parts.append(e.key)
            elif e.operator == "DoesNotExist":
                parts.append(f"!{e.key}")
            else:
                parts.append(f"{e.key} {'in' if e.operator == 'In' else 'notin'} ({','.join(e.values)})")
        return ",".join(parts) or "<all nodes>"


@dataclass(frozen=True)
class NodesSpec:
    count: int
    gpus_per_node: int
    selector: LabelSelector | None = None
    cluster_label: str = LABEL_CLUSTER
    min_count: int | None = None  # None: count (the job never runs on fewer nodes)
    scale_up: str = "atCheckpoint"  # back to count once nodes return: atCheckpoint | never

    @property
    def minimum(self) -> int:
        """The fewest nodes the job runs on (``minCount``, or ``count`` when not elastic)."""
        return self.count if self.min_count is None else self.min_count

    @property
    def elastic(self) -> bool:
        return self.minimum < self.count


@dataclass(frozen=True)
class ExitCodes:
    """A failure-policy rule's ``onExitCodes``: a container's exit code In or NotIn ``values``."""

    operator: str
    values: tuple[int, ...]
    container_name: str | None = None  # None: any container of the pod

    def matches(self, container: str, code: int) -> bool:
        if self.container_name is not None and container != self.container_name:
            return False
        return (code in self.values) == (self.operator == "In")


@dataclass(frozen=True)
class FailureRule:
    action: str  # FailJob | Ignore | Count
    on_exit_codes: ExitCodes


@dataclass(frozen=True)
class FailurePolicy:
    rules: tuple[FailureRule, ...] = ()

    def action_for(self, exits: list[tuple[str, int]]) -> FailureRule | None:
        """The first rule matching any (container, non-zero exit code) of a failed pod."""
        for rule in self.rules:
            if any(code != 0 and rule.on_exit_codes.matches(c, code) for c, code in exits):
                return rule
        return None


@dataclass(frozen=True)
class RunPolicy:
    backoff_limit: int = 3
    suspend: bool = False
    ttl_seconds_after_finished: int | None = None
    active_deadline_seconds: int | None = None
    wait_for_nodes_seconds: int = 60
    disruption_limit: int | None = None  # None: disruptions never fail the job
    failure_policy: FailurePolicy | None = None
    # queue order on a shared cluster: a number, else a PriorityClass's value, else 0
    priority: int | None = None
    priority_class_name: str | None = None


@dataclass(frozen=True, eq=True)
class JobSpec:
    model: ModelSpec
    training: TrainingSpec
    nodes: NodesSpec
    parallelism: ParallelismSpec = field(default_factory=ParallelismSpec)
    template: dict[str, Any] = field(default_factory=dict, hash=False)
    run_policy: RunPolicy = field(default_factory=RunPolicy)
    # how pods reach each other (across member clusters too): their own pod IPs (podNetwork)
    # or their node's network (hostNetwork, the usual choice on RDMA nodes)
    network: str = POD_NETWORK
    # per-island network settings: RDMA devices, SR-IOV networks, traffic class, net plugin
    islands: tuple[IslandNetwork, ...] = ()
    # which program trains the layout: Holmes' engine, or the user's own (frameworks.py)
    framework: str = DEFAULT_FRAMEWORK

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
                [f"HolmesJob manifest: must be a mapping (apiVersion, kind, spec), got {_show(obj)}"]
            )
        problems = []
        if obj.get("apiVersion") != API_VERSION:
            problems.append(f"apiVersion: must be {API_VERSION}, got {_show(obj.get('apiVersion'))}")
        if obj.get("kind") != KIND:
            problems.append(f"kind: must be {KIND}, got {_show(obj.get('kind'))}")
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
        r = _Reader()
        top = r.mapping(
            spec,
            "spec",
            required=("model", "training", "nodes"),
            optional=("parallelism", "template", "runPolicy", "network", "islands", "framework"),
        )
        if top is None:
            raise SpecError(r.problems)
        model = _model(r, top.get("model"), "spec.model")
        training = _training(r, top.get("training"), "spec.training")
        nodes = _nodes(r, top.get("nodes"), "spec.nodes")
        par = _parallelism(r, top.get("parallelism", {}), "spec.parallelism")
        template = top.get("template", {})
        if template is None:
            template = {}
        if not isinstance(template, Mapping):
            r.add(
                "spec.template", f"must be a mapping (a PodTemplateSpec-like object), got {_show(template)}"
            )
            template = {}
        run_policy = _run_policy(r, top.get("runPolicy", {}), "spec.runPolicy")
        network = r.choice(top, "network", "spec", NETWORKS, default=cls.network)
        islands = read_islands(r, top.get("islands"), "spec.islands", network)
        framework = r.choice(top, "framework", "spec", FRAMEWORKS, default=cls.framework)
        if r.problems or model is None or training is None or nodes is None:
            raise SpecError(r.problems)  # a missing section is among the problems
        job = cls(
            model=model,
            training=training,
            nodes=nodes,
            parallelism=par,
            template=dict(template),
            run_policy=run_policy,
            network=network,
            islands=islands,
            framework=framework,
        )
        problems = cross_check(job) + framework_problems(job)
        if problems:
            raise SpecError(problems)
        return job

    def to_spec(self) -> dict[str, Any]:
        """The spec back in camelCase; ``JobSpec.from_spec(job.to_spec()) == job``."""
        return _camel_mapping(self)

    def replace(self, **sections: Any) -> JobSpec:
        """A copy with whole sections swapped (``job.replace(parallelism=...)``)."""
        from dataclasses import replace

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
    world = job.world_size
    T = p.tensor
    if isinstance(T, int):
        if n.gpus_per_node % T:
            out.append(
                f"spec.parallelism.tensor: {T} must divide nodes.gpusPerNode {n.gpus_per_node} "
                f"(tensor parallelism stays inside a node)"
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


# ---- section parsers ----------------------------------------------------------------------


def _model(r: _Reader, v: Any, path: str) -> ModelSpec | None:
    d = r.mapping(
        v,
        path,
        required=("layers", "hiddenSize", "attentionHeads", "seqLength", "vocabSize"),
        optional=(
            "architecture",
            "ffnHiddenSize",
            "tiedEmbeddings",
            "kvHeads",
            "ropeTheta",
            "normEps",
            "init",
        ),
    )
    if d is None:
        return None
    norm_eps = r.number(d, "normEps", path, default=ModelSpec.norm_eps, positive=True)
    rope_theta = r.number(d, "ropeTheta", path, default=None, positive=True)
    return ModelSpec(
        layers=r.integer(d, "layers", path),
        hidden_size=r.integer(d, "hiddenSize", path),
        attention_heads=r.integer(d, "attentionHeads", path),
        seq_length=r.integer(d, "seqLength", path),
        vocab_size=r.integer(d, "vocabSize", path),
        ffn_hidden_size=r.integer(d, "ffnHiddenSize", path, default=None) or 0,
        tied_embeddings=r.boolean(d, "tiedEmbeddings", path, default=ModelSpec.tied_embeddings),
        architecture=r.choice(d, "architecture", path, ARCHITECTURES, default=ModelSpec.architecture)
        or ModelSpec.architecture,
        kv_heads=r.integer(d, "kvHeads", path, default=None) or 0,
        rope_theta=rope_theta,
        norm_eps=norm_eps if norm_eps is not None else ModelSpec.norm_eps,
        init=_init(r, d.get("init"), f"{path}.init"),
    )


def _init(r: _Reader, v: Any, path: str) -> ModelInit | None:
    if v is None:
        return None
    d = r.mapping(v, path, required=("huggingface",))
    if d is None or d.get("huggingface") is None:
        return None
    hf = r.mapping(d["huggingface"], f"{path}.huggingface", required=("path",))
    if hf is None:
        return None
    where = r.string(hf, "path", f"{path}.huggingface")
    return ModelInit(HuggingFaceSource(where)) if where else None


def _training(r: _Reader, v: Any, path: str) -> TrainingSpec | None:
    d = r.mapping(
        v,
        path,
        required=("globalBatchSize", "microBatchSize", "iterations", "learningRate"),
        optional=(
            "seed",
            "weightDecay",
            "gradClip",
            "warmupIterations",
            "decay",
            "minLearningRate",
            "betas",
            "activationRecompute",
            "data",
            "eval",
            "checkpoint",
            "gradReduceDtype",
            "fabricCheck",
        ),
    )
    if d is None:
        return None
    T = TrainingSpec  # the defaults
    return TrainingSpec(
        global_batch_size=r.integer(d, "globalBatchSize", path),
        micro_batch_size=r.integer(d, "microBatchSize", path),
        iterations=r.integer(d, "iterations", path),
        learning_rate=r.number(d, "learningRate", path, positive=True),
        seed=r.integer(d, "seed", path, default=T.seed, minimum=0),
        weight_decay=r.number(d, "weightDecay", path, default=T.weight_decay),
        grad_clip=r.number(d, "gradClip", path, default=T.grad_clip),
        warmup_iterations=r.integer(d, "warmupIterations", path, default=T.warmup_iterations, minimum=0),
        activation_recompute=r.boolean(d, "activationRecompute", path, default=T.activation_recompute),
        decay=r.choice(d, "decay", path, DECAYS, default=T.decay),
        min_learning_rate=r.number(d, "minLearningRate", path, default=T.min_learning_rate),
        betas=_betas(r, d.get("betas"), f"{path}.betas"),
        data=_data(r, d.get("data"), f"{path}.data"),
        eval=_eval(r, d.get("eval"), f"{path}.eval"),
        checkpoint=_checkpoint(r, d.get("checkpoint"), f"{path}.checkpoint"),
        grad_reduce_dtype=r.choice(
            d, "gradReduceDtype", path, tuple(GRAD_REDUCE_BYTES), default=T.grad_reduce_dtype
        ),
        fabric_check=r.choice(d, "fabricCheck", path, FABRIC_CHECKS, default=T.fabric_check),
    )


def _betas(r: _Reader, v: Any, path: str) -> tuple[float, float]:
    if v is None:
        return TrainingSpec.betas
    ok = (
        isinstance(v, (list, tuple))
        and len(v) == 2
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1 for x in v)
    )
    if not ok:
        r.add(path, f"must be two numbers in [0, 1) (Adam's beta1, beta2), e.g. [0.9, 0.95], got {_show(v)}")
        return TrainingSpec.betas
    return (float(v[0]), float(v[1]))


def _data(r: _Reader, v: Any, path: str) -> DataSpec:
    if v is None:
        return DataSpec()
    d = r.mapping(v, path, optional=("synthetic", "path", "blend"))
    if d is None:
        return DataSpec()
    if sum(k in d for k in ("synthetic", "path", "blend")) != 1:
        r.add(
            path,
            "set exactly one of synthetic: {} (random tokens), path: <token file> or "
            "blend: [{path, weight}, ...]",
        )
        return DataSpec()
    if "synthetic" in d:
        r.mapping(d["synthetic"] if d["synthetic"] is not None else {}, f"{path}.synthetic")
        return DataSpec()
    if "path" in d:
        return DataSpec(synthetic=False, path=r.string(d, "path", path))
    parts = d["blend"]
    if not isinstance(parts, (list, tuple)) or not parts:
        r.add(f"{path}.blend", f"must be a non-empty list of {{path, weight}}, got {_show(parts)}")
        return DataSpec()
    blend = []
    for i, part in enumerate(parts):
        p = f"{path}.blend[{i}]"
        pd = r.mapping(part, p, required=("path", "weight"))
        if pd is None:
            continue
        where, weight = r.string(pd, "path", p), r.number(pd, "weight", p, positive=True)
        if where and weight:
            blend.append(BlendPart(where, weight))
    return DataSpec(synthetic=False, blend=tuple(blend))


def _eval(r: _Reader, v: Any, path: str) -> EvalSpec | None:
    if v is None:
        return None
    d = r.mapping(v, path, required=("data", "intervalIterations"), optional=("windows",))
    if d is None or d.get("data") is None:
        return None
    data = r.mapping(d["data"], f"{path}.data", required=("path",))
    where = r.string(data, "path", f"{path}.data") if data is not None else None
    interval = r.integer(d, "intervalIterations", path)
    windows = r.integer(d, "windows", path, default=None)
    if where is None or interval is None:
        return None
    return EvalSpec(path=where, interval_iterations=interval, windows=windows)


def _checkpoint(r: _Reader, v: Any, path: str) -> CheckpointSpec | None:
    if v is None:
        return None
    d = r.mapping(v, path, required=("path", "intervalIterations"), optional=("onPreemption",))
    if d is None:
        return None
    return CheckpointSpec(
        path=r.string(d, "path", path),
        interval_iterations=r.integer(d, "intervalIterations", path),
        on_preemption=r.boolean(d, "onPreemption", path, default=CheckpointSpec.on_preemption),
    )


def _parallelism(r: _Reader, v: Any, path: str) -> ParallelismSpec:
    if v is None:
        v = {}
    d = r.mapping(
        v,
        path,
        optional=("tensor", "pipeline", "data", "partition", "nicSelection", "sequenceParallel", "replan"),
    )
    if d is None:
        return ParallelismSpec()
    P = ParallelismSpec  # the defaults
    partition = _partition(r, d.get("partition", P.partition), f"{path}.partition")
    return ParallelismSpec(
        tensor=r.degree(d, "tensor", path, default=P.tensor),
        pipeline=r.degree(d, "pipeline", path, default=P.pipeline),
        data=r.degree(d, "data", path, default=P.data),
        partition=partition,
        nic_selection=r.choice(d, "nicSelection", path, NIC_SELECTION_MODES, default=P.nic_selection),
        sequence_parallel=r.boolean(d, "sequenceParallel", path, default=P.sequence_parallel),
        replan=_replan(r, d.get("replan"), f"{path}.replan", partition),
    )


def _replan(r: _Reader, v: Any, path: str, partition: Partition) -> ReplanSpec:
    """parallelism.replan: on by default for partition adaptive (the only mode whose layer
    split the planner may change), refused for a fixed one."""
    adaptive = partition == "adaptive"
    d = r.mapping(v or {}, path, optional=("enabled", "threshold", "maxReplans"))
    if d is None:
        return ReplanSpec(enabled=adaptive)
    enabled = r.boolean(d, "enabled", path, default=adaptive)
    if enabled and not adaptive:
        r.add(
            f"{path}.enabled",
            "re-planning changes the layer split: it needs partition: adaptive (set enabled: false, "
            "or partition: adaptive)",
        )
    threshold = r.number(d, "threshold", path, default=ReplanSpec.threshold, positive=True)
    return ReplanSpec(
        enabled=bool(enabled),
        threshold=ReplanSpec.threshold if threshold is None else threshold,
        max_replans=r.integer(d, "maxReplans", path, default=ReplanSpec.max_replans, minimum=0),
    )


def _partition(r: _Reader, v: Any, path: str) -> Partition:
    if isinstance(v, str) and v in PARTITION_MODES:
        return v
    if isinstance(v, (list, tuple)):
        if not v:
            r.add(path, "an explicit partition needs one layer count per stage, got an empty list")
            return "adaptive"
        bad = [i for i, x in enumerate(v) if not _is_int(x) or x < 1]
        for i in bad:
            r.add(f"{path}[{i}]", f"must be a positive integer (layers of stage {i}), got {_show(v[i])}")
        return tuple(v) if not bad else "adaptive"
    r.add(path, f"must be adaptive, uniform or a list of layer counts per stage, got {_show(v)}")
    return "adaptive"


def _nodes(r: _Reader, v: Any, path: str) -> NodesSpec | None:
    d = r.mapping(
        v,
        path,
        required=("count", "gpusPerNode"),
        optional=("selector", "clusterLabel", "minCount", "scaleUp"),
    )
    if d is None:
        return None
    return NodesSpec(
        count=r.integer(d, "count", path),
        gpus_per_node=r.integer(d, "gpusPerNode", path),
        selector=_selector(r, d.get("selector"), f"{path}.selector"),
        cluster_label=r.string(d, "clusterLabel", path, default=NodesSpec.cluster_label),
        min_count=r.integer(d, "minCount", path, default=None),
        scale_up=r.choice(d, "scaleUp", path, SCALE_UP_MODES, default=NodesSpec.scale_up),
    )


def _selector(r: _Reader, v: Any, path: str) -> LabelSelector | None:
    if v is None:
        return None
    d = r.mapping(v, path, optional=("matchLabels", "matchExpressions"))
    if d is None:
        return None
    labels: list[tuple[str, str]] = []
    ml = d.get("matchLabels") or {}
    if not isinstance(ml, Mapping):
        r.add(f"{path}.matchLabels", f"must be a mapping of label to value, got {_show(ml)}")
    else:
        for k, val in ml.items():
            if not isinstance(k, str) or not isinstance(val, str):
                r.add(
                    f"{path}.matchLabels.{k}",
                    f"label values must be strings (quote them in YAML), got {_show(val)}",
                )
            else:
                labels.append((k, val))
    exprs: list[SelectorRequirement] = []
    me = d.get("matchExpressions") or []
    if not isinstance(me, (list, tuple)):
        r.add(f"{path}.matchExpressions", f"must be a list of {{key, operator, values}}, got {_show(me)}")
        me = []
    for i, e in enumerate(me):
        p = f"{path}.matchExpressions[{i}]"
        ed = r.mapping(e, p, required=("key", "operator"), optional=("values",))
        if ed is None:
            continue
        key = r.string(ed, "key", p)
        op = r.choice(ed, "operator", p, SELECTOR_OPERATORS)
        vals = ed.get("values") or []
        if not isinstance(vals, (list, tuple)) or not all(isinstance(x, str) for x in vals):
            r.add(f"{p}.values", f"must be a list of strings, got {_show(vals)}")
            vals = []
        if op in ("In", "NotIn") and not vals:
            r.add(f"{p}.values", f"operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and vals:
            r.add(f"{p}.values", f"operator {op} takes no values")
        exprs.append(SelectorRequirement(key=key, operator=op, values=tuple(vals)))
    return LabelSelector(match_labels=tuple(sorted(labels)), match_expressions=tuple(exprs))


def _run_policy(r: _Reader, v: Any, path: str) -> RunPolicy:
    if v is None:
        v = {}
    d = r.mapping(
        v,
        path,
        optional=(
            "backoffLimit",
            "suspend",
            "ttlSecondsAfterFinished",
            "activeDeadlineSeconds",
            "waitForNodesSeconds",
            "disruptionLimit",
            "failurePolicy",
            "priority",
            "priorityClassName",
        ),
    )
    if d is None:
        return RunPolicy()
    return RunPolicy(
        backoff_limit=r.integer(d, "backoffLimit", path, default=RunPolicy.backoff_limit, minimum=0),
        suspend=r.boolean(d, "suspend", path, default=RunPolicy.suspend),
        ttl_seconds_after_finished=r.integer(d, "ttlSecondsAfterFinished", path, default=None, minimum=0),
        active_deadline_seconds=r.integer(d, "activeDeadlineSeconds", path, default=None),
        wait_for_nodes_seconds=r.integer(
            d, "waitForNodesSeconds", path, default=RunPolicy.wait_for_nodes_seconds, minimum=0
        ),
        disruption_limit=r.integer(d, "disruptionLimit", path, default=None, minimum=0),
        failure_policy=_failure_policy(r, d.get("failurePolicy"), f"{path}.failurePolicy"),
        priority=r.integer(d, "priority", path, default=None, minimum=-(2**31)),
        priority_class_name=r.string(d, "priorityClassName", path, default=None),
    )


def _failure_policy(r: _Reader, v: Any, path: str) -> FailurePolicy | None:
    if v is None:
        return None
    d = r.mapping(v, path, required=("rules",))
    if d is None or d.get("rules") is None:
        return None
    rules = d["rules"]
    if not isinstance(rules, (list, tuple)):
        r.add(f"{path}.rules", f"must be a list of {{action, onExitCodes}}, got {_show(rules)}")
        return None
    out: list[FailureRule] = []
    for i, rule in enumerate(rules):
        p = f"{path}.rules[{i}]"
        rd = r.mapping(rule, p, required=("action", "onExitCodes"))
        if rd is None:
            continue
        action = r.choice(rd, "action", p, FAILURE_ACTIONS)
        ep = f"{p}.onExitCodes"
        if rd.get("onExitCodes") is None:
            continue  # reported by mapping()
        ed = r.mapping(rd["onExitCodes"], ep, required=("operator", "values"), optional=("containerName",))
        if ed is None:
            continue
        op = r.choice(ed, "operator", ep, EXIT_CODE_OPERATORS)
        container = r.string(ed, "containerName", ep, default=None)
        vals = ed.get("values")
        if not isinstance(vals, (list, tuple)) or not vals or not all(_is_int(x) for x in vals):
            r.add(f"{ep}.values", f"must be a non-empty list of integer exit codes, got {_show(vals)}")
            continue
        if len(set(vals)) != len(vals):
            r.add(f"{ep}.values", f"lists an exit code twice: {list(vals)}")
        if op == "In" and 0 in vals:
            r.add(f"{ep}.values", "0 is success, not a failure: remove it (operator In)")
        if any(x < 0 or x > 255 for x in vals):
            r.add(f"{ep}.values", f"exit codes are 0..255, got {list(vals)}")
        if action is not None and op is not None:
            out.append(FailureRule(action, ExitCodes(op, tuple(sorted(set(vals))), container)))
    return FailurePolicy(tuple(out))


# ---- field readers that collect problems instead of stopping at the first ------------------

_REQUIRED = object()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _show(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, Mapping):
        return "a mapping"
    if isinstance(v, (list, tuple)):
        return "a list"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class _Reader:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, path: str, what: str) -> None:
        self.problems.append(f"{path}: {what}")

    def mapping(
        self, v: Any, path: str, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()
    ) -> Mapping[str, Any] | None:
        if not isinstance(v, Mapping):
            self.add(path, f"must be a mapping, got {_show(v)}")
            return None
        allowed = set(required) | set(optional)
        unknown = sorted(str(k) for k in v if k not in allowed)
        if unknown:
            known = ", ".join(list(required) + list(optional)) or "no fields"
            self.add(
                path,
                f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                f"(known: {known}); remove or fix the spelling",
            )
        for k in required:
            if v.get(k) is None:
                self.add(f"{path}.{k}", "required field is missing")
        return v

    def _get(self, d: Mapping[str, Any], key: str, default: Any) -> Any:
        v = d.get(key)
        if v is None:
            return _REQUIRED if default is _REQUIRED else default
        return v

    def integer(
        self, d: Mapping[str, Any], key: str, path: str, default: Any = _REQUIRED, minimum: int = 1
    ) -> Any:
        v = self._get(d, key, default)
        if v is _REQUIRED:
            return None  # reported by mapping()
        if v is None and default is None:
            return None
        if not _is_int(v) or v < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            hint = (
                " (a string: remove the quotes)"
                if isinstance(v, str) and v.strip().lstrip("-").isdigit()
                else ""
            )
            self.add(f"{path}.{key}", f"must be {kind}, got {_show(v)}{hint}")
            return None
        return v

    def number(
        self, d: Mapping[str, Any], key: str, path: str, default: Any = _REQUIRED, positive: bool = False
    ) -> Any:
        v = self._get(d, key, default)
        if v is _REQUIRED or (v is None and default is None):
            return None
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0 or (positive and v == 0):
            hint = ""
            if isinstance(v, str):
                try:
                    float(v)
                    hint = " (a string: YAML 1.1 reads 3e-4 as text, write 3.0e-4)"
                except ValueError:
                    pass
            self.add(
                f"{path}.{key}",
                f"must be a {'positive' if positive else 'non-negative'} number, got {_show(v)}{hint}",
            )
            return None
        return float(v)

    def boolean(self, d: Mapping[str, Any], key: str, path: str, default: Any = _REQUIRED) -> Any:
        v = self._get(d, key, default)
        if v is _REQUIRED:
            return None
        if not isinstance(v, bool):
            self.add(f"{path}.{key}", f"must be true or false, got {_show(v)}")
            return None
        return v

    def string(self, d: Mapping[str, Any], key: str, path: str, default: Any = _REQUIRED) -> Any:
        v = self._get(d, key, default)
        if v is _REQUIRED or (v is None and default is None):
            return None
        if not isinstance(v, str) or not v:
            self.add(f"{path}.{key}", f"must be a non-empty string, got {_show(v)}")
            return None
        return v

    def choice(
        self, d: Mapping[str, Any], key: str, path: str, options: tuple[str, ...], default: Any = _REQUIRED
    ) -> Any:
        v = self._get(d, key, default)
        if v is _REQUIRED:
            return None
        if v not in options:
            hint = ""
            if isinstance(v, bool) and "off" in options:  # YAML 1.1 reads a bare off/no as false
                hint = ' (YAML reads a bare off as false: write "off" in quotes)'
            self.add(f"{path}.{key}", f"must be one of {', '.join(options)}, got {_show(v)}{hint}")
            return None
        return v

    def degree(self, d: Mapping[str, Any], key: str, path: str, default: Degree) -> Any:
        v = self._get(d, key, default)
        if v == AUTO:
            return AUTO
        if not _is_int(v) or v < 1:
            self.add(f"{path}.{key}", f'must be a positive integer or "auto", got {_show(v)}')
            return None
        return v


# ---- back to camelCase --------------------------------------------------------------------


def camel(name: str) -> str:
    """snake_case field name -> the camelCase key of the manifest (and of the cost-model file)."""
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def _to_camel(obj: Any) -> Any:
    if is_dataclass(obj):
        return _camel_mapping(obj)
    if isinstance(obj, (tuple, list)):
        return [_to_camel(x) for x in obj]
    return obj


def _camel_mapping(obj: Any) -> dict[str, Any]:
    """One of the dataclasses above as its camelCase mapping."""
    if isinstance(obj, LabelSelector):
        out: dict[str, Any] = {}
        if obj.match_labels:
            out["matchLabels"] = dict(obj.match_labels)
        if obj.match_expressions:
            out["matchExpressions"] = [
                {"key": e.key, "operator": e.operator, **({"values": list(e.values)} if e.values else {})}
                for e in obj.match_expressions
            ]
        return out
    if isinstance(obj, DataSpec):
        if obj.blend:
            return {"blend": [{"path": b.path, "weight": b.weight} for b in obj.blend]}
        return {"synthetic": {}} if obj.synthetic else {"path": obj.path}
    if isinstance(obj, EvalSpec):
        return {
            "data": {"path": obj.path},
            "intervalIterations": obj.interval_iterations,
            **({"windows": obj.windows} if obj.windows is not None else {}),
        }
    if isinstance(obj, JobSpec):
        return {
            "model": _to_camel(obj.model),
            "training": _to_camel(obj.training),
            "parallelism": _to_camel(obj.parallelism),
            "nodes": _to_camel(obj.nodes),
            "template": dict(obj.template),
            "runPolicy": _to_camel(obj.run_policy),
            **({"network": obj.network} if obj.network != JobSpec.network else {}),
            **({"islands": _to_camel(obj.islands)} if obj.islands else {}),
            **({"framework": obj.framework} if obj.framework != JobSpec.framework else {}),
        }
    return {
        camel(f.name): _to_camel(getattr(obj, f.name))
        for f in fields(obj)
        if getattr(obj, f.name) is not None
    }
