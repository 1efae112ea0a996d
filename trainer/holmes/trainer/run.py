"""``python -m holmes.trainer.run [torchrun arguments]``: torchrun, exiting with the workers' code.

Takes torchrun's arguments unchanged (``python -m holmes.trainer.run --nnodes ... -m
holmes.trainer --job ...``) and runs ``torch.distributed.run`` in this process. torchrun exits 1
whenever a worker fails; this launcher exits instead with:

- 0 when every worker succeeded;
- the first failed worker's exit code (torchrun's ``ChildFailedError`` keeps each rank's; a
  worker killed by signal N gives 128 + N, as a shell would): 83
  (``holmes.contract.names.EXIT_PREEMPTED``) when the workers stopped on a preemption that
  reached this pod only through its peers;
- 83 when torchrun itself was stopped by SIGTERM (this pod deleted, evicted, preempted) and
  its workers then exited with 83 (each notes its code in ``HOLMES_EXIT_DIR``, a directory
  this launcher makes: torchrun keeps none of them on that path); else 128 + the signal.

On SIGTERM torchrun sends SIGTERM to its workers and SIGKILLs them after its shutdown timeout
(``--shutdown-timeout``, else ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 30 s), then exits. This
launcher sets that timeout to the pod's grace period (``HOLMES_GRACE_SECONDS``, default 30) when
neither is given, and exports it so the workers know their deadline (preempt.grace_seconds).
Keep torchrun's ``--max-restarts`` at 0 (its default): a restart would run the workers again
after they exit 83.

Before torchrun starts a worker, the pod's network names are resolved inside the pod
(``holmes.launch.podnet``, the same resolver ``holmes.launch`` calls): ``NCCL_SOCKET_IFNAME`` and
``GLOO_SOCKET_IFNAME`` from the route to the rendezvous, ``NCCL_IB_HCA`` from the RDMA devices
the pod sees. A template value naming what the pod does not have exits 2 with the reason.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
from typing import Any

from holmes.contract.names import ENV_GRACE_SECONDS, EXIT_PREEMPTED
from holmes.launch import podnet

from .preempt import ENV_EXIT_DIR, TORCHRUN_SHUTDOWN_ENV, grace_seconds


def exit_status(code: int) -> int:
    """A process's exit code as a shell reports it: killed by signal N -> 128 + N."""
    return 128 - code if code < 0 else code


def noted_exits(directory: str) -> list[int]:
    """The exit codes the workers noted in ``directory`` (preempt.note_exit)."""
    codes = []
    for name in sorted(os.listdir(directory)):
        try:
            with open(os.path.join(directory, name)) as f:
                codes.append(int(f.read().strip()))
        except (OSError, ValueError):
            continue
    return codes


def rendezvous(args: Any) -> tuple[str, int]:
    """The host and port torchrun's workers meet at (``--master-addr`` under the static
    rendezvous Holmes renders, else ``--rdzv-endpoint``; port 0: not known yet)."""
    if args.standalone:
        return "localhost", 0
    if args.rdzv_backend == "static" and not args.rdzv_endpoint:
        return args.master_addr, int(args.master_port)
    host, _, port = args.rdzv_endpoint.rpartition(":")
    if not host or not port.isdigit():
        return args.rdzv_endpoint.strip("[]"), 0
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(argv)
    if args.shutdown_timeout is None:
        # the pod's grace period, so torchrun waits as long as Kubernetes does before SIGKILL
        given = os.environ.get(TORCHRUN_SHUTDOWN_ENV, "")
        grace = grace_seconds({ENV_GRACE_SECONDS: os.environ.get(ENV_GRACE_SECONDS, "")})
        args.shutdown_timeout = int(given) if given.isdigit() else math.ceil(grace)
    os.environ[TORCHRUN_SHUTDOWN_ENV] = str(args.shutdown_timeout)  # the workers' deadline too
    try:
        podnet.setup(os.environ, *rendezvous(args))
    except podnet.NetError as e:
        print(f"holmes.trainer.run: {e}", file=sys.stderr, flush=True)
        return 2
    exits = tempfile.mkdtemp(prefix="holmes-exit-")
    os.environ[ENV_EXIT_DIR] = exits
    try:
        torchrun.run(args)
        return 0
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        code = exit_status(failure.exitcode)
        print(f"holmes.trainer.run: rank {rank} failed first, exit code {code}", file=sys.stderr, flush=True)
        return code
    except SignalException as e:
        codes = noted_exits(exits)
        if codes and all(c == EXIT_PREEMPTED for c in codes):
            return EXIT_PREEMPTED
        return 128 + int(e.sigval)
    finally:
        shutil.rmtree(exits, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
