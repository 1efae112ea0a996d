"""Runs one pod container from an image in the local containers storage (`make images`) as a
real OCI container with runc: the image's root filesystem, its USER (or the securityContext's),
a read-only root when readOnlyRootFilesystem, its ENTRYPOINT/CMD merged with the container's
command/args, the env, bind mounts, a hostname, and a given network namespace (or the host's).

The image's root is the containers storage's own read-only mount of it (`podman image mount`,
once per image id); each container gets an overlay on top (its writes, and the mount points its
volumes need, land in <bundle>/upper), mounted inside a private mount namespace that holds the
runtime, so the overlay disappears with it whatever happens to the caller.

runc, not crun: crun refuses cgroup v1 hierarchies next to a cgroup v2 one with controllers
(this machine's layout); the config is plain OCI, both run it. Needs root.

    c = start(ContainerRequest(id=..., image="localhost/holmes-operator:0.1.0", bundle=dir, ...),
              stdout=logfile)
    c.proc.wait()          # the container's exit code (128+N when killed by signal N)
    c.signal(SIGTERM)      # to the container's init, as a kubelet stops a container
    c.cleanup()            # kills what is left, deletes the runtime's state and the bundle
"""

from __future__ import annotations

import json
import resource
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .ociconfig import ImageConfig, Mount, home_dir, merged_env, process_args, resolve_user, runtime_config
from .podspec import Unsupported

RUNTIME = "runc"
_image_roots: dict[str, str] = {}  # image id -> its read-only root, mounted by containers storage
_image_lock = threading.Lock()


def _run(cmd: list[str], timeout: float = 120) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def local_image_id(ref: str) -> str | None:
    """The id of ``ref`` (fully qualified: imagepolicy.normalize) in the local containers storage;
    None when it is not there or podman is missing."""
    try:
        cmd = ["podman", "image", "inspect", "--format", "{{.Id}}", ref]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def inspect_image(ref: str) -> ImageConfig:
    """The image's config, from the local containers storage (Unsupported when it is not there)."""
    proc = subprocess.run(
        ["podman", "image", "inspect", "--format", "json", ref], capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        raise Unsupported(
            f"image {ref!r} is not in the local containers storage (`make images` builds the "
            f"project's; `podman images` lists what is there): {proc.stderr.strip()}"
        )
    (info,) = json.loads(proc.stdout)
    return ImageConfig.from_inspect(info["Id"], info.get("Config") or {})


def image_root(image_id: str) -> str:
    """The image's merged root filesystem, mounted read-only by the containers storage once per
    image id and kept mounted for later containers (release_images() unmounts)."""
    with _image_lock:
        if image_id not in _image_roots:
            _image_roots[image_id] = _run(["podman", "image", "mount", image_id]).strip()
        return _image_roots[image_id]


def release_images() -> None:
    with _image_lock:
        for image_id in list(_image_roots):
            subprocess.run(["podman", "image", "unmount", image_id], capture_output=True, timeout=60)
            del _image_roots[image_id]


@dataclass(frozen=True)
class ContainerRequest:
    """One container of a pod, in the terms of the pod spec (already resolved by the agent: env
    values expanded, command/args $(VAR)-expanded, volumes materialized on this machine)."""

    id: str  # unique among running containers: the runtime's name for it
    image: str
    bundle: Path  # a fresh directory of the caller's: config.json, the overlay's upper layer
    hostname: str
    command: list[str] | None = None
    args: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    netns: str | None = None  # a network namespace's path; None: the host's network
    working_dir: str = ""
    security_context: dict | None = None
    pod_security_context: dict | None = None


@dataclass
class Container:
    id: str
    bundle: Path
    proc: subprocess.Popen

    def signal(self, sig: int = signal.SIGTERM) -> None:
        """Signal the container's init (its pid 1: without a handler it ignores SIGTERM, as on a
        node). Nothing happens when it has already exited."""
        subprocess.run([RUNTIME, "kill", self.id, str(int(sig))], capture_output=True, timeout=30)

    def cleanup(self) -> None:
        """Kill what is left of the container, delete the runtime's state and the bundle."""
        if self.proc.poll() is None:
            self.signal(signal.SIGKILL)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        subprocess.run([RUNTIME, "delete", "--force", self.id], capture_output=True, timeout=30)
        shutil.rmtree(self.bundle, ignore_errors=True)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def start(req: ContainerRequest, stdout: IO | int | None = None) -> Container:
    """Start the container; its stdout and stderr go to `stdout` (a file, or the caller's)."""
    image = inspect_image(req.image)
    lower = image_root(image.id)
    for path in (lower, str(req.bundle)):
        if any(ch in path for ch in ",:"):
            raise Unsupported(f"path {path!r} holds ',' or ':', which overlay mount options cannot carry")
    user = resolve_user(
        image.user,
        req.security_context,
        _read(Path(lower, "etc/passwd")),
        _read(Path(lower, "etc/group")),
        req.pod_security_context,
    )
    env = merged_env(image.env, req.env, req.hostname)
    if not any(e.startswith("HOME=") for e in env):  # as Docker and CRI-O: the user's passwd home
        env.append(f"HOME={home_dir(user.uid, _read(Path(lower, 'etc/passwd')))}")
    config = runtime_config(
        rootfs=str(req.bundle / "rootfs"),
        argv=process_args(image, req.command, req.args),
        env=env,
        user=user,
        cwd=req.working_dir or image.workdir or "/",
        hostname=req.hostname,
        mounts=req.mounts,
        netns=req.netns,
        security_context=req.security_context,
        memlock_hard=resource.getrlimit(resource.RLIMIT_MEMLOCK)[1],  # the runtime's own
    )
    for d in ("rootfs", "upper", "work"):
        (req.bundle / d).mkdir(parents=True, exist_ok=True)
    (req.bundle / "config.json").write_text(json.dumps(config, indent=1))
    script = (
        'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4"'
        ' && exec "$5" run --bundle "$6" "$7"'
    )
    proc = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            lower,
            str(req.bundle / "upper"),
            str(req.bundle / "work"),
            str(req.bundle / "rootfs"),
            RUNTIME,
            str(req.bundle),
            req.id,
        ],
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        start_new_session=True,
        close_fds=True,
    )
    return Container(req.id, req.bundle, proc)


def remove_leftovers(prefix: str) -> list[str]:
    """Kill and delete the runtime's containers whose id starts with ``prefix`` (one node agent's,
    left by an agent that died without stopping them); their bundles go with the state dir."""
    try:
        proc = subprocess.run([RUNTIME, "list", "-q"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return []
    gone = [cid for cid in proc.stdout.split() if cid.startswith(prefix)]
    for cid in gone:
        subprocess.run([RUNTIME, "kill", cid, "KILL"], capture_output=True, timeout=30)
        subprocess.run([RUNTIME, "delete", "--force", cid], capture_output=True, timeout=30)
    return gone
