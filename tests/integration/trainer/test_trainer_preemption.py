"""SIGTERM: every rank stops after the same iteration, saves when training.checkpoint.onPreemption
asks and it fits in the grace period, and exits 83 (through holmes.trainer.run, which keeps the
workers' exit codes that torchrun drops); a later run resumes from that checkpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from holmes.contract.names import EXIT_PREEMPTED
from holmes.trainer import checkpoint
from holmes.trainer.config import CheckpointConfig, OptimizerConfig
from holmes.trainer.engine import Trainer
from holmes.trainer.preempt import Preemption, grace_seconds
from tests.helpers.trainer.trainer_harness import (
    TINY_JOB,
    finish_nodes,
    free_port,
    make_layout,
    run_ranks,
    start_nodes,
    tiny_config,
    train_on_layout,
)

ADAMW = OptimizerConfig(kind="adamw", learning_rate=3e-3, warmup_iterations=2)
LAYOUT = make_layout(2, 2, [3, 1], 2, 4)


def _signal_rank(rank_to_stop: int, after: int, env: dict | None = None):
    def body(rank: int, cfg, layout) -> dict:
        os.environ.update(env or {})
        preemption = Preemption().install()

        def on_iteration(trainer, record):
            if rank == rank_to_stop and trainer.iteration == after:
                os.kill(os.getpid(), signal.SIGTERM)  # this rank only, mid-run

        trainer = Trainer(
            cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo", preemption=preemption
        )
        history = trainer.train(on_iteration)
        return {"preempted": trainer.preempted, "losses": [h["loss"] for h in history]}

    return body


def test_sigterm_on_one_rank_stops_all_at_one_boundary_saves_and_resumes_exactly(tmp_path):
    cfg = tiny_config(optimizer=ADAMW, iterations=6)
    want = run_ranks(4, train_on_layout, cfg, LAYOUT)[0][1]["losses"]
    cfg = cfg.with_(checkpoint=CheckpointConfig(str(tmp_path / "ckpt"), interval_iterations=100))
    res = run_ranks(4, _signal_rank(3, after=2), cfg, LAYOUT)
    # the signal came after iteration 2's vote had started: iteration 3's vote carries it
    assert {r: out["preempted"]["iteration"] for r, (_, out) in res.items()} == {0: 3, 1: 3, 2: 3, 3: 3}
    assert all(out["preempted"]["saved"] for _, (_, out) in res.items())
    assert checkpoint.newest_complete(cfg.checkpoint.path) == 3
    meta = checkpoint.check_model(checkpoint.iteration_dir(cfg.checkpoint.path, 3), cfg.model.shape())
    assert meta["preempted"] is True
    got = run_ranks(4, train_on_layout, cfg, LAYOUT)[0][1]["records"]
    assert [r["iteration"] for r in got] == [4, 5, 6]
    assert [r["loss"] for r in got] == pytest.approx(want[3:], abs=1e-6)


@pytest.mark.parametrize(
    "on_preemption,env,why",
    [(False, {}, "onPreemption false"), (True, {"HOLMES_GRACE_SECONDS": "1"}, "no time left")],
)
def test_no_checkpoint_when_not_wanted_or_it_does_not_fit(tmp_path, on_preemption, env, why):
    ckpt = CheckpointConfig(str(tmp_path / "ckpt"), interval_iterations=100, on_preemption=on_preemption)
    res = run_ranks(4, _signal_rank(0, after=1, env=env), tiny_config(iterations=20, checkpoint=ckpt), LAYOUT)
    assert all(out["preempted"] == {"iteration": 2, "saved": False} for _, (_, out) in res.items()), why
    assert not os.path.exists(ckpt.path) or not os.listdir(ckpt.path), why


def test_grace_seconds_from_the_pod_and_torchrun():
    assert grace_seconds({}) == 30.0
    assert grace_seconds({"HOLMES_GRACE_SECONDS": "120"}) == 120.0
    # torchrun SIGKILLs its workers after its shutdown timeout: 30 s unless it was told
    assert grace_seconds({"HOLMES_GRACE_SECONDS": "120", "TORCHELASTIC_RUN_ID": "x"}) == 30.0
    env = {"HOLMES_GRACE_SECONDS": "120", "TORCHELASTIC_RUN_ID": "x", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "120"}
    assert grace_seconds(env) == 120.0


# ---- the real entry point under the launcher: two "pods" of two processes -------------------


def _start(tmp_path, job: dict, extra: tuple = ()) -> list[subprocess.Popen]:
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "layout.json").write_text(make_layout(2, 2, [3, 1], 2, 4, gpus_per_node=2).to_json())
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HOLMES_TERMINATION_LOG": str(tmp_path / "termination-log"),
        "HOLMES_GRACE_SECONDS": "60",
    }
    # torchrun's arguments, unchanged, under Holmes' launcher
    return start_nodes(tmp_path, 2, 2, env, launcher="holmes.trainer.run", args=extra)


def _wait_for_iteration(tmp_path, n: int, procs, timeout: float = 180) -> None:
    """A deadline for four ranks' start (torchrun, imports, groups, the fabric preflight): about
    40 s on 2 loaded cores, where 60 s was missed under the load of a parallel e2e run."""
    deadline = time.monotonic() + timeout
    path = tmp_path / "metrics.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and any(
            json.loads(l).get("holmes") == "iteration" and json.loads(l)["iteration"] >= n
            for l in path.read_text().splitlines()
        ):
            return
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    raise AssertionError("training did not start in time")


def _finish(procs) -> list[tuple[int, str, str]]:
    return finish_nodes(procs, timeout=90)


def _workers_of(pid: int) -> list[int]:
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(d))
    return sorted(kids)


def _stops(outs) -> dict[int, int]:
    """Each rank's 'stopped after iteration N' line (stderr of both launchers)."""
    found = {}
    for _, _, err in outs:
        for m in re.finditer(r"rank (\d+): preempted \(SIGTERM\): stopped after iteration (\d+)", err):
            found[int(m.group(1))] = int(m.group(2))
    return found


def _job(iterations: int, ckpt: str, on_preemption: bool) -> dict:
    job = json.loads(json.dumps(TINY_JOB))
    job["spec"]["training"].update(
        iterations=iterations,
        checkpoint={"path": ckpt, "intervalIterations": 1000, "onPreemption": on_preemption},
    )
    return job


def test_sigterm_to_one_pods_launcher_saves_exits_83_and_a_new_run_resumes(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    procs = _start(tmp_path, _job(1000, ckpt, True))
    _wait_for_iteration(tmp_path, 2, procs)
    procs[1].send_signal(signal.SIGTERM)  # node 1 is deleted; node 0 hears of it only from its peers
    outs = _finish(procs)
    assert [code for code, _, _ in outs] == [EXIT_PREEMPTED, EXIT_PREEMPTED], [e[-3000:] for _, _, e in outs]
    # torchrun of node 1 was itself stopped (its workers noted 83); node 0's saw its workers fail
    assert "death signal, shutting down workers" in outs[1][2]
    assert "holmes.trainer.run: rank" in outs[0][2]
    stops = _stops(outs)
    assert sorted(stops) == [0, 1, 2, 3] and len(set(stops.values())) == 1, stops
    n = stops[0]
    assert checkpoint.newest_complete(ckpt) == n
    lines = [json.loads(l) for l in outs[0][1].splitlines() if l.startswith('{"holmes"')]
    last = lines[-1]
    assert last["holmes"] == "preempted" and last["iteration"] == n and last["saved"] is True
    # node 1's two workers: both, or one when the other's signal came after that iteration's vote
    assert last["signalledRanks"] in (1, 2) and 0 < last["graceLeftSeconds"] <= 60
    assert json.loads((tmp_path / "termination-log").read_text())["holmes"] == "preempted"

    outs = _finish(_start(tmp_path, _job(1000, ckpt, True), extra=("--iterations", str(n + 2))))
    assert [code for code, _, _ in outs] == [0, 0], [e[-3000:] for _, _, e in outs]
    lines = [json.loads(l) for l in outs[0][1].splitlines() if l.startswith('{"holmes"')]
    assert [l["iteration"] for l in lines if l["holmes"] == "resume"] == [n]
    assert [l["iteration"] for l in lines if l["holmes"] == "iteration"] == [n + 1, n + 2]
    assert lines[-1]["holmes"] == "done"


def test_sigterm_to_one_worker_without_on_preemption_exits_83_without_saving(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    procs = _start(tmp_path, _job(1000, ckpt, False))
    _wait_for_iteration(tmp_path, 2, procs)
    workers = _workers_of(procs[1].pid)
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGTERM)  # one process of node 1; its launcher is not signalled
    outs = _finish(procs)
    assert [code for code, _, _ in outs] == [EXIT_PREEMPTED, EXIT_PREEMPTED], [e[-3000:] for _, _, e in outs]
    stops = _stops(outs)
    assert sorted(stops) == [0, 1, 2, 3] and len(set(stops.values())) == 1, stops
    assert not os.path.exists(ckpt) or not os.listdir(ckpt)
    last = [json.loads(l) for l in outs[0][1].splitlines() if l.startswith('{"holmes"')][-1]
    assert last["holmes"] == "preempted" and last["saved"] is False and last["signalledRanks"] == 1


def test_the_launcher_exits_with_the_workers_code_where_torchrun_says_1(tmp_path):
    from holmes.trainer.run import exit_status

    assert exit_status(-9) == 137 and exit_status(83) == 83
    # a world that does not match the layout: the worker exits 2 (configuration)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(TINY_JOB))
    (tmp_path / "layout.json").write_text(make_layout(2, 2, [3, 1], 2, 4, gpus_per_node=2).to_json())
    cmd = [
        sys.executable,
        "-m",
        "holmes.trainer.run",
        "--nproc-per-node=1",
        "--rdzv-backend=static",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "-m",
        "holmes.trainer",
    ]
    cmd += ["--job", str(tmp_path / "job.yaml"), "--layout", str(tmp_path / "layout.json")]
    p = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert p.returncode == 2, p.stderr[-3000:]
    assert "layout needs 4" in p.stderr and "exit code 2" in p.stderr
