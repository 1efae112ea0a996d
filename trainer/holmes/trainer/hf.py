"""Hugging Face checkpoints in and out: names, config.json, safetensors shards.

In: ``spec.model.init.huggingface.path`` is a directory as ``save_pretrained`` writes a Llama
model (``config.json`` and ``*.safetensors``, one file or shards with
``model.safetensors.index.json``). :func:`check_config` compares config.json with the job's
model and names every field that differs; :func:`load_stage` fills one pipeline stage's
parameters tensor by tensor through ``safe_open`` (memory-mapped, read straight onto the
parameter's device), so a rank reads only its own layers and never holds the model on the host.

Out: :func:`hf_config` and :func:`write_shards` write what ``from_pretrained`` loads:
``LlamaForCausalLM`` for ``llama``, ``GPT2LMHeadModel`` for ``gpt`` (GPT-2's Conv1D keeps its
matrices transposed, [in, out]; its fused c_attn has Q, K, V in the order ours has).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from holmes.contract import ModelSpec

from .model import global_name
from .models import sharding

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"

# (our name pattern, Hugging Face name, transposed): per architecture, the whole vocabulary.
_LLAMA = [
    (r"embedding\.tok\.weight", "model.embed_tokens.weight", False),
    (r"layers\.(\d+)\.ln1\.weight", r"model.layers.\1.input_layernorm.weight", False),
    (r"layers\.(\d+)\.ln2\.weight", r"model.layers.\1.post_attention_layernorm.weight", False),
    (r"layers\.(\d+)\.attn\.(q|k|v)\.weight", r"model.layers.\1.self_attn.\2_proj.weight", False),
    (r"layers\.(\d+)\.attn\.proj\.weight", r"model.layers.\1.self_attn.o_proj.weight", False),
    (r"layers\.(\d+)\.mlp\.(gate|up)\.weight", r"model.layers.\1.mlp.\2_proj.weight", False),
    (r"layers\.(\d+)\.mlp\.proj\.weight", r"model.layers.\1.mlp.down_proj.weight", False),
    (r"head\.norm\.weight", "model.norm.weight", False),
    (r"head\.out\.weight", "lm_head.weight", False),
]
_GPT = [
    (r"embedding\.tok\.weight", "transformer.wte.weight", False),
    (r"embedding\.pos\.weight", "transformer.wpe.weight", False),
    (r"layers\.(\d+)\.ln(1|2)\.(weight|bias)", r"transformer.h.\1.ln_\2.\3", False),
    (r"layers\.(\d+)\.attn\.qkv\.weight", r"transformer.h.\1.attn.c_attn.weight", True),
    (r"layers\.(\d+)\.attn\.qkv\.bias", r"transformer.h.\1.attn.c_attn.bias", False),
    (r"layers\.(\d+)\.attn\.proj\.weight", r"transformer.h.\1.attn.c_proj.weight", True),
    (r"layers\.(\d+)\.attn\.proj\.bias", r"transformer.h.\1.attn.c_proj.bias", False),
    (r"layers\.(\d+)\.mlp\.fc\.weight", r"transformer.h.\1.mlp.c_fc.weight", True),
    (r"layers\.(\d+)\.mlp\.fc\.bias", r"transformer.h.\1.mlp.c_fc.bias", False),
    (r"layers\.(\d+)\.mlp\.proj\.weight", r"transformer.h.\1.mlp.c_proj.weight", True),
    (r"layers\.(\d+)\.mlp\.proj\.bias", r"transformer.h.\1.mlp.c_proj.bias", False),
    (r"head\.norm\.(weight|bias)", r"transformer.ln_f.\1", False),
    (r"head\.out\.weight", "lm_head.weight", False),
]
_NAMES = {"llama": _LLAMA, "gpt": _GPT}


class HuggingFaceError(ValueError):
    """A Hugging Face directory that does not hold this job's model; says what differs."""


def hf_name(cfg: ModelSpec, name: str) -> tuple[str, bool]:
    """Our parameter name -> (its Hugging Face name, whether the matrix is stored transposed)."""
    name = global_name(name)
    for pattern, repl, transposed in _NAMES[cfg.architecture]:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, repl, name), transposed
    raise KeyError(f"no Hugging Face name for parameter {name!r} of a {cfg.architecture} model")


# ---- config.json ---------------------------------------------------------------------------


def read_config(path: str) -> dict[str, Any]:
    where = os.path.join(path, CONFIG)
    try:
        with open(where) as f:
            conf = json.load(f)
    except FileNotFoundError:
        raise HuggingFaceError(
            f"spec.model.init.huggingface.path: {path} has no {CONFIG}; give the directory "
            "save_pretrained wrote (config.json and *.safetensors)"
        ) from None
    except (OSError, ValueError) as e:
        raise HuggingFaceError(f"spec.model.init.huggingface.path: cannot read {where}: {e}") from None
    if not isinstance(conf, dict):
        raise HuggingFaceError(f"{where}: not a JSON object")
    return conf


def _rope(conf: dict[str, Any]) -> tuple[Any, Any]:
    """(rope_theta, rope type) from either transformers 4 (rope_theta, rope_scaling) or 5
    (rope_parameters) spelling."""
    params = conf.get("rope_parameters") or {}
    scaling = conf.get("rope_scaling") or {}
    theta = params.get("rope_theta", conf.get("rope_theta", 10000.0))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return theta, kind


def check_config(cfg: ModelSpec, conf: dict[str, Any], where: str) -> None:
    """Raise HuggingFaceError naming every spec.model field that config.json contradicts."""
    if cfg.architecture != "llama" or conf.get("model_type") != "llama":
        raise HuggingFaceError(
            f"spec.model.architecture: {cfg.architecture}, but {where} has model_type "
            f"{conf.get('model_type')!r}; init.huggingface loads llama models"
        )
    assert cfg.rope_theta is not None, "ModelSpec sets rope_theta for every llama model"
    heads = conf.get("num_attention_heads")
    theta, rope_type = _rope(conf)
    pairs = [
        ("layers", cfg.layers, "num_hidden_layers", conf.get("num_hidden_layers")),
        ("hiddenSize", cfg.hidden_size, "hidden_size", conf.get("hidden_size")),
        ("attentionHeads", cfg.attention_heads, "num_attention_heads", heads),
        ("kvHeads", cfg.kv_heads, "num_key_value_heads", conf.get("num_key_value_heads", heads)),
        ("ffnHiddenSize", cfg.ffn_hidden_size, "intermediate_size", conf.get("intermediate_size")),
        ("vocabSize", cfg.vocab_size, "vocab_size", conf.get("vocab_size")),
        (
            "tiedEmbeddings",
            cfg.tied_embeddings,
            "tie_word_embeddings",
            conf.get("tie_word_embeddings", False),
        ),
    ]
    problems = [
        f"spec.model.{field}: {ours!r} but {where} has {key} {theirs!r}"
        for field, ours, key, theirs in pairs
        if ours != theirs
    ]
    for field, ours, key, theirs in (
        ("normEps", cfg.norm_eps, "rms_norm_eps", conf.get("rms_norm_eps", 1e-6)),
        ("ropeTheta", cfg.rope_theta, "rope_theta", theta),
    ):
        if not isinstance(theirs, (int, float)) or abs(ours - theirs) > 1e-9 * max(abs(theirs), 1e-30):
            problems.append(f"spec.model.{field}: {ours!r} but {where} has {key} {theirs!r}")
    if conf.get("max_position_embeddings", cfg.seq_length) < cfg.seq_length:
        problems.append(
            f"spec.model.seqLength: {cfg.seq_length} exceeds {where}'s max_position_embeddings "
            f"{conf['max_position_embeddings']}"
        )
    if conf.get("head_dim") not in (None, cfg.head_dim):
        problems.append(
            f"spec.model.hiddenSize: hiddenSize/attentionHeads = {cfg.head_dim} but {where} has "
            f"head_dim {conf['head_dim']}; the trainer needs head_dim = hidden_size/num_attention_heads"
        )
    unsupported = [
        f"hidden_act {conf.get('hidden_act')!r} (the trainer runs silu)"
        if conf.get("hidden_act", "silu") != "silu"
        else "",
        "attention_bias: true" if conf.get("attention_bias") else "",
        "mlp_bias: true" if conf.get("mlp_bias") else "",
        f"rope type {rope_type!r} (the trainer runs default RoPE)" if rope_type != "default" else "",
    ]
    problems += [f"{where}: {u} is not supported" for u in unsupported if u]
    if problems:
        raise HuggingFaceError(
            "the Hugging Face model does not match spec.model:\n" + "\n".join(f"  - {p}" for p in problems)
        )


def hf_config(cfg: ModelSpec, dtype: torch.dtype) -> dict[str, Any]:
    """config.json for the exported model (transformers 4 and 5 both read it)."""
    dtype_name = str(dtype).removeprefix("torch.")
    if cfg.architecture == "llama":
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.ffn_hidden_size,
            "num_hidden_layers": cfg.layers,
            "num_attention_heads": cfg.attention_heads,
            "num_key_value_heads": cfg.kv_heads,
            "head_dim": cfg.head_dim,
            "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.seq_length,
            "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": cfg.tied_embeddings,
            "torch_dtype": dtype_name,
            "dtype": dtype_name,
        }
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_embd": cfg.hidden_size,
        "n_layer": cfg.layers,
        "n_head": cfg.attention_heads,
        "n_inner": cfg.ffn_hidden_size,
        "n_positions": cfg.seq_length,
        "vocab_size": cfg.vocab_size,
        "activation_function": "gelu_new",  # GELU, tanh approximation: what models/gpt.py runs
        "layer_norm_epsilon": cfg.norm_eps,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "tie_word_embeddings": cfg.tied_embeddings,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
    }


# ---- reading -------------------------------------------------------------------------------


def _where_each_tensor(path: str) -> dict[str, str]:
    """Hugging Face tensor name -> the safetensors file holding it."""
    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        return {name: os.path.join(path, file) for name, file in weight_map.items()}
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise HuggingFaceError(f"spec.model.init.huggingface.path: {path} holds no *.safetensors file")
    out: dict[str, str] = {}
    for file in files:
        with safe_open(os.path.join(path, file), framework="pt") as f:
            out.update({name: os.path.join(path, file) for name in f.keys()})
    return out


@torch.no_grad()
def load_stage(module: nn.Module, cfg: ModelSpec, path: str) -> int:
    """Fill every parameter of ``module`` (one stage, this rank's tensor-parallel slice) from the
    directory; returns the tensors read. Each is read on its own, and of a split one only this
    rank's rows or columns (``get_slice``), straight onto the parameter's device."""
    from safetensors import safe_open

    check_config(cfg, read_config(path), os.path.join(path, CONFIG))
    where = _where_each_tensor(path)
    tp = getattr(module, "tp", None)
    handles: dict[str, Any] = {}
    count = 0
    for name, p in module.named_parameters():
        theirs, transposed = hf_name(cfg, name)
        file = where.get(theirs)
        if file is None:
            raise HuggingFaceError(
                f"{path}: no tensor {theirs} (for {global_name(name)}) in its safetensors files"
            )
        if file not in handles:
            handles[file] = safe_open(file, framework="pt", device=str(p.device))
        t = _read_slice(handles[file], theirs, global_name(name), transposed, tp)
        if tuple(t.shape) != tuple(p.shape):
            full = (
                "" if tp is None or tp.size == 1 else f" (this rank's slice of tensor parallelism {tp.size})"
            )
            raise HuggingFaceError(
                f"{file}: {theirs} has shape {list(handles[file].get_slice(theirs).get_shape())} but "
                f"spec.model gives {global_name(name)} shape {list(p.shape)}{full}"
            )
        p.copy_(t)
        count += 1
    return count


def _read_slice(f: Any, theirs: str, ours: str, transposed: bool, tp: Any) -> torch.Tensor:
    """Our rank's part of tensor ``theirs`` (models/sharding.py), in our orientation."""
    split = sharding.split_of(ours)
    if tp is None or tp.size == 1 or split is None:
        t = f.get_tensor(theirs)
        return t.t() if transposed else t
    sl = f.get_slice(theirs)
    dim = 1 - split.dim if transposed else split.dim
    extent = sl.get_shape()[dim]
    if extent % (tp.size * split.parts):
        return f.get_tensor(theirs)  # a shape that cannot be ours: reported by the caller
    pieces = [
        sl[a:b] if dim == 0 else sl[:, a:b] for a, b in sharding.ranges(extent, split, tp.size, tp.rank)
    ]
    t = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=dim)
    return t.t() if transposed else t


# ---- writing -------------------------------------------------------------------------------


def write_shards(
    out: str, tensors: Iterable[tuple[str, torch.Tensor]], config: dict[str, Any], max_shard_bytes: int
) -> list[str]:
    """Write (Hugging Face name, tensor) pairs as safetensors shards of at most max_shard_bytes
    (one tensor may exceed it alone), with an index when there is more than one, and
    config.json. ``tensors`` may be a generator: at most one shard is held at a time."""
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    written: list[tuple[str, list[str]]] = []
    total = 0

    def flush(shard: dict[str, torch.Tensor]) -> None:
        tmp = os.path.join(out, f".shard-{len(written):05d}.safetensors")
        save_file(shard, tmp, metadata={"format": "pt"})
        written.append((tmp, list(shard)))

    for shard in _shards(tensors, max_shard_bytes):
        total += sum(t.numel() * t.element_size() for t in shard.values())
        flush(shard)
    n = len(written)
    names = (
        ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    )
    weight_map = {}
    for (tmp, keys), name in zip(written, names):
        os.replace(tmp, os.path.join(out, name))
        weight_map.update({k: name for k in keys})
    if n > 1:
        with open(os.path.join(out, INDEX), "w") as f:
            json.dump(
                {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                f,
                indent=2,
            )
    with open(os.path.join(out, CONFIG), "w") as f:
        json.dump(config, f, indent=2)
    return names


def _shards(
    tensors: Iterable[tuple[str, torch.Tensor]], max_shard_bytes: int
) -> Iterator[dict[str, torch.Tensor]]:
    shard: dict[str, torch.Tensor] = {}
    size = 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if shard and size + nbytes > max_shard_bytes:
            yield shard
            shard, size = {}, 0
        shard[name] = t.contiguous()
        size += nbytes
    if shard:
        yield shard
