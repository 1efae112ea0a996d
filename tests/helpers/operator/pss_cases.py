"""One failing and one passing spec.template per job-policy control, laid out like the Kubernetes
pod-security-admission fixtures (a control, the fields it restricts, a pod that fails and one that
passes): the pure test (test_pod_security.py) and the local control plane test share them."""

from __future__ import annotations

from dataclasses import dataclass

from holmes.operator.core.template import BASELINE, RESTRICTED, TemplatePolicy


@dataclass(frozen=True)
class Case:
    control: str  # the pod-security-admission check id, or Holmes' own control
    level: str  # the level checked (a baseline case's ``fail`` is refused at restricted too)
    fail: dict  # a spec.template the policy refuses at ``level``...
    path: str  # ...naming this field (spec.template.<path>)
    flag: str  # ...and this operator flag
    allowing: TemplatePolicy  # the exception that lets ``fail`` through
    ok: dict  # a spec.template the policy accepts at ``level``, near ``fail``

    @property
    def id(self) -> str:
        return f"{self.control}:{self.path}"


def spec(**s) -> dict:
    return {"spec": s}


def c(**container) -> dict:
    """A template whose trainer container has these fields."""
    return {"spec": {"containers": [{"name": "trainer", **container}]}}


def sc(**security) -> dict:
    return c(securityContext=security)


def psc(**security) -> dict:
    return spec(securityContext=security)


APPARMOR = "container.apparmor.security.beta.kubernetes.io/trainer"
SECCOMP_POD = "seccomp.security.alpha.kubernetes.io/pod"
TOKEN = {"serviceAccountToken": {"path": "token", "audience": "x"}}


def projected(*sources) -> list[dict]:
    return [{"name": "t", "projected": {"sources": list(sources)}}]


def P(**kw) -> TemplatePolicy:
    return TemplatePolicy(**kw)


def R(**kw) -> TemplatePolicy:
    return TemplatePolicy(level=RESTRICTED, **kw)


B = BASELINE
CASES = [
    # ---- baseline (Pod Security Standards, Kubernetes v1.36) ------------------------------------
    Case(
        "windowsHostProcess",
        B,
        psc(windowsOptions={"hostProcess": True}),
        "spec.securityContext.windowsOptions.hostProcess",
        "allow-host-process",
        P(allow_host_process=True),
        psc(windowsOptions={"hostProcess": False}),
    ),
    Case(
        "windowsHostProcess",
        B,
        sc(windowsOptions={"hostProcess": True}),
        "spec.containers[0].securityContext.windowsOptions.hostProcess",
        "allow-host-process",
        P(allow_host_process=True),
        sc(windowsOptions={"runAsUserName": "x"}),
    ),
    *(
        Case(
            "hostNamespaces",
            B,
            spec(**{key: True}),
            f"spec.{key}",
            "allow-host-namespaces",
            P(allow_host_namespaces=True),
            spec(**{key: False}),
        )
        for key in ("hostNetwork", "hostPID", "hostIPC")
    ),
    Case(
        "privileged",
        B,
        sc(privileged=True),
        "spec.containers[0].securityContext.privileged",
        "allow-privileged",
        P(allow_privileged=True),
        sc(privileged=False),
    ),
    Case(
        "privileged",
        B,
        {"spec": {"initContainers": [{"name": "init", "securityContext": {"privileged": True}}]}},
        "spec.initContainers[0].securityContext.privileged",
        "allow-privileged",
        P(allow_privileged=True),
        {"spec": {"initContainers": [{"name": "init"}]}},
    ),
    Case(
        "capabilities_baseline",
        B,
        sc(capabilities={"add": ["SYS_ADMIN"]}),
        "spec.containers[0].securityContext.capabilities.add",
        "allow-capabilities SYS_ADMIN",
        P(allowed_capabilities=("SYS_ADMIN",)),
        sc(capabilities={"add": ["CHOWN", "NET_BIND_SERVICE"]}),  # in the runtimes' default set
    ),
    Case(  # Holmes adds IPC_LOCK itself on RDMA nodes; a template asking for it is refused
        "capabilities_baseline",
        B,
        sc(capabilities={"add": ["IPC_LOCK"]}),
        "spec.containers[0].securityContext.capabilities.add",
        "allow-capabilities IPC_LOCK",
        P(allowed_capabilities=("IPC_LOCK",)),
        sc(capabilities={"drop": ["ALL"]}),
    ),
    Case(
        "hostPathVolumes",
        B,
        spec(volumes=[{"name": "h", "hostPath": {"path": "/"}}]),
        "spec.volumes[0].hostPath",
        "allow-host-path",
        P(allow_host_path=True),
        spec(volumes=[{"name": "h", "emptyDir": {}}]),
    ),
    Case(
        "hostPorts",
        B,
        c(ports=[{"containerPort": 80, "hostPort": 80}]),
        "spec.containers[0].ports[0].hostPort",
        "allow-host-ports",
        P(allow_host_ports=True),
        c(ports=[{"containerPort": 80, "hostPort": 0}]),
    ),
    Case(
        "hostProbesAndHostLifecycle",
        B,
        c(livenessProbe={"httpGet": {"host": "10.0.0.1", "port": 80}}),
        "spec.containers[0].livenessProbe.httpGet.host",
        "allow-probe-hosts",
        P(allow_probe_hosts=True),
        c(livenessProbe={"httpGet": {"port": 80}}),
    ),
    Case(
        "hostProbesAndHostLifecycle",
        B,
        c(lifecycle={"preStop": {"tcpSocket": {"host": "metadata", "port": 80}}}),
        "spec.containers[0].lifecycle.preStop.tcpSocket.host",
        "allow-probe-hosts",
        P(allow_probe_hosts=True),
        c(lifecycle={"preStop": {"exec": {"command": ["true"]}}}),
    ),
    Case(
        "appArmorProfile",
        B,
        {"metadata": {"annotations": {APPARMOR: "unconfined"}}},
        f"metadata.annotations['{APPARMOR}']",
        "allow-unconfined-apparmor",
        P(allow_unconfined_apparmor=True),
        {"metadata": {"annotations": {APPARMOR: "localhost/trainer"}}},
    ),
    Case(
        "appArmorProfile",
        B,
        psc(appArmorProfile={"type": "Unconfined"}),
        "spec.securityContext.appArmorProfile.type",
        "allow-unconfined-apparmor",
        P(allow_unconfined_apparmor=True),
        psc(appArmorProfile={"type": "RuntimeDefault"}),
    ),
    Case(
        "appArmorProfile",
        B,
        sc(appArmorProfile={"type": "Unconfined"}),
        "spec.containers[0].securityContext.appArmorProfile.type",
        "allow-unconfined-apparmor",
        P(allow_unconfined_apparmor=True),
        sc(appArmorProfile={"type": "Localhost", "localhostProfile": "trainer"}),
    ),
    Case(
        "seLinuxOptions",
        B,
        psc(seLinuxOptions={"type": "spc_t"}),
        "spec.securityContext.seLinuxOptions.type",
        "allow-selinux-options",
        P(allow_selinux_options=True),
        psc(seLinuxOptions={"type": "container_t", "level": "s0:c1,c2"}),
    ),
    Case(
        "seLinuxOptions",
        B,
        sc(seLinuxOptions={"user": "system_u"}),
        "spec.containers[0].securityContext.seLinuxOptions.user",
        "allow-selinux-options",
        P(allow_selinux_options=True),
        sc(seLinuxOptions={"type": "container_init_t"}),
    ),
    Case(
        "seLinuxOptions",
        B,
        sc(seLinuxOptions={"role": "system_r"}),
        "spec.containers[0].securityContext.seLinuxOptions.role",
        "allow-selinux-options",
        P(allow_selinux_options=True),
        sc(seLinuxOptions={"level": "s0"}),
    ),
    Case(
        "procMount",
        B,
        sc(procMount="Unmasked"),
        "spec.containers[0].securityContext.procMount",
        "allow-unmasked-proc-mount",
        P(allow_unmasked_proc_mount=True),
        {
            "spec": {
                "hostUsers": False,
                "containers": [{"name": "trainer", "securityContext": {"procMount": "Unmasked"}}],
            }
        },
    ),
    Case(
        "seccompProfile_baseline",
        B,
        psc(seccompProfile={"type": "Unconfined"}),
        "spec.securityContext.seccompProfile.type",
        "allow-unconfined-seccomp",
        P(allow_unconfined_seccomp=True),
        psc(seccompProfile={"type": "Localhost", "localhostProfile": "trainer.json"}),
    ),
    Case(
        "seccompProfile_baseline",
        B,
        sc(seccompProfile={"type": "Unconfined"}),
        "spec.containers[0].securityContext.seccompProfile.type",
        "allow-unconfined-seccomp",
        P(allow_unconfined_seccomp=True),
        sc(seccompProfile={"type": "RuntimeDefault"}),
    ),
    Case(  # the annotation older API servers still read
        "seccompProfile_baseline",
        B,
        {"metadata": {"annotations": {SECCOMP_POD: "unconfined"}}},
        f"metadata.annotations['{SECCOMP_POD}']",
        "allow-unconfined-seccomp",
        P(allow_unconfined_seccomp=True),
        {"metadata": {"annotations": {SECCOMP_POD: "runtime/default"}}},
    ),
    Case(
        "sysctls",
        B,
        psc(sysctls=[{"name": "kernel.msgmax", "value": "65536"}]),
        "spec.securityContext.sysctls[0].name",
        "allow-sysctls kernel.msgmax",
        P(allowed_sysctls=("kernel.msgmax",)),
        psc(sysctls=[{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]),
    ),
    Case(  # not a Pod Security Standards control at baseline; Holmes refuses it at every level
        "allowPrivilegeEscalation",
        B,
        sc(allowPrivilegeEscalation=True),
        "spec.containers[0].securityContext.allowPrivilegeEscalation",
        "allow-privileged",
        P(allow_privileged=True),
        sc(allowPrivilegeEscalation=False),
    ),
    # ---- restricted ------------------------------------------------------------------------------
    Case(
        "restrictedVolumes",
        RESTRICTED,
        spec(volumes=[{"name": "data", "nfs": {"server": "nas", "path": "/data"}}]),
        "spec.volumes[0].nfs",
        "allow-volume-types nfs",
        R(allowed_volume_types=("nfs",)),
        spec(volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]),
    ),
    Case(
        "allowPrivilegeEscalation",
        RESTRICTED,
        {"spec": {"initContainers": [{"name": "i", "securityContext": {"allowPrivilegeEscalation": True}}]}},
        "spec.initContainers[0].securityContext.allowPrivilegeEscalation",
        "allow-privileged",
        R(allow_privileged=True),
        {"spec": {"initContainers": [{"name": "i"}]}},  # Holmes sets false where unset
    ),
    Case(
        "capabilities_restricted",
        RESTRICTED,
        sc(capabilities={"drop": ["NET_RAW"]}),
        "spec.containers[0].securityContext.capabilities.drop",
        "policy-level baseline",
        P(),
        sc(capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}),
    ),
    Case(
        "capabilities_restricted",
        RESTRICTED,
        sc(capabilities={"add": ["CHOWN"]}),
        "spec.containers[0].securityContext.capabilities.add",
        "allow-capabilities CHOWN",
        R(allowed_capabilities=("CHOWN",)),
        sc(capabilities={"add": ["NET_BIND_SERVICE"]}),
    ),
    Case(
        "runAsNonRoot",
        RESTRICTED,
        psc(runAsNonRoot=False),
        "spec.securityContext.runAsNonRoot",
        "allow-run-as-root",
        R(allow_run_as_root=True),
        psc(runAsUser=1000),  # Holmes sets runAsNonRoot: true where unset
    ),
    Case(
        "runAsNonRoot",
        RESTRICTED,
        sc(runAsNonRoot=False),
        "spec.containers[0].securityContext.runAsNonRoot",
        "allow-run-as-root",
        R(allow_run_as_root=True),
        {
            "spec": {
                "hostUsers": False,
                "containers": [{"name": "trainer", "securityContext": {"runAsNonRoot": False}}],
            }
        },
    ),
    Case(  # Holmes sets a pod-level RuntimeDefault where unset: only an explicit value can fail
        "seccompProfile_restricted",
        RESTRICTED,
        {
            "spec": {
                "initContainers": [
                    {"name": "i", "securityContext": {"seccompProfile": {"type": "Unconfined"}}}
                ]
            }
        },
        "spec.initContainers[0].securityContext.seccompProfile.type",
        "allow-unconfined-seccomp",
        R(allow_unconfined_seccomp=True),
        {"spec": {"initContainers": [{"name": "i"}]}},
    ),
    Case(
        "runAsUser",
        RESTRICTED,
        sc(runAsUser=0),
        "spec.containers[0].securityContext.runAsUser",
        "allow-run-as-root",
        R(allow_run_as_root=True),
        sc(runAsUser=65532),
    ),
    Case(
        "procMount_restricted",
        RESTRICTED,
        {
            "spec": {
                "hostUsers": False,
                "containers": [{"name": "trainer", "securityContext": {"procMount": "Unmasked"}}],
            }
        },
        "spec.containers[0].securityContext.procMount",
        "allow-unmasked-proc-mount",
        R(allow_unmasked_proc_mount=True),
        {
            "spec": {
                "hostUsers": False,
                "containers": [{"name": "trainer", "securityContext": {"procMount": "Default"}}],
            }
        },
    ),
    # ---- Holmes' own: API tokens by any route, placement, runtimes --------------------------------
    Case(
        "serviceAccount",
        B,
        spec(serviceAccountName="admin"),
        "spec.serviceAccountName",
        "allow-service-accounts admin",
        P(service_accounts=("admin",)),
        spec(automountServiceAccountToken=False),
    ),
    Case(
        "serviceAccountToken",
        B,
        spec(automountServiceAccountToken=True),
        "spec.automountServiceAccountToken",
        "allow-service-accounts default",
        P(service_accounts=("default",)),
        spec(),
    ),
    Case(
        "serviceAccountToken",
        B,
        spec(volumes=projected({"configMap": {"name": "ca"}}, TOKEN)),
        "spec.volumes[0].projected.sources[1].serviceAccountToken",
        "allow-service-accounts default",
        P(service_accounts=("default",)),
        spec(volumes=projected({"configMap": {"name": "ca"}}, {"downwardAPI": {"items": []}})),
    ),
    Case(
        "nodeName",
        B,
        spec(nodeName="n1"),
        "spec.nodeName",
        "allow-node-name",
        P(allow_node_name=True),
        spec(nodeSelector={"pool": "a"}),
    ),
    Case(
        "runtimeClass",
        B,
        spec(runtimeClassName="kata"),
        "spec.runtimeClassName",
        "allow-runtime-classes kata",
        P(runtime_classes=("kata",)),
        spec(priorityClassName="x"),
    ),
]

# The checks of k8s.io/pod-security-admission v0.36 (Kubernetes v1.36), each covered above.
PSA_CHECKS = {
    "baseline": {
        "windowsHostProcess",
        "hostNamespaces",
        "privileged",
        "capabilities_baseline",
        "hostPathVolumes",
        "hostPorts",
        "hostProbesAndHostLifecycle",
        "appArmorProfile",
        "seLinuxOptions",
        "procMount",
        "seccompProfile_baseline",
        "sysctls",
    },
    "restricted": {
        "restrictedVolumes",
        "allowPrivilegeEscalation",
        "capabilities_restricted",
        "runAsNonRoot",
        "runAsUser",
        "seccompProfile_restricted",
        "procMount_restricted",
    },
}
