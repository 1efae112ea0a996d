"""Parameter counts and model FLOPs of the decoders the trainer runs (``gpt``, ``llama``): the
one place the planner's estimate and the trainer's reported TFLOPS/GPU and parameter count take
them from. Pure Python.

Per token, forward (matmul FLOPs = 2 x multiply-adds; norms, softmax, activations, rotary
embeddings ignored), for GPT:

- one transformer layer: ``8h^2`` (QKV + output projection) ``+ 4h*ffn`` (MLP up and down)
  ``+ 4sh`` (attention scores and their weighted sum) = ``24h^2 (1 + s/6h)`` when ffn = 4h;
- the LM head: ``2hV`` (the embedding lookup costs nothing).

Backward costs twice the forward. Activation recomputation runs each layer's forward once more
during backward (not the head's: its input is kept). Per iteration of B sequences of length s,
so B*s tokens and l layers, with ffn = 4h:

- with recomputation: ``B s (4 l 24h^2(1 + s/6h) + 3*2hV) = 96 B s l h^2 (1 + s/6h + V/16lh)``,
  the formula of Narayanan et al. 2021 that the Holmes paper reports TFLOPS with;
- without:            ``B s (3 l 24h^2(1 + s/6h) + 3*2hV) = 72 B s l h^2 (1 + s/6h + V/12lh)``.

Reporting with the formula that matches what ran keeps TFLOPS/GPU an honest rate of the work
done: the 96 formula on a run without recomputation would overstate it by 96/72.

Llama (SwiGLU, grouped-query attention, no biases) has other matrices, so one layer's forward is
``2 N_l + 4sh`` per token with ``N_l = 2h^2 + 2h*h_kv + 3h*ffn`` its matrix parameters (Q and the
output projection h x h each, K and V h x h_kv each with h_kv = kvHeads * h/attentionHeads, the
gate, up and down projections h x ffn each) and ``4sh`` the attention scores and weighted sum;
the head adds ``2hV``. Per iteration: ``B s (p l (2 N_l + 4sh) + 6hV)`` with p = 4 passes with
recomputation, 3 without; for GPT's N_l = 4h^2 + 2h*ffn this is exactly the formula above.

A mixture of experts (``model.moe``) replaces each layer's MLP by ``experts`` MLPs of width
``ffn_e`` (the expert hidden size) plus ``shared`` always-on ones and a router (``h x experts``).
Its parameters count every expert; its FLOPs only the ``topk + shared`` experts a token passes
through plus the router: per token and layer ``2 (A_l + R + (topk + shared) M(ffn_e)) + 4sh``
with ``A_l`` the attention's matrices, ``R = h*experts`` and ``M`` one MLP's matrices.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec_sections import ModelSpec


def layer_fwd_flops_per_token(hidden: int, ffn: int, seq: int) -> float:
    """A GPT layer (ffn-wide GELU MLP, full multi-head attention)."""
    return 8 * hidden * hidden + 4 * hidden * ffn + 4 * seq * hidden


def layer_matrix_params(architecture: str, hidden: int, ffn: int, kv_hidden: int) -> int:
    """Weights of one layer's matrix multiplies (no biases, no norms)."""
    if architecture == "llama":
        return 2 * hidden * hidden + 2 * hidden * kv_hidden + 3 * hidden * ffn
    return 4 * hidden * hidden + 2 * hidden * ffn


def attention_matrix_params(architecture: str, hidden: int, kv_hidden: int) -> int:
    if architecture == "llama":
        return 2 * hidden * hidden + 2 * hidden * kv_hidden
    return 4 * hidden * hidden


def mlp_matrix_params(architecture: str, hidden: int, ffn: int) -> int:
    """One MLP's matrices: SwiGLU's gate, up and down (llama), GELU's up and down (gpt)."""
    return (3 if architecture == "llama" else 2) * hidden * ffn


def head_fwd_flops_per_token(hidden: int, vocab: int) -> float:
    return 2 * hidden * vocab


def flops_per_iteration(
    *,
    global_batch: int,
    seq: int,
    layers: int,
    hidden: int,
    vocab: int,
    ffn: int | None = None,
    recompute: bool,
) -> float:
    """Model FLOPs of one iteration (forward, backward and, if on, the recomputed forward)."""
    ffn = 4 * hidden if ffn is None else ffn
    passes = 4 if recompute else 3  # forward + backward (2x) [+ recomputed forward]
    per_token = passes * layers * layer_fwd_flops_per_token(hidden, ffn, seq) + 3 * head_fwd_flops_per_token(
        hidden, vocab
    )
    return global_batch * seq * per_token


def paper_formula(
    *, global_batch: int, seq: int, layers: int, hidden: int, vocab: int, recompute: bool
) -> float:
    """The closed forms above (ffn = 4h): ``96 ... V/16lh`` with recomputation, ``72 ... V/12lh`` without."""
    B, s, l, h, V = global_batch, seq, layers, hidden, vocab
    if recompute:
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


def formula_name(recompute: bool, architecture: str = "gpt") -> str:
    """Which formula a TFLOPS number used, for logs and READMEs (see the module docstring)."""
    if architecture == "llama":
        passes = 4 if recompute else 3
        return f"Bs({passes}l(2(2h^2+2h*hkv+3h*ffn)+4sh)+6hV)"
    return "96Bslh^2(1+s/6h+V/16lh)" if recompute else "72Bslh^2(1+s/6h+V/12lh)"


def tflops_per_gpu(flops: float, seconds: float, world: int) -> float:
    return flops / (seconds * world * 1e12)


@dataclass(frozen=True)
class ModelCost:
    """Parameter counts and FLOPs of one model, computed from its shape and architecture."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int
    tied: bool
    architecture: str = "gpt"
    kv_heads: int = 0  # 0: heads
    experts: int = 0  # 0: a dense model (no mixture of experts)
    experts_per_token: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0

    @classmethod
    def of(cls, m: ModelSpec) -> ModelCost:
        moe = m.moe
        return cls(
            m.layers,
            m.hidden_size,
            m.attention_heads,
            m.seq_length,
            m.vocab_size,
            m.ffn_hidden_size,
            m.tied_embeddings,
            m.architecture,
            m.kv_heads,
            experts=moe.experts if moe else 0,
            experts_per_token=moe.experts_per_token if moe else 0,
            expert_ffn=moe.expert_hidden_size if moe else 0,
            shared_experts=moe.shared_experts if moe else 0,
        )

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def _mlp(self, ffn: int) -> int:
        """One MLP: matrices, and GPT's biases (ffn + h)."""
        bias = 0 if self.architecture == "llama" else ffn + self.hidden
        return mlp_matrix_params(self.architecture, self.hidden, ffn) + bias

    @property
    def expert_layer_params(self) -> int:
        """One layer's routed experts: what expert parallelism splits (0 for a dense model)."""
        return self.experts * self._mlp(self.expert_ffn) if self.moe else 0

    @property
    def router_params(self) -> int:
        return self.hidden * self.experts if self.moe else 0

    @property
    def kv_hidden(self) -> int:
        return (self.kv_heads or self.heads) * (self.hidden // self.heads)

    @property
    def layer_params(self) -> int:
        """Every parameter of one layer (a mixture of experts: every expert, shared ones, router)."""
        h, f = self.hidden, self.ffn
        if self.moe:
            attention = attention_matrix_params(self.architecture, h, self.kv_hidden)
            attention += 2 * h if self.architecture == "llama" else 4 * h + 4 * h  # norms (+ biases)
            shared = self.shared_experts * self._mlp(self.expert_ffn)
            return attention + self.router_params + shared + self.expert_layer_params
        matrices = layer_matrix_params(self.architecture, h, f, self.kv_hidden)
        if self.architecture == "llama":
            return matrices + 2 * h  # two RMSNorm weights, no biases
        return matrices + 4 * h + f + h + 4 * h  # biases: QKV 3h, proj h, MLP f + h; two LayerNorms 4h

    @property
    def embedding_params(self) -> int:
        positions = 0 if self.architecture == "llama" else self.seq * self.hidden  # RoPE learns none
        return self.vocab * self.hidden + positions

    @property
    def head_params(self) -> int:
        norm = self.hidden if self.architecture == "llama" else 2 * self.hidden  # RMSNorm | LayerNorm
        return norm + (0 if self.tied else self.vocab * self.hidden)

    @property
    def total_params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.head_params

    def layer_activation_bytes_per_token(self) -> tuple[int, int]:
        """Bytes one layer keeps for backward per token without recomputation, as (not split by
        tensor parallelism, split by it), 2-byte activations, leaving out the attention scores
        (5as per token, split): Korthikanti et al.'s 34h = 10h + 24h for GPT with ffn = 4h. GPT
        keeps both norms' and both matmul blocks' inputs (8h) and two dropout masks (2h); Q, K, V
        and the projection's input (8h) and the MLP's GELU input and output (4 ffn). Llama has no
        dropout (8h) and keeps Q and the projection's input (4h), the smaller K and V (4 h_kv) and
        the gate, up and product outputs (6 ffn).
        A mixture of experts keeps the MLP terms once per expert a token passes through
        (``topk + shared`` of width ffn_e) and the routed copies of its input and output
        (``4 topk h``: the dispatched tokens and the combined outputs)."""
        h, f = self.hidden, self.ffn
        routed = 0
        if self.moe:
            f = (self.experts_per_token + self.shared_experts) * self.expert_ffn
            routed = 4 * self.experts_per_token * h
        if self.architecture == "llama":
            return 8 * h, 4 * h + 4 * self.kv_hidden + 6 * f + routed
        return 10 * h, 8 * h + 4 * f + routed

    def layer_fwd_flops_per_token(self) -> float:
        if self.moe:
            active = self.experts_per_token + self.shared_experts
            matrices = attention_matrix_params(self.architecture, self.hidden, self.kv_hidden)
            matrices += self.router_params + active * mlp_matrix_params(
                self.architecture, self.hidden, self.expert_ffn
            )
        else:
            matrices = layer_matrix_params(self.architecture, self.hidden, self.ffn, self.kv_hidden)
        return 2 * matrices + 4 * self.seq * self.hidden

    def head_fwd_flops_per_token(self) -> float:
        return head_fwd_flops_per_token(self.hidden, self.vocab)

    def flops_per_iteration(self, global_batch: int, *, recompute: bool) -> float:
        """Model FLOPs of one iteration; for GPT with ffn = 4h the paper's
        ``96 B s l h^2 (1 + s/6h + V/16lh)`` with recomputation, ``72 ... V/12lh`` without."""
        passes = 4 if recompute else 3
        per_token = (
            passes * self.layers * self.layer_fwd_flops_per_token() + 3 * self.head_fwd_flops_per_token()
        )
        return global_batch * self.seq * per_token

    def formula_name(self, recompute: bool) -> str:
        return formula_name(recompute, self.architecture)
