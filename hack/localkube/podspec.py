"""Pure helpers of the node agent: a pod's env, downward-API fields, $(VAR) expansion, hosts
files and the pod status it reports. No I/O here: lookups of ConfigMaps/Secrets are passed in.

Pods are plain dicts in the API's camelCase JSON form.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from datetime import datetime, timezone

# (namespace, name) -> data dict or None when missing. Secret data is already base64-decoded.
Lookup = Callable[[str, str], "dict[str, str] | None"]


class ConfigError(Exception):
    """The container cannot start yet (e.g. a referenced ConfigMap key is missing); retried."""


class Unsupported(Exception):
    """The pod uses something the local node agent does not do; the pod fails with this message."""


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def decode_secret(data: dict | None) -> dict[str, str]:
    return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (data or {}).items()}


# ---- downward API -----------------------------------------------------------------------------
_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(pod: dict, path: str) -> str:
    md, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    m = _SUBSCRIPT.match(path)
    if m:
        return (md.get(m.group(1)) or {}).get(m.group(2), "")
    simple = {
        "metadata.name": md.get("name", ""),
        "metadata.namespace": md.get("namespace", ""),
        "metadata.uid": md.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIP": status.get("podIP", ""),
        "status.podIPs": ",".join(p["ip"] for p in status.get("podIPs") or []),
    }
    if path in simple:
        return simple[path]
    if path in ("metadata.labels", "metadata.annotations"):  # volume form: key="value" lines
        items = sorted((md.get(path.split(".")[1]) or {}).items())
        return "\n".join(f'{k}="{v}"' for k, v in items)
    raise Unsupported(f"fieldRef.fieldPath {path!r} is not supported")


_QUANTITY = re.compile(r"^([0-9.]+)(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")
_FACTOR = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "Ki": 2**10,
    "M": 1e6,
    "Mi": 2**20,
    "G": 1e9,
    "Gi": 2**30,
    "T": 1e12,
    "Ti": 2**40,
}


def parse_quantity(q: str) -> float:
    m = _QUANTITY.match(str(q))
    if not m:
        raise Unsupported(f"cannot parse quantity {q!r}")
    return float(m.group(1)) * _FACTOR[m.group(2)]


def resource_value(container: dict, ref: dict, node_allocatable: dict) -> str:
    """resourceFieldRef: limits.* falls back to the node's allocatable, like the kubelet; rounded up."""
    kind, _, res = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    q = (resources.get(kind) or {}).get(res)
    if q is None and kind == "limits":
        q = node_allocatable.get(res)
    if q is None:
        q = "0"
    value = parse_quantity(q) / parse_quantity(ref.get("divisor") or "1")
    return str(int(-(-value // 1)))


# ---- env --------------------------------------------------------------------------------------
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names are replaced, unknown ones kept, $$ escapes."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, value)


def resolve_env(
    pod: dict,
    container: dict,
    base: dict[str, str],
    configmap: Lookup,
    secret: Lookup,
    node_allocatable: dict | None = None,
) -> dict[str, str]:
    """The container's environment: base (service vars etc.), then envFrom, then env, in order."""
    ns = pod["metadata"]["namespace"]
    env = dict(base)
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        if "configMapRef" in src:
            ref, data = src["configMapRef"], configmap(ns, src["configMapRef"]["name"])
            kind = "ConfigMap"
        elif "secretRef" in src:
            ref, data = src["secretRef"], secret(ns, src["secretRef"]["name"])
            kind = "Secret"
        else:
            raise Unsupported(f"envFrom entry {src} is not supported")
        if data is None:
            if ref.get("optional"):
                continue
            raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
        env.update({prefix + k: v for k, v in data.items()})
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        vf = var["valueFrom"]
        if "fieldRef" in vf:
            env[name] = field_value(pod, vf["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in vf:
            env[name] = resource_value(container, vf["resourceFieldRef"], node_allocatable or {})
        elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
            is_cm = "configMapKeyRef" in vf
            ref = vf["configMapKeyRef" if is_cm else "secretKeyRef"]
            data = (configmap if is_cm else secret)(ns, ref["name"])
            kind = "configmap" if is_cm else "secret"
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    continue
                what = (
                    f'{kind} "{ref["name"]}" not found'
                    if data is None
                    else f"couldn't find key {ref['key']} in {kind.capitalize()} {ns}/{ref['name']}"
                )
                raise ConfigError(what)
            env[name] = data[ref["key"]]
        else:
            raise Unsupported(f"env {name}: valueFrom {sorted(vf)} is not supported")
    return env


def container_argv(container: dict, env: dict[str, str]) -> list[str]:
    """command + args with $(VAR) expansion. Images are not run, so a command is required."""
    command, args = container.get("command") or [], container.get("args") or []
    if not command:
        raise Unsupported(
            f"container {container['name']!r} has no `command`: the local node agent "
            f"runs commands, not images (image {container.get('image')!r} has no "
            f"known entrypoint here)"
        )
    return [expand(a, env) for a in [*command, *args]]


def container_command(container: dict, env: dict[str, str]) -> tuple[list[str] | None, list[str] | None]:
    """command and args, each $(VAR)-expanded, None when the container leaves it to the image
    (its ENTRYPOINT and CMD, which are never expanded)."""
    command, args = container.get("command"), container.get("args")
    return (
        [expand(a, env) for a in command] if command else None,
        [expand(a, env) for a in args] if args else None,
    )


def pod_hostname(pod: dict) -> str:
    spec = pod.get("spec", {})
    return spec.get("hostname") or pod["metadata"]["name"]


# ---- hosts files ------------------------------------------------------------------------------
def host_names(pod: dict) -> list[tuple[str, str]]:
    """(name, namespace-scope) pairs a pod answers to; scope "" means cluster-wide FQDN."""
    ns, host = pod["metadata"]["namespace"], pod_hostname(pod)
    sub = pod.get("spec", {}).get("subdomain")
    if not sub:
        return []
    return [
        (f"{host}.{sub}.{ns}.svc.cluster.local", ""),
        (f"{host}.{sub}.{ns}.svc", ""),
        (f"{host}.{sub}.{ns}", ns),
        (f"{host}.{sub}", ns),
    ]


def service_names(svc: dict) -> list[tuple[str, str]]:
    ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
    return [
        (f"{name}.{ns}.svc.cluster.local", ""),
        (f"{name}.{ns}.svc", ""),
        (f"{name}.{ns}", ns),
        (name, ns),
    ]


def selector_matches(selector: dict | None, labels: dict | None) -> bool:
    return bool(selector) and all((labels or {}).get(k) == v for k, v in selector.items())


def render_hosts(own_pod: dict, own_ip: str, entries: list[tuple[str, str, str]]) -> str:
    """A pod's /etc/hosts. entries: (ip, name, scope) from host_names/service_names of all pods
    and services; names scoped to another namespace are left out (emulating DNS search paths)."""
    ns = own_pod["metadata"]["namespace"]
    lines = [
        "# managed by the localkube node agent (no cluster DNS here)",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
    ]
    own = [n for n, _ in host_names(own_pod)[:2]] + [pod_hostname(own_pod)]
    lines.append(f"{own_ip}\t" + " ".join(own))
    for ip, name, scope in entries:
        if scope in ("", ns):
            lines.append(f"{ip}\t{name}")
    return "\n".join(lines) + "\n"


# ---- status -----------------------------------------------------------------------------------
def container_status(
    container: dict,
    state: dict,
    restarts: int,
    last_state: dict | None,
    ready: bool,
    container_id: str = "",
    image_id: str = "",
) -> dict:
    out = {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": image_id,
        "ready": ready,
        "restartCount": restarts,
        "started": "running" in state,
        "state": state,
        "lastState": last_state or {},
    }
    if container_id:
        out["containerID"] = container_id
    return out


def pod_conditions(initialized: bool, ready: bool, since: str) -> list[dict]:
    def cond(t, ok):
        return {
            "type": t,
            "status": "True" if ok else "False",
            "lastProbeTime": None,
            "lastTransitionTime": since,
        }

    return [
        cond("Initialized", initialized),
        cond("Ready", ready),
        cond("ContainersReady", ready),
        cond("PodScheduled", True),
    ]


def terminated_state(
    exit_code: int, started: str, finished: str, container_id: str, message: str = ""
) -> dict:
    reason = "Completed" if exit_code == 0 else "Error"
    term = {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": started,
        "finishedAt": finished,
        "containerID": container_id,
    }
    if message:
        term["message"] = message
    return {"terminated": term}


def restart_wanted(policy: str, exit_code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


def backoff_seconds(restarts: int) -> float:
    """Kubelet-like exponential back-off, scaled down (0.5 s doubling up to 10 s) for tests."""
    return min(10.0, 0.5 * 2 ** max(0, restarts - 1))
