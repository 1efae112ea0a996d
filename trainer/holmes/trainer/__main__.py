"""Entry point: ``python -m holmes.trainer --job JOB.yaml --layout LAYOUT.json [--metrics-file F]``.

Run under torchrun (one process per GPU); rank, world size and the master address come from
the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

Environment knobs (flags win over them):
- HOLMES_METRICS_PORT: Prometheus port on rank 0 (unset: no endpoint); HOLMES_METRICS_ADDR (0.0.0.0)
- HOLMES_CHECKPOINT_DIR: overrides training.checkpoint.path of the job
- HOLMES_BACKEND: nccl | gloo (default: nccl when CUDA is available, else gloo)
- HOLMES_TIMEOUT_SECONDS: process-group timeout, how long a dead peer can stall the others
- HOLMES_DTYPE: float32 | bfloat16 (default: bfloat16 on CUDA, float32 on CPU)
- HOLMES_OPTIMIZER: adamw | sgd;  HOLMES_OVERLAP=0: synchronous optimizer (same math)
- HOLMES_BUCKET_ELEMENTS: gradient bucket size in elements (default 40M)
- HOLMES_PIPELINE_SCHEDULE: overrides training.pipelineSchedule (default: the job's; auto runs the
  schedule the layout was planned for); one that places virtual stages otherwise is refused
- HOLMES_FABRIC_ROOT: where the fabric check finds sys/ and dev/ (default /), e.g. a host's
  sysfs mounted elsewhere; set, it also runs the device checks on gloo
- HOLMES_FABRIC_STEP_SECONDS: the most one fabric preflight step may take (default: a quarter of
  the timeout, at most 150 s); a rank whose peers do not answer in time stops with their names
- HOLMES_TERMINATION_LOG: where rank 0 keeps its latest JSON line (default /dev/termination-log
  when it exists), for the operator once the pod has terminated
- HOLMES_GRACE_SECONDS: seconds from SIGTERM to SIGKILL (the pod's terminationGracePeriodSeconds;
  default 30)
- HOLMES_REPLICA, HOLMES_REPLICAS, HOLMES_OUTER_ADDR (host:port): with
  spec.training.acrossIslands.mode replicas, this world is replica HOLMES_REPLICA of
  HOLMES_REPLICAS, whose outer group meets at the store replica 0's rank 0 serves there (outer.py)

Exit codes: 0 done, 1 failed, 2 cannot start (configuration), 83 (holmes.contract.names.
EXIT_PREEMPTED) stopped on SIGTERM at an iteration boundary all ranks agreed on, after saving a
checkpoint when training.checkpoint.onPreemption asks and it fits in the grace period
(preempt.py). Start it with ``python -m holmes.trainer.run`` (torchrun's arguments) so the pod
exits with these codes: torchrun alone exits 1 whenever a worker fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Any

from holmes.contract.release import RELEASE


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # argparse converts a string default with the option's type (a bad value: a usage error)
    env = os.environ.get
    ap = argparse.ArgumentParser(
        prog="python -m holmes.trainer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--version", action="version", version=f"holmes-train-trainer {RELEASE}")
    ap.add_argument("--job", required=True, help="HolmesJob manifest (YAML) or its spec")
    ap.add_argument("--layout", required=True, help="Layout JSON written by the planner")
    ap.add_argument("--metrics-file", help="append one JSON line per event here (rank 0)")
    ap.add_argument(
        "--metrics-port",
        type=int,
        default=env("HOLMES_METRICS_PORT") or None,
    )
    ap.add_argument("--metrics-addr", default=env("HOLMES_METRICS_ADDR", "0.0.0.0"))
    ap.add_argument("--checkpoint-dir", default=env("HOLMES_CHECKPOINT_DIR"))
    ap.add_argument("--backend", default=env("HOLMES_BACKEND"), choices=["nccl", "gloo", None])
    ap.add_argument(
        "--timeout-seconds",
        type=float,
        default=env("HOLMES_TIMEOUT_SECONDS") or None,
    )
    ap.add_argument("--iterations", type=int, help="override training.iterations")
    ap.add_argument("--dtype", default=env("HOLMES_DTYPE"), help="float32 | bfloat16")
    ap.add_argument("--optimizer", default=env("HOLMES_OPTIMIZER", "adamw"), choices=["adamw", "sgd"])
    ap.add_argument(
        "--bucket-elements",
        type=int,
        default=env("HOLMES_BUCKET_ELEMENTS") or None,
    )
    ap.add_argument("--pipeline-schedule", default=env("HOLMES_PIPELINE_SCHEDULE"))
    ap.add_argument(
        "--no-overlap",
        action="store_true",
        default=env("HOLMES_OVERLAP", "1") == "0",
        help="synchronous optimizer (same math), for comparison",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from .preempt import Preemption

    preemption = Preemption().install()  # from here on SIGTERM only asks to stop (preempt.py)

    import torch.distributed as dist

    from holmes.contract import trainer_metrics as wire
    from holmes.contract.names import EXIT_PREEMPTED

    from .engine import Trainer
    from .groups import init_world
    from .outer import ReplicaError, ReplicaPlace
    from .preempt import note_exit
    from .reporting import MetricsSink
    from .startup import StartupError, report, start

    overrides: dict[str, Any] = {
        "optimizer": args.optimizer,
        "overlap": not args.no_overlap,
    }
    for name in ("bucket_elements", "timeout_seconds", "iterations", "pipeline_schedule"):
        if getattr(args, name):
            overrides[name] = getattr(args, name)
    try:
        started = start(
            args.job,
            args.layout,
            training=True,
            dtype=args.dtype,
            backend=args.backend,
            checkpoint_dir=args.checkpoint_dir,
            **overrides,
        )
    except StartupError as e:
        report("holmes.trainer", e)
        if e.rank == 0:  # the operator reads stdout: say why in its format too
            print(json.dumps({wire.EVENT_KEY: wire.ERROR, "rank": 0, "message": str(e)[:2000]}), flush=True)
        return 2
    cfg, layout, rank = started.cfg, started.layout, started.rank
    try:
        replica = ReplicaPlace.from_env(os.environ)
    except ReplicaError as e:
        report("holmes.trainer", StartupError(str(e), rank))
        return 2
    term = os.environ.get(
        "HOLMES_TERMINATION_LOG", "/dev/termination-log" if os.path.exists("/dev/termination-log") else ""
    )
    sink = MetricsSink(
        enabled=rank == 0,
        metrics_file=args.metrics_file,
        port=args.metrics_port,
        addr=args.metrics_addr,
        termination_log=term or None,
    )
    code = 0
    try:
        init_world(layout, started.backend, cfg.timeout_seconds)
        trainer = Trainer(
            cfg,
            layout,
            rank=rank,
            device=started.device,
            backend=started.backend,
            sink=sink,
            fabric_root=os.environ.get("HOLMES_FABRIC_ROOT") or None,
            preemption=preemption,
            replica=replica,
        )
        trainer.train()
        if trainer.preempted is not None:
            code = EXIT_PREEMPTED
            saved = "checkpoint saved" if trainer.preempted["saved"] else "no checkpoint"
            print(
                f"holmes.trainer: rank {rank}: preempted (SIGTERM): stopped after iteration "
                f"{trainer.preempted['iteration']}, {saved}",
                file=sys.stderr,
                flush=True,
            )
    except Exception as e:  # every rank says why it stopped; the launcher sees a non-zero exit
        msg = f"{type(e).__name__}: {e}"
        print(
            f"holmes.trainer: rank {rank} failed: {msg}\n{traceback.format_exc()}",
            file=sys.stderr,
            flush=True,
        )
        sink.emit(wire.ERROR, rank=rank, message=msg[:2000])
        code = 1
    finally:
        sink.close()
    if code == EXIT_PREEMPTED:  # every rank stopped at the same boundary: leave together
        note_exit(rank, code)
    if code in (0, EXIT_PREEMPTED):
        dist.destroy_process_group()
    # A failed rank's peers may still hold its sockets in a collective: it leaves without
    # destroying. Every rank leaves now, not through interpreter shutdown: the grace period of a
    # preemption is running, and finalization can abort (SIGABRT, "terminate called without an
    # active exception") while gloo's threads still hold tensors of Python objects being torn
    # down, which once turned a finished job's rank into exit code 134 in CI.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
