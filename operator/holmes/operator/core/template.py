"""A job's pod template, checked before anything is rendered from it (pure functions).

Creating a HolmesJob creates pods, so what a job author may put in ``spec.template`` is the
cluster admin's call. ``TemplatePolicy`` (chart values ``jobPolicy``, operator flags
``--policy-level`` and ``--allow-*``) enforces the Kubernetes Pod Security Standards in place of
Pod Security Admission, which cannot guard the namespaces where RDMA jobs run (they must be
``privileged`` for the IPC_LOCK capability Holmes grants): by default every control of the
**baseline** profile, optionally the **restricted** one, each control relaxed only by its own
``--allow-*`` exception. On top, Holmes' own: service accounts (and so API tokens, by any
route), nodeName and runtime classes. Violations are "path: what is wrong" strings, with paths
as in the HolmesJob. (Fields of the wrong type, which the CRD schema, an open object, lets
through, are the contract's ``holmes.contract.podtemplate.shape_problems``: ``load_job``
refuses them before anything here reads the template.)

``secure_defaults`` fills what Holmes sets unless the template says otherwise (render.py calls
it); ``rendered_pod_violations`` checks a pod Holmes rendered against the level it enforces.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from holmes.contract.podtemplate import ROOT

RDMA_CAPABILITIES = ("IPC_LOCK",)  # pinned memory for ibv_reg_mr: Holmes adds it on RDMA nodes

# The Pod Security Standards as of this Kubernetes release (k8s.io/pod-security-admission's
# policy checks at the same version give the exact lists below).
PSS_VERSION = "v1.36"
BASELINE, RESTRICTED = "baseline", "restricted"
LEVELS = (BASELINE, RESTRICTED)
# Capabilities a baseline container may add (the container runtimes' default set).
BASELINE_CAPABILITIES = frozenset(
    "AUDIT_WRITE CHOWN DAC_OVERRIDE FOWNER FSETID KILL MKNOD NET_BIND_SERVICE SETFCAP SETGID "
    "SETPCAP SETUID SYS_CHROOT".split()
)
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
# Namespaced sysctls isolated from other pods on the node.
SAFE_SYSCTLS = frozenset(
    "kernel.shm_rmid_forced net.ipv4.ip_local_port_range net.ipv4.tcp_syncookies "
    "net.ipv4.ping_group_range net.ipv4.ip_unprivileged_port_start net.ipv4.ip_local_reserved_ports "
    "net.ipv4.tcp_keepalive_time net.ipv4.tcp_fin_timeout net.ipv4.tcp_keepalive_intvl "
    "net.ipv4.tcp_keepalive_probes net.ipv4.tcp_rmem net.ipv4.tcp_wmem".split()
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
PROFILE_TYPES = frozenset({"RuntimeDefault", "Localhost"})  # seccompProfile / appArmorProfile .type
# Inline volume sources the restricted level allows (the others need node or cloud access).
RESTRICTED_VOLUME_TYPES = frozenset(
    "configMap csi downwardAPI emptyDir ephemeral image persistentVolumeClaim projected secret".split()
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"  # read by releases before 1.27
SECCOMP_CONTAINER_ANNOTATION = "container.seccomp.security.alpha.kubernetes.io/"
CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")


@dataclass(frozen=True)
class TemplatePolicy:
    """What a job author may set in the pod template. ``level``: the Pod Security Standards
    profile enforced; each other field is one control's exception, named by the operator flag
    and chart value (under ``jobPolicy``) in ``POLICY_OPTIONS``."""

    level: str = BASELINE
    allow_privileged: bool = False
    allowed_capabilities: tuple[str, ...] = ()
    allow_host_namespaces: bool = False
    allow_host_path: bool = False
    allow_host_ports: bool = False
    allow_host_process: bool = False
    allow_probe_hosts: bool = False
    allow_unconfined_apparmor: bool = False
    allow_selinux_options: bool = False
    allow_unmasked_proc_mount: bool = False
    allow_unconfined_seccomp: bool = False
    allowed_sysctls: tuple[str, ...] = ()
    allowed_volume_types: tuple[str, ...] = ()
    allow_run_as_root: bool = False
    service_accounts: tuple[str, ...] = ()
    allow_node_name: bool = False
    runtime_classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"level {self.level!r}: expected one of {', '.join(LEVELS)}")


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
        "level",
        "policy-level",
        "level",
        "baseline (default), or restricted: also non-root, no privilege escalation, capabilities "
        "dropped, restricted volume types",
    ),
    PolicyOption(
        "allow_privileged",
        "allow-privileged",
        "allowPrivileged",
        "privileged containers, allowPrivilegeEscalation",
    ),
    PolicyOption(
        "allowed_capabilities",
        "allow-capabilities",
        "allowedCapabilities",
        "capabilities a container may add beyond the level's (baseline: the runtimes' default set; "
        "restricted: NET_BIND_SERVICE)",
    ),
    PolicyOption(
        "allow_host_namespaces",
        "allow-host-namespaces",
        "allowHostNamespaces",
        "hostNetwork, hostPID, hostIPC (and spec.network: hostNetwork)",
    ),
    PolicyOption("allow_host_path", "allow-host-path", "allowHostPath", "hostPath volumes"),
    PolicyOption("allow_host_ports", "allow-host-ports", "allowHostPorts", "containers' ports[].hostPort"),
    PolicyOption("allow_host_process", "allow-host-process", "allowHostProcess", "Windows HostProcess pods"),
    PolicyOption(
        "allow_probe_hosts",
        "allow-probe-hosts",
        "allowProbeHosts",
        "a host in probes' and lifecycle hooks' handlers",
    ),
    PolicyOption(
        "allow_unconfined_apparmor",
        "allow-unconfined-apparmor",
        "allowUnconfinedAppArmor",
        "AppArmor profiles but RuntimeDefault and Localhost (field or annotation)",
    ),
    PolicyOption(
        "allow_selinux_options",
        "allow-selinux-options",
        "allowSELinuxOptions",
        "seLinuxOptions with a custom type, user or role",
    ),
    PolicyOption(
        "allow_unmasked_proc_mount",
        "allow-unmasked-proc-mount",
        "allowUnmaskedProcMount",
        "procMount: Unmasked",
    ),
    PolicyOption(
        "allow_unconfined_seccomp",
        "allow-unconfined-seccomp",
        "allowUnconfinedSeccomp",
        "seccomp profiles but RuntimeDefault and Localhost (field or annotation)",
    ),
    PolicyOption("allowed_sysctls", "allow-sysctls", "allowedSysctls", "sysctls beyond the safe set"),
    PolicyOption(
        "allowed_volume_types",
        "allow-volume-types",
        "allowedVolumeTypes",
        "restricted: inline volume types beyond configMap, csi, downwardAPI, emptyDir, ephemeral, "
        "image, persistentVolumeClaim, projected, secret (e.g. nfs)",
    ),
    PolicyOption(
        "allow_run_as_root",
        "allow-run-as-root",
        "allowRunAsRoot",
        "restricted: runAsNonRoot: false, runAsUser: 0",
    ),
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


# ---- Pod Security controls ---------------------------------------------------------------------


def _map(v: Any) -> Mapping:
    return v if isinstance(v, Mapping) else {}


def _maps(v: Any) -> Iterator[tuple[int, Mapping]]:
    return ((i, x) for i, x in enumerate(v if isinstance(v, list) else []) if isinstance(x, Mapping))


def harden_container(c: Mapping[str, Any]) -> dict:
    """The container with Holmes' defaults where it leaves them unset: no privilege escalation,
    every capability dropped."""
    c = dict(c)
    sc = copy.deepcopy(dict(_map(c.get("securityContext"))))
    sc.setdefault("allowPrivilegeEscalation", False)
    caps = sc.setdefault("capabilities", {})
    if isinstance(caps, dict):
        caps.setdefault("drop", ["ALL"])
    c["securityContext"] = sc
    return c


def secure_defaults(spec: dict, level: str) -> dict:
    """Holmes' defaults, filled in place where the pod spec leaves them unset: no API token,
    seccomp RuntimeDefault; at the restricted level also runAsNonRoot at pod level and every
    container hardened (render.py hardens the trainer container at every level)."""
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


def policy_violations(template: Mapping[str, Any] | None, policy: TemplatePolicy) -> list[str]:
    """Settings of ``spec.template`` the policy does not allow, each with its path and the flag
    (and chart value) that would allow it. What Holmes fills in (``secure_defaults``) counts."""
    template = template or {}
    spec = secure_defaults(copy.deepcopy(dict(_map(template.get("spec")))), policy.level)
    return _violations(_map(template.get("metadata")), spec, policy, ROOT)


def rendered_pod_violations(
    pod: Mapping[str, Any], level: str = BASELINE, *, service_accounts: tuple[str, ...] = ()
) -> list[str]:
    """What keeps a pod Holmes rendered from passing ``level`` with no exception but IPC_LOCK
    (which Holmes adds on RDMA nodes) and the ``service_accounts`` it may run as: every kind of
    pod Holmes creates must pass this with a template that asks for nothing."""
    policy = TemplatePolicy(level=level, service_accounts=service_accounts)
    return _violations(_map(pod.get("metadata")), _map(pod.get("spec")), policy, "", RDMA_CAPABILITIES)


def _violations(
    meta: Mapping, spec: Mapping, policy: TemplatePolicy, root: str, holmes_caps: tuple[str, ...] = ()
) -> list[str]:
    out: list[str] = []
    mp, sp = (f"{root}.metadata", f"{root}.spec") if root else ("metadata", "spec")
    restricted = policy.level == RESTRICTED

    def deny(path: str, what: str, field: str, value: str = "") -> None:
        o = OPTION[field]
        flag = f"--{o.flag}" + (f" {value}" if value else "")
        chart = f"jobPolicy.{o.chart}" + (f": {value}" if field == "level" else "" if o.is_list else ": true")
        out.append(
            f"{path}: {what} is not allowed by the operator's job policy (allowed by the operator "
            f"flag {flag}, chart value {chart})"
        )

    containers = [(f"{sp}.{k}[{i}]", c) for k in CONTAINER_KINDS for i, c in _maps(spec.get(k))]
    csc = [(f"{p}.securityContext", _map(c.get("securityContext"))) for p, c in containers]
    psc = _map(spec.get("securityContext"))
    scs = [(f"{sp}.securityContext", psc), *csc]  # pod level, then each container
    annotations = _map(meta.get("annotations"))
    user_namespace = spec.get("hostUsers") is False  # relaxes root and /proc rules (baseline)

    def flagged(checks: list[tuple[str, Mapping]], key: str, bad: Callable[[Any], bool]):
        return [(f"{p}.{key}", sc[key]) for p, sc in checks if key in sc and bad(sc[key])]

    # -- baseline ---------------------------------------------------------------------------
    if not policy.allow_host_process:
        for p, sc in scs:
            if _map(sc.get("windowsOptions")).get("hostProcess"):
                deny(f"{p}.windowsOptions.hostProcess", "a Windows HostProcess pod", "allow_host_process")
    if not policy.allow_host_namespaces:
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(key):
                deny(f"{sp}.{key}", f"{key}: true", "allow_host_namespaces")
    if not policy.allow_privileged:
        for p, _ in flagged(csc, "privileged", bool):
            deny(p, "a privileged container", "allow_privileged")
    allowed_caps = (RESTRICTED_CAPABILITIES if restricted else BASELINE_CAPABILITIES).union(
        policy.allowed_capabilities, holmes_caps
    )
    for p, sc in csc:
        caps = _map(sc.get("capabilities"))
        for cap in caps.get("add") or []:
            if isinstance(cap, str) and cap not in allowed_caps:
                deny(f"{p}.capabilities.add", f"capability {cap}", "allowed_capabilities", cap)
        if restricted and "ALL" not in (caps.get("drop") or []):
            deny(f"{p}.capabilities.drop", "keeping capabilities (restricted: drop ALL)", "level", BASELINE)
    for i, vol in _maps(spec.get("volumes")):
        for kind in vol:
            if kind == "hostPath":
                if not policy.allow_host_path:
                    deny(f"{sp}.volumes[{i}].hostPath", "a hostPath volume", "allow_host_path")
            elif (
                restricted
                and kind != "name"
                and kind not in RESTRICTED_VOLUME_TYPES | set(policy.allowed_volume_types)
            ):
                deny(
                    f"{sp}.volumes[{i}].{kind}",
                    f"a {kind} volume (restricted level)",
                    "allowed_volume_types",
                    kind,
                )
    for p, c in containers:
        if not policy.allow_host_ports:
            for j, port in _maps(c.get("ports")):
                if port.get("hostPort") not in (None, 0):
                    deny(f"{p}.ports[{j}].hostPort", f"hostPort {port['hostPort']}", "allow_host_ports")
        if not policy.allow_probe_hosts:
            handlers = [
                (f"{p}.{k}", _map(c.get(k))) for k in ("livenessProbe", "readinessProbe", "startupProbe")
            ]
            lifecycle = _map(c.get("lifecycle"))
            handlers += [(f"{p}.lifecycle.{k}", _map(lifecycle.get(k))) for k in ("postStart", "preStop")]
            for hp, h in handlers:
                for kind in ("httpGet", "tcpSocket"):
                    host = _map(h.get(kind)).get("host")
                    if host:
                        deny(f"{hp}.{kind}.host", f"a probe or hook to host {host!r}", "allow_probe_hosts")
    if not policy.allow_unconfined_apparmor:
        for k, v in annotations.items():
            if k.startswith(APPARMOR_ANNOTATION) and not (
                v in ("", "runtime/default") or str(v).startswith("localhost/")
            ):
                deny(f"{mp}.annotations['{k}']", f"AppArmor profile {v!r}", "allow_unconfined_apparmor")
        for p, sc in scs:
            t = _map(sc.get("appArmorProfile")).get("type")
            if "appArmorProfile" in sc and t not in PROFILE_TYPES:
                deny(f"{p}.appArmorProfile.type", f"AppArmor profile {t!r}", "allow_unconfined_apparmor")
    if not policy.allow_selinux_options:
        for p, sc in scs:
            se = _map(sc.get("seLinuxOptions"))
            if se.get("type", "") not in SELINUX_TYPES:
                deny(f"{p}.seLinuxOptions.type", f"SELinux type {se['type']!r}", "allow_selinux_options")
            for key in ("user", "role"):
                if se.get(key):
                    deny(f"{p}.seLinuxOptions.{key}", f"a custom SELinux {key}", "allow_selinux_options")
    if not policy.allow_unmasked_proc_mount and (restricted or not user_namespace):
        for p, pm in flagged(csc, "procMount", lambda v: v not in (None, "Default")):
            deny(p, f"procMount {pm}", "allow_unmasked_proc_mount")
    if not policy.allow_unconfined_seccomp:
        for p, sc in scs:
            t = _map(sc.get("seccompProfile")).get("type")
            if "seccompProfile" in sc and t not in PROFILE_TYPES:
                deny(f"{p}.seccompProfile.type", f"seccomp profile {t!r}", "allow_unconfined_seccomp")
        for k, v in annotations.items():
            if (k == SECCOMP_POD_ANNOTATION or k.startswith(SECCOMP_CONTAINER_ANNOTATION)) and not (
                v in ("runtime/default", "docker/default") or str(v).startswith("localhost/")
            ):
                deny(f"{mp}.annotations['{k}']", f"seccomp profile {v!r}", "allow_unconfined_seccomp")
        if restricted and "seccompProfile" not in psc:
            for p, sc in csc:
                if "seccompProfile" not in sc:
                    deny(f"{p}.seccompProfile", "no seccomp profile (restricted)", "allow_unconfined_seccomp")
    allowed_sysctls = SAFE_SYSCTLS.union(policy.allowed_sysctls)
    for j, s in _maps(psc.get("sysctls")):
        if s.get("name") not in allowed_sysctls:
            deny(
                f"{sp}.securityContext.sysctls[{j}].name",
                f"sysctl {s.get('name')}",
                "allowed_sysctls",
                str(s.get("name")),
            )

    # -- restricted -------------------------------------------------------------------------
    for p, sc in csc if not policy.allow_privileged else []:
        ape = sc.get("allowPrivilegeEscalation")
        if ape or (restricted and ape is not False):  # baseline: only an explicit true
            what = "privilege escalation" if ape else "not setting allowPrivilegeEscalation: false"
            deny(f"{p}.allowPrivilegeEscalation", what, "allow_privileged")
    if restricted and not user_namespace and not policy.allow_run_as_root:
        pod_non_root = psc.get("runAsNonRoot")
        if pod_non_root is False:
            deny(f"{sp}.securityContext.runAsNonRoot", "runAsNonRoot: false", "allow_run_as_root")
        for p, sc in csc:
            if sc.get("runAsNonRoot") is False or ("runAsNonRoot" not in sc and pod_non_root is not True):
                deny(f"{p}.runAsNonRoot", "a container that may run as root", "allow_run_as_root")
        for p, _ in flagged(scs, "runAsUser", lambda v: v == 0):
            deny(p, "runAsUser: 0", "allow_run_as_root")

    # -- Holmes' own: API tokens, placement, runtimes -----------------------------------------
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
