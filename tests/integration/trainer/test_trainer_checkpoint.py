"""Checkpoint at k, kill, resume: the losses from k+1 on equal an uninterrupted run (resuming
under another layout: test_checkpoint_reshard.py)."""

import os

import pytest
import torch

from holmes.trainer import checkpoint
from holmes.trainer.config import CheckpointConfig, OptimizerConfig
from holmes.trainer.engine import Trainer, layout_signature
from tests.helpers.trainer.trainer_harness import (
    kill_after,
    make_layout,
    run_ranks,
    tiny_config,
    train_on_layout,
)

ADAMW = OptimizerConfig(kind="adamw", learning_rate=3e-3, warmup_iterations=2)


def test_resume_after_kill_continues_exactly(tmp_path):
    lay = make_layout(2, 2, [3, 1], 2, 4)
    full = run_ranks(4, train_on_layout, tiny_config(optimizer=ADAMW, iterations=6), lay)
    want = full[0][1]["losses"]

    ckpt = CheckpointConfig(path=str(tmp_path / "ckpt"), interval_iterations=3)
    cfg = tiny_config(optimizer=ADAMW, iterations=6, checkpoint=ckpt)
    killed = run_ranks(4, train_on_layout, cfg, lay, kill_after(5), allow_exit=True)
    assert all(v == ("exit", 17) for v in killed.values()), killed
    assert checkpoint.newest_complete(ckpt.path) == 3
    # a checkpoint that was being written when the job died has no marker and is skipped
    os.makedirs(checkpoint.iteration_dir(ckpt.path, 4))

    resumed = run_ranks(4, train_on_layout, cfg, lay)
    got = resumed[0][1]["records"]
    assert [r["iteration"] for r in got] == [4, 5, 6]
    assert [r["loss"] for r in got] == pytest.approx(want[3:], abs=1e-6)
    assert checkpoint.newest_complete(ckpt.path) == 6


def _save_format1(rank, cfg, layout):
    """Train, then write what the trainer wrote before checkpoints were layout-independent:
    stage-local weight names, per-bucket optimizer shards, no ``format`` in the marker."""
    trainer = Trainer(
        cfg.with_(checkpoint=CheckpointConfig()),
        layout,
        rank=rank,
        device=torch.device("cpu"),
        backend="gloo",
    )
    trainer.train()
    trainer.opt.wait_param_gathers()
    info = trainer.info
    state = checkpoint.model_tensors(trainer.module, global_names=False)
    state.update(trainer.opt.bucket_state_dict(f"optim.stage{info.stage}.dp{info.dp_index}"))
    state.update(checkpoint.rng_state(rank))
    meta = {"layout": layout_signature(layout), "model": cfg.model.shape(), "consumedSamples": 2 * 16}
    checkpoint.save(cfg.checkpoint.path, trainer.iteration, state, rank, meta)
    return {}


def test_a_format1_checkpoint_resumes_under_its_layout_and_is_refused_under_another(tmp_path):
    lay = make_layout(2, 1, [3, 1], 2, 8)
    cfg = tiny_config(optimizer=ADAMW, iterations=4, checkpoint=CheckpointConfig(str(tmp_path / "ckpt"), 2))
    want = run_ranks(2, train_on_layout, cfg.with_(checkpoint=CheckpointConfig()), lay)[0][1]["losses"]
    run_ranks(2, _save_format1, cfg.with_(iterations=2), lay)
    other = make_layout(2, 1, [2, 2], 2, 8)
    res = run_ranks(2, train_on_layout, cfg, other, allow_exit=True)
    assert res[0][0] == "error" and "older Holmes trainer" in res[0][1] and "under that layout" in res[0][1]
    got = run_ranks(2, train_on_layout, cfg, lay)[0][1]["records"]
    assert [r["iteration"] for r in got] == [3, 4]
    assert [r["loss"] for r in got] == pytest.approx(want[2:], abs=1e-6)


def test_a_marker_that_does_not_parse_is_an_incomplete_checkpoint(tmp_path):
    # e.g. a node lost power after the rename reached the disk but before the marker's data did
    root = str(tmp_path)
    for it, text in ((3, '{"iteration": 3}'), (6, ""), (9, '{"iteration": 9')):
        os.makedirs(checkpoint.iteration_dir(root, it))
        with open(os.path.join(checkpoint.iteration_dir(root, it), checkpoint.MARKER), "w") as f:
            f.write(text)
    assert checkpoint.newest_complete(root) == 3


def _checkpoint_group(rank: int, cfg, layout) -> dict:
    """The group checkpoint coordination runs on, and how it was made."""
    import torch.distributed as dist

    from holmes.trainer import checkpoint as ckpt

    made: list = []
    real_new, real_save = dist.new_group, ckpt.save

    def new_group(*args, **kwargs):
        g = real_new(*args, **kwargs)
        made.append((g, kwargs.get("backend"), kwargs.get("timeout")))
        return g

    used: list = []

    def save(*args, group=None, **kwargs):
        used.append(group)
        return real_save(*args, group=group, **kwargs)

    dist.new_group, ckpt.save = new_group, save
    try:
        Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo").train()
    finally:
        dist.new_group, ckpt.save = real_new, real_save
    (group,) = set(used)
    backend, timeout = next((b, t) for g, b, t in made if g is group)
    return {"world": group is dist.group.WORLD, "backend": backend, "seconds": timeout.total_seconds()}


def test_checkpoint_coordination_runs_on_a_host_group_with_a_long_timeout(tmp_path):
    """Before: DCP coordinated on the world group (NCCL on GPUs, its 600 s timeout and watchdog),
    so a save slower than the process-group timeout killed the job."""
    cfg = tiny_config(iterations=1, checkpoint=CheckpointConfig(path=str(tmp_path), asynchronous=False))
    out = run_ranks(2, _checkpoint_group, cfg, make_layout(1, 2, [4], 2, 4))
    for rank in (0, 1):
        res = out[rank][1]
        assert res["world"] is False and res["backend"] == "gloo" and res["seconds"] >= 1800, res
