"""DeepSpeed pipelines cut at the Layout's stages (``spec.framework: deepspeed``).

``deepspeed.runtime.pipe.PipelineModule`` partitions its layer list only ``uniform``, by
``parameters`` or by ``type:<regex>`` (balanced counts of matching layers; Megatron-DeepSpeed
hard-codes ``type:transformer``): none of them gives stage s exactly the planner's layer count.
This module replaces ``PipelineModule._partition_layers`` so that stage s holds the Layout's
``stages[s].layers`` transformer layers. Which entries are transformer layers: those the
program's ``type:<regex>`` matches, or every entry when the list holds exactly the model's
layers. Other entries (embedding, final norm, head) stay with the stage before the next
transformer layer: the first stage takes what leads, the last what trails.

The patch is applied when DeepSpeed's pipeline module is imported (a meta-path hook), so that
workers that never import DeepSpeed pay nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

PIPE_MODULE = "deepspeed.runtime.pipe.module"
ENV_FRAMEWORK = "HOLMES_FRAMEWORK"


class StageError(ValueError):
    """The program's pipeline cannot take the Layout's stages; the message says why."""


def stage_bounds(is_layer: Sequence[bool], counts: Sequence[int]) -> list[int]:
    """DeepSpeed's ``parts`` (P + 1 indices into the layer list) giving stage s ``counts[s]``
    transformer layers (``is_layer[i]``: entry i is one)."""
    positions = [i for i, x in enumerate(is_layer) if x]
    if len(positions) != sum(counts):
        raise StageError(
            f"the pipeline holds {len(positions)} transformer layers but the Layout's stages hold "
            f"{sum(counts)} ({'+'.join(map(str, counts))}): spec.model.layers must be the "
            "program's layer count"
        )
    parts, seen = [0], 0
    for c in counts[:-1]:
        seen += c
        parts.append(positions[seen])
    return parts + [len(is_layer)]


def layout_counts(path: str) -> list[int]:
    with open(path) as f:
        stages = json.load(f)["stages"]
    return [s["layers"][1] - s["layers"][0] for s in stages]


def patch(module: Any, counts: Sequence[int]) -> None:
    """Make ``module.PipelineModule`` partition at ``counts`` (idempotent)."""
    cls = module.PipelineModule
    if getattr(cls._partition_layers, "__holmes_hook__", False):
        return

    def _partition_layers(self, method="uniform"):
        if self.num_stages != len(counts):
            raise StageError(
                f"PipelineModule(num_stages={self.num_stages}) but the Layout plans {len(counts)} "
                "stages: build the pipeline with num_stages from the Layout (HOLMES_LAYOUT)"
            )
        method = (method or "").lower()
        if method.startswith("type:"):
            matched = set(self._find_layer_type(method.split(":", 1)[1]))
            is_layer = [i in matched for i in range(len(self._layer_specs))]
        elif len(self._layer_specs) == sum(counts):
            is_layer = [True] * len(self._layer_specs)
        else:
            raise StageError(
                f"PipelineModule(partition_method={method!r}) over {len(self._layer_specs)} entries: "
                f"Holmes cannot tell which are the model's {sum(counts)} transformer layers; use "
                "partition_method='type:<your block class name>'"
            )
        self.parts = stage_bounds(is_layer, counts)
        stage_id = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])

    setattr(_partition_layers, "__holmes_hook__", True)  # noqa: B010 (a marker on a function)
    cls._partition_layers = _partition_layers


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, counts: Sequence[int]):
        self.counts = list(counts)

    def find_spec(self, name, path, target=None):
        if name != PIPE_MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        load, counts = spec.loader.exec_module, self.counts

        def exec_module(module):
            load(module)
            patch(module, counts)

        spec.loader.exec_module = exec_module
        return spec


def install_from_env(given: Mapping[str, str] | None = None) -> bool:
    """Patch DeepSpeed (now, or when it is imported) for ``HOLMES_FRAMEWORK=deepspeed``."""
    env: Mapping[str, str] = os.environ if given is None else given
    if env.get(ENV_FRAMEWORK) != "deepspeed" or not env.get("HOLMES_LAYOUT"):
        return False
    counts = layout_counts(env["HOLMES_LAYOUT"])
    if PIPE_MODULE in sys.modules:
        patch(sys.modules[PIPE_MODULE], counts)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(counts))
    return True
