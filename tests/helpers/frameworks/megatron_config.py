"""Megatron-LM's command line as megatron-core's ``TransformerConfig``, the way Megatron-LM's
``core_transformer_config_from_args`` builds it (megatron/training/arguments.py: every
TransformerConfig field read from the argument of the same name; ``--num-experts`` is
``num_moe_experts``; ``--bf16`` sets the parameter dtype, which is also the pipeline's). The
pip package megatron-core does not ship Megatron-LM's argument parser, so flags are read here:
``--flag value``, ``--flag=value``, a bare ``--flag`` is true; the value takes the field's type."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence

RENAMED = {"num_experts": "num_moe_experts"}
# Megatron-LM's store_false flags: the flag -> the field it turns off
NEGATED = {"disable_bias_linear": "add_bias_linear"}


def parse_flags(argv: Sequence[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if not a.startswith("--"):
            continue
        name, eq, value = a[2:].partition("=")
        if not eq:
            if i < len(argv) and not argv[i].startswith("--"):
                value = argv[i]
                i += 1
            else:
                out[name.replace("-", "_")] = True
                continue
        out[name.replace("-", "_")] = value
    return out


def _typed(tp: object, value: str | bool) -> object:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if args and typing.get_origin(tp) is typing.Union else tp
    if isinstance(value, bool):
        return value
    if base is int:
        return int(value)
    if base is float:
        return float(value)
    if base is bool:
        return value.lower() in ("1", "true", "yes")
    return value


def transformer_config(argv: Sequence[str]):
    """megatron-core's TransformerConfig from Megatron-LM arguments (raises what it raises)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    flags = {RENAMED.get(k, k): v for k, v in parse_flags(argv).items()}
    flags.update({NEGATED[k]: False for k in list(flags) if k in NEGATED})
    hints = typing.get_type_hints(TransformerConfig)
    names = [f.name for f in dataclasses.fields(TransformerConfig) if f.name in flags]
    kw = {n: _typed(hints[n], flags[n]) for n in names}
    kw["params_dtype"] = kw["pipeline_dtype"] = torch.bfloat16 if flags.get("bf16") else torch.float32
    return TransformerConfig(**kw)
