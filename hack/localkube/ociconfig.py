"""Pure helpers of the container runner (container.py): the process a pod's container runs, its
user, its capabilities and the OCI runtime config (config.json) for runc. No I/O here: the image's
config and its /etc/passwd and /etc/group are passed in.

Each rule follows what a kubelet with containerd does, so a pod behaves here as on a node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .podspec import Unsupported

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# containerd's default capability set (what a container gets unless securityContext changes it).
DEFAULT_CAPS = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
# The memlock limit RDMA's memory registration needs (ibv_reg_mr pins pages), set by the runtime
# as docs/install.md#rdma-and-the-memlock-limit says (CRI-O's default_ulimits = ["memlock=-1:-1"]
# writes it into every container's spec; containerd passes on its own LimitMEMLOCK=infinity):
# unlimited, or the most the runtime itself may give (its own hard limit: a runtime without
# CAP_SYS_RESOURCE cannot raise it, and runc would then fail to start the container).
RLIM_INFINITY = 2**64 - 1


def memlock_rlimit(runtime_hard: int | None) -> dict:
    """The container's RLIMIT_MEMLOCK: unlimited, within ``runtime_hard`` (None: unlimited)."""
    limit = RLIM_INFINITY if runtime_hard is None or runtime_hard < 0 else min(runtime_hard, RLIM_INFINITY)
    return {"type": "RLIMIT_MEMLOCK", "hard": limit, "soft": limit}


MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
)
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an image's config a container start reads (`podman image inspect` .Config)."""

    id: str
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()  # "NAME=value"
    user: str = ""
    workdir: str = ""

    @classmethod
    def from_inspect(cls, image_id: str, config: dict) -> ImageConfig:
        return cls(
            id=image_id,
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            env=tuple(config.get("Env") or ()),
            user=config.get("User") or "",
            workdir=config.get("WorkingDir") or "",
        )


def process_args(image: ImageConfig, command: list[str] | None, args: list[str] | None) -> list[str]:
    """The argv Kubernetes runs: the container's command replaces the image's ENTRYPOINT and
    drops its CMD; args alone replace CMD after the ENTRYPOINT; neither runs ENTRYPOINT + CMD.
    `command` and `args` are already $(VAR)-expanded (the image's are never expanded)."""
    command, args = list(command or []), list(args or [])
    if not command:
        command = list(image.entrypoint)
        if not args:
            args = list(image.cmd)
    argv = command + args
    if not argv:
        raise Unsupported(f"image {image.id[:12]} has no ENTRYPOINT or CMD and the container no command")
    return argv


@dataclass(frozen=True)
class User:
    uid: int
    gid: int
    additional_gids: tuple[int, ...] = field(default=())


def _table(text: str, fields: int) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= fields and not line.startswith("#"):
            rows.append(parts)
    return rows


def resolve_user(
    image_user: str, security_context: dict | None, passwd: str, group: str, pod_security_context: dict | None
) -> User:
    """The uid/gid/groups the container runs as: the container's securityContext runAsUser/
    runAsGroup over the pod's over the image's USER (`uid`, `uid:gid`, `name`, `name:group`,
    looked up in the image's /etc/passwd and /etc/group); a uid without a group takes the
    passwd entry's group, else 0. Groups: the user's groups in /etc/group, the pod's
    supplementalGroups and fsGroup. runAsNonRoot refuses uid 0 and a non-numeric USER that a
    runAsUser does not override (the kubelet cannot verify one)."""
    sc, psc = security_context or {}, pod_security_context or {}
    users = _table(passwd, 4)
    groups = _table(group, 4)
    user_part, _, group_part = image_user.partition(":")
    run_as_user = sc.get("runAsUser", psc.get("runAsUser"))
    run_as_group = sc.get("runAsGroup", psc.get("runAsGroup"))
    non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))

    name = None
    if run_as_user is not None:
        uid = int(run_as_user)
        entry = next((u for u in users if u[2] == str(uid)), None)
    elif user_part and not user_part.isdigit():
        if non_root:
            raise Unsupported(
                f"runAsNonRoot: the image's USER {image_user!r} is not numeric and cannot be verified "
                f"as non-root; set securityContext.runAsUser"
            )
        entry = next((u for u in users if u[0] == user_part), None)
        if entry is None:
            raise Unsupported(f"the image's USER {user_part!r} is not in its /etc/passwd")
        uid = int(entry[2])
    else:
        uid = int(user_part or 0)
        entry = next((u for u in users if u[2] == str(uid)), None)
    if entry is not None:
        name = entry[0]

    if run_as_group is not None:
        gid = int(run_as_group)
    elif group_part and run_as_user is None:
        if group_part.isdigit():
            gid = int(group_part)
        else:
            found = next((g for g in groups if g[0] == group_part), None)
            if found is None:
                raise Unsupported(f"the image's USER group {group_part!r} is not in its /etc/group")
            gid = int(found[2])
    else:
        gid = int(entry[3]) if entry is not None else 0

    if non_root and uid == 0:
        raise Unsupported("runAsNonRoot: the container would run as uid 0 (root)")
    extra: list[int] = []
    if name is not None:
        extra += [int(g[2]) for g in groups if name in g[3].split(",")]
    extra += [int(g) for g in psc.get("supplementalGroups") or []]
    if psc.get("fsGroup") is not None:
        extra.append(int(psc["fsGroup"]))
    return User(uid, gid, tuple(sorted(set(extra) - {gid})))


def home_dir(uid: int, passwd: str) -> str:
    """The home directory of ``uid`` in the image's /etc/passwd; "/" when it has no entry."""
    entry = next((u for u in _table(passwd, 6) if u[2] == str(uid)), None)
    return entry[5] if entry is not None and entry[5] else "/"


def capabilities(security_context: dict | None) -> list[str]:
    """containerd's default set with securityContext.capabilities' drop, then add, applied."""
    caps_sc = (security_context or {}).get("capabilities") or {}
    norm = lambda c: c if c.upper().startswith("CAP_") else "CAP_" + c.upper()
    drop = {norm(c) for c in caps_sc.get("drop") or []}
    caps = [] if "CAP_ALL" in drop else [c for c in DEFAULT_CAPS if c not in drop]
    return caps + [norm(c) for c in caps_sc.get("add") or [] if norm(c) not in caps]


def merged_env(image_env: tuple[str, ...], env: dict[str, str], hostname: str) -> list[str]:
    """The image's ENV, then HOSTNAME, then the container's env over both (same name: the
    container wins, in the image's order); PATH defaults as containerd's does."""
    out: dict[str, str] = {}
    for item in image_env:
        k, _, v = item.partition("=")
        out[k] = v
    out.setdefault("PATH", DEFAULT_PATH)
    out["HOSTNAME"] = hostname
    out.update(env)
    return [f"{k}={v}" for k, v in out.items()]


@dataclass(frozen=True)
class Mount:
    src: str
    dst: str
    ro: bool = False


def runtime_config(
    *,
    rootfs: str,
    argv: list[str],
    env: list[str],
    user: User,
    cwd: str,
    hostname: str,
    mounts: list[Mount],
    netns: str | None,
    security_context: dict | None = None,
    shm_bytes: int = 64 << 20,
    memlock_hard: int | None = None,
) -> dict:
    """The OCI runtime config for one container. netns: the path of a network namespace to join;
    None shares the host's (hostNetwork). A fresh pid, ipc, uts and mount namespace always.
    memlock_hard: the runtime's own RLIMIT_MEMLOCK hard limit (memlock_rlimit)."""
    sc = security_context or {}
    if sc.get("privileged"):
        raise Unsupported("securityContext.privileged is not supported by the local container runner")
    caps = capabilities(sc)
    namespaces: list[dict] = [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
    if netns is not None:
        namespaces.append({"type": "network", "path": netns})
    base_mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={shm_bytes // 1024}k"],
        },
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        # sysfs shows the network devices of the namespace that mounts it: with the host's network,
        # bind the host's /sys (read-only) as runc would.
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        }
        if netns is not None
        else {
            "destination": "/sys",
            "type": "bind",
            "source": "/sys",
            "options": ["rbind", "nosuid", "noexec", "nodev", "ro"],
        },
    ]
    binds = [
        {
            "destination": m.dst,
            "type": "bind",
            "source": m.src,
            "options": ["rbind", "rprivate", "ro" if m.ro else "rw"],
        }
        for m in mounts
    ]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": user.uid, "gid": user.gid, "additionalGids": list(user.additional_gids)},
            "args": argv,
            "env": env,
            "cwd": cwd or "/",
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
            "rlimits": [memlock_rlimit(memlock_hard)],
            # Kubernetes' allowPrivilegeEscalation (default true) is the opposite of no_new_privs.
            "noNewPrivileges": sc.get("allowPrivilegeEscalation") is False,
        },
        "root": {"path": rootfs, "readonly": bool(sc.get("readOnlyRootFilesystem"))},
        "hostname": hostname,
        "mounts": base_mounts + binds,
        "linux": {
            "namespaces": namespaces,
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
        },
    }
