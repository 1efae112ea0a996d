"""Sharded checkpoints with torch.distributed.checkpoint (DCP).

``<path>/iter_00000042/`` holds one DCP checkpoint: model tensors under their global names
(replicated across DP ranks, so DCP writes each once), this rank's optimizer shards under
``optim.stage<s>.dp<d>.*``, and each rank's RNG state. Rank 0 writes ``holmes.json`` last,
after every rank has finished (written to a temporary name, fsynced, renamed): a directory
without it, or with one that does not parse, is incomplete and is never resumed from.
The data position is the iteration number (data.py draws batches by iteration), so
restoring the iteration restores the data stream exactly.

Model tensors are whole global tensors whatever the tensor-parallel degree: a rank's slice is
saved as a DTensor shard of the global tensor over its tp group (``model_tensors``), so DCP
stores offsets into one logical tensor, and a fused parameter's blocks (GPT's QKV) get a
dimension of their own so each slice is one regular shard (models/sharding.py). Checkpoints
written before tensor parallelism (QKV stored flat) still load with tensor 1.

The optimizer shards depend on the layout (pipeline/data/tensor degrees, stage split,
micro-batching), so a checkpoint resumes only under the same layout; a different one is refused
by name. The model weights alone (``load_model``: evaluate, export) load under any layout,
tensor degree included, since their names are global; the marker records the model's shape so
another model's checkpoint is refused naming the field that differs.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from .models import sharding
from .tensor_parallel import TensorParallel

MARKER = "holmes.json"
_DIR = re.compile(r"^iter_(\d{8})$")


class CheckpointError(RuntimeError):
    pass


def iteration_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:08d}")


def _read_marker(path: str) -> dict[str, Any] | None:
    """The marker of a checkpoint directory, or None when it is missing or does not parse."""
    try:
        with open(os.path.join(path, MARKER)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def newest_complete(root: str | None) -> int | None:
    """The iteration of the newest checkpoint whose marker exists and parses, or None."""
    if not root or not os.path.isdir(root):
        return None
    done = [
        int(m.group(1))
        for name in os.listdir(root)
        if (m := _DIR.match(name)) and _read_marker(os.path.join(root, name)) is not None
    ]
    return max(done) if done else None


def resolve(path: str) -> str:
    """A checkpoint argument -> one complete checkpoint directory: ``path`` itself when it is one
    (it has a readable marker), else the newest complete one inside it."""
    if _read_marker(path) is not None:
        return path
    newest = newest_complete(path)
    if newest is None:
        what = "does not exist" if not os.path.exists(path) else "holds no complete checkpoint"
        raise CheckpointError(
            f"checkpoint {path} {what}: give training.checkpoint.path or one iter_NNNNNNNN directory "
            f"in it that has {MARKER}"
        )
    return iteration_dir(path, newest)


def check_model(path: str, model_shape: dict[str, Any]) -> dict[str, Any]:
    """The marker of checkpoint directory ``path``, after checking it holds this model."""
    meta = _read_marker(path)
    if meta is None:
        raise CheckpointError(f"checkpoint {path} has no readable {MARKER}: it is incomplete")
    theirs = meta.get("model")
    if theirs is not None and theirs != model_shape:
        diff = sorted(k for k in set(theirs) | set(model_shape) if theirs.get(k) != model_shape.get(k))
        raise CheckpointError(
            f"checkpoint {path} holds another model: "
            + ", ".join(f"spec.model.{k} is {model_shape.get(k)!r} there {theirs.get(k)!r}" for k in diff)
        )
    return meta


def saved_sizes(path: str) -> dict[str, torch.Size]:
    """Each tensor's global size in checkpoint directory ``path`` (its DCP metadata)."""
    meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    return {k: v.size for k, v in meta.items() if hasattr(v, "size")}


_MESHES: dict[int, Any] = {}


def _mesh(tp: TensorParallel, device: torch.device) -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    group, mesh = _MESHES.get(id(tp.group), (None, None))
    if group is not tp.group:  # the group is kept with its mesh, so its id is never reused
        mesh = DeviceMesh.from_group(tp.group, device.type)
        _MESHES[id(tp.group)] = (tp.group, mesh)
    return mesh


def global_tensor(name: str, local: torch.Tensor, tp: TensorParallel, saved: torch.Size | None = None) -> Any:
    """What DCP saves or loads for parameter ``name`` (its global name) whose slice this rank
    holds as ``local``: the local tensor itself when replicated (DCP writes it once), else a
    view of it as a shard of the global tensor in its stored shape. ``saved``: the size the
    checkpoint holds it in, when loading (a pre-tensor-parallel QKV is stored flat)."""
    split = sharding.split_of(name)
    if split is None:
        return local
    full = list(local.shape)
    full[split.dim] *= tp.size
    stored = sharding.stored_shape(name, full)
    if tp.size == 1:
        return local if saved is not None and tuple(saved) == tuple(full) else local.view(stored)
    if saved is not None and tuple(saved) != stored:
        raise CheckpointError(
            f"the checkpoint holds {name} as {list(saved)}, which tensor parallelism cannot "
            "slice: load it with parallelism.tensor 1 and save it again"
        )
    from torch.distributed.tensor import DTensor, Shard

    dim = split.dim + (1 if split.parts > 1 else 0)
    strides = torch.empty(stored, device="meta").stride()
    view = local.view(sharding.stored_shape(name, local.shape))
    return DTensor.from_local(
        view, _mesh(tp, local.device), [Shard(dim)], run_check=False, shape=torch.Size(stored), stride=strides
    )


def model_tensors(
    module: nn.Module, *, global_names: bool, saved: dict[str, torch.Size] | None = None
) -> dict[str, Any]:
    """A stage's parameters for DCP, keyed ``model.<name>``: under their global names (a tied
    copy as the embedding: loading under any layout) or their own (training's save and resume)."""
    from .model import global_name

    tp = getattr(module, "tp", None) or TensorParallel()
    out: dict[str, Any] = {}
    for name, p in module.named_parameters():
        g = global_name(name)
        key = f"model.{g if global_names else name}"
        out[key] = global_tensor(g, p.data, tp, (saved or {}).get(key))
    return out


def load_model(path: str, module: nn.Module, group: Any = None) -> None:
    """Collective over ``group`` (or one process without torch.distributed): fill ``module``'s
    parameters (one stage, this rank's tensor-parallel slice, under any layout) in place from
    checkpoint directory ``path``; only those are read."""
    state = model_tensors(module, global_names=True, saved=saved_sizes(path))
    dcp.load(state, checkpoint_id=path, process_group=group, no_dist=not dist.is_initialized())


def load_tensors(path: str, named: dict[str, torch.Tensor]) -> None:
    """One process (export): fill whole tensors, keyed by global parameter name, in place."""
    saved = saved_sizes(path)
    state = {
        f"model.{n}": global_tensor(n, t, TensorParallel(), saved.get(f"model.{n}")) for n, t in named.items()
    }
    dcp.load(state, checkpoint_id=path, no_dist=True)


def rng_state(rank: int) -> dict[str, torch.Tensor]:
    out = {f"rng.cpu.rank{rank}": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out[f"rng.cuda.rank{rank}"] = torch.cuda.get_rng_state()
    return out


def save(
    root: str, iteration: int, state: dict[str, Any], rank: int, meta: dict[str, Any], group: Any = None
) -> str:
    """Collective over ``group`` (the world group, on the Layout's worldNet): every rank calls it
    with its own state; returns the directory."""
    path = iteration_dir(root, iteration)
    dcp.save(state, checkpoint_id=path, process_group=group)
    dist.barrier(group=group)
    if rank == 0:
        tmp = os.path.join(path, MARKER + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"iteration": iteration, **meta}, f)
            f.flush()
            os.fsync(f.fileno())  # the data before the rename that publishes it
        os.replace(tmp, os.path.join(path, MARKER))
    dist.barrier(group=group)
    return path


def load(
    root: str, iteration: int, state: dict[str, Any], expect_meta: dict[str, Any], group: Any = None
) -> dict[str, Any]:
    """Collective over ``group``: fill ``state``'s tensors in place from the checkpoint; returns
    its marker."""
    path = iteration_dir(root, iteration)
    meta = _read_marker(path)
    if meta is None:
        raise CheckpointError(f"checkpoint {path} has no readable {MARKER}: it is incomplete")
    for key, want in expect_meta.items():
        if meta.get(key) != want:
            raise CheckpointError(
                f"checkpoint {path} was written with {key}={meta.get(key)!r} but this run "
                f"has {key}={want!r}; resume with the same layout, or start in a new "
                "checkpoint directory"
            )
    dcp.load(state, checkpoint_id=path, process_group=group)
    return meta


def restore_rng(state: dict[str, Any], rank: int) -> None:
    if f"rng.cpu.rank{rank}" in state:
        torch.set_rng_state(state[f"rng.cpu.rank{rank}"])
    if f"rng.cuda.rank{rank}" in state:
        torch.cuda.set_rng_state(state[f"rng.cuda.rank{rank}"])
