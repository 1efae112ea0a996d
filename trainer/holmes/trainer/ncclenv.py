"""``NCCL_NET`` wherever NCCL reads it: it overrides the network pinned on every communicator.

NCCL (2.2x, ``init.cc``: ``parseCommConfig``) replaces a communicator's ``config.netName`` with
``NCCL_NET`` when that is set, so one value silently moves every group Holmes pins (IB inside an
island, Socket across) onto one network. NCCL takes it from the process environment, else from
its configuration files (``misc/param.cc``: ``initEnv``): ``$NCCL_CONF_FILE`` when set, else
``$HOME/.nccl.conf`` (``misc/param.cc``: ``userHomeDir`` reads the ``HOME`` variable in NCCL
2.30, not the password database: a random UID or an image-set ``HOME`` changes the file), then
``/etc/nccl.conf``; lines ``NAME=value``, ``#`` comments, the first file to set a variable wins
and the environment wins over both. So removing the variable from the environment is enough for
the environment, and not for a file: only editing the image fixes that.

Standard library only: the launcher and its network hook run it in the user's image, copied
beside the launcher (holmes.launch.install, holmes.launch.shared).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

NCCL_NET = "NCCL_NET"
ETC_CONF = Path("/etc/nccl.conf")


@dataclass(frozen=True)
class Override:
    value: str
    source: str  # "the environment" or a file's path

    def describe(self) -> str:
        return f"{NCCL_NET}={self.value} in {self.source}"


def conf_value(text: str, name: str) -> str | None:
    """The value a NCCL configuration file gives ``name``, parsed as NCCL does (the name is
    everything before the first ``=``, unstripped; the first line that sets it counts)."""
    for line in text.splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        if key == name:
            return value
    return None


def user_home(env: Mapping[str, str]) -> Path | None:
    """Where NCCL looks for ``.nccl.conf``: ``$HOME`` of the environment NCCL will read (the
    process's, or the one its workers inherit); none when unset, as NCCL then reads no user
    file. An empty ``HOME`` makes NCCL read ``/.nccl.conf``."""
    home = env.get("HOME")
    if home is None:
        return None
    return Path(home or "/")


def conf_files(env: Mapping[str, str], home: Path | None, etc: Path = ETC_CONF) -> list[Path]:
    """NCCL's configuration files, in the order it reads them."""
    user = env.get("NCCL_CONF_FILE")
    first = Path(user) if user else (home / ".nccl.conf" if home is not None else None)
    return [p for p in (first, etc) if p is not None]


def file_override(env: Mapping[str, str], home: Path | None, etc: Path = ETC_CONF) -> Override | None:
    """The ``NCCL_NET`` a configuration file would give NCCL, if any (the first file that sets
    it; one that cannot be read is skipped, as NCCL skips it)."""
    for path in conf_files(env, home, etc):
        try:
            value = conf_value(path.read_text(errors="replace"), NCCL_NET)
        except OSError:
            continue
        if value is not None:
            return Override(value, str(path))
    return None


def file_fix(found: Override, escape: str) -> str:
    """Why a file's NCCL_NET stops the start, and the fix."""
    own_file = found.source != str(ETC_CONF)
    return (
        f"{found.describe()} would override the network Holmes pins on every process group "
        "(NCCL applies it to every communicator and never says so). Remove that line from the "
        "image's file"
        + (" (or point NCCL_CONF_FILE at a file without it)" if own_file else "")
        + f"; {escape}"
    )


def drop_from_env(env: MutableMapping[str, str]) -> str | None:
    """Remove ``NCCL_NET`` from ``env`` (the process's own: NCCL reads it at its first
    communicator); a note saying so, or None when it was not set."""
    value = env.pop(NCCL_NET, None)
    if value is None:
        return None
    return f"removed {NCCL_NET}={value} from the environment: it would override every group's network"
