"""A CPU budget per group of processes, through the kernel's CPU controller, for benchmarks that
need genuinely unequal compute (one island's trainers slower than the other's): the processes run
as they are, the kernel throttles them, every timing is real.

    limits = CpuLimits.create({"a": 1.2, "b": 0.5})    # cores per group (root)
    cmd = limits.wrap("b", cmd)                        # the command (and its children) in group b
    ...
    limits.remove()

cgroup v2 (``cpu.max``) when the unified hierarchy has the cpu controller, else cgroup v1's cpu
hierarchy (``cpu.cfs_quota_us``). A group is ``holmes-bench-<name>`` under the hierarchy's root;
``remove_leftovers`` deletes those a killed run left. The pure part (which files say what, the
wrapping command) is unit-tested; the rest needs root.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "holmes-bench-"
PERIOD_US = 100_000  # the kernel's default CFS period: the budget is enforced every 100 ms
V2_ROOT = "/sys/fs/cgroup"
V1_ROOT = "/sys/fs/cgroup/cpu"


class CpuLimitError(RuntimeError):
    """This machine cannot limit CPU per group; the message says what is missing."""


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 1 | 2
    root: str


def detect(v2_root: str = V2_ROOT, v1_root: str = V1_ROOT) -> Hierarchy:
    """The hierarchy with a usable cpu controller (v2 preferred), or CpuLimitError saying why."""
    controllers = os.path.join(v2_root, "cgroup.controllers")
    if os.path.exists(controllers):
        with open(controllers) as f:
            if "cpu" in f.read().split():
                return Hierarchy(2, v2_root)
    if os.path.exists(os.path.join(v1_root, "cpu.cfs_quota_us")):
        return Hierarchy(1, v1_root)
    raise CpuLimitError(
        f"no cgroup cpu controller: neither {controllers} lists 'cpu' nor {v1_root}/cpu.cfs_quota_us "
        "exists (mount the cgroup cpu controller, or run where it is)"
    )


def quota_files(version: int, cores: float) -> dict[str, str]:
    """What to write into a group's files so its processes get ``cores`` CPUs' worth of time."""
    if not cores > 0:
        raise ValueError(f"a CPU budget must be > 0 cores, got {cores}")
    quota = max(1000, round(cores * PERIOD_US))  # the kernel's minimum quota is 1 ms
    if version == 2:
        return {"cpu.max": f"{quota} {PERIOD_US}"}
    return {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(quota)}


def wrap(group_dir: str, cmd: list[str]) -> list[str]:
    """``cmd`` started inside the group: the shell moves itself in, then execs (children inherit
    the group at fork, so nothing the command starts escapes it, even for a moment)."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', group_dir, *cmd]


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise CpuLimitError(f"cannot write {text!r} to {path}: {e.strerror or e} (root needed)") from None


def remove_leftovers(h: Hierarchy) -> list[str]:
    """Delete this module's groups (empty ones: their processes must have ended)."""
    removed = []
    for name in sorted(os.listdir(h.root)):
        if name.startswith(PREFIX) and os.path.isdir(os.path.join(h.root, name)):
            try:
                os.rmdir(os.path.join(h.root, name))
                removed.append(name)
            except OSError as e:
                raise CpuLimitError(
                    f"cannot remove the leftover group {h.root}/{name}: {e.strerror} "
                    f"(its processes still run: kill the PIDs in {h.root}/{name}/cgroup.procs)"
                ) from None
    return removed


@dataclass
class CpuLimits:
    hierarchy: Hierarchy
    cores: Mapping[str, float]

    @classmethod
    def create(cls, cores: Mapping[str, float], hierarchy: Hierarchy | None = None) -> CpuLimits:
        h = hierarchy or detect()
        remove_leftovers(h)
        if h.version == 2:  # the root's children get the cpu controller only when it is delegated
            with open(os.path.join(h.root, "cgroup.subtree_control")) as f:
                if "cpu" not in f.read().split():
                    _write(os.path.join(h.root, "cgroup.subtree_control"), "+cpu")
        limits = cls(h, dict(cores))
        try:
            for name, c in cores.items():
                d = limits.dir(name)
                try:
                    os.mkdir(d)
                except OSError as e:
                    raise CpuLimitError(f"cannot create {d}: {e.strerror} (root needed)") from None
                for file, text in quota_files(h.version, c).items():
                    _write(os.path.join(d, file), text)
        except BaseException:
            limits.remove()
            raise
        return limits

    def dir(self, name: str) -> str:
        return os.path.join(self.hierarchy.root, PREFIX + name)

    def wrap(self, name: str, cmd: list[str]) -> list[str]:
        return wrap(self.dir(name), cmd)

    def throttled_seconds(self, name: str) -> float:
        """Time the group's processes spent throttled (their budget used up), from cpu.stat."""
        stat = {}
        with open(os.path.join(self.dir(name), "cpu.stat")) as f:
            for line in f:
                k, _, v = line.partition(" ")
                stat[k] = int(v)
        if "throttled_usec" in stat:
            return stat["throttled_usec"] / 1e6
        return stat.get("throttled_time", 0) / 1e9  # v1: nanoseconds

    def remove(self) -> None:
        for name in self.cores:
            d = self.dir(name)
            if os.path.isdir(d):
                try:
                    os.rmdir(d)
                except OSError as e:
                    raise CpuLimitError(
                        f"cannot remove {d}: {e.strerror} (kill the PIDs in {d}/cgroup.procs)"
                    ) from None
