"""A job's pod template, checked before anything is rendered from it (pure functions).

Creating a HolmesJob creates pods, so what a job author may put in ``spec.template`` is the
cluster admin's call: ``TemplatePolicy`` (chart values ``jobPolicy``, operator flags
``--allow-*``) says which powerful settings are allowed; by default none are. ``shape_problems``
catches the fields the operator reads but that the CRD schema (an open object) lets through
with the wrong type, which would otherwise raise inside rendering on every reconcile.
Both return "path: what is wrong" strings, with paths as in the HolmesJob.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ROOT = "spec.template"
RDMA_CAPABILITIES = ("IPC_LOCK",)  # pinned memory for ibv_reg_mr: always allowed, added on RDMA nodes


@dataclass(frozen=True)
class TemplatePolicy:
    """What a job author may set in the pod template beyond plain workload fields. Each field
    names the operator flag (and chart value under ``jobPolicy``) that allows it."""

    allow_privileged: bool = False  # --allow-privileged (jobPolicy.allowPrivileged)
    allowed_capabilities: tuple[str, ...] = ()  # --allow-capabilities (jobPolicy.allowedCapabilities)
    allow_host_namespaces: bool = False  # --allow-host-namespaces (jobPolicy.allowHostNamespaces)
    allow_host_path: bool = False  # --allow-host-path (jobPolicy.allowHostPath)
    service_accounts: tuple[str, ...] = ()  # --allow-service-accounts (jobPolicy.serviceAccounts)
    allow_node_name: bool = False  # --allow-node-name (jobPolicy.allowNodeName)
    runtime_classes: tuple[str, ...] = ()  # --allow-runtime-classes (jobPolicy.runtimeClasses)


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return f"the number {v}"
    if isinstance(v, str):
        return f"the string {v!r}"
    if isinstance(v, list):
        return "a list"
    return "a mapping" if isinstance(v, Mapping) else type(v).__name__


_MAP, _LIST, _STR, _STRS = "mapping", "list", "string", "list of strings"


_IS = {
    _MAP: lambda v: isinstance(v, Mapping),
    _LIST: lambda v: isinstance(v, list),
    _STR: lambda v: isinstance(v, str),
    _STRS: lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
}


def _check(value: Any, want: str, path: str, out: list[str]) -> bool:
    ok = _IS[want](value)
    if not ok:
        out.append(f"{path}: must be a {want}, got {_kind(value)}")
    return ok


def _string_map(d: Mapping, key: str, path: str, out: list[str]) -> None:
    v = d.get(key)
    if v is None or not _check(v, _MAP, f"{path}.{key}", out):
        return
    for k, x in v.items():
        if not isinstance(x, str):
            out.append(f"{path}.{key}.{k}: must be a string, got {_kind(x)} (quote it)")


def _list_of_maps(d: Mapping, key: str, path: str, out: list[str]) -> list[tuple[str, Mapping]]:
    v = d.get(key)
    if v is None or not _check(v, _LIST, f"{path}.{key}", out):
        return []
    items = []
    for i, x in enumerate(v):
        p = f"{path}.{key}[{i}]"
        if _check(x, _MAP, p, out):
            items.append((p, x))
    return items


def shape_problems(template: Mapping[str, Any] | None) -> list[str]:
    """Wrongly typed fields among those the operator reads or merges into."""
    out: list[str] = []
    if not template:
        return out
    meta = template.get("metadata")
    if meta is not None and _check(meta, _MAP, f"{ROOT}.metadata", out):
        _string_map(meta, "labels", f"{ROOT}.metadata", out)
        _string_map(meta, "annotations", f"{ROOT}.metadata", out)
    spec = template.get("spec")
    if spec is None or not _check(spec, _MAP, f"{ROOT}.spec", out):
        return out
    sp = f"{ROOT}.spec"
    for key in ("affinity", "securityContext", "nodeSelector"):
        if spec.get(key) is not None:
            _check(spec[key], _MAP, f"{sp}.{key}", out)
    if spec.get("nodeSelector") is not None:
        _string_map(spec, "nodeSelector", sp, out)
    for key in ("serviceAccountName", "nodeName", "runtimeClassName", "schedulerName"):
        if spec.get(key) is not None:
            _check(spec[key], _STR, f"{sp}.{key}", out)
    _list_of_maps(spec, "tolerations", sp, out)
    for p, vol in _list_of_maps(spec, "volumes", sp, out):
        if not isinstance(vol.get("name"), str):
            out.append(f"{p}.name: must be a string, got {_kind(vol.get('name'))}")
    for p, c in _list_of_maps(spec, "containers", sp, out) + _list_of_maps(spec, "initContainers", sp, out):
        if c.get("name") is not None:
            _check(c["name"], _STR, f"{p}.name", out)
        for key in ("command", "args"):
            if c.get(key) is not None:
                _check(c[key], _STRS, f"{p}.{key}", out)
        for key in ("resources", "securityContext"):
            if c.get(key) is not None and _check(c[key], _MAP, f"{p}.{key}", out) and key == "resources":
                for part in ("limits", "requests"):
                    if c[key].get(part) is not None:
                        _check(c[key][part], _MAP, f"{p}.resources.{part}", out)
        sc = c.get("securityContext")
        if isinstance(sc, Mapping) and sc.get("capabilities") is not None:
            if _check(sc["capabilities"], _MAP, f"{p}.securityContext.capabilities", out):
                for part in ("add", "drop"):
                    if sc["capabilities"].get(part) is not None:
                        _check(
                            sc["capabilities"][part], _STRS, f"{p}.securityContext.capabilities.{part}", out
                        )
        for ep, e in _list_of_maps(c, "env", p, out):
            if not isinstance(e.get("name"), str):
                out.append(f"{ep}.name: must be a string, got {_kind(e.get('name'))}")
        for mp, m in _list_of_maps(c, "volumeMounts", p, out):
            for key in ("name", "mountPath"):
                if not isinstance(m.get(key), str):
                    out.append(f"{mp}.{key}: must be a string, got {_kind(m.get(key))}")
        _list_of_maps(c, "ports", p, out)
    return out


def policy_violations(template: Mapping[str, Any] | None, policy: TemplatePolicy) -> list[str]:
    """Settings the policy does not allow, each with the flag (and chart value) that would."""
    out: list[str] = []
    spec = (template or {}).get("spec")
    if not isinstance(spec, Mapping):
        return out
    sp = f"{ROOT}.spec"

    def deny(path: str, what: str, flag: str, value: str) -> None:
        out.append(
            f"{path}: {what} is not allowed by the operator's job policy (allowed by the operator "
            f"flag --{flag}, chart value jobPolicy.{value})"
        )

    if not policy.allow_host_namespaces:
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(key):
                deny(f"{sp}.{key}", f"{key}: true", "allow-host-namespaces", "allowHostNamespaces: true")
    if not policy.allow_node_name and spec.get("nodeName"):
        deny(
            f"{sp}.nodeName", "setting nodeName (the planner places pods)", "allow-node-name", "allowNodeName"
        )
    sa = spec.get("serviceAccountName") or spec.get("serviceAccount")
    if sa and sa not in policy.service_accounts:
        deny(
            f"{sp}.serviceAccountName",
            f"service account {sa!r}",
            f"allow-service-accounts {sa}",
            "serviceAccounts",
        )
    rc = spec.get("runtimeClassName")
    if rc and rc not in policy.runtime_classes:
        deny(
            f"{sp}.runtimeClassName", f"runtime class {rc!r}", f"allow-runtime-classes {rc}", "runtimeClasses"
        )
    if spec.get("automountServiceAccountToken") is True and not sa:
        deny(
            f"{sp}.automountServiceAccountToken",
            "mounting the default service account's token",
            "allow-service-accounts default",
            "serviceAccounts",
        )
    if not policy.allow_host_path:
        for i, vol in enumerate(spec.get("volumes") or []):
            if isinstance(vol, Mapping) and "hostPath" in vol:
                deny(
                    f"{sp}.volumes[{i}].hostPath",
                    "a hostPath volume",
                    "allow-host-path",
                    "allowHostPath: true",
                )
    allowed_caps = set(RDMA_CAPABILITIES) | set(policy.allowed_capabilities)
    for kind in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(kind) or []):
            if not isinstance(c, Mapping) or not isinstance(c.get("securityContext"), Mapping):
                continue
            p, sc = f"{sp}.{kind}[{i}].securityContext", c["securityContext"]
            if sc.get("privileged") and not policy.allow_privileged:
                deny(f"{p}.privileged", "a privileged container", "allow-privileged", "allowPrivileged: true")
            if sc.get("allowPrivilegeEscalation") and not policy.allow_privileged:
                deny(
                    f"{p}.allowPrivilegeEscalation",
                    "privilege escalation",
                    "allow-privileged",
                    "allowPrivileged: true",
                )
            caps = sc.get("capabilities") if isinstance(sc.get("capabilities"), Mapping) else {}
            extra = [x for x in caps.get("add") or [] if isinstance(x, str) and x not in allowed_caps]
            for cap in extra:
                deny(
                    f"{p}.capabilities.add",
                    f"capability {cap}",
                    f"allow-capabilities {cap}",
                    "allowedCapabilities",
                )
    return out
