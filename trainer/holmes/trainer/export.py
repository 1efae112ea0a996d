"""Export a checkpoint's weights in Hugging Face format.

    python -m holmes.trainer.export --job JOB --layout LAYOUT --checkpoint DIR --out HFDIR

One process, no torchrun, no GPU. ``DIR`` is training.checkpoint.path (its newest complete
checkpoint) or one checkpoint directory in it; ``LAYOUT`` is any Layout of the job's model (the
weights are stored under global names, so the one they were written under does not matter).
Writes ``config.json`` and safetensors shards (``--max-shard-gib``, default 2) that
``LlamaForCausalLM.from_pretrained`` (architecture llama) or ``GPT2LMHeadModel.from_pretrained``
(gpt) loads, in the dtype the checkpoint holds unless ``--dtype`` says otherwise. The checkpoint
is read a shard at a time: the host never holds more than about two shards.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator

import torch
import torch.distributed.checkpoint as dcp

from holmes.contract import Layout, ModelSpec

from . import checkpoint, hf
from .config import TrainConfig
from .model import StageModule


def checkpoint_dtype(path: str, key: str) -> torch.dtype:
    meta = dcp.FileSystemReader(path).read_metadata()
    entry = meta.state_dict_metadata.get(key)
    if entry is None:
        raise checkpoint.CheckpointError(
            f"checkpoint {path} has no {key}: it was not written by this trainer"
        )
    return entry.properties.dtype


def exported_tensors(
    path: str, model: ModelSpec, stored: torch.dtype, dtype: torch.dtype | None, max_shard_bytes: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) in model order, read from the checkpoint (which holds them in
    ``stored``) a group at a time."""
    with torch.device("meta"):
        shapes = StageModule(model, 0, model.layers, True, True)
    group: dict[str, torch.Tensor] = {}
    size = 0

    def flush() -> Iterator[tuple[str, torch.Tensor]]:
        checkpoint.load_tensors(path, group)
        for name, t in group.items():
            theirs, transposed = hf.hf_name(model, name)
            t = t.t().contiguous() if transposed else t
            yield theirs, t.to(dtype) if dtype is not None else t

    for name, p in shapes.named_parameters():  # a tied head is the embedding: listed once
        t = torch.empty(p.shape, dtype=stored)
        group[name] = t
        size += t.numel() * t.element_size()
        if size >= max_shard_bytes:
            yield from flush()
            group, size = {}, 0
    if group:
        yield from flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m holmes.trainer.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--job", required=True, help="HolmesJob manifest (YAML) or its spec")
    ap.add_argument("--layout", required=True, help="a Layout JSON of the job's model")
    ap.add_argument("--checkpoint", required=True, help="training.checkpoint.path, or one checkpoint in it")
    ap.add_argument("--out", required=True, help="directory to write config.json and *.safetensors to")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: as stored")
    ap.add_argument("--max-shard-gib", type=float, default=2.0)
    a = ap.parse_args(argv)
    try:
        cfg = TrainConfig.from_job(a.job)
        with open(a.layout) as f:
            cfg.check_model_layout(Layout.from_json(f.read()))
        path = checkpoint.resolve(a.checkpoint)
        checkpoint.check_model(path, cfg.model.shape())
        dtype = getattr(torch, a.dtype) if a.dtype else None
        stored = checkpoint_dtype(path, "model.embedding.tok.weight")
        out_dtype = dtype or stored
        budget = int(a.max_shard_gib * 2**30)
        files = hf.write_shards(
            a.out,
            exported_tensors(path, cfg.model, stored, dtype, budget),
            hf.hf_config(cfg.model, out_dtype),
            budget,
        )
    except (OSError, ValueError, RuntimeError) as e:
        print(f"holmes.trainer.export: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": a.out, "checkpoint": path, "files": files, "dtype": str(out_dtype)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
