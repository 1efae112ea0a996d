"""A CPU budget per group of processes, through the kernel's CPU controller, for benchmarks that
need genuinely unequal compute (one island's trainers slower than the other's): the processes run
as they are, the kernel throttles them, every timing is real.

    limits = CpuLimits.create({"a": 1.2, "b": 0.5})    # cores per group (root)
    cmd = limits.wrap("b", cmd)                        # the command (and its children) in group b
    limits.enforce(False) ... limits.enforce(True)     # lift the budgets for a while, restore them
    CpuLimits.create({...}, priority=True)             # and first claim on the CPU up to them
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
# The budget is enforced per period. The kernel's default, 100 ms, lets a process that idles
# between bursts (a pipeline stage waiting on its neighbour) run them unthrottled: its speed then
# depends on its duty cycle, which no GPU's does. With 4 ms, the shortest period a 0.25-core
# budget allows (the kernel's minimum quota is 1 ms), a budget of 0.25 core slowed bursts of
# 5-100 ms at duty cycles 0.2-1 by 3.2-4.9x, against 1.2-3.9x with 100 ms (measured, 2 cores).
PERIOD_US = 4000
MIN_QUOTA_US = 1000
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


def quota_files(version: int, cores: float | None) -> dict[str, str]:
    """What to write into a group's files so its processes get ``cores`` CPUs' worth of time
    (None: no limit)."""
    if cores is None:
        return {"cpu.max": f"max {PERIOD_US}"} if version == 2 else {"cpu.cfs_quota_us": "-1"}
    if not cores > 0:
        raise ValueError(f"a CPU budget must be > 0 cores, got {cores}")
    quota = round(cores * PERIOD_US)
    if quota < MIN_QUOTA_US:
        raise ValueError(
            f"a CPU budget of {cores} core is below the kernel's minimum quota ({MIN_QUOTA_US} us per "
            f"{PERIOD_US} us period): give at least {MIN_QUOTA_US / PERIOD_US:g} core"
        )
    if version == 2:
        return {"cpu.max": f"{quota} {PERIOD_US}"}
    return {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(quota)}


# A quota caps a group; it guarantees nothing when the machine is shared: a group competes with
# every other runnable thread at the default weight, so on a loaded machine its ranks get less than
# their budget, unevenly, and a rank woken by a message waits its turn. The highest weight gives a
# group first claim on the CPU up to its quota (the budgets together must fit the machine's cores).
MAX_WEIGHT = {1: ("cpu.shares", "262144"), 2: ("cpu.weight", "10000")}


def priority_files(version: int) -> dict[str, str]:
    """What to write into a group's files so it takes the CPU before default-weight threads."""
    file, value = MAX_WEIGHT[version]
    return {file: value}


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
    def create(
        cls,
        cores: Mapping[str, float],
        hierarchy: Hierarchy | None = None,
        sweep: bool = True,
        priority: bool = False,
    ) -> CpuLimits:
        """``sweep``: delete the groups a killed run left first (False where another bench may be
        running: give ``cores`` names of this run's own, e.g. with the PID in them). ``priority``:
        each group at the highest weight (priority_files), so its budget holds on a busy machine."""
        h = hierarchy or detect()
        if sweep:
            remove_leftovers(h)
        if h.version == 2:  # the root's children get the cpu controller only when it is delegated
            with open(os.path.join(h.root, "cgroup.subtree_control")) as f:
                if "cpu" not in f.read().split():
                    _write(os.path.join(h.root, "cgroup.subtree_control"), "+cpu")
        limits = cls(h, dict(cores))
        try:
            for name in cores:
                d = limits.dir(name)
                try:
                    os.mkdir(d)
                except OSError as e:
                    raise CpuLimitError(f"cannot create {d}: {e.strerror} (root needed)") from None
                if priority:
                    total = sum(cores.values())
                    if total > (os.cpu_count() or 1):
                        raise CpuLimitError(
                            f"budgets of {total:g} cores with priority exceed this machine's "
                            f"{os.cpu_count()} cores: lower them, or run without priority"
                        )
                    for file, text in priority_files(h.version).items():
                        _write(os.path.join(d, file), text)
            limits.enforce(True)
        except BaseException:
            limits.remove()
            raise
        return limits

    def dir(self, name: str) -> str:
        return os.path.join(self.hierarchy.root, PREFIX + name)

    def wrap(self, name: str, cmd: list[str]) -> list[str]:
        return wrap(self.dir(name), cmd)

    def enforce(self, on: bool) -> None:
        """Every group at its budget (on) or unlimited (off)."""
        for name, c in self.cores.items():
            for file, text in quota_files(self.hierarchy.version, c if on else None).items():
                _write(os.path.join(self.dir(name), file), text)

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
