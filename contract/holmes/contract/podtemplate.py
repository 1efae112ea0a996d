"""The part of a pod template the CRD documents (``spec.template``): what ``kubectl explain``
shows for the fields Holmes reads or adds to. The job keeps the template as given (a mapping,
``JobSpec.template``); everything else a PodTemplateSpec holds is kept too
(``x-kubernetes-preserve-unknown-fields``).

``shape_problems`` catches the fields Holmes reads (the spec checks of ``spec.framework``, the
planner's socket threads, the operator's rendering) but that an open object lets through with
the wrong type, e.g. ``args: 5``: ``load_job`` refuses them, naming the field, before anything
reads the template."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from .schema import Field, documented


@documented
@dataclass(frozen=True)
class PodMetadata:
    labels: Annotated[
        dict[str, str] | None, Field("Labels added to every pod (holmes.dev/* labels are reserved).")
    ] = None
    annotations: Annotated[dict[str, str] | None, Field("Annotations added to every pod.")] = None


@documented
@dataclass(frozen=True)
class Container:
    name: Annotated[str, Field('Container name; "trainer" marks the training container.')]
    image: Annotated[
        str | None, Field("Image holding Holmes and torch; the operator's --trainer-image when omitted.")
    ] = None
    command: Annotated[
        tuple[str, ...] | None, Field("Overrides the default torchrun launch of holmes.trainer.")
    ] = None
    args: Annotated[tuple[str, ...] | None, Field("Arguments to command.")] = None
    env: Annotated[
        tuple[dict[str, Any], ...] | None,
        Field("Extra environment; wins over Holmes' defaults of the same name (e.g. NCCL_SOCKET_IFNAME)."),
    ] = None
    resources: Annotated[
        dict[str, Any] | None,
        Field(
            "Requests and limits; Holmes adds nvidia.com/gpu = gpusPerNode and the node's RDMA "
            "resource unless set here."
        ),
    ] = None


@documented
@dataclass(frozen=True)
class PodSpec:
    containers: Annotated[
        tuple[Container, ...] | None,
        Field(
            (
                'Containers; the one named "trainer" (or the first) runs training. Omit to use the '
                "default trainer container."
            ),
            preserve_unknown=True,
        ),
    ] = None
    volumes: Annotated[
        tuple[dict[str, Any], ...] | None,
        Field("Volumes added to every pod (e.g. the dataset or checkpoint volume)."),
    ] = None
    tolerations: Annotated[tuple[dict[str, Any], ...] | None, Field("Tolerations for tainted GPU nodes.")] = (
        None
    )
    scheduler_name: Annotated[
        str | None,
        Field("Scheduler for the pods (e.g. a gang scheduler); the default scheduler when omitted."),
    ] = None
    service_account_name: Annotated[str | None, Field("Service account the pods run as.")] = None
    priority_class_name: Annotated[str | None, Field("Priority class of the pods.")] = None


@documented
@dataclass(frozen=True)
class PodTemplate:
    metadata: Annotated[PodMetadata | None, Field("Labels and annotations added to every pod.")] = None
    spec: Annotated[
        PodSpec | None,
        Field(
            (
                "A PodSpec. Holmes sets affinity to the planned node, hostname, subdomain and "
                "restartPolicy Never itself."
            ),
            preserve_unknown=True,
        ),
    ] = None


# ---- the shape of what Holmes reads ------------------------------------------------------

ROOT = "spec.template"


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


_IS: dict[str, Any] = {
    _MAP: lambda v: isinstance(v, Mapping),
    _LIST: lambda v: isinstance(v, list),
    _STR: lambda v: isinstance(v, str),
    _STRS: lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
}


def _check(value: Any, want: str, path: str, out: list[str]) -> bool:
    ok: bool = _IS[want](value)
    if not ok:
        out.append(f"{path}: must be a {want}, got {_kind(value)}")
    return ok


def _string_map(d: Mapping[str, Any], key: str, path: str, out: list[str]) -> None:
    v = d.get(key)
    if v is None or not _check(v, _MAP, f"{path}.{key}", out):
        return
    for k, x in v.items():
        if not isinstance(x, str):
            out.append(f"{path}.{key}.{k}: must be a string, got {_kind(x)} (quote it)")


def _quantities(d: Mapping[str, Any], path: str, out: list[str]) -> None:
    """Resource amounts: a quantity string ("8Gi", "500m") or a finite number."""
    for k, v in d.items():
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not (isinstance(v, str) or number) or (number and not math.isfinite(v)):
            out.append(f'{path}.{k}: must be a quantity such as "8Gi" or 4, got {_kind(v)}')


def _list_of_maps(
    d: Mapping[str, Any], key: str, path: str, out: list[str]
) -> list[tuple[str, Mapping[str, Any]]]:
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
    """Wrongly typed fields among those Holmes reads or merges into, as "path: what" lines."""
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
                    amounts, at = c[key].get(part), f"{p}.resources.{part}"
                    if amounts is not None and _check(amounts, _MAP, at, out):
                        _quantities(amounts, at, out)
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
            if e.get("value") is not None:
                _check(e["value"], _STR, f"{ep}.value", out)
        for mp, m in _list_of_maps(c, "volumeMounts", p, out):
            for key in ("name", "mountPath"):
                if not isinstance(m.get(key), str):
                    out.append(f"{mp}.{key}: must be a string, got {_kind(m.get(key))}")
        _list_of_maps(c, "ports", p, out)
    return out
