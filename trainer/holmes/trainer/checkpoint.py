"""Sharded checkpoints with torch.distributed.checkpoint (DCP), readable under any layout.

``<path>/iter_00000042/`` holds one DCP checkpoint. Every tensor is stored under a GLOBAL name
as (chunks of) one logical global tensor, so nothing in it depends on the layout that wrote it:

- ``model.<global name>``: the weights (replicated across DP ranks: DCP writes each once; a
  tensor-parallel slice is a DTensor shard of the global tensor over its tp group; GPT's fused
  QKV is stored [3, h, h] so each slice is one regular shard, models/sharding.py). The last
  stage's copy of a tied embedding is not written: it is the embedding (the first stage writes
  it) and loads from it.
- ``optim.<global name>.{master,exp_avg,exp_avg_sq}``: the fp32 master weights and AdamW's
  moments, in the parameter's stored global shape. A DP rank's ZeRO-1 shard covers a contiguous
  range of each of its parameters' (tp-local, flattened) elements; that range is written as at
  most a few rectangular chunks of the global tensor (:func:`flat_chunks`), so each element is
  written once by the rank that owns it, padding never, and no rank ever holds more than its
  own shard. A replicated parameter under tensor parallelism is written by tp rank 0; the tied
  copy not at all. ``optim.step``: the optimizer's step count (Adam's bias correction).
- ``rng.cpu.rank<r>`` (and ``rng.cuda.rank<r>``): each rank's RNG state.

Loading under another layout (pipeline degree and split, data degree, tensor degree, nodes,
micro-batches): each rank asks DCP for exactly the chunks it now owns; DCP intersects them with
the chunks in the checkpoint's metadata and reads only the saved chunks that overlap (one at a
time). RNG states are restored only under the same layout (a rank's stream belongs to its
place in it); Holmes' models have no dropout and draw nothing from the global RNG while
training, so that changes no number. The data position is the iteration: data.py draws the
global batch of iteration i from the sample stream whatever the layout, so the marker's
iteration (and ``consumedSamples``) restore it exactly, provided the global batch size is the
same; another model or global batch size or optimizer is refused naming the difference
(:func:`check_resume`).

Rank 0 writes ``holmes.json`` last, after every rank has finished (a temporary name, fsynced,
renamed): a directory without it, or with one that does not parse, is incomplete and is never
resumed from. Its ``format`` is 2; a checkpoint without ``format`` (per-bucket optimizer shards
``optim.stage<s>[.tp<t>].dp<d>.bucket<k>.*``, stage-local weight names) resumes only under the
layout that wrote it, and is refused under another naming that layout. The model weights alone
(``load_model``: evaluate, export) load from either format under any layout.
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


def _differences(mine: dict[str, Any], theirs: dict[str, Any], prefix: str) -> list[str]:
    keys = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
    return [f"{prefix}{k} is {mine.get(k)!r} here, {theirs.get(k)!r} there" for k in keys]


def check_model(path: str, model_shape: dict[str, Any]) -> dict[str, Any]:
    """The marker of checkpoint directory ``path``, after checking it holds this model."""
    meta = _read_marker(path)
    if meta is None:
        raise CheckpointError(f"checkpoint {path} has no readable {MARKER}: it is incomplete")
    theirs = meta.get("model")
    if theirs is not None and theirs != model_shape:
        raise CheckpointError(
            f"checkpoint {path} holds another model: "
            + ", ".join(_differences(model_shape, theirs, "spec.model."))
        )
    return meta


_LABELS = {
    "globalBatchSize": "spec.training.globalBatchSize",
    "optimizer": "the optimizer (HOLMES_OPTIMIZER)",
}


def check_resume(
    path: str, model_shape: dict[str, Any], training: dict[str, Any], layout: dict[str, Any]
) -> dict[str, Any]:
    """The marker of checkpoint ``path`` after checking this run can continue it exactly: the
    same model, and the same ``training`` values (globalBatchSize: the data position and the
    step count continue only with it; optimizer: its state). The layout may differ, except for
    a checkpoint of format 1, which resumes only under the layout that wrote it."""
    meta = check_model(path, model_shape)
    diff = [
        f"{_LABELS.get(k, k)} is {v!r} here, {meta[k]!r} there"
        for k, v in training.items()
        if k in meta and meta[k] != v
    ]
    if diff:
        raise CheckpointError(
            f"checkpoint {path} cannot be continued exactly by this run: {'; '.join(diff)}. Resume "
            "with the values it was written with, or start in a new checkpoint directory "
            "(spec.training.checkpoint.path)"
        )
    if meta.get("format", 1) == 1 and meta.get("layout") != layout:
        raise CheckpointError(
            f"checkpoint {path} was written by an older Holmes trainer whose optimizer state "
            f"depends on the layout ({meta.get('layout')!r}); this run has {layout!r}. Resume it "
            "under that layout once (its next checkpoint is layout-independent), or start in a "
            "new checkpoint directory"
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


def dp_owners(sizes: list[tuple[str, int]], data: int) -> dict[str, int]:
    """Which data-parallel rank of a stage writes each of its parameters (``sizes``: name and
    bytes, the same list on every data-parallel rank): the largest first, each to the rank with
    the fewest bytes so far (ties: the lowest). Every rank holds the stage's weights whole;
    DCP would write each once anyway, but only after every rank staged all of them."""
    load = [0] * data
    out: dict[str, int] = {}
    for name, n in sorted(sizes, key=lambda x: (-x[1], x[0])):
        d = min(range(data), key=lambda r: (load[r], r))
        out[name] = d
        load[d] += n
    return out


def model_tensors(
    module: nn.Module,
    *,
    global_names: bool = True,
    saved: dict[str, torch.Size] | None = None,
    tied_copy: bool = True,
    share: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """A stage's parameters for DCP, keyed ``model.<name>``: under their global names (a tied
    copy as the embedding) or, for a checkpoint of format 1, their own. ``tied_copy=False``
    leaves the last stage's copy of a tied embedding out (saving: the first stage writes it).
    ``share`` (saving): (this rank's data-parallel index, data) keeps only the parameters that
    rank writes (:func:`dp_owners`), so a rank stages 1/D of the stage's weights, not all."""
    from .model import TIED_COPY, global_name

    tp = getattr(module, "tp", None) or TensorParallel()
    named = [(n, p) for n, p in module.named_parameters() if not (n == TIED_COPY and not tied_copy)]
    if share is not None:
        owners = dp_owners([(n, p.numel() * p.element_size()) for n, p in named], share[1])
        named = [(n, p) for n, p in named if owners[n] == share[0]]
    out: dict[str, Any] = {}
    for name, p in named:
        g = global_name(name)
        key = f"model.{g if global_names else name}"
        out[key] = global_tensor(g, p.data, tp, (saved or {}).get(key))
    return out


FORMAT = 2  # holmes.json "format": optimizer state under global names (1: per bucket, no field)
OPT_STATES = ("master", "exp_avg", "exp_avg_sq")


class Chunks(torch.Tensor):
    """This rank's chunks of one global tensor, for DCP only: ``pieces`` are (offsets, tensor)
    with each tensor a view of memory this rank owns. DCP writes each chunk at its offsets in
    the logical tensor (validating that all ranks' chunks tile it exactly) and, on load, fills
    each from whichever saved chunks overlap it: DCP's resharding, with chunks of any shape
    (torch's DTensor allows only regular shards; ShardedTensor needs every rank's metadata).
    Implements DCP's checkpointable protocol; any other use is an error."""

    @staticmethod
    def __new__(cls, size: tuple[int, ...], pieces: list[tuple[tuple[int, ...], torch.Tensor]]) -> Chunks:
        first = pieces[0][1]
        r = torch.Tensor._make_wrapper_subclass(cls, torch.Size(size), dtype=first.dtype, device=first.device)
        r._pieces = [(torch.Size(o), t) for o, t in pieces]
        return r

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        raise RuntimeError(f"checkpoint.Chunks holds chunks for DCP only; {func} is not supported")

    def __create_write_items__(self, fqn: str, obj: Any) -> list[Any]:
        from torch.distributed.checkpoint.metadata import (
            ChunkStorageMetadata,
            MetadataIndex,
            TensorProperties,
        )
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

        return [
            WriteItem(
                index=MetadataIndex(fqn, o),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(o, t.size()),
                    properties=TensorProperties.create_from_tensor(t),
                    size=self.size(),
                ),
            )
            for o, t in self._pieces
        ]

    def __create_chunk_list__(self) -> list[Any]:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        return [ChunkStorageMetadata(o, t.size()) for o, t in self._pieces]

    def __get_tensor_shard__(self, index: Any) -> torch.Tensor:
        for o, t in self._pieces:
            if o == index.offset:
                return t
        raise ValueError(f"checkpoint.Chunks: no chunk at {index}")


def flat_chunks(
    name: str, local_shape: torch.Size | tuple[int, ...], tp: TensorParallel, lo: int, hi: int
) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """Elements [lo, hi) of this rank's flattened (tensor-parallel) slice of parameter ``name``
    (global name) as rectangular chunks of its stored global tensor: (start within [lo, hi),
    offsets, sizes), each contiguous in the slice. A range is a partial first row, whole rows
    and a partial last row; whole rows are cut where a fused parameter's blocks meet (GPT's QKV,
    stored [3, h, h]); rows and columns are moved to where this rank's slice sits in the global
    tensor (models/sharding.py: dim 0 splits rows, dim 1 columns)."""
    if len(local_shape) not in (1, 2):
        raise ValueError(f"{name}: only 1-D and 2-D parameters are supported, not {tuple(local_shape)}")
    split = sharding.split_of(name)
    two_d = len(local_shape) == 2
    rows, cols = local_shape[0], (local_shape[1] if two_d else 1)
    rects = []
    r0, c0 = divmod(lo, cols)
    r1, c1 = divmod(hi, cols)
    if r0 == r1:
        rects.append((r0, r0 + 1, c0, c1))
    else:
        if c0:
            rects.append((r0, r0 + 1, c0, cols))
            r0 += 1
        if r1 > r0:
            rects.append((r0, r1, 0, cols))
        if c1:
            rects.append((r1, r1 + 1, 0, c1))
    parts = split.parts if split is not None else 1
    block = rows // parts  # local rows per fused block
    out = []
    for a, b, ca, cb in rects:
        for k in range(a // block, (b - 1) // block + 1):
            ra, rb = max(a, k * block), min(b, (k + 1) * block)
            row, col = ra - k * block, ca
            if split is not None and split.dim == 0:
                row += tp.rank * block
            elif split is not None and split.dim == 1:
                col += tp.rank * cols
            offsets = ([k] if parts > 1 else []) + [row] + ([col] if two_d else [])
            sizes = ([1] if parts > 1 else []) + [rb - ra] + ([cb - ca] if two_d else [])
            out.append((ra * cols + ca - lo, tuple(offsets), tuple(sizes)))
    return out


def stored_global_shape(
    name: str, local_shape: torch.Size | tuple[int, ...], tp: TensorParallel
) -> tuple[int, ...]:
    """The stored shape of parameter ``name``'s global tensor, from this rank's slice's shape."""
    split = sharding.split_of(name)
    full = list(local_shape)
    if split is not None:
        full[split.dim] *= tp.size
    return sharding.stored_shape(name, full)


def optimizer_tensors(opt: Any, tp: TensorParallel, *, saving: bool) -> dict[str, Any]:
    """This rank's optimizer state for DCP under global names (module docstring): its shard's
    pieces of each parameter as :class:`Chunks` of ``optim.<global name>.<state>``, views of the
    shard itself (nothing is copied), and ``optim.step``. ``saving``: leave out what another
    rank writes (the tied copy; replicated parameters on tp ranks > 0)."""
    from .model import TIED_COPY, global_name

    pieces: dict[str, list[tuple[tuple[int, ...], torch.Tensor]]] = {}
    sizes: dict[str, tuple[int, ...]] = {}
    for i, b, lo, hi, at in opt.shard_pieces():
        name = opt.names[i]
        g = global_name(name)
        if saving and (name == TIED_COPY or (tp.rank > 0 and sharding.split_of(g) is None)):
            continue
        shape = opt.params[i].shape
        chunks = flat_chunks(g, shape, tp, lo, hi)
        for kind, buf in opt.shard_states(b).items():
            key = f"optim.{g}.{kind}"
            sizes[key] = stored_global_shape(g, shape, tp)
            for start, offsets, size in chunks:
                n = 1
                for d in size:
                    n *= d
                pieces.setdefault(key, []).append((offsets, buf[at + start : at + start + n].view(size)))
    out: dict[str, Any] = {k: Chunks(sizes[k], v) for k, v in pieces.items()}
    out["optim.step"] = torch.tensor(opt.step_count, dtype=torch.long)
    return out


def staging_size(module: nn.Module, opt: Any, tp: TensorParallel, share: tuple[int, int]) -> int:
    """Bytes of what this rank writes (model_tensors with ``share``, optimizer_tensors saving),
    from the local tensors' sizes alone (no DTensor or Chunks is built: the dry run counts it
    under fake tensors): the asynchronous checkpoint's staging buffer without its alignment
    and RNG state (holmes.contract.host_memory)."""
    from .model import TIED_COPY, global_name

    named = [(n, p) for n, p in module.named_parameters() if n != TIED_COPY]
    owners = dp_owners([(n, p.numel() * p.element_size()) for n, p in named], share[1])
    total = sum(p.numel() * p.element_size() for n, p in named if owners[n] == share[0])
    for i, b, lo, hi, _ in opt.shard_pieces():
        name = opt.names[i]
        if name == TIED_COPY or (tp.rank > 0 and sharding.split_of(global_name(name)) is None):
            continue
        total += sum((hi - lo) * t.element_size() for t in opt.shard_states(b).values())
    return total + 8  # optim.step


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
        write_marker(path, iteration, meta)
    dist.barrier(group=group)
    return path


def write_marker(path: str, iteration: int, meta: dict[str, Any]) -> None:
    """Publish checkpoint directory ``path`` as complete (rank 0, once every rank has written)."""
    tmp = os.path.join(path, MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"iteration": iteration, **meta}, f)
        f.flush()
        os.fsync(f.fileno())  # the data before the rename that publishes it
    os.replace(tmp, os.path.join(path, MARKER))


def load(path: str, state: dict[str, Any], group: Any = None) -> None:
    """Collective over ``group``: fill ``state``'s tensors (plain, DTensor or :class:`Chunks`)
    in place from checkpoint directory ``path``, reading only the saved chunks they overlap. A
    key the checkpoint lacks fails on every rank (DCP gathers each rank's planning errors)."""
    dcp.load(state, checkpoint_id=path, process_group=group)


def restore_rng(state: dict[str, Any], rank: int) -> None:
    if f"rng.cpu.rank{rank}" in state:
        torch.set_rng_state(state[f"rng.cpu.rank{rank}"])
    if f"rng.cuda.rank{rank}" in state:
        torch.cuda.set_rng_state(state[f"rng.cuda.rank{rank}"])
