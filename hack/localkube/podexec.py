"""Runs inside the pod's fresh mount + UTS namespaces (started by `unshare --mount --uts`):
set the hostname, bind-mount the volumes, the hosts file and nothing else, raise the memlock
limit as the runtime would (ociconfig.memlock_rlimit), then exec the container command. The pid stays
the same through every exec, so the agent signals it directly.

Usage: python -m localkube.podexec SPEC.json
SPEC: {"hostname", "hosts", "mounts": [{"src","dst","ro"}], "cwd", "argv", "env", "mountpoints",
       "preserve": [paths that must stay visible: the repository with its .venv]}
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import socket
import sys

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(src: str, dst: str, flags: int) -> None:
    if _libc.mount(src.encode(), dst.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} -> {dst}: {os.strerror(err)}")


def bind(src: str, dst: str, ro: bool, created: list[str]) -> None:
    if not os.path.exists(dst):
        # The mount point must exist on the (shared) root filesystem; the agent removes the ones
        # it created when it stops.
        parent = dst if os.path.isdir(src) else os.path.dirname(dst)
        missing = []
        while not os.path.exists(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        created.extend(missing)
        os.makedirs(dst if os.path.isdir(src) else os.path.dirname(dst), exist_ok=True)
        if not os.path.isdir(src):
            open(dst, "a").close()
            created.append(dst)
    _mount(src, dst, MS_BIND | MS_REC)
    if ro:
        _mount(src, dst, MS_REMOUNT | MS_BIND | MS_RDONLY)


def covers(mount_point: str, path: str) -> bool:
    mp = os.path.normpath(mount_point)
    return path == mp or path.startswith(mp.rstrip("/") + "/")


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    created: list[str] = []
    try:
        socket.sethostname(spec["hostname"])
        # Pin every source before mounting anything: a volume mounted over a directory that holds
        # other sources (an emptyDir at /tmp while the state dir is under /tmp) would hide them.
        mounts = [(spec["hosts"], "/etc/hosts", True)] + [
            (m["src"], m["dst"], m["ro"]) for m in spec["mounts"]
        ]
        # Likewise a volume over a parent of the repository (an emptyDir at /work or /tmp) would
        # hide the .venv the command runs from: bind the repository back on top, read-write.
        mounts += [
            (p, p, False) for p in spec.get("preserve", []) if any(covers(dst, p) for _, dst, _ in mounts)
        ]
        fds = [os.open(src, os.O_PATH) for src, _, _ in mounts]
        for fd, (_, dst, ro) in zip(fds, mounts):
            bind(f"/proc/self/fd/{fd}", dst, ro, created)
        for fd in fds:
            os.close(fd)
    except OSError as e:
        print(f"localkube: cannot set up the pod sandbox: {e}", file=sys.stderr, flush=True)
        os._exit(128)
    finally:
        if created:
            with open(spec["mountpoints"], "a") as f:
                f.writelines(p + "\n" for p in created)
    # the runtime's memlock limit, as for a container (ociconfig.memlock_rlimit): unlimited, or
    # the agent's own hard limit where it may not raise it (no CAP_SYS_RESOURCE)
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    for limit in (resource.RLIM_INFINITY, hard):
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))
            break
        except (OSError, ValueError):
            continue
    cwd = spec.get("cwd")
    try:
        os.chdir(cwd if cwd and os.path.isdir(cwd) else "/")
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as e:
        print(f"localkube: cannot run {spec['argv'][0]!r}: {e}", file=sys.stderr, flush=True)
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)


if __name__ == "__main__":
    main(sys.argv[1])
