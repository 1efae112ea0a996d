"""Every new torch.distributed group gets the NCCL network of its members' island.

Megatron-LM can name one network per group *type* (its communicator YAML), torchtitan and
DeepSpeed none; Holmes' plans need one per *group* (the DP groups of an InfiniBand stage on IB,
those of an Ethernet stage on sockets). Every group torch creates goes through one of two private
functions of ``torch.distributed.distributed_c10d``:

- ``_new_process_group_helper``: the default group (``init_process_group``) and every
  ``new_group`` / ``new_subgroups`` (Megatron's groups, DeviceMesh without a bound device);
- ``split_group``: ``ncclCommSplit`` children (DeviceMesh with a bound device), which bypass the
  helper.

The hook wraps both: for an NCCL group it sets ``ProcessGroupNCCL.Options().config.net_name``
(a copy of the options the caller gave, else torch's own default options) to
:meth:`Islands.net` of the group's global ranks, and the group's lowest rank logs one JSON line
``{"holmesGroup": {"ranks": [...], "backend": ..., "net": ..., "applied": ...}}`` (``applied``:
the backend is NCCL, so the net was passed; on gloo the line says what NCCL would use). A net the
caller had set (Megatron's YAML) is replaced by the island's and shown as ``"given"``.

These are private functions: :data:`SUPPORTED_TORCH` lists the torch versions whose source they
were read against, and :func:`install` refuses any other (and any whose signatures differ)
with a message saying so, rather than guess.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from .islands import Islands

SUPPORTED_TORCH = ("2.13",)  # major.minor read against (torch/distributed/distributed_c10d.py)
HELPER_PARAMS = ("group_size", "group_rank", "global_ranks_in_group", "backend", "store", "group_name")
SPLIT_PARAMS = ("parent_pg", "split_ranks", "timeout", "pg_options", "group_desc")
ENV_LAYOUT = "HOLMES_LAYOUT"
LOG_KEY = "holmesGroup"


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


def is_nccl(backend: Any) -> bool:
    """Whether a backend (``"nccl"``, ``"cpu:gloo,cuda:nccl"``, a Backend) includes NCCL."""
    return "nccl" in str(backend).lower()


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
    """The two wrappers and what they decided, bound to one Layout's islands."""

    def __init__(
        self,
        islands: Islands,
        log: TextIO | None = None,
        new_options: Callable[[], Any] = _nccl_options,
        split_options: Callable[[Any], Any] | None = None,
    ):
        self.islands = islands
        self.log = log if log is not None else sys.stderr
        self.new_options = new_options  # ProcessGroupNCCL.Options (absent from CPU builds)
        self.split_options = split_options or _parent_nccl_options
        self.decisions: list[dict[str, Any]] = []  # every group this process saw created

    def decide(self, ranks: Sequence[int], backend: Any, me: int, given: str | None, desc: Any) -> str:
        net = self.islands.net(ranks)
        entry = {"ranks": list(ranks), "backend": str(backend), "net": net, "applied": is_nccl(backend)}
        if desc:
            entry["desc"] = str(desc)
        if given and given != net:
            entry["given"] = given
        self.decisions.append(entry)
        if ranks and me == min(ranks):  # one line per group in the pods' logs together
            self.write_line(json.dumps({LOG_KEY: entry}, separators=(",", ":")))
        return net

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
            net = self.islands.net(ranks)
            if is_nccl(backend):
                options = kwargs.pop("backend_options", args[0] if args else None)
                args = args[1:]
                options, given = with_net(options, net, self.new_options)
                kwargs["backend_options"] = options
            self.decide(ranks, backend, me, given, kwargs.get("group_desc"))
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
                ranks = [to_global[r] for r in mine]
                given = None
                if is_nccl(backend):
                    base = pg_options if pg_options is not None else self.split_options(parent)
                    pg_options, given = with_net(base, self.islands.net(ranks), self.new_options)
                self.decide(ranks, backend, me, given, group_desc)
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


def install(islands: Islands, log: TextIO | None = None, **options: Any) -> NetHook:
    """Check torch, then wrap the group-creation functions wherever torch keeps a reference to
    them (distributed_c10d, the torch.distributed namespace, DeviceMesh). A second install
    replaces the first."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    check_torch(torch.__version__, c10d)
    uninstall()
    hook = NetHook(islands, log, **options)
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


def install_from_env(given: Mapping[str, str] | None = None) -> NetHook | None:
    """The hook for the Layout at ``$HOLMES_LAYOUT`` (none when it is unset, or with
    ``HOLMES_NET_HOOK=off``)."""
    env: Mapping[str, str] = os.environ if given is None else given
    if env.get("HOLMES_NET_HOOK", "on") == "off" or not env.get(ENV_LAYOUT):
        return None
    return install(Islands.read(env[ENV_LAYOUT]))
