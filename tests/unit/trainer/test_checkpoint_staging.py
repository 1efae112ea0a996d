"""Asynchronous checkpoints' host memory (holmes.trainer.async_checkpoint, checkpoint.py): a rank
stages only what it writes (its share of the stage's replicated weights), into one buffer of
exactly that size, pinned by registering it with CUDA rather than through torch's caching host
allocator (which rounds each pinned block up to a power of two and keeps it)."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from holmes.trainer import async_checkpoint
from holmes.trainer.async_checkpoint import HostStager, staging_offsets
from holmes.trainer.checkpoint import CheckpointError, Chunks, dp_owners


def test_each_weight_is_written_by_one_data_parallel_rank_balanced_by_bytes():
    sizes = [("embed", 800), ("a", 300), ("b", 300), ("c", 200), ("norm", 8)]
    owners = dp_owners(sizes, 2)
    assert owners == {"embed": 0, "a": 1, "b": 1, "c": 1, "norm": 0}  # a tie: the lower rank
    assert dp_owners(list(reversed(sizes)), 2) == owners  # the order each rank lists them in
    load = [sum(n for k, n in sizes if owners[k] == d) for d in range(2)]
    assert load == [808, 800]
    assert set(dp_owners(sizes, 1).values()) == {0}
    four = dp_owners(sizes, 4)
    assert sorted(four.values()) == [0, 1, 2, 3, 3]


def test_one_exact_buffer_reused_between_saves():
    stager = HostStager(pin=False)
    state = {
        "w": torch.arange(6.0).view(2, 3),
        "step": torch.tensor(7),
        "h": torch.ones(5, dtype=torch.bfloat16),
    }
    out = stager.stage(state)
    _, total = staging_offsets([24, 8, 10])
    assert stager.staged_bytes == total == 3 * async_checkpoint.ALIGN
    assert torch.equal(out["w"], state["w"]) and int(out["step"]) == 7 and torch.equal(out["h"], state["h"])
    ptr = out["w"].data_ptr()
    state["w"].add_(1)
    again = stager.stage(state)
    assert again["w"].data_ptr() == ptr and torch.equal(again["w"], state["w"])
    stager.close()
    assert stager.staged_bytes == 0


def test_pinning_registers_the_exact_buffer_with_cuda(monkeypatch):
    """Before: torch.empty(..., pin_memory=True) per tensor, through the caching host allocator
    (each block a power of two, kept after the save)."""
    calls = []

    class Cudart:
        def cudaHostRegister(self, ptr, size, flags):
            calls.append(("register", ptr, size, flags))
            return 0

        def cudaHostUnregister(self, ptr):
            calls.append(("unregister", ptr))
            return 0

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart())
    real_empty = torch.empty

    def no_pinned(*args, **kwargs):
        assert not kwargs.get("pin_memory"), "pinned through the caching host allocator"
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", no_pinned)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    stager = HostStager(pin=True)
    state = {"w": torch.zeros(1000), "m": torch.zeros(3, 7)}
    stager.stage(state)
    _, total = staging_offsets([4000, 84])
    assert calls == [("register", stager._flat.data_ptr(), total, 0)]
    stager.stage(state)  # same shapes: the same registered buffer
    assert len(calls) == 1
    stager.close()
    assert calls[-1][0] == "unregister"


def _leaves(state: dict) -> list[torch.Tensor]:
    out = []
    for value in state.values():
        out += [t for _, t in value._pieces] if isinstance(value, Chunks) else [value]
    return out


def test_a_save_sends_its_staging_buffer_to_the_checkpoint_process_once():
    """Before: each save's state crossed the checkpoint process's pipe through torch's
    reductions: the buffer's shared-memory handle (fetched from the training process) and a
    rebuilt tensor per tensor, every save; and every staged tensor was a view of the whole
    buffer, which DCP's file writer clones before writing (its storage is larger than itself)."""
    stager = HostStager(pin=False, shared=True)
    state = {
        "w": torch.arange(6.0).view(2, 3),
        "opt": Chunks((4, 3), [((0, 0), torch.ones(1, 3)), ((2, 0), torch.full((2, 3), 2.0))]),
        "step": torch.tensor(7),
        "h": torch.ones(5, dtype=torch.bfloat16),
    }
    staged = stager.stage(state)
    # DCP writes each tensor as it is: its storage holds exactly its bytes, in the buffer
    for t in _leaves(staged):
        assert t.untyped_storage().nbytes() == t.nbytes
    first = bytes(ForkingPickler.dumps(staged))
    received = pickle.loads(first)  # what the checkpoint process rebuilds
    state["w"].add_(1)
    state["opt"]._pieces[1][1].fill_(5.0)
    second = bytes(ForkingPickler.dumps(stager.stage(state)))
    assert b"rebuild_storage" in first  # the buffer, the first time
    assert b"rebuild_storage" not in second and len(second) < len(first)
    again = pickle.loads(second)  # the second save's values, on the buffer received the first time
    assert torch.equal(again["w"], state["w"]) and int(again["step"]) == 7
    assert torch.equal(again["h"], state["h"]) and again["h"].dtype == torch.bfloat16
    assert [tuple(o) for o, _ in again["opt"]._pieces] == [(0, 0), (2, 0)]
    assert tuple(again["opt"].shape) == (4, 3)
    assert torch.equal(again["opt"]._pieces[1][1], torch.full((2, 3), 5.0))
    assert again["w"].data_ptr() == received["w"].data_ptr()  # no copy between saves
    for t in _leaves(again):
        assert t.untyped_storage().nbytes() == t.nbytes
    # a state of another shape: a new buffer, sent again
    state["w"] = torch.zeros(3, 3)
    third = bytes(ForkingPickler.dumps(stager.stage(state)))
    assert b"rebuild_storage" in third
    assert torch.equal(pickle.loads(third)["w"], torch.zeros(3, 3))
    stager.close()


def test_a_recipe_without_its_buffer_is_a_clear_error():
    stager = HostStager(pin=False, shared=True)
    staged = stager.stage({"w": torch.ones(4)})
    stager._sent_to = None  # as if the checkpoint process had received it
    async_checkpoint._RECEIVED.clear()
    with pytest.raises(CheckpointError, match="never received staging buffer"):
        pickle.loads(ForkingPickler.dumps(staged))
    stager.close()
