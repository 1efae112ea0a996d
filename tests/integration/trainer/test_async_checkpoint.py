"""Asynchronous checkpoints (async_checkpoint.py): training goes on while a save is written, a
save that fails anywhere never gets its marker, and what was saved resumes exactly."""

from __future__ import annotations

import os
import threading
import time

from holmes.trainer import checkpoint
from holmes.trainer.async_checkpoint import CHECKPOINT_NICE
from holmes.trainer.config import CheckpointConfig, OptimizerConfig
from tests.helpers.trainer.trainer_harness import make_layout, run_ranks, tiny_config, train_on_layout

ADAMW = OptimizerConfig(kind="adamw", learning_rate=3e-3, warmup_iterations=2)
LAYOUT = make_layout(1, 2, [4], 2, 4)  # two data-parallel ranks: each writes its own file


def _train_with_slow_storage(rank: int, cfg, layout, root: str) -> dict:
    """Rank 1's storage holds every write of checkpoint 2 until iteration 3 has finished here
    (slow storage, deterministically: the real writer, started late)."""
    from torch.distributed.checkpoint import FileSystemWriter

    gate = threading.Event()
    real = FileSystemWriter.write_data

    def write_data(self, plan, planner):
        if rank == 1 and str(self.path).endswith("iter_00000002"):
            assert gate.wait(60), "iteration 3 never finished while checkpoint 2 was being written"
        return real(self, plan, planner)

    FileSystemWriter.write_data = write_data
    seen: list = []

    def on_iteration(trainer, record) -> None:
        marker = os.path.join(checkpoint.iteration_dir(root, 2), checkpoint.MARKER)
        seen.append((trainer.iteration, trainer.checkpointer.in_flight_iteration, os.path.exists(marker)))
        if trainer.iteration == 3:
            gate.set()

    out = train_on_layout(rank, cfg, layout, on_iteration)
    return {"seen": seen, "losses": out["losses"]}


def test_training_goes_on_while_a_save_is_written_and_the_marker_follows(tmp_path):
    """Before: dcp.save inside the loop, so a rank whose write is slow stopped every rank (here
    until the 60 s gate gives up: checkpoint 2 fails)."""
    root = str(tmp_path / "ckpt")
    cfg = tiny_config(optimizer=ADAMW, iterations=4, checkpoint=CheckpointConfig(root, 2))
    out = run_ranks(2, _train_with_slow_storage, cfg, LAYOUT, root, timeout=90)
    for rank in (0, 1):
        seen = out[rank][1]["seen"]
        # iteration 3 ran while checkpoint 2 was still being written, and it had no marker
        assert (3, 2, False) in seen, seen
    assert checkpoint.newest_complete(root) == 4
    assert checkpoint._read_marker(checkpoint.iteration_dir(root, 2))["iteration"] == 2

    # what the asynchronous saves wrote resumes exactly as what synchronous saves wrote
    sync_root = str(tmp_path / "sync")
    sync = CheckpointConfig(sync_root, 2, asynchronous=False)
    run_ranks(2, train_on_layout, tiny_config(optimizer=ADAMW, iterations=4, checkpoint=sync), LAYOUT)
    losses = {}
    for name, ckpt in (("async", CheckpointConfig(root, 2)), ("sync", sync)):
        cfg6 = tiny_config(optimizer=ADAMW, iterations=6, checkpoint=ckpt)
        got = run_ranks(2, train_on_layout, cfg6, LAYOUT)[0][1]["records"]
        assert [r["iteration"] for r in got] == [5, 6]
        losses[name] = [r["loss"] for r in got]
    assert losses["async"] == losses["sync"]


def test_a_save_that_fails_on_one_rank_never_looks_complete(tmp_path):
    """Rank 1 cannot write its file of checkpoint 2: every rank stops at the next save naming
    rank 1, checkpoint 2 has no marker, and the newest complete one stays what it was."""
    root = str(tmp_path / "ckpt")
    os.makedirs(os.path.join(checkpoint.iteration_dir(root, 2), "__1_0.distcp"))  # not a file
    cfg = tiny_config(optimizer=ADAMW, iterations=6, checkpoint=CheckpointConfig(root, 1))
    out = run_ranks(2, train_on_layout, cfg, LAYOUT, allow_exit=True, timeout=90)
    for rank in (0, 1):
        status, text = out[rank]
        assert status == "error" and "CheckpointError" in text, out[rank]
        assert "iter_00000002 was not completed" in text and "rank 1: " in text, text
    assert checkpoint._read_marker(checkpoint.iteration_dir(root, 2)) is None
    assert checkpoint.newest_complete(root) == 1


def test_staging_is_bounded_to_one_copy_of_the_state(tmp_path):
    """Every save reuses the same host buffers: after three saves they hold one copy."""
    root = str(tmp_path / "ckpt")
    cfg = tiny_config(optimizer=ADAMW, iterations=3, checkpoint=CheckpointConfig(root, 1))

    def body(rank, cfg, layout):
        sizes = []

        def on_iteration(trainer, record):
            sizes.append(trainer.checkpointer.stager.staged_bytes)

        train_on_layout(rank, cfg, layout, on_iteration)
        return sizes

    out = run_ranks(2, body, cfg, LAYOUT)
    for rank in (0, 1):
        sizes = out[rank][1]
        # on_iteration runs before that iteration's save: no buffers yet, then one set of them
        assert sizes[0] == 0 and sizes[1] > 0 and sizes[1] == sizes[2], sizes


def test_each_data_parallel_rank_stages_only_the_weights_it_writes(tmp_path):
    """Before: every data-parallel rank staged the stage's whole replicated weights (DCP drops
    the duplicates only when it plans the write, after staging). Now the two ranks' shares are
    disjoint and cover the stage, and each rank's one staging buffer is exactly its share, its
    optimizer shard and its RNG state."""
    from holmes.trainer.async_checkpoint import staging_offsets

    root = str(tmp_path / "ckpt")
    cfg = tiny_config(optimizer=ADAMW, iterations=2, checkpoint=CheckpointConfig(root, 1))

    def body(rank, cfg, layout):
        seen = {}

        def on_iteration(trainer, record):
            if trainer.iteration != 2:  # after the first save, before the second
                return
            share = (trainer.info.dp_index, layout.data)
            mine = checkpoint.model_tensors(trainer.module, tied_copy=False, share=share)
            whole = checkpoint.model_tensors(trainer.module, tied_copy=False)
            rest = {**checkpoint.optimizer_tensors(trainer.opt, trainer.tp, saving=True)}
            rest.update(checkpoint.rng_state(rank))

            def total(state):
                return staging_offsets([t.numel() * t.element_size() for t in _sources(state)])[1]

            seen.update(
                # what the dry run and the planner count, from sizes alone
                counted=checkpoint.staging_size(trainer.module, trainer.opt, trainer.tp, share),
                slack=len(_sources({**mine, **rest})) * 512 + total(checkpoint.rng_state(rank)),
                mine=sorted(mine),
                whole=sorted(whole),
                staged=trainer.checkpointer.stager.staged_bytes,
                expected=total({**mine, **rest}),
                before=total({**whole, **rest}),
            )

        train_on_layout(rank, cfg, layout, on_iteration)
        return seen

    out = run_ranks(2, body, cfg, LAYOUT)
    a, b = out[0][1], out[1][1]
    assert a["whole"] == b["whole"] and not set(a["mine"]) & set(b["mine"])
    assert sorted(a["mine"] + b["mine"]) == a["whole"] and a["mine"] and b["mine"]
    for r in (a, b):
        assert r["staged"] == r["expected"] < r["before"], r
        assert r["counted"] <= r["staged"] <= r["counted"] + r["slack"], r


def _sources(state):
    out = []
    for v in state.values():
        if isinstance(v, checkpoint.Chunks):
            out += [t for _, t in v._pieces]
        elif hasattr(v, "to_local"):
            out.append(v.to_local())
        else:
            out.append(v)
    return out


def test_the_save_is_written_by_a_checkpoint_process_of_each_rank(tmp_path):
    """Before: DCP planned and wrote on a thread of the training process (its GIL). Now one
    checkpoint process per rank, started at the first save and kept for the next, reading the
    staging buffer from shared memory; the plans are cached from the second save on. It runs
    at a lower CPU priority than its rank (before: the same, competing with training)."""
    root = str(tmp_path / "ckpt")
    cfg = tiny_config(optimizer=ADAMW, iterations=3, checkpoint=CheckpointConfig(root, 1))

    def body(rank, cfg, layout):
        import os

        from torch.distributed.checkpoint import _async_process_executor as executor

        seen = []

        def on_iteration(trainer, record):
            proc = executor._CHECKPOINT_PROCESS
            if proc is not None:
                pid = proc._save_process.pid
                nice = (os.getpriority(os.PRIO_PROCESS, 0), os.getpriority(os.PRIO_PROCESS, pid))
                seen.append((pid, proc._save_process.is_alive(), nice))
            assert trainer.checkpointer.stager._flat is None or trainer.checkpointer.stager._flat.is_shared()

        train_on_layout(rank, cfg, layout, on_iteration)
        return {"pid": os.getpid(), "seen": seen}

    t0 = time.monotonic()
    out = run_ranks(2, body, cfg, LAYOUT, timeout=240)
    # each rank exits once it returns: it stops its checkpoint process first (before, a forked
    # rank's multiprocessing exit hook sent it the SIGTERM it ignores and joined it for ever,
    # until run_ranks killed the rank at its deadline)
    assert time.monotonic() - t0 < 200
    for rank in (0, 1):
        got = out[rank][1]
        pids = {pid for pid, alive, _ in got["seen"] if alive}
        assert len(pids) == 1 and got["pid"] not in pids, got  # one process, not the rank's own
        for _, _, (mine, its) in got["seen"]:
            assert its == min(19, mine + CHECKPOINT_NICE), got
    assert checkpoint.newest_complete(root) == 3


def test_the_checkpoint_process_outlives_the_pods_stop_signal_and_ends_with_its_rank(tmp_path):
    """A pod's SIGTERM reaches every process of the group (torchrun signals its workers'
    groups): before, it killed the checkpoint process, so the save on preemption was lost (the
    fault soak's deleted pod lost 13 iterations). The checkpoint process blocks it; it is
    stopped by its rank at exit, never left behind."""
    root = str(tmp_path / "ckpt")
    cfg = tiny_config(optimizer=ADAMW, iterations=3, checkpoint=CheckpointConfig(root, 1))

    def body(rank, cfg, layout):
        import signal

        from torch.distributed.checkpoint import _async_process_executor as executor

        pids = []

        def on_iteration(trainer, record):
            proc = executor._CHECKPOINT_PROCESS
            if proc is not None and not pids:
                pids.append(proc._save_process.pid)
                os.kill(pids[0], signal.SIGTERM)  # what killpg does to it

        train_on_layout(rank, cfg, layout, on_iteration)
        return {"pid": pids[0]}

    out = run_ranks(2, body, cfg, LAYOUT)
    assert checkpoint.newest_complete(root) == 3  # every save after the signal committed
    for rank in (0, 1):  # these ranks end with os._exit (no atexit): the pipe's EOF ends it
        pid = out[rank][1]["pid"]
        deadline = time.monotonic() + 60
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(pid), f"rank {rank}'s checkpoint process {pid} outlived its rank"


def _running(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1][0] not in "ZX"
    except (FileNotFoundError, IndexError):
        return False


def test_a_rank_whose_checkpoint_process_dies_stops_at_once(tmp_path):
    """A rank's checkpoint process killed (the OOM killer, a kill) while a save is written:
    gloo tells only its neighbours in the save's ring, so the other checkpoint processes wait
    for peers that have left it (until gloo's 30-minute timeout), and before, the dead
    process's rank waited for them in the exchange of outcomes: with four ranks the job stood
    still until the run's deadline (the fault soak's killed trainer hit a checkpoint process and
    its job hung). Now that rank stops at once, not at its next save (whatever it trained
    meanwhile would be lost), naming the cause, so that the job restarts from its newest
    complete checkpoint; the other ranks, stuck as they would be until the operator deletes
    their pods, are ended here once it has failed."""
    root = str(tmp_path / "ckpt")
    failed = tmp_path / "rank3-failed"
    layout = make_layout(1, 4, [4], 2, 2)
    cfg = tiny_config(optimizer=ADAMW, iterations=9, checkpoint=CheckpointConfig(root, 3))

    def body(rank, cfg, layout):
        import signal

        from torch.distributed.checkpoint import _async_process_executor as executor

        def on_iteration(trainer, record):
            proc = executor._CHECKPOINT_PROCESS
            if proc is None:  # started in the background: the first save waits for it
                return
            (tmp_path / f"pid{rank}").write_text(str(proc._save_process.pid))
            (tmp_path / f"iteration{rank}").write_text(str(trainer.iteration))
            if rank == 3 and trainer.iteration == 4:
                (tmp_path / "killed").write_text(str(time.monotonic()))
                os.kill(proc._save_process.pid, signal.SIGKILL)
                while _running(proc._save_process.pid):  # dead before this iteration's poll
                    time.sleep(0.01)

        if rank != 3:  # stuck in a save, as the dead process's peers are: ended here

            def end_when_rank3_failed():
                while not failed.exists():
                    time.sleep(0.1)
                os._exit(3)

            threading.Thread(target=end_when_rank3_failed, daemon=True).start()
        try:
            train_on_layout(rank, cfg, layout, on_iteration)
        except Exception:
            if rank == 3:
                failed.write_text(str(time.monotonic()))
            raise
        return "finished"

    pids = []
    try:
        out = run_ranks(4, body, cfg, layout, allow_exit=True, timeout=120)
        pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(4) if (tmp_path / f"pid{r}").exists()]
        deadline = time.monotonic() + 10
        while any(map(_running, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        # the survivors' checkpoint processes, stuck in their gloo group, went with their ranks
        # (before, they stayed for gloo's 30 minutes, holding their rank's stdout and stderr)
        left = [p for p in pids if _running(p)]
    finally:
        for p in pids:
            if _running(p):
                os.kill(p, 9)
    assert len(pids) == 4 and not left, f"checkpoint processes left behind: {left}"
    status, text = out[3]
    assert status == "error" and "CheckpointProcessDied" in text, out
    assert "checkpoint process" in text and "was killed by SIGKILL" in text, text
    assert "restarts from its newest complete checkpoint" in text, text
    assert float(failed.read_text()) - float((tmp_path / "killed").read_text()) < 30, out
    assert int((tmp_path / "iteration3").read_text()) == 4, "rank 3 trained on after its process died"
    for rank in range(3):  # each either stuck (ended here) or told of the failure by gloo
        assert out[rank] == ("exit", 3) or out[rank][0] == "error", out
