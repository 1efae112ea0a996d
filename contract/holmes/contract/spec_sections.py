"""The HolmesJob spec's sections as frozen dataclasses, each field declared once: the model, its
training run, how it is split, which nodes it runs on and its run policy. One config that flows
from the manifest to the planner, the operator and the trainer (torchtitan style). Pure Python,
no third-party import. :class:`holmes.contract.jobspec.JobSpec` joins them (with network.py's
islands and podtemplate.py's pod template), reads them from a manifest and checks them across
fields.

Each field is declared once, below: its type, default, allowed values, bounds and the one-line
doc ``kubectl explain`` shows (``Annotated[type, Field(doc, ...)] = default``, see
:mod:`holmes.contract.schema`). The reader and the CRD's schema (``crds/holmesjob.yaml``,
``make crd``) are both made from these declarations; the special cases no declaration can
state are the small ``read=`` functions just above the dataclasses, and :func:`to_camel` writes
back the few whose manifest shape differs from the dataclass. How to add a field:
docs/api.md#adding-a-spec-field.

``activationRecompute`` (full recomputation: each transformer block keeps only its input and
runs its forward again in backward) defaults to true because the paper's runs and Megatron-LM
at scale use it: the planner's memory model then fits billion-parameter models at the paper's
micro-batch sizes (without it, one layer keeps ``s b h (34 + 5 a s / h)`` bytes per in-flight
micro-batch: several GiB per layer at h=4096, s=2048), and the reported TFLOPS use the paper's
formula. The price is one extra forward (~33% more compute); small models that fit without it
(the demo) should set it false. The planner, the operator and the trainer all read it from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Annotated, Any, ClassVar, Union

from .names import LABEL_CLUSTER
from .pipeline_schedules import AUTO as AUTO_SCHEDULE
from .pipeline_schedules import SCHEDULE_NAMES
from .schema import ABSENT, INVALID, PRESERVE, Field, Reader, Rule, camel, declared, is_int, show

AUTO = "auto"
PARTITION_MODES = ("adaptive", "uniform")
NIC_SELECTION_MODES = ("auto", "off")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
FABRIC_CHECKS = ("fail", "warn", "off")
ACROSS_ISLANDS_MODES = ("pipeline", "replicas", "auto")
EXCHANGE_DTYPES = ("float32", "bfloat16")
GRAD_REDUCE_BYTES = {"float32": 4, "bfloat16": 2}
ARCHITECTURES = ("gpt", "llama")
DECAYS = ("cosine", "linear", "constant")
DEFAULT_ROPE_THETA = 10000.0  # Llama 2's; Llama 3 uses 500000
SCALE_UP_MODES = ("atCheckpoint", "never")
FAILURE_ACTIONS = ("FailJob", "Ignore", "Count")  # as a Kubernetes Job's podFailurePolicy
EXIT_CODE_OPERATORS = ("In", "NotIn")


# Upper bounds of the sizes planning and training grow with, far beyond any model or cluster
# trained today (Llama 3 405B: 126 layers, hidden 16384, 128 heads, a 128k vocabulary; the
# largest clusters: about 100,000 GPUs). A value past them is a typo or a hostile spec: refused
# here and by the API server (the CRD's maximum), it never reaches the planner, whose search
# grows with layers x nodes (holmes.plan.budget bounds what stays within them).
MAX_LAYERS = 1024
MAX_HIDDEN = 131_072
MAX_HEADS = 16_384
MAX_TOKENS = 16_777_216  # sequence length, vocabulary, sequences per batch: 2^24
MAX_NODES = 65_536
MAX_GPUS_PER_NODE = 64


def llama_ffn_hidden_size(hidden: int) -> int:
    """Meta's default SwiGLU width: 2/3 of 4h (three matrices instead of two keep the
    parameters of a 4h GELU MLP), rounded up to a multiple of 256 (11008 for h=4096)."""
    return 256 * -(-int(8 * hidden / 3) // 256)


Degree = Union[int, str]  # an integer >= 1, or AUTO
Partition = Union[str, tuple[int, ...]]  # "adaptive" | "uniform" | tuple of layer counts


# ---- the special readers the declarations below name (read=); each returns the value, ABSENT
# (the default applies) or INVALID after adding a problem ------------------------------------


def _token_file(r: Reader, v: Any, path: str, _: Mapping[str, Any]) -> Any:
    """training.eval.data: the manifest nests the path one level down ({path: ...})."""
    if v is None:
        return INVALID  # required: mapping() said so
    data = r.object(TokenFile, v, path)
    return INVALID if data is INVALID else data.path


def _data(r: Reader, v: Any, path: str, _: Mapping[str, Any]) -> Any:
    """training.data: exactly one source; ``synthetic: {}`` is written as an empty mapping."""
    if v is None:
        return ABSENT
    d = r.mapping(v, path, optional=("synthetic", "path", "blend"))
    if d is None:
        return INVALID
    if sum(k in d for k in ("synthetic", "path", "blend")) != 1:
        r.add(
            path,
            "set exactly one of synthetic: {} (random tokens), path: <token file> or "
            "blend: [{path, weight}, ...]",
        )
        return INVALID
    if "synthetic" in d:
        synthetic = d["synthetic"] if d["synthetic"] is not None else {}
        return INVALID if r.mapping(synthetic, f"{path}.synthetic") is None else DataSpec()
    (f,) = [f for f in declared(DataSpec) if f.key in d]
    value = r.value(f.type, f.spec, d[f.key], f"{path}.{f.key}")
    return INVALID if value is INVALID else DataSpec(synthetic=False, **{f.name: value})


def _betas(r: Reader, v: Any, path: str, _: Mapping[str, Any]) -> Any:
    if v is None:
        return ABSENT
    ok = (
        isinstance(v, (list, tuple))
        and len(v) == 2
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1 for x in v)
    )
    if not ok:
        r.add(path, f"must be two numbers in [0, 1) (Adam's beta1, beta2), e.g. [0.9, 0.95], got {show(v)}")
        return INVALID
    return (float(v[0]), float(v[1]))


def _partition(r: Reader, v: Any, path: str, _: Mapping[str, Any]) -> Any:
    if v is None:
        return ABSENT
    if isinstance(v, str) and v in PARTITION_MODES:
        return v
    if isinstance(v, (list, tuple)):
        if not v:
            r.add(path, "an explicit partition needs one layer count per stage, got an empty list")
            return INVALID
        bad = [i for i, x in enumerate(v) if not is_int(x) or x < 1]
        for i in bad:
            r.add(f"{path}[{i}]", f"must be a positive integer (layers of stage {i}), got {show(v[i])}")
        return tuple(v) if not bad else INVALID
    r.add(path, f"must be adaptive, uniform or a list of layer counts per stage, got {show(v)}")
    return INVALID


def _replan(r: Reader, v: Any, path: str, siblings: Mapping[str, Any]) -> Any:
    """parallelism.replan: on by default for partition adaptive (the only mode whose layer
    split the planner may change), refused for a fixed one."""
    adaptive = siblings.get("partition", ParallelismSpec.partition) == "adaptive"
    replan = r.object(ReplanSpec, v if v is not None else {}, path, defaults={"enabled": adaptive})
    if replan is not INVALID and replan.enabled and not adaptive:
        r.add(
            f"{path}.enabled",
            "re-planning changes the layer split: it needs partition: adaptive (set enabled: false, "
            "or partition: adaptive)",
        )
    return replan


def _match_labels(r: Reader, v: Any, path: str, _: Mapping[str, Any]) -> Any:
    if not v:
        return ABSENT
    if not isinstance(v, Mapping):
        r.add(path, f"must be a mapping of label to value, got {show(v)}")
        return INVALID
    bad = [(k, x) for k, x in v.items() if not isinstance(k, str) or not isinstance(x, str)]
    for k, x in bad:
        r.add(f"{path}.{k}", f"label values must be strings (quote them in YAML), got {show(x)}")
    return INVALID if bad else tuple(sorted(v.items()))


def _selector_values(r: Reader, v: Any, path: str, siblings: Mapping[str, Any]) -> Any:
    """A requirement's values: any strings (an empty label value too), as many as its operator
    takes."""
    values = v or []
    if not isinstance(values, (list, tuple)) or not all(isinstance(x, str) for x in values):
        r.add(path, f"must be a list of strings, got {show(values)}")
        return INVALID
    op = siblings.get("operator")
    if op in ("In", "NotIn") and not values:
        r.add(path, f"operator {op} needs at least one value")
    if op in ("Exists", "DoesNotExist") and values:
        r.add(path, f"operator {op} takes no values")
    return tuple(values)


def _exit_codes(r: Reader, v: Any, path: str, siblings: Mapping[str, Any]) -> Any:
    if not isinstance(v, (list, tuple)) or not v or not all(is_int(x) for x in v):
        if v is not None:  # missing: mapping() said so
            r.add(path, f"must be a non-empty list of integer exit codes, got {show(v)}")
        return INVALID
    if len(set(v)) != len(v):
        r.add(path, f"lists an exit code twice: {list(v)}")
    if siblings.get("operator") == "In" and 0 in v:
        r.add(path, "0 is success, not a failure: remove it (operator In)")
    if any(x < 0 or x > 255 for x in v):
        r.add(path, f"exit codes are 0..255, got {list(v)}")
    return tuple(sorted(set(v)))


# ---- the dataclasses: one declaration per field -------------------------------------------


@dataclass(frozen=True)
class HuggingFaceSource:
    path: Annotated[str, Field("The directory, mounted through template volumes.")]


@dataclass(frozen=True)
class ModelInit:
    """Where the weights start from (none: random, seeded by training.seed)."""

    huggingface: Annotated[
        HuggingFaceSource,
        Field(
            "A directory inside the pods as transformers' save_pretrained writes a Llama model "
            "(config.json and *.safetensors, sharded or not). config.json must match this model; "
            "each pipeline stage reads only its own layers."
        ),
    ]


@dataclass(frozen=True)
class MixtureOfExperts:
    """Every transformer layer's MLP as a mixture of experts (Mixtral, DeepSeek, Qwen3-MoE): a
    router sends each token to expertsPerToken of the experts, plus the shared experts every
    token passes through."""

    # CEL rules the API server checks (Kubernetes 1.25+); jobspec.moe_problems makes the same check
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "self.expertsPerToken <= self.experts",
            "expertsPerToken must be at most experts (a token is routed to at most every expert)",
        ),
    )

    experts: Annotated[
        int,
        Field(
            "Routed experts per layer (Megatron-LM --num-experts); the expert-parallel degree "
            "(parallelism.expert) must divide it.",
            minimum=2,
        ),
    ]
    experts_per_token: Annotated[
        int,
        Field(
            "Experts each token is routed to, the router's top-k (--moe-router-topk); at most experts.",
            minimum=1,
        ),
    ] = 2
    # 0 (not given): model.ffnHiddenSize, resolved by ModelSpec.__post_init__
    expert_hidden_size: Annotated[
        int,
        Field(
            "Feed-forward inner size of one expert (--moe-ffn-hidden-size); model.ffnHiddenSize "
            "when omitted.",
            minimum=1,
        ),
    ] = 0
    shared_experts: Annotated[
        int,
        Field(
            "Experts every token passes through besides its routed ones (DeepSeek's shared experts), "
            "each expertHiddenSize wide (--moe-shared-expert-intermediate-size = sharedExperts x "
            "expertHiddenSize).",
            minimum=0,
        ),
    ] = 0


@dataclass(frozen=True)
class ModelSpec:
    # CEL rules the API server checks (Kubernetes 1.25+); jobspec.cross_check makes the same checks
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "self.hiddenSize % self.attentionHeads == 0",
            "hiddenSize must be divisible by attentionHeads; pick a head count that divides it",
        ),
        Rule(
            "!has(self.kvHeads) || (self.architecture == 'llama' ? self.attentionHeads % self.kvHeads == 0 "
            ": self.kvHeads == self.attentionHeads)",
            "kvHeads must divide attentionHeads (llama); architecture gpt has no grouped-query attention, "
            "so its kvHeads must equal attentionHeads",
        ),
        Rule(
            "self.architecture == 'llama' || !has(self.ropeTheta)",
            "ropeTheta is for architecture llama (gpt learns its positions); remove it or use llama",
        ),
        Rule(
            "self.architecture == 'llama' || !has(self.init)",
            "init.huggingface loads llama weights only; use architecture: llama or remove init",
        ),
        Rule(
            "self.architecture != 'llama' || self.hiddenSize % self.attentionHeads != 0 || "
            "(self.hiddenSize / self.attentionHeads) % 2 == 0",
            "the head size hiddenSize/attentionHeads must be even for llama's rotary embeddings",
        ),
    )

    layers: Annotated[
        int,
        Field("Number of transformer layers; pipeline stages split these.", minimum=1, maximum=MAX_LAYERS),
    ]
    hidden_size: Annotated[
        int, Field("Hidden size h; must be divisible by attentionHeads.", minimum=1, maximum=MAX_HIDDEN)
    ]
    attention_heads: Annotated[
        int,
        Field(
            "Number of attention heads; must be divisible by parallelism.tensor.",
            minimum=1,
            maximum=MAX_HEADS,
        ),
    ]
    seq_length: Annotated[int, Field("Sequence length s in tokens.", minimum=1, maximum=MAX_TOKENS)]
    vocab_size: Annotated[
        int,
        Field("Vocabulary size V (the embedding and output layer size).", minimum=1, maximum=MAX_TOKENS),
    ]
    # 0 (not given): the architecture's default, resolved in __post_init__
    ffn_hidden_size: Annotated[
        int,
        Field(
            "Feed-forward inner size. When omitted: 4 x hiddenSize for gpt; for llama 8/3 x "
            "hiddenSize rounded up to a multiple of 256 (11008 for 4096), Meta's default.",
            minimum=1,
            maximum=8 * MAX_HIDDEN,
        ),
    ] = 0
    tied_embeddings: Annotated[
        bool,
        Field(
            "Share the input embedding with the output layer (first and last stage keep them in sync).",
            server_default=False,
        ),
    ] = False
    architecture: Annotated[
        str,
        Field(
            "gpt: GPT-2 style (learned positions, LayerNorm, GELU MLP, biases). llama: rotary "
            "position embeddings (ropeTheta), RMSNorm (normEps), SwiGLU MLP (ffnHiddenSize), "
            "grouped-query attention (kvHeads), no biases; loads and exports Hugging Face Llama "
            "weights.",
            enum=ARCHITECTURES,
        ),
    ] = "gpt"
    kv_heads: Annotated[  # 0 (not given): attention_heads (no grouping)
        int,
        Field(
            "Key/value heads (llama: grouped-query attention); must divide attentionHeads. "
            "Defaults to attentionHeads; gpt allows only that.",
            minimum=1,
            maximum=MAX_HEADS,
        ),
    ] = 0
    rope_theta: Annotated[  # llama only; None resolves to DEFAULT_ROPE_THETA there
        float | None,
        Field(
            "Base of the rotary embedding's frequencies (llama only; default 10000, Llama 3 uses 500000).",
            minimum=0,
            exclusive_minimum=True,
        ),
    ] = None
    norm_eps: Annotated[
        float,
        Field(
            "Epsilon of the LayerNorm (gpt) or RMSNorm (llama); default 1e-5.",
            minimum=0,
            exclusive_minimum=True,
            server_default=False,
        ),
    ] = 1e-5
    init: Annotated[
        ModelInit | None,
        Field(
            "Where the weights start from; omitted: random, from training.seed. A run that "
            "resumes from a checkpoint takes the checkpoint's weights instead."
        ),
    ] = None
    moe: Annotated[
        MixtureOfExperts | None,
        Field(
            "Mixture of experts in every layer's MLP; a dense model when omitted. Trained by "
            "framework megatron or torchtitan (Holmes' own engine trains dense models); the "
            "planner keeps each expert-parallel group inside one NIC island."
        ),
    ] = None

    def __post_init__(self) -> None:
        if not self.ffn_hidden_size:
            llama = self.architecture == "llama"
            ffn = llama_ffn_hidden_size(self.hidden_size) if llama else 4 * self.hidden_size
            object.__setattr__(self, "ffn_hidden_size", ffn)
        if self.moe is not None and not self.moe.expert_hidden_size:
            object.__setattr__(self, "moe", replace(self.moe, expert_hidden_size=self.ffn_hidden_size))
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
    path: Annotated[str, Field("A token file inside the pod.")]
    weight: Annotated[
        float,
        Field(
            "Relative share of the samples (weights need not sum to 1).", minimum=0, exclusive_minimum=True
        ),
    ]


@dataclass(frozen=True)
class DataSpec:
    """Read by _data (exactly one source)."""

    synthetic: Annotated[
        bool,
        Field(
            "Random tokens drawn from the seed (for benchmarks and tests); write synthetic {}.",
            schema={"type": "object", **PRESERVE},
            server_default=False,
        ),
    ] = True
    path: Annotated[
        str | None, Field("Path inside the pod of a token file, mounted through template volumes.")
    ] = None
    blend: Annotated[
        tuple[BlendPart, ...],
        Field(
            "Several token files, each drawn in proportion to its weight (to 1/1024 of the "
            "samples), deterministic and the same under every layout.",
            min_items=1,
        ),
    ] = ()


@dataclass(frozen=True)
class TokenFile:
    """The manifest's form of training.eval.data (EvalSpec holds just its path)."""

    path: Annotated[str, Field("A token file inside the pod.")]


@dataclass(frozen=True)
class EvalSpec:
    path: Annotated[  # written as data: {path: ...}
        str,
        Field(
            "The held-out tokens (a token file, as training.data.path).",
            key="data",
            schema=TokenFile,
            read=_token_file,
        ),
    ]
    interval_iterations: Annotated[int, Field("Evaluate every this many iterations.", minimum=1)]
    windows: Annotated[
        int | None, Field("Evaluate on the first this many windows only (default all of them).", minimum=1)
    ] = None


@dataclass(frozen=True)
class CheckpointSpec:
    path: Annotated[str, Field("Directory inside the pods, on a volume every pod shares (template volumes).")]
    interval_iterations: Annotated[int, Field("Save every this many iterations.", minimum=1)]
    on_preemption: Annotated[
        bool,
        Field(
            "On SIGTERM (pod deleted, evicted or preempted) the trainer ends the current "
            "iteration and saves a checkpoint before exiting, when the last save took less than "
            "what is left of the pod's terminationGracePeriodSeconds."
        ),
    ] = True
    asynchronous: Annotated[
        bool,
        Field(
            "Copy each checkpoint into host memory, then write it while training goes on (one "
            "save at a time; the marker is written once every pod has finished). false: every "
            "pod waits for the files, and needs no host memory for a copy of its state."
        ),
    ] = True


@dataclass(frozen=True)
class AcrossIslandsSpec:
    """How training crosses the slow links between islands: the paper's pipeline cut (only
    activations cross), or DiLoCo replicas that meet every innerSteps steps (trainer outer.py)."""

    # CEL rules the API server checks (Kubernetes 1.25+); jobspec.cross_check makes the same checks
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "self.fragments < 1 || self.innerSteps % self.fragments == 0",
            "fragments must divide innerSteps (every fragment is synchronized once per innerSteps)",
        ),
        Rule(
            "self.fragments < 1 || self.overlapSteps <= self.innerSteps / self.fragments",
            "overlapSteps must be at most innerSteps / fragments (one exchange in flight at a time)",
        ),
    )

    mode: Annotated[
        str,
        Field(
            "pipeline (default): one model across the islands, cut into pipeline stages where the "
            "links are slow, updated synchronously. replicas: every island trains a whole replica "
            "(its own pipeline, data and tensor parallelism) and the replicas average the change "
            "of their weights every innerSteps steps with an outer Nesterov step (DiLoCo); this "
            "changes the optimization, so it is opt-in. auto: the planner picks whichever it "
            "estimates reaches the loss sooner.",
            enum=ACROSS_ISLANDS_MODES,
        ),
    ] = "pipeline"
    inner_steps: Annotated[
        int,
        Field(
            "With replicas: optimizer steps each replica takes on its own between two "
            "synchronizations over the slow link (DiLoCo's H).",
            minimum=1,
        ),
    ] = 50
    outer_learning_rate: Annotated[
        float,
        Field(
            "With replicas: the outer step's learning rate on the replicas' averaged weight change "
            "(1 with outerMomentum 0 is plain weight averaging).",
            minimum=0,
            exclusive_minimum=True,
        ),
    ] = 0.7
    outer_momentum: Annotated[
        float,
        Field("With replicas: the outer step's Nesterov momentum (0: none).", minimum=0, maximum=0.999),
    ] = 0.9
    fragments: Annotated[
        int,
        Field(
            "With replicas: synchronize the weights in this many fragments, one every "
            "innerSteps / fragments steps (Streaming DiLoCo), so each exchange sends 1/fragments "
            "of the model; divides innerSteps.",
            minimum=1,
        ),
    ] = 1
    exchange_dtype: Annotated[
        str,
        Field(
            "With replicas: the dtype the weight changes cross the slow link in; bfloat16 halves "
            "the bytes, the outer step still runs in float32.",
            enum=EXCHANGE_DTYPES,
        ),
    ] = "float32"
    overlap_steps: Annotated[
        int,
        Field(
            "With replicas: inner steps each exchange overlaps (Streaming DiLoCo's tau). The "
            "all-reduce of a fragment's weight change starts when the fragment is due and is "
            "applied this many steps later, while training goes on; the replica then mixes the "
            "outer step's weights with its own progress since. 0 (default): synchronous, every "
            "rank waits on the link. At most innerSteps / fragments, so one exchange is in flight.",
            minimum=0,
        ),
    ] = 0


@dataclass(frozen=True)
class TrainingSpec:
    # CEL rules the API server checks (Kubernetes 1.25+); jobspec.cross_check makes the same checks
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "self.globalBatchSize % self.microBatchSize == 0",
            "globalBatchSize must be a multiple of microBatchSize",
        ),
        Rule(
            "!has(self.warmupIterations) || self.warmupIterations <= self.iterations",
            "warmupIterations must be at most iterations",
        ),
        Rule(
            "!has(self.minLearningRate) || self.minLearningRate <= self.learningRate",
            "minLearningRate must be at most learningRate (the schedule decays from one to the other)",
        ),
    )

    global_batch_size: Annotated[
        int,
        Field(
            "Sequences per iteration over all data-parallel replicas; divisible by data x microBatchSize.",
            minimum=1,
            maximum=MAX_TOKENS,
        ),
    ]
    micro_batch_size: Annotated[
        int,
        Field(
            "Sequences per micro-batch on one pipeline; the 1F1B schedule runs globalBatchSize / "
            "(data x microBatchSize) micro-batches per iteration.",
            minimum=1,
        ),
    ]
    iterations: Annotated[
        int, Field("Optimizer steps to run; the job Succeeds when all pods finish them.", minimum=1)
    ]
    learning_rate: Annotated[
        float,
        Field(
            "Peak AdamW learning rate. Write 3.0e-4, not 3e-4 (YAML 1.1 reads the latter as a string).",
            minimum=0,
            exclusive_minimum=True,
        ),
    ]
    seed: Annotated[int, Field("Seed for weight initialisation and synthetic data.", minimum=0)] = 1234
    weight_decay: Annotated[
        float, Field("AdamW weight decay (default 0.01).", minimum=0, server_default=False)
    ] = 0.01
    grad_clip: Annotated[
        float,
        Field("Global gradient-norm clip (default 1.0; 0 disables).", minimum=0, server_default=False),
    ] = 1.0
    warmup_iterations: Annotated[
        int,
        Field(
            "Linear learning-rate warm-up iterations (default 0); at most iterations.",
            minimum=0,
            server_default=False,
        ),
    ] = 0
    activation_recompute: Annotated[  # why: see the module docstring
        bool,
        Field(
            "Full activation recomputation (default true, as the paper's runs and Megatron-LM at "
            "scale): each transformer block keeps only its input and runs its forward again in "
            "backward, about 33% more compute for a fraction of the activation memory. The "
            "planner's time and memory estimate follow it, and TFLOPS/GPU are reported with the "
            "matching model-FLOPs formula (96 B s l h^2 (1 + s/6h + V/16lh) with it, 72 B s l h^2 "
            "(1 + s/6h + V/12lh) without). Set false for models that fit without it."
        ),
    ] = True
    decay: Annotated[
        str,
        Field(
            "How the learning rate falls from learningRate to minLearningRate after warm-up, over "
            "the remaining iterations.",
            enum=DECAYS,
        ),
    ] = "cosine"
    min_learning_rate: Annotated[
        float,
        Field("Where the decay ends (default 0); at most learningRate.", minimum=0, server_default=False),
    ] = 0.0
    betas: Annotated[
        tuple[float, float],
        Field(
            "AdamW's beta1 and beta2 (default [0.9, 0.95]).",
            read=_betas,
            schema={
                "type": "array",
                "minItems": 2,
                "maxItems": 2,
                "items": {"type": "number", "minimum": 0, "exclusiveMaximum": True, "maximum": 1},
            },
        ),
    ] = (0.9, 0.95)
    data: Annotated[
        DataSpec,
        Field(
            "Where tokens come from; set exactly one of synthetic, path or blend.",
            read=_data,
            server_default=False,
        ),
    ] = field(default_factory=DataSpec)
    eval: Annotated[
        EvalSpec | None,
        Field(
            "Held-out loss during training: every intervalIterations (and after the last), the "
            "mean next-token loss over consecutive non-overlapping windows of seqLength + 1 "
            "tokens of a token file, in the metrics lines and status.progress.evalLoss."
        ),
    ] = None
    checkpoint: Annotated[
        CheckpointSpec | None,
        Field("Periodic distributed checkpoints; a restarted attempt resumes from the latest one."),
    ] = None
    grad_reduce_dtype: Annotated[
        str,
        Field(
            "The dtype gradients are reduce-scattered in across each data-parallel group, and a "
            "tied embedding's gradient all-reduced in between first and last stage (default "
            "float32). bfloat16 halves those bytes, which matters on slow Socket groups; "
            "gradients still accumulate and land in fp32 for the optimizer. The planner's cost "
            "model counts the bytes it implies.",
            enum=tuple(GRAD_REDUCE_BYTES),
        ),
    ] = "float32"
    fabric_check: Annotated[
        str,
        Field(
            "What the trainer does when a pod's fabric is not what the layout planned (default "
            "warn). At start-up each rank checks that the RDMA devices, HCAs and GID index its IB "
            "groups need are in the pod, and on NCCL that each group really uses the network the "
            "layout chose (NCCL silently falls back to sockets). fail stops the job with the "
            "mismatch; warn trains on and reports it in status.progress.fabricWarnings and a "
            "FabricMismatch event; off skips it.",
            enum=FABRIC_CHECKS,
        ),
    ] = "warn"
    across_islands: Annotated[
        AcrossIslandsSpec,
        Field(
            "How training crosses the slow links between islands: pipeline stages (default) or "
            "replicas that synchronize every innerSteps steps (DiLoCo), or auto (the planner picks).",
            server_default=False,
        ),
    ] = field(default_factory=AcrossIslandsSpec)
    pipeline_schedule: Annotated[
        str,
        Field(
            "The pipeline schedule (default auto: the planner picks the fastest by its cost model "
            "and says why in holmes plan). 1F1B and GPipe run one stage per GPU; Interleaved1F1B "
            "and InterleavedZeroBubble run virtualStages chunks per GPU, looped round the "
            "pipeline (each micro-batch crosses every stage boundary, and the link from the last "
            "stage back to the first, once per chunk); ZBVZeroBubble and DualPipeV run two chunks "
            "per GPU down the pipeline and back (only neighbouring stages talk). Interleaving "
            "divides 1F1B's bubble by the chunks per GPU; the zero-bubble ones also fill it with "
            "deferred weight gradients. Each chunk stays on its GPU's island.",
            enum=(AUTO_SCHEDULE, *SCHEDULE_NAMES),
        ),
    ] = AUTO_SCHEDULE
    virtual_stages: Annotated[
        int | None,
        Field(
            "Chunks per GPU for Interleaved1F1B and InterleavedZeroBubble (default: the planner's "
            "choice, 2 to 4); ZBVZeroBubble and DualPipeV always run 2, 1F1B and GPipe 1.",
            minimum=1,
            maximum=8,
        ),
    ] = None

    @property
    def grad_reduce_bytes(self) -> int:
        return GRAD_REDUCE_BYTES[self.grad_reduce_dtype]


@dataclass(frozen=True)
class ReplanSpec:
    """Re-planning a running job from its measured stage speeds (operator core/replan.py)."""

    enabled: Annotated[  # the default when read: partition == adaptive (_replan)
        bool,
        Field(
            "On by default with partition adaptive, off otherwise (it changes the layer split, so "
            "it needs partition adaptive); also needs training.checkpoint.path.",
            server_default=False,
        ),
    ] = True
    threshold: Annotated[
        float,
        Field(
            "Re-plan when the best layout under the measured speeds is estimated faster than the "
            "running one by more than this fraction (0.1 = 10%); each further re-plan needs "
            "threshold x (1 + re-plans so far).",
            minimum=0,
            exclusive_minimum=True,
        ),
    ] = 0.1
    max_replans: Annotated[  # never counted against runPolicy.backoffLimit
        int,
        Field("At most this many re-plans per job; a layout already run is never returned to.", minimum=0),
    ] = 2


@dataclass(frozen=True)
class ParallelismSpec:
    tensor: Annotated[
        Degree,
        Field(
            "Tensor-parallel degree (Megatron-style, over NVLink): a positive integer or "
            '"auto" (the planner picks). It divides gpusPerNode (a group inside a node) or is a '
            "multiple of it (a group over whole nodes of one NVLink domain, nvidia.com/gpu.clique: "
            "GB200/GB300 NVL72; the planner refuses groups across domains), and divides "
            "attentionHeads, kvHeads, ffnHiddenSize and vocabSize (and seqLength with "
            "sequenceParallel).",
            minimum=1,
            words=(AUTO,),
        ),
    ] = 1
    pipeline: Annotated[
        Degree,
        Field(
            'Pipeline stages, a positive integer or "auto" (the planner picks, at most one per NIC '
            "island where that balances).",
            minimum=1,
            words=(AUTO,),
        ),
    ] = AUTO
    data: Annotated[
        Degree,
        Field(
            'Data-parallel degree, a positive integer or "auto" (nodes x gpusPerNode / (pipeline x tensor)).',
            minimum=1,
            words=(AUTO,),
        ),
    ] = AUTO
    expert: Annotated[
        Degree,
        Field(
            "Expert-parallel degree of a model.moe: how many data-parallel ranks of a stage split "
            'the experts between them (each group all-to-alls its tokens), or "auto" (the planner '
            "picks, keeping every group inside one NIC island and, where it fits, one node). It "
            "divides model.moe.experts and the data-parallel degree; 1 for a dense model.",
            minimum=1,
            words=(AUTO,),
        ),
    ] = AUTO
    partition: Annotated[
        Partition,
        Field(
            'Layers per stage: "adaptive" (in proportion to each stage\'s effective speed, the '
            'Holmes default), "uniform" (equal split), or a list of layer counts per stage such as '
            "[26, 22] that sums to model.layers.",
            read=_partition,
            schema=PRESERVE,
        ),
    ] = "adaptive"
    nic_selection: Annotated[
        str,
        Field(
            '"auto" forms data-parallel groups only of nodes with the same NIC kind (Holmes\' '
            'automatic NIC selection); "off" uses plain rank order like Megatron-LM, for comparison.',
            enum=NIC_SELECTION_MODES,
        ),
    ] = "auto"
    sequence_parallel: Annotated[  # shard the norm regions' activations over the tensor group
        bool,
        Field(
            "With tensor > 1, also split the sequence between the tensor-parallel matmuls: norms "
            "run on 1/tensor of the tokens and their activations take 1/tensor of the memory, for "
            "the same communication volume (all-gather + reduce-scatter instead of all-reduce)."
        ),
    ] = False
    replan: Annotated[
        ReplanSpec,
        Field(
            "Re-planning while the job runs: from the stage times the trainer measures, the "
            "operator calibrates the cost model for this job and, when another layer split or "
            "island order is estimated faster by more than threshold, restarts the gang in that "
            "layout from a checkpoint (status.adaptation, condition Replanned). Never counted "
            "against backoffLimit.",
            read=_replan,
            server_default=False,
        ),
    ] = field(default_factory=ReplanSpec)

    @property
    def explicit_partition(self) -> tuple[int, ...] | None:
        return self.partition if isinstance(self.partition, tuple) else None


@dataclass(frozen=True)
class SelectorRequirement:
    key: Annotated[str, Field("The node label key.")]
    operator: Annotated[str, Field("How the label relates to values.", enum=SELECTOR_OPERATORS)]
    values: Annotated[
        tuple[str, ...],
        Field(
            "Values for In and NotIn; empty for Exists and DoesNotExist.",
            read=_selector_values,
            schema={"type": "array", "items": {"type": "string"}},
        ),
    ] = ()

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

    match_labels: Annotated[
        tuple[tuple[str, str], ...],
        Field(
            "Node labels that must all be present with these values.",
            read=_match_labels,
            schema={"type": "object", "additionalProperties": {"type": "string"}},
        ),
    ] = ()
    match_expressions: Annotated[
        tuple[SelectorRequirement, ...], Field("Label requirements that must all hold.")
    ] = ()

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
    # a CEL rule the API server checks (Kubernetes 1.25+); jobspec.cross_check makes the same check
    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule("!has(self.minCount) || self.minCount <= self.count", "minCount must be at most count"),
    )

    count: Annotated[
        int,
        Field(
            "Number of nodes, one pod per node. The job waits (Reconciling, WaitingForNodes) until "
            "this many suitable nodes are Ready, or, with minCount below count, at most "
            "runPolicy.waitForNodesSeconds before running on fewer.",
            minimum=1,
            maximum=MAX_NODES,
        ),
    ]
    gpus_per_node: Annotated[
        int,
        Field(
            "GPUs used on each node (one process per GPU); each chosen node must have at least this "
            "many nvidia.com/gpu allocatable.",
            minimum=1,
            maximum=MAX_GPUS_PER_NODE,
        ),
    ]
    selector: Annotated[
        LabelSelector | None,
        Field("A label selector restricting the candidate nodes; all nodes when omitted."),
    ] = None
    cluster_label: Annotated[
        str,
        Field(
            "Node label naming the cluster (fabric island) a node belongs to; nodes of one cluster "
            "and one NIC kind form an island."
        ),
    ] = LABEL_CLUSTER
    min_count: Annotated[  # None: count (the job never runs on fewer nodes)
        int | None,
        Field(
            "Elastic size: the fewest nodes the job runs on (default count). When fewer than count "
            "suitable nodes are usable, the job runs on what there is (at least minCount) with the "
            "same global batch (more micro-batches per rank), and resumes from its newest "
            "checkpoint in the new layout.",
            minimum=1,
            maximum=MAX_NODES,
        ),
    ] = None
    scale_up: Annotated[
        str,
        Field(
            "When a job running below count sees nodes return: atCheckpoint relaunches it on more "
            "nodes at a checkpoint (the one its pods write as they stop with "
            "training.checkpoint.onPreemption, else right after its next periodic one); never "
            "keeps the size until the next restart.",
            enum=SCALE_UP_MODES,
        ),
    ] = "atCheckpoint"

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

    operator: Annotated[str, Field("Whether the exit code is in values or not.", enum=EXIT_CODE_OPERATORS)]
    values: Annotated[
        tuple[int, ...],
        Field(
            "Exit codes (0 is not allowed with In).",
            read=_exit_codes,
            schema={"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}},
        ),
    ]
    container_name: Annotated[  # None: any container of the pod
        str | None, Field("Only this container's exit code; any container when omitted.")
    ] = None

    def matches(self, container: str, code: int) -> bool:
        if self.container_name is not None and container != self.container_name:
            return False
        return (code in self.values) == (self.operator == "In")


@dataclass(frozen=True)
class FailureRule:
    action: Annotated[
        str,
        Field(
            "FailJob fails the job at once; Ignore restarts the gang without counting it; Count "
            "counts it against backoffLimit.",
            enum=FAILURE_ACTIONS,
        ),
    ]
    on_exit_codes: Annotated[
        ExitCodes, Field("Which exit codes of the failed pod's containers the rule matches.")
    ]


@dataclass(frozen=True)
class FailurePolicy:
    rules: Annotated[tuple[FailureRule, ...], Field("Rules in order; the first that matches decides.")]

    def action_for(self, exits: list[tuple[str, int]]) -> FailureRule | None:
        """The first rule matching any (container, non-zero exit code) of a failed pod."""
        for rule in self.rules:
            if any(code != 0 and rule.on_exit_codes.matches(c, code) for c, code in exits):
                return rule
        return None


@dataclass(frozen=True)
class RunPolicy:
    backoff_limit: Annotated[
        int,
        Field(
            "Gang restarts allowed. When any pod fails, all pods of the attempt are deleted, the "
            "layout is planned again on the nodes now available and the pods are recreated; after "
            "backoffLimit restarts the next failure fails the job (reason BackoffLimitExceeded).",
            minimum=0,
        ),
    ] = 3
    suspend: Annotated[
        bool,
        Field(
            "true deletes the pods and keeps the status (phase Suspended); false again plans anew "
            "and relaunches."
        ),
    ] = False
    ttl_seconds_after_finished: Annotated[
        int | None,
        Field(
            "Delete the HolmesJob (and through owner references its pods) this many seconds after "
            "it Succeeded or Failed; kept forever when omitted.",
            minimum=0,
            nullable=True,
        ),
    ] = None
    active_deadline_seconds: Annotated[
        int | None,
        Field(
            "Fail the job (reason DeadlineExceeded) when it has been active this long since it "
            "started or was resumed.",
            minimum=1,
            nullable=True,
        ),
    ] = None
    wait_for_nodes_seconds: Annotated[
        int,
        Field(
            "With nodes.minCount below count, how long a launch waits for count suitable nodes "
            "before running on fewer. A restart after a disruption does not wait: it runs at once "
            "on what is left.",
            minimum=0,
        ),
    ] = 60
    scheduling_timeout_seconds: Annotated[
        int,
        Field(
            "How long a pod of a launched attempt may stay unschedulable on its planned node (its "
            "PodScheduled condition False, reason Unschedulable: a resource, affinity or spread "
            "rule the scheduler refuses there) before the attempt gives its nodes back and plans "
            "again without that node, for this long; a disruption, not counted against "
            "backoffLimit. Not used for a job Kueue admits: Kueue's waitForPodsReady is its "
            "deadline.",
            minimum=1,
        ),
    ] = 120
    disruption_limit: Annotated[  # None: disruptions never fail the job
        int | None,
        Field(
            "Gang restarts allowed after disruptions (pod evicted, preempted or deleted, its node "
            "lost or NotReady, the trainer's preempted exit, code 83). These do not count "
            "against backoffLimit. Unbounded when omitted.",
            minimum=0,
            nullable=True,
        ),
    ] = None
    failure_policy: Annotated[
        FailurePolicy | None,
        Field(
            "What a failed pod's container exit codes mean, like a Kubernetes Job's "
            "podFailurePolicy. The first rule that matches a non-zero exit code of the failed pod "
            "decides; failures no rule matches count against backoffLimit."
        ),
    ] = None
    # queue order on a shared cluster: a number, else a PriorityClass's value, else 0
    priority: Annotated[
        int | None,
        Field(
            "A raw priority, only in namespaces the operator's --raw-priority-namespaces lists "
            "(elsewhere the job is Stalled, reason PolicyViolation: use priorityClassName or "
            "Kueue's WorkloadPriorityClass). Queue order on a shared cluster: among jobs waiting "
            "for capacity (reason WaitingForCapacity) a higher number plans first; equal "
            "priorities go by creation time. Wins over priorityClassName. Default 0.",
            minimum=-(2**31),
            nullable=True,
        ),
    ] = None
    priority_class_name: Annotated[
        str | None,
        Field(
            "Queue order from a PriorityClass (scheduling.k8s.io/v1), which admins own: its value "
            "is the job's priority when runPolicy.priority is not set. A class that does not "
            "exist stalls the job (reason InvalidSpec) until it is created or the field is fixed.",
            nullable=True,
        ),
    ] = None


# ---- back to camelCase --------------------------------------------------------------------


def to_camel(obj: Any) -> Any:
    """A section (or a list of them) as a manifest writes it: camelCase keys, no None."""
    if is_dataclass(obj):
        return _camel_mapping(obj)
    if isinstance(obj, (tuple, list)):
        return [to_camel(x) for x in obj]
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
    return {
        camel(f.name): to_camel(getattr(obj, f.name)) for f in fields(obj) if getattr(obj, f.name) is not None
    }
