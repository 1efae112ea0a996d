"""One file per architecture (``spec.model.architecture``). Each gives the three parts a
pipeline stage is built from: ``Embedding(cfg, tp)``, ``Block(cfg, tp)`` and ``Norm(cfg)`` (the
final norm before the LM head); model.py assembles stages from them whatever the architecture.
``tp`` is the rank's tensor-parallel slice: sharding.py says which slice of each parameter it
holds, parallel.py has the split layers.

Parameter names inside a block are shared where the role is the same (``ln1``, ``ln2``,
``attn.proj`` and ``mlp.proj`` for the residual outputs), so initialisation and weight decay
rules read the same for every architecture; hf.py maps them to Hugging Face names.
"""

from __future__ import annotations

from types import ModuleType

from holmes.contract import ModelSpec

from . import gpt, llama

ARCHITECTURES: dict[str, ModuleType] = {"gpt": gpt, "llama": llama}


def architecture(cfg: ModelSpec) -> ModuleType:
    return ARCHITECTURES[cfg.architecture]  # the spec parser allows only these names
