"""Every new torch.distributed group gets the NCCL network of its members' island.

Megatron-LM can name one network per group *type* (its communicator YAML), torchtitan and
DeepSpeed none; Holmes' plans need one per *group* (the DP groups of an InfiniBand stage on IB,
those of an Ethernet stage on sockets). Every group torch creates goes through one of two private
functions of ``torch.distributed.distributed_c10d``:

- ``_new_process_group_helper``: the default group (``init_process_group``) and every
  ``new_group`` / ``new_subgroups`` (Megatron's groups, DeviceMesh without a bound device);
- ``split_group``: ``ncclCommSplit`` children (DeviceMesh with a bound device), which bypass the
  helper.

The hook wraps both. Whether a group runs on NCCL is read from the device map torch itself
builds (``BackendConfig``), never from the backend string: ``init_process_group()`` without a
backend records ``"undefined"`` (and every ``new_group`` inherits it), which torch maps to the
accelerator's default backend, NCCL on CUDA. For an NCCL group that spans nodes it sets
``ProcessGroupNCCL.Options().config.net_name`` (a copy of the options the caller gave, else
torch's own default options) to :meth:`Islands.net` of the group's global ranks. A group whose
ranks all sit on one node (NVLink-only tensor parallelism) is left to NCCL: pinning it to IB
would make it fail whenever the pod's IB is unusable, and NCCL needs no network for it.

The group's lowest rank logs one JSON line ``{"holmesGroup": {"ranks": [...], "backend": ...,
"net": ..., "applied": ...}}``: ``applied`` is true when the net was passed to NCCL; otherwise
``why`` says why not (one node: ``net`` null; a backend without NCCL: ``net`` is what NCCL would
get; TorchComms on: torch 2.13 does not hand per-group options to TorchComms). ``devices`` shows
torch's device map where the backend string hides it (``undefined``). A net the caller had set
(Megatron's YAML) is replaced by the island's and shown as ``"given"``.

:func:`install` refuses to start (:class:`HookError`, with the fix) where the nets could not hold:

- a torch whose private functions the hook was not read against (:data:`SUPPORTED_TORCH`), or
  whose signatures differ;
- ``NCCL_NET`` in one of NCCL's configuration files (the trainer's ``ncclenv.py``): it
  overrides every pinned net; in the environment it is removed instead (as the launcher does
  for torchrun);
- TorchComms on (``TORCH_DISTRIBUTED_USE_TORCHCOMMS`` / ``torch.distributed.config.
  use_torchcomms``, with the ``torchcomms`` package installed) while the Layout's groups need
  more than one net; with one net it warns and logs every group ``applied: false``.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from . import shared
from .islands import Islands

SUPPORTED_TORCH = ("2.13",)  # major.minor read against (torch/distributed/distributed_c10d.py)
HELPER_PARAMS = ("group_size", "group_rank", "global_ranks_in_group", "backend", "store", "group_name")
SPLIT_PARAMS = ("parent_pg", "split_ranks", "timeout", "pg_options", "group_desc")
ENV_LAYOUT = "HOLMES_LAYOUT"
LOG_KEY = "holmesGroup"
NCCL = "nccl"
ESCAPE = "or set HOLMES_NET_HOOK=off to run without per-group networks"
TORCHCOMMS_WHY = (
    "TorchComms is on (TORCH_DISTRIBUTED_USE_TORCHCOMMS or torch.distributed.config.use_torchcomms): "
    "torch 2.13 does not pass per-group NCCL options to TorchComms, so NCCL picks the network"
)


class HookError(RuntimeError):
    """The hook cannot be installed here; the message says why and what to do."""


def check_torch(version: str, c10d: Any) -> None:
    """Refuse a torch whose private group functions the hook was not read against."""
    major_minor = ".".join(version.split("+")[0].split(".")[:2])
    if major_minor not in SUPPORTED_TORCH:
        raise HookError(
            f"torch {version} is not supported by Holmes' network hook (supported: "
            f"{', '.join(v + '.x' for v in SUPPORTED_TORCH)}): it wraps private torch.distributed "
            "functions. Use an image with a supported torch, or set HOLMES_NET_HOOK=off to run "
            "without per-group networks (every NCCL group then uses NCCL's own choice)"
        )
    for name, want in (("_new_process_group_helper", HELPER_PARAMS), ("split_group", SPLIT_PARAMS)):
        fn = getattr(c10d, name, None)
        got = tuple(inspect.signature(fn).parameters)[: len(want)] if fn else ()
        if got != want:
            raise HookError(
                f"torch {version}: torch.distributed.distributed_c10d.{name} has parameters {got}, "
                f"expected {want}; this build of torch differs from the one the hook supports "
                "(set HOLMES_NET_HOOK=off to run without per-group networks)"
            )


def check_torchcomms(islands: Islands, enabled: bool) -> str | None:
    """Refuse TorchComms when the Layout's groups need more than one net (torch would run them
    all on NCCL's single choice); a warning when they need at most one."""
    if not enabled:
        return None
    nets = sorted(islands.nets_in_use())
    if len(nets) > 1:
        raise HookError(
            f"{TORCHCOMMS_WHY}; this Layout's groups need {' and '.join(nets)} on different groups. "
            f"Unset TORCH_DISTRIBUTED_USE_TORCHCOMMS (and use_torchcomms), {ESCAPE}"
        )
    return (
        f"WARNING: {TORCHCOMMS_WHY}; the Layout needs {nets[0] if nets else 'no network'} only, "
        "so training goes on, with every group logged applied: false"
    )


def check_nccl_net(env: MutableMapping[str, str], home: Path | None, etc: Path | None) -> list[str]:
    """Refuse an NCCL_NET in NCCL's configuration files (``home``: the user's, default ``env``'s
    ``HOME``, as NCCL reads it; ``etc``: default /etc/nccl.conf); remove it from ``env``. The notes."""
    nccl = shared.load("ncclenv.py")  # the trainer's: see shared.py
    home = nccl["user_home"](env) if home is None else home
    found = nccl["file_override"](env, home, nccl["ETC_CONF"] if etc is None else etc)
    if found is not None:
        raise HookError(nccl["file_fix"](found, ESCAPE))
    note = nccl["drop_from_env"](env)
    return [note] if note else []


def torchcomms_enabled() -> bool:
    """torch's own test (the flag and an importable torchcomms)."""
    import torch.distributed.distributed_c10d as c10d

    return bool(c10d._use_torchcomms_enabled())


def device_backends(backend: Any) -> dict[str, str]:
    """The backend per device torch will create for ``backend`` (its ``BackendConfig``):
    ``"undefined"`` becomes the accelerator's default (``{"cuda": "nccl"}`` on a GPU),
    ``"cpu:gloo,cuda:nccl"`` both; empty where torch cannot tell (it then refuses the group)."""
    from torch.distributed.distributed_c10d import BackendConfig

    try:
        config = BackendConfig(backend)
    except ValueError:
        return {}
    return {device: str(b) for device, b in config.get_device_backend_map().items()}


def decide(
    islands: Islands, ranks: Sequence[int], devices: Mapping[str, str], nccl: str, torchcomms: bool
) -> dict[str, Any]:
    """What the hook does for one group (pure): ``net`` (None inside one node), ``applied``
    (pass it to NCCL) and, when not applied, ``why``."""
    nodes = islands.nodes(ranks)
    net = islands.pinned(ranks)
    if net is None:
        node = next(iter(nodes), 0)
        why = f"all ranks on node {node}: NCCL uses NVLink or shared memory, no network pinned"
        return {"net": None, "applied": False, "why": why}
    if nccl not in devices.values():
        found = ",".join(f"{d}:{b}" for d, b in devices.items()) or "none"
        return {"net": net, "applied": False, "why": f"no NCCL device in the backend ({found})"}
    if torchcomms:
        return {"net": net, "applied": False, "why": TORCHCOMMS_WHY}
    return {"net": net, "applied": True}


def with_net(options: Any, net: str, new_options: Callable[[], Any]) -> tuple[Any, str | None]:
    """NCCL options carrying ``net``: a copy of ``options`` (the caller's object is not changed),
    else fresh ones as torch makes them; and the net the caller had set, if any."""
    if options is None:
        options = new_options()
        options.is_high_priority_stream = False  # torch's own default for a new group
    else:
        options = copy.deepcopy(options)  # as torch copies a parent's options for a split
    given = getattr(options.config, "net_name", None) or None
    options.config.net_name = net
    return options, given


def _nccl_options() -> Any:
    import torch.distributed as dist

    return dist.ProcessGroupNCCL.Options()


class NetHook:
    """The two wrappers and what they decided, bound to one Layout's islands. ``nccl``: the
    backend name whose groups take ``new_options`` (tests name the fake backend, which stands
    in for NCCL on a CPU build); ``torchcomms``: whether torch hands groups to TorchComms, asked
    at each group (a program may turn it on after the hook is installed)."""

    def __init__(
        self,
        islands: Islands,
        log: TextIO | None = None,
        new_options: Callable[[], Any] = _nccl_options,
        split_options: Callable[[Any], Any] | None = None,
        nccl: str = NCCL,
        torchcomms: Callable[[], bool] = torchcomms_enabled,
    ):
        self.islands = islands
        self.log = log if log is not None else sys.stderr
        self.new_options = new_options  # ProcessGroupNCCL.Options (absent from CPU builds)
        self.split_options = split_options or _parent_nccl_options
        self.nccl = nccl
        self.torchcomms = torchcomms
        self.decisions: list[dict[str, Any]] = []  # every group this process saw created

    def plan(self, ranks: Sequence[int], backend: Any) -> dict[str, Any]:
        devices = device_backends(backend)
        entry: dict[str, Any] = {"ranks": list(ranks), "backend": str(backend)}
        if str(backend) == "undefined":
            entry["devices"] = devices  # what "undefined" stands for on this machine
        entry.update(decide(self.islands, ranks, devices, self.nccl, self.torchcomms()))
        return entry

    def record(self, entry: dict[str, Any], me: int, given: str | None, desc: Any) -> None:
        if desc:
            entry["desc"] = str(desc)
        if given and given != entry["net"]:
            entry["given"] = given
        self.decisions.append(entry)
        if entry["ranks"] and me == min(entry["ranks"]):  # one line per group in the pods' logs
            self.write_line(json.dumps({LOG_KEY: entry}, separators=(",", ":")))

    def write_line(self, text: str) -> None:
        """One write() per line: the workers of a pod share its log, and a line written in two
        pieces can be split by another worker's output."""
        data = (text + "\n").encode()
        try:
            fd = self.log.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            self.log.write(text + "\n")
            self.log.flush()
            return
        self.log.flush()
        while data:
            data = data[os.write(fd, data) :]

    def wrap_helper(self, original: Callable) -> Callable:
        @functools.wraps(original)
        def helper(
            group_size, group_rank, global_ranks_in_group, backend, store, group_name, *args, **kwargs
        ):
            default = not global_ranks_in_group  # init_process_group passes [] for the world
            ranks = list(range(group_size)) if default else list(global_ranks_in_group)
            me = group_rank if default else _global_rank(group_rank)
            given = None
            entry = self.plan(ranks, backend)
            if entry["applied"]:
                options = kwargs.pop("backend_options", args[0] if args else None)
                args = args[1:]
                options, given = with_net(options, entry["net"], self.new_options)
                kwargs["backend_options"] = options
            self.record(entry, me, given, kwargs.get("group_desc"))
            return original(
                group_size, group_rank, global_ranks_in_group, backend, store, group_name, *args, **kwargs
            )

        setattr(helper, "__holmes_hook__", True)  # noqa: B010 (a marker on a function)
        return helper

    def wrap_split(self, original: Callable) -> Callable:
        @functools.wraps(original)
        def split(parent_pg=None, split_ranks=None, timeout=None, pg_options=None, group_desc=None, **kwargs):
            import torch.distributed as dist

            parent = parent_pg if parent_pg is not None else dist.distributed_c10d._get_default_group()
            to_global = dist.get_process_group_ranks(parent)
            me = dist.get_rank()
            mine = next((sorted(g) for g in split_ranks or [] if to_global.index(me) in g), None)
            backend = kwargs.get("backend") or dist.get_backend(parent)
            if mine is not None:
                given = None
                entry = self.plan([to_global[r] for r in mine], backend)
                if entry["applied"]:
                    base = pg_options if pg_options is not None else self.split_options(parent)
                    pg_options, given = with_net(base, entry["net"], self.new_options)
                self.record(entry, me, given, group_desc)
            return original(
                parent_pg=parent_pg,
                split_ranks=split_ranks,
                timeout=timeout,
                pg_options=pg_options,
                group_desc=group_desc,
                **kwargs,
            )

        setattr(split, "__holmes_hook__", True)  # noqa: B010 (a marker on a function)
        return split


def _global_rank(fallback: int) -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else fallback


def _parent_nccl_options(parent: Any) -> Any:
    """What torch itself passes a split child by default: a copy of the parent's NCCL options."""
    import torch

    return copy.deepcopy(parent._get_backend(torch.device("cuda")).options)


def _modules() -> list[Any]:
    """Where torch keeps a reference to the group-creation functions."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    modules = [c10d, dist]
    try:
        import torch.distributed.device_mesh as device_mesh

        modules.append(device_mesh)
    except ImportError:  # a torch built without distributed meshes
        pass
    return modules


_ORIGINALS: dict[str, Callable] = {}


def install(
    islands: Islands,
    log: TextIO | None = None,
    *,
    env: MutableMapping[str, str] | None = None,
    home: Path | None = None,
    etc: Path | None = None,
    **options: Any,
) -> NetHook:
    """Check torch, NCCL_NET (in ``env``, default this process's, and NCCL's configuration
    files: ``home`` is the user's, default ``$HOME`` as NCCL reads it) and TorchComms, then wrap
    the group-creation functions wherever torch keeps a reference to them (distributed_c10d,
    the torch.distributed namespace, DeviceMesh). A second install replaces the first."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    check_torch(torch.__version__, c10d)
    env = os.environ if env is None else env
    notes = check_nccl_net(env, home, etc)
    warning = check_torchcomms(islands, options.get("torchcomms", torchcomms_enabled)())
    uninstall()
    hook = NetHook(islands, log, **options)
    for note in notes + ([warning] if warning else []):
        hook.write_line(f"holmes network hook: {note}")
    _ORIGINALS.update(helper=c10d._new_process_group_helper, split=c10d.split_group)
    c10d._new_process_group_helper = hook.wrap_helper(_ORIGINALS["helper"])
    split = hook.wrap_split(_ORIGINALS["split"])
    for m in _modules():
        if getattr(m, "split_group", None) is _ORIGINALS["split"]:
            m.split_group = split
    return hook


def uninstall() -> None:
    """Put torch's own functions back (tests; a process that wants them)."""
    if not _ORIGINALS:
        return
    import torch.distributed.distributed_c10d as c10d

    c10d._new_process_group_helper = _ORIGINALS["helper"]
    for m in _modules():
        if getattr(getattr(m, "split_group", None), "__holmes_hook__", False):
            m.split_group = _ORIGINALS["split"]
    _ORIGINALS.clear()


def install_from_env(given: MutableMapping[str, str] | None = None, **checks: Any) -> NetHook | None:
    """The hook for the Layout at ``$HOLMES_LAYOUT`` (none when it is unset, or with
    ``HOLMES_NET_HOOK=off``); ``checks``: :func:`install`'s ``home`` and ``etc``."""
    env: MutableMapping[str, str] = os.environ if given is None else given
    if env.get("HOLMES_NET_HOOK", "on") == "off" or not env.get(ENV_LAYOUT):
        return None
    return install(Islands.read(env[ENV_LAYOUT]), env=env, **checks)
