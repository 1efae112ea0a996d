"""A job's pod template: what Holmes fills in, and what only Holmes can refuse (pure functions).

The Kubernetes Pod Security Standards are the platform's: Pod Security Admission checks every pod
the operator creates (and the server-side dry run of a rendered pod before the gang is created,
kube.py) against the level its namespace enforces (``pod-security.kubernetes.io/enforce``).
Holmes does not check them again. ``TemplatePolicy`` (chart values ``jobPolicy``, operator flags
``--allow-*``) keeps only what the API server cannot see: that the operator, not the job's
author, creates the pods, so it must not lend them a service account (and so an API token, by any
route) the admin did not name, nor let a template pick its node (``nodeName``: the planner places
pods) or a runtime class. Violations are "path: what is wrong" strings, with paths as in the
HolmesJob. (Fields of the wrong type, which the CRD schema, an open object, lets through, are the
contract's ``holmes.contract.podtemplate.shape_problems``: ``load_job`` refuses them before
anything here reads the template.)

``secure_defaults`` fills what Holmes sets unless the template says otherwise (render.py calls
it), so that a template that asks for nothing passes the namespace's level.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from holmes.contract.podtemplate import ROOT

# Pod Security Admission's namespace label and its levels (the namespace's admin sets them).
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
PRIVILEGED, BASELINE, RESTRICTED = "privileged", "baseline", "restricted"
LEVELS = (PRIVILEGED, BASELINE, RESTRICTED)


def enforced_level(labels: Mapping[str, str] | None) -> str:
    """The level a namespace's labels enforce (unset or unknown: privileged, as PSA reads it
    with the API server's default configuration)."""
    level = (labels or {}).get(ENFORCE_LABEL, "")
    return level if level in LEVELS else PRIVILEGED


@dataclass(frozen=True)
class TemplatePolicy:
    """What a job author may set in the pod template beyond what Pod Security Admission checks;
    each field is named by the operator flag and chart value (under ``jobPolicy``) in
    ``POLICY_OPTIONS``."""

    service_accounts: tuple[str, ...] = ()
    allow_node_name: bool = False
    runtime_classes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PolicyOption:
    """One ``TemplatePolicy`` field as the operator flag and chart value that set it."""

    field: str
    flag: str
    chart: str
    help: str

    @property
    def is_list(self) -> bool:
        return isinstance(getattr(TemplatePolicy(), self.field), tuple)


POLICY_OPTIONS = (
    PolicyOption(
        "service_accounts",
        "allow-service-accounts",
        "serviceAccounts",
        "service accounts job pods may run as and whose token they may mount or project "
        "(default: the namespace's default one)",
    ),
    PolicyOption(
        "allow_node_name", "allow-node-name", "allowNodeName", "spec.nodeName (the planner places pods)"
    ),
    PolicyOption("runtime_classes", "allow-runtime-classes", "runtimeClasses", "runtimeClassName values"),
)
OPTION = {o.field: o for o in POLICY_OPTIONS}
assert [o.field for o in POLICY_OPTIONS] == [f.name for f in fields(TemplatePolicy)]


def _map(v: Any) -> Mapping:
    return v if isinstance(v, Mapping) else {}


def _maps(v: Any) -> Iterator[tuple[int, Mapping]]:
    return ((i, x) for i, x in enumerate(v if isinstance(v, list) else []) if isinstance(x, Mapping))


# ---- Holmes' defaults ---------------------------------------------------------------------------


def harden_container(c: Mapping[str, Any]) -> dict:
    """The container with Holmes' defaults where it leaves them unset: no privilege escalation
    (unless it is privileged or adds SYS_ADMIN, which the API server refuses with it), every
    capability dropped."""
    c = dict(c)
    sc = copy.deepcopy(dict(_map(c.get("securityContext"))))
    added = {str(a).upper().removeprefix("CAP_") for a in _map(sc.get("capabilities")).get("add") or []}
    if not sc.get("privileged") and "SYS_ADMIN" not in added:
        sc.setdefault("allowPrivilegeEscalation", False)
    caps = sc.setdefault("capabilities", {})
    if isinstance(caps, dict):
        caps.setdefault("drop", ["ALL"])
    c["securityContext"] = sc
    return c


def secure_defaults(spec: dict, level: str) -> dict:
    """Holmes' defaults, filled in place where the pod spec leaves them unset: no API token,
    seccomp RuntimeDefault; where the namespace enforces ``restricted`` also runAsNonRoot at
    pod level and every container hardened (render.py hardens the trainer container always)."""
    spec.setdefault("automountServiceAccountToken", False)  # the trainer never calls the API
    psc = dict(_map(spec.get("securityContext")))
    psc.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    if level == RESTRICTED:
        psc.setdefault("runAsNonRoot", True)
        for kind in ("initContainers", "containers"):
            if isinstance(spec.get(kind), list):
                spec[kind] = [harden_container(c) if isinstance(c, Mapping) else c for c in spec[kind]]
    spec["securityContext"] = psc
    return spec


# ---- what only Holmes can refuse ----------------------------------------------------------------


def policy_violations(template: Mapping[str, Any] | None, policy: TemplatePolicy) -> list[str]:
    """Settings of ``spec.template`` the operator's policy does not allow, each with its path
    and the flag (and chart value) that would allow it. What Holmes fills in counts (no token)."""
    template = template or {}
    spec = secure_defaults(copy.deepcopy(dict(_map(template.get("spec")))), BASELINE)
    out: list[str] = []
    sp = f"{ROOT}.spec"

    def deny(path: str, what: str, field: str, value: str = "") -> None:
        o = OPTION[field]
        flag = f"--{o.flag}" + (f" {value}" if value else "")
        chart = f"jobPolicy.{o.chart}" + ("" if o.is_list else ": true")
        out.append(
            f"{path}: {what} is not allowed by the operator's job policy (allowed by the operator "
            f"flag {flag}, chart value {chart})"
        )

    sa_key = "serviceAccountName" if spec.get("serviceAccountName") else "serviceAccount"
    sa = spec.get(sa_key)
    if sa and sa not in policy.service_accounts:
        deny(f"{sp}.{sa_key}", f"service account {sa!r}", "service_accounts", str(sa))
    elif not sa and "default" not in policy.service_accounts:  # its token, by any route
        token = "the default service account's token"
        if spec.get("automountServiceAccountToken") is not False:  # unset: the API mounts it
            deny(f"{sp}.automountServiceAccountToken", f"mounting {token}", "service_accounts", "default")
        for i, vol in _maps(spec.get("volumes")):
            for j, src in _maps(_map(vol.get("projected")).get("sources")):
                if "serviceAccountToken" in src:
                    deny(
                        f"{sp}.volumes[{i}].projected.sources[{j}].serviceAccountToken",
                        f"projecting {token}",
                        "service_accounts",
                        "default",
                    )
    if not policy.allow_node_name and spec.get("nodeName"):
        deny(f"{sp}.nodeName", "setting nodeName (the planner places pods)", "allow_node_name")
    rc = spec.get("runtimeClassName")
    if rc and rc not in policy.runtime_classes:
        deny(f"{sp}.runtimeClassName", f"runtime class {rc!r}", "runtime_classes", str(rc))
    return out
