"""Collect the operator image's whole root file system: its Python, the standard library, the venv,
the shared libraries they load, the user entries and /tmp. No shell, no package manager, nothing
the operator does not run (the Dockerfile's `operator-root` stage; the `operator` stage is this
tree on `scratch`).

    python rootfs.py VENV ROOT

Run with the Python the venv was made from, in the image that Python came from (the Dockerfile's
PYTHON_IMAGE): the interpreter, its standard library and the libraries `ldd` names are copied to
the same paths under ROOT. The build then runs the operator in ROOT (`chroot`), so a file this
misses fails the build, not a cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

UID = GID = 65532  # the Dockerfile's USER, the chart's runAsUser
# Parts of the standard library the operator never imports: the tests, the GUI, the installers.
SKIP_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data"}
# The one command the operator runs: openssl makes the secure metrics' self-signed certificate
# (operator/holmes/operator/metrics_server.py self_signed), with its configuration file.
TOOLS = ("openssl",)
TOOL_FILES = ("/usr/lib/ssl/openssl.cnf",)
_LDD_PATH = re.compile(r"(/\S+)")


def copy(src: Path, root: Path) -> None:
    """``src`` at the same path under ``root``; a symlink is kept and its target copied too."""
    dst = root / src.relative_to("/")
    if dst.exists() or dst.is_symlink():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_symlink():
        target = os.readlink(src)
        os.symlink(target, dst)
        copy(Path(os.path.normpath(src.parent / target)), root)  # each link of a chain, then the file
    elif src.is_dir():
        for child in src.iterdir():
            copy(child, root)
    else:
        shutil.copy2(src, dst)


def shared_libraries(files: list[Path]) -> set[Path]:
    """Every library ``ldd`` says these ELF files load (the dynamic loader included)."""
    out: set[Path] = set()
    for f in files:
        proc = subprocess.run(["ldd", str(f)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:  # not a dynamic ELF file (a script, a static binary)
            continue
        for line in proc.stdout.splitlines():
            if "not found" in line:
                raise SystemExit(f"rootfs: {f} needs a library the base image lacks: {line.strip()}")
            out.update(Path(m) for m in _LDD_PATH.findall(line))
    return out


def main(venv: Path, root: Path) -> None:
    python = (venv / "bin" / "python").resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    copy(venv, root)
    copy(python, root)
    for child in stdlib.iterdir():
        # the system's packages are not the venv's; config-*: the static library for embedding
        skip = child.name in SKIP_STDLIB or child.name in ("site-packages", "dist-packages")
        if not skip and not child.name.startswith("config-"):
            copy(child, root)
    tools = []
    for name in TOOLS:
        found = shutil.which(name)
        if found is None:
            raise SystemExit(f"rootfs: the base image lacks {name}, which the operator runs")
        tools.append(Path(found))
        copy(Path(found), root)
    for extra in TOOL_FILES:
        if Path(extra).exists():
            copy(Path(extra), root)
    elf = [python, *tools, *stdlib.rglob("*.so"), *venv.rglob("*.so*")]  # lib-dynload is in stdlib
    for lib in sorted(shared_libraries(elf)):
        copy(lib, root)
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(
        f"root:x:0:0:root:/root:/sbin/nologin\nholmes:x:{UID}:{GID}::/nonexistent:/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\nholmes:x:{GID}:\n")
    for extra in (Path("/etc/ssl/certs/ca-certificates.crt"),):  # member clusters' API servers
        if extra.exists():
            copy(extra, root)
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python rootfs.py VENV ROOT")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
