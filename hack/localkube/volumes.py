"""Materialize a pod's volumes as host directories, which podexec bind-mounts at the mountPaths.

Supported: emptyDir (medium Memory -> under /dev/shm), configMap, secret, downwardAPI,
projected (serviceAccountToken via the TokenRequest API, configMap, secret, downwardAPI), hostPath.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from .podspec import ConfigError, Lookup, Unsupported, field_value

SHM_ROOT = Path("/dev/shm/localkube")
# (pod, serviceaccount, audience|None, expirationSeconds) -> a token bound to the pod, as the
# kubelet requests it (the API server then names the pod's node in the token's user extra)
TokenFn = Callable[[dict, str, "str | None", int], str]


def _write_items(
    dest: Path, data: dict[str, str], items: list | None, mode: int | None, what: str, optional: bool
) -> None:
    if items:
        chosen = []
        for it in items:
            if it["key"] not in data:
                if optional:
                    continue
                raise ConfigError(f"{what}: key {it['key']!r} not found")
            chosen.append((it["path"], data[it["key"]], it.get("mode")))
    else:
        chosen = [(k, v, None) for k, v in data.items()]
    for rel, value, item_mode in chosen:
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(value)
        p.chmod(item_mode if item_mode is not None else (mode if mode is not None else 0o644))


def _from_source(src: dict, ns: str, dest: Path, configmap: Lookup, secret: Lookup, mode: int | None) -> None:
    if "configMap" in src:
        ref, lookup, kind = src["configMap"], configmap, "configmap"
        name = ref["name"]
    elif "secret" in src:
        ref, lookup, kind = src["secret"], secret, "secret"
        name = ref.get("secretName") or ref.get("name")
    else:
        raise Unsupported(f"volume source {sorted(src)} is not supported")
    data = lookup(ns, name)
    if data is None:
        if ref.get("optional"):
            return
        raise ConfigError(f'{kind} "{name}" not found')
    _write_items(
        dest,
        data,
        ref.get("items"),
        ref.get("defaultMode", mode),
        f"{kind} {name}",
        bool(ref.get("optional")),
    )


def materialize(
    pod: dict, pod_dir: Path, configmap: Lookup, secret: Lookup, token: TokenFn
) -> dict[str, str]:
    """Return {volume name: host path}. Raises ConfigError (retry) or Unsupported (fail pod)."""
    ns, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
    out: dict[str, str] = {}
    for vol in pod["spec"].get("volumes") or []:
        name = vol["name"]
        dest = pod_dir / "volumes" / name
        if "emptyDir" in vol:
            if (vol["emptyDir"] or {}).get("medium") == "Memory":
                dest = SHM_ROOT / uid / name
            dest.mkdir(parents=True, exist_ok=True)
            dest.chmod(0o777)  # as the kubelet makes it: writable by a container's non-root user
        elif "hostPath" in vol:
            hp = vol["hostPath"]
            dest = Path(hp["path"])
            if hp.get("type") == "DirectoryOrCreate":
                dest.mkdir(parents=True, exist_ok=True)
            elif not dest.exists():
                raise ConfigError(f"hostPath {dest} does not exist")
        elif "configMap" in vol or "secret" in vol:
            _fresh(dest)
            _from_source(vol, ns, dest, configmap, secret, None)
        elif "downwardAPI" in vol:
            _fresh(dest)
            _downward(pod, vol["downwardAPI"].get("items") or [], dest)
        elif "projected" in vol:
            _fresh(dest)
            proj = vol["projected"]
            for src in proj.get("sources") or []:
                if "serviceAccountToken" in src:
                    t = src["serviceAccountToken"]
                    sa = pod["spec"].get("serviceAccountName") or "default"
                    tok = token(pod, sa, t.get("audience"), int(t.get("expirationSeconds", 3600)))
                    (dest / t["path"]).parent.mkdir(parents=True, exist_ok=True)
                    (dest / t["path"]).write_text(tok)
                elif "downwardAPI" in src:
                    _downward(pod, src["downwardAPI"].get("items") or [], dest)
                else:
                    _from_source(src, ns, dest, configmap, secret, proj.get("defaultMode"))
        else:
            kinds = sorted(k for k in vol if k != "name")
            raise Unsupported(
                f"volume {name!r}: type {kinds} is not supported by the local node agent "
                f"(supported: emptyDir, configMap, secret, downwardAPI, projected, hostPath)"
            )
        out[name] = str(dest)
    return out


def _fresh(dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)


def _downward(pod: dict, items: list, dest: Path) -> None:
    for it in items:
        if "fieldRef" not in it:
            raise Unsupported("downwardAPI volume: only fieldRef items are supported")
        p = dest / it["path"]
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(field_value(pod, it["fieldRef"]["fieldPath"]))


def mounts_for(container: dict, volume_paths: dict[str, str]) -> list[dict]:
    """Bind mounts for podexec: [{src, dst, ro}] from the container's volumeMounts."""
    out = []
    for vm in container.get("volumeMounts") or []:
        if vm["name"] not in volume_paths:
            raise Unsupported(f"volumeMount {vm['name']!r} names no volume of the pod")
        src = volume_paths[vm["name"]]
        if vm.get("subPath"):
            src = os.path.join(src, vm["subPath"])
            if not os.path.exists(src):
                os.makedirs(src, exist_ok=True)
        out.append({"src": src, "dst": vm["mountPath"], "ro": bool(vm.get("readOnly"))})
    return out


def cleanup(pod_dir: Path, uid: str) -> None:
    shutil.rmtree(pod_dir / "volumes", ignore_errors=True)
    shutil.rmtree(SHM_ROOT / uid, ignore_errors=True)
