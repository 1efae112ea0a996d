"""Parameter counts and model FLOPs of a GPT-style decoder: the one place the planner's
estimate and the trainer's reported TFLOPS/GPU and parameter count take them from. Pure Python.

Per token, forward (matmul FLOPs = 2 x multiply-adds; LayerNorm, softmax, GELU ignored):

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
"""

from __future__ import annotations

from dataclasses import dataclass

from .jobspec import ModelSpec


def layer_fwd_flops_per_token(hidden: int, ffn: int, seq: int) -> float:
    return 8 * hidden * hidden + 4 * hidden * ffn + 4 * seq * hidden


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


def formula_name(recompute: bool) -> str:
    """Which formula a TFLOPS number used, for logs and READMEs."""
    return "96Bslh^2(1+s/6h+V/16lh)" if recompute else "72Bslh^2(1+s/6h+V/12lh)"


def tflops_per_gpu(flops: float, seconds: float, world: int) -> float:
    return flops / (seconds * world * 1e12)


@dataclass(frozen=True)
class ModelCost:
    """Parameter counts and FLOPs of the GPT model, computed from its shape."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int
    tied: bool

    @classmethod
    def of(cls, m: ModelSpec) -> ModelCost:
        return cls(
            m.layers,
            m.hidden_size,
            m.attention_heads,
            m.seq_length,
            m.vocab_size,
            m.ffn_hidden_size,
            m.tied_embeddings,
        )

    @property
    def layer_params(self) -> int:
        h, f = self.hidden, self.ffn
        # QKV + proj (with biases), MLP up/down (with biases), two LayerNorms.
        return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden + self.seq * self.hidden  # token + learned positions

    @property
    def head_params(self) -> int:
        return 2 * self.hidden + (0 if self.tied else self.vocab * self.hidden)  # final LayerNorm + LM head

    @property
    def total_params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.head_params

    def layer_fwd_flops_per_token(self) -> float:
        return layer_fwd_flops_per_token(self.hidden, self.ffn, self.seq)

    def head_fwd_flops_per_token(self) -> float:
        return head_fwd_flops_per_token(self.hidden, self.vocab)

    def flops_per_iteration(self, global_batch: int, *, recompute: bool) -> float:
        """Model FLOPs of one iteration, general in ffn; for ffn = 4h the paper's
        ``96 B s l h^2 (1 + s/6h + V/16lh)`` with recomputation, ``72 ... V/12lh`` without."""
        return flops_per_iteration(
            global_batch=global_batch,
            seq=self.seq,
            layers=self.layers,
            hidden=self.hidden,
            vocab=self.vocab,
            ffn=self.ffn,
            recompute=recompute,
        )
