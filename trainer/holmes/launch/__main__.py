"""``python /holmes-launch/launch.py -- <program> [args]``: the user's program under torchrun, on
Holmes' layout (the operator writes this command for ``spec.framework`` other than holmes).

1. The environment: ``NCCL_NET`` removed (it would override every group's net), the
   launcher's directory first on ``PYTHONPATH`` so each worker's ``sitecustomize`` installs the
   network hook; the other NCCL variables are the pod's, per node, as the operator set them.
2. The hook's checks, before any worker starts (unless ``HOLMES_NET_HOOK=off``): an unsupported
   torch, an ``NCCL_NET`` in NCCL's configuration files (``/etc/nccl.conf``, ``~/.nccl.conf``,
   ``$NCCL_CONF_FILE``: it would override every group's net) or TorchComms on while the Layout
   needs several nets stops the pod with the reason (exit 2).
3. The pod's network names, resolved in the pod (``podnet``, as the Holmes engine's start-up
   does): ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` from the route to ``MASTER_ADDR``,
   ``NCCL_IB_HCA`` from the RDMA devices the pod sees; a wrong value in the template: exit 2.
4. The fabric preflight's device checks when this node's groups are planned on IB (RDMA devices,
   HCAs, ports, GID index: ``holmes.trainer.fabric.rdma_problems``, copied beside this launcher),
   per ``HOLMES_FABRIC_CHECK`` (fail: exit 3 | warn: one JSON line | off). They run on GPUs, or
   anywhere ``HOLMES_FABRIC_ROOT`` names a directory holding sys/ and dev/.
0. In a pod of a JobSet labelled ``holmes.dev/plan: enabled`` (``$HOLMES_PLAN``, or a mounted
   /etc/holmes/plan.json and no NODE_RANK): the rank env and the node's NCCL env from the pod's
   entry in Holmes' plan (jobset.py), not from the operator.
5. ``exec`` torchrun with a static rendezvous: ``--node-rank`` is the Layout's (``NODE_RANK``),
   not the hostname order torchrun's c10d rendezvous would choose, so stage s is the block of
   nodes the planner put on one island. torchrun's exit code is the pod's.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path

from . import jobset, podnet, shared
from .islands import Islands

RDMA_KINDS = ("infiniband", "roce")
ROOT = Path(__file__).resolve().parents[2]  # the directory holding holmes/launch (PYTHONPATH)
FABRIC_FILE = "fabric.py"  # the trainer's fabric checks, copied here by install.py
_PYTHONS = ("python", "python3")


class LaunchError(RuntimeError):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def worker_env(env: Mapping[str, str], root: Path = ROOT) -> tuple[dict[str, str], list[str]]:
    """The environment torchrun and its workers get, and notes on what changed."""
    out, notes = dict(env), []
    if out.pop("NCCL_NET", None) is not None:
        notes.append(f"removed NCCL_NET={env['NCCL_NET']}: it would override every group's network")
    paths = [str(root)] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(root)]
    out["PYTHONPATH"] = os.pathsep.join(paths)
    return out, notes


def program_args(argv: Sequence[str]) -> list[str]:
    """The user's command as torchrun's program arguments: ``python [-u] x.py a`` -> ``x.py a``,
    ``python -m pkg a`` -> ``-m pkg a``, any other executable -> ``--no-python exe a``."""
    if not argv:
        raise LaunchError("no program given: python -m holmes.launch -- <program> [args]", 2)
    head = os.path.basename(argv[0])
    if not (head in _PYTHONS or head.startswith("python3.")):
        return ["--no-python", *argv]
    rest = list(argv[1:])
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        rest.pop(0)  # python's own switches (-u, -O): torchrun runs workers with its own python
    if not rest:
        raise LaunchError(f"{' '.join(argv)} names no script or module for torchrun to run", 2)
    return rest


def torchrun_argv(env: Mapping[str, str], program: Sequence[str]) -> list[str]:
    need = ("NNODES", "NPROC_PER_NODE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
    missing = [k for k in need if not env.get(k)]
    if missing:
        raise LaunchError(
            f"{', '.join(missing)} not set: this launcher runs in pods the Holmes operator made", 2
        )
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={env['NNODES']}",
        f"--nproc-per-node={env['NPROC_PER_NODE']}",
        f"--node-rank={env['NODE_RANK']}",
        "--rdzv-backend=static",
        f"--master-addr={env['MASTER_ADDR']}",
        f"--master-port={env['MASTER_PORT']}",
        *program,
    ]


def check_hook(env: Mapping[str, str], home: Path | None = None, etc: Path | None = None) -> str | None:
    """What the hook would refuse in every worker, refused once for the pod (exit 2): the
    torch version, an NCCL_NET in NCCL's configuration files, TorchComms with a Layout that
    needs several nets. A warning to print, if any."""
    if env.get("HOLMES_NET_HOOK", "on") == "off":
        return None
    import torch
    import torch.distributed.distributed_c10d as c10d

    from .hook import HookError, check_nccl_net, check_torch, check_torchcomms, torchcomms_enabled

    try:
        check_torch(torch.__version__, c10d)
        check_nccl_net(dict(env), home, etc)  # a copy: worker_env has already dropped the variable
        layout = env.get("HOLMES_LAYOUT")
        return check_torchcomms(Islands.read(layout), torchcomms_enabled()) if layout else None
    except HookError as e:
        raise LaunchError(str(e), 2) from None


def device_check(env: Mapping[str, str], root: Path = ROOT) -> dict | None:
    """The device checks' findings as a JSON-able dict, None when they do not apply here."""
    mode = env.get("HOLMES_FABRIC_CHECK", "warn")
    layout = env.get("HOLMES_LAYOUT")
    if mode == "off" or not layout or env.get("HOLMES_NIC") not in RDMA_KINDS:
        return None
    node_rank = int(env.get("NODE_RANK", "0"))
    if Islands.read(layout).node_island[node_rank] is None:
        return None  # none of this node's groups is planned on IB
    base = env.get("HOLMES_FABRIC_ROOT")
    if not base:
        import torch

        if not torch.cuda.is_available():
            return {"devices": "skipped (no GPU and no HOLMES_FABRIC_ROOT)", "problems": []}
        base = "/"
    checks = runpy.run_path(str(fabric_file(root)))
    problems = checks["rdma_problems"](Path(base) / "sys", Path(base) / "dev", env)
    if problems and mode == "fail":
        raise LaunchError(
            f"fabric check failed on node rank {node_rank} ({env.get('HOLMES_NIC')}): "
            + "; ".join(problems)
            + ". Fix the pod's RDMA setup, or set training.fabricCheck: warn to train anyway at the "
            "slower speed",
            3,
        )
    return {"devices": "checked", "problems": problems}


def fabric_file(root: Path = ROOT) -> Path:
    """The copy beside the launcher in a pod; the trainer's own file in a checkout."""
    try:
        return shared.trainer_file(FABRIC_FILE, root)
    except FileNotFoundError as e:
        raise LaunchError(str(e), 2) from None


def main(argv: list[str] | None = None, env: MutableMapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    env = os.environ if env is None else env
    try:
        planned = dict(env)  # a labelled JobSet's pod: its rank env from Holmes' plan (jobset.py)
        plan_notes = jobset.from_plan(planned)
        run_env, notes = worker_env(planned)
        notes = plan_notes + notes
        for note in notes:
            print(f"holmes.launch: {note}", file=sys.stderr, flush=True)
        warning = check_hook(run_env)
        if warning:
            print(f"holmes.launch: {warning}", file=sys.stderr, flush=True)
        cmd = torchrun_argv(run_env, program_args(argv))
        if not run_env["MASTER_PORT"].isdigit():
            raise LaunchError(f"MASTER_PORT={run_env['MASTER_PORT']} is not a port number", 2)
        podnet.setup(run_env, run_env["MASTER_ADDR"], int(run_env["MASTER_PORT"]))
        found = device_check(run_env)
        if found is not None:
            print(json.dumps({"holmesFabric": found}), file=sys.stderr, flush=True)
    except podnet.NetError as e:
        print(f"holmes.launch: {e}", file=sys.stderr, flush=True)
        return 2
    except LaunchError as e:
        print(f"holmes.launch: {e}", file=sys.stderr, flush=True)
        return e.code
    except jobset.PlanMissing as e:
        print(f"holmes.launch: {e}", file=sys.stderr, flush=True)
        return 2
    print("holmes.launch: " + json.dumps({"exec": cmd[1:]}), file=sys.stderr, flush=True)
    os.execvpe(cmd[0], cmd, run_env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
