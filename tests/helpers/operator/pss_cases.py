"""One failing and one passing spec.template per Pod Security Standards control, laid out like the
Kubernetes pod-security-admission fixtures (a control, the field it restricts, a template whose pods
fail and one whose pods pass): the local control plane test (tests/e2e/operator/
test_pod_security_cluster.py) applies them to namespaces enforcing the level, where the API
server's Pod Security Admission, not Holmes, must refuse each ``fail`` before any pod exists and
take each ``ok`` rendered by Holmes."""

from __future__ import annotations

from dataclasses import dataclass

BASELINE, RESTRICTED = "baseline", "restricted"


@dataclass(frozen=True)
class Case:
    control: str  # the pod-security-admission check id
    level: str  # the level checked (a baseline case's ``fail`` is refused at restricted too)
    fail: dict  # a spec.template whose pods the level refuses...
    path: str  # ...at this field of the pod
    ok: dict  # a spec.template whose pods (as Holmes renders them) pass, near ``fail``

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


B = BASELINE
CASES = [
    # ---- baseline (Pod Security Standards, Kubernetes v1.36) ------------------------------------
    Case(  # a HostProcess pod must be on the host network (Pod validation)
        "windowsHostProcess",
        B,
        spec(hostNetwork=True, securityContext={"windowsOptions": {"hostProcess": True}}),
        "spec.securityContext.windowsOptions.hostProcess",
        psc(windowsOptions={"hostProcess": False}),
    ),
    Case(
        "windowsHostProcess",
        B,
        {
            "spec": {
                "hostNetwork": True,
                "containers": [
                    {"name": "trainer", "securityContext": {"windowsOptions": {"hostProcess": True}}}
                ],
            }
        },
        "spec.containers[0].securityContext.windowsOptions.hostProcess",
        sc(windowsOptions={"runAsUserName": "x"}),
    ),
    *(
        Case(
            "hostNamespaces",
            B,
            spec(**{key: True}),
            f"spec.{key}",
            spec(**{key: False}),
        )
        for key in ("hostNetwork", "hostPID", "hostIPC")
    ),
    Case(
        "privileged",
        B,
        sc(privileged=True),
        "spec.containers[0].securityContext.privileged",
        sc(privileged=False),
    ),
    Case(
        "privileged",
        B,
        {
            "spec": {
                "initContainers": [
                    {"name": "init", "image": "busybox", "securityContext": {"privileged": True}}
                ]
            }
        },
        "spec.initContainers[0].securityContext.privileged",
        {"spec": {"initContainers": [{"name": "init", "image": "busybox"}]}},
    ),
    Case(
        "capabilities_baseline",
        B,
        sc(capabilities={"add": ["SYS_ADMIN"]}),
        "spec.containers[0].securityContext.capabilities.add",
        sc(capabilities={"add": ["CHOWN", "NET_BIND_SERVICE"]}),  # in the runtimes' default set
    ),
    Case(  # the capability RDMA once needed: an island's ipcLock asks for it, in a privileged namespace
        "capabilities_baseline",
        B,
        sc(capabilities={"add": ["IPC_LOCK"]}),
        "spec.containers[0].securityContext.capabilities.add",
        sc(capabilities={"drop": ["ALL"]}),
    ),
    Case(
        "hostPathVolumes",
        B,
        spec(volumes=[{"name": "h", "hostPath": {"path": "/"}}]),
        "spec.volumes[0].hostPath",
        spec(volumes=[{"name": "h", "emptyDir": {}}]),
    ),
    Case(
        "hostPorts",
        B,
        c(ports=[{"containerPort": 80, "hostPort": 80}]),
        "spec.containers[0].ports[0].hostPort",
        c(ports=[{"containerPort": 80, "hostPort": 0}]),
    ),
    Case(
        "hostProbesAndHostLifecycle",
        B,
        c(livenessProbe={"httpGet": {"host": "10.0.0.1", "port": 80}}),
        "spec.containers[0].livenessProbe.httpGet.host",
        c(livenessProbe={"httpGet": {"port": 80}}),
    ),
    Case(
        "hostProbesAndHostLifecycle",
        B,
        c(lifecycle={"preStop": {"tcpSocket": {"host": "metadata", "port": 80}}}),
        "spec.containers[0].lifecycle.preStop.tcpSocket.host",
        c(lifecycle={"preStop": {"exec": {"command": ["true"]}}}),
    ),
    Case(
        "appArmorProfile",
        B,
        {"metadata": {"annotations": {APPARMOR: "unconfined"}}},
        f"metadata.annotations['{APPARMOR}']",
        {"metadata": {"annotations": {APPARMOR: "localhost/trainer"}}},
    ),
    Case(
        "appArmorProfile",
        B,
        psc(appArmorProfile={"type": "Unconfined"}),
        "spec.securityContext.appArmorProfile.type",
        psc(appArmorProfile={"type": "RuntimeDefault"}),
    ),
    Case(
        "appArmorProfile",
        B,
        sc(appArmorProfile={"type": "Unconfined"}),
        "spec.containers[0].securityContext.appArmorProfile.type",
        sc(appArmorProfile={"type": "Localhost", "localhostProfile": "trainer"}),
    ),
    Case(
        "seLinuxOptions",
        B,
        psc(seLinuxOptions={"type": "spc_t"}),
        "spec.securityContext.seLinuxOptions.type",
        psc(seLinuxOptions={"type": "container_t", "level": "s0:c1,c2"}),
    ),
    Case(
        "seLinuxOptions",
        B,
        sc(seLinuxOptions={"user": "system_u"}),
        "spec.containers[0].securityContext.seLinuxOptions.user",
        sc(seLinuxOptions={"type": "container_init_t"}),
    ),
    Case(
        "seLinuxOptions",
        B,
        sc(seLinuxOptions={"role": "system_r"}),
        "spec.containers[0].securityContext.seLinuxOptions.role",
        sc(seLinuxOptions={"level": "s0"}),
    ),
    Case(
        "procMount",
        B,
        sc(procMount="Unmasked"),
        "spec.containers[0].securityContext.procMount",
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
        psc(seccompProfile={"type": "Localhost", "localhostProfile": "trainer.json"}),
    ),
    Case(
        "seccompProfile_baseline",
        B,
        sc(seccompProfile={"type": "Unconfined"}),
        "spec.containers[0].securityContext.seccompProfile.type",
        sc(seccompProfile={"type": "RuntimeDefault"}),
    ),
    Case(  # the annotation older API servers still read
        "seccompProfile_baseline",
        B,
        {"metadata": {"annotations": {SECCOMP_POD: "unconfined"}}},
        f"metadata.annotations['{SECCOMP_POD}']",
        {"metadata": {"annotations": {SECCOMP_POD: "runtime/default"}}},
    ),
    Case(
        "sysctls",
        B,
        psc(sysctls=[{"name": "kernel.msgmax", "value": "65536"}]),
        "spec.securityContext.sysctls[0].name",
        psc(sysctls=[{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]),
    ),
    # ---- restricted ------------------------------------------------------------------------------
    Case(
        "restrictedVolumes",
        RESTRICTED,
        spec(volumes=[{"name": "data", "nfs": {"server": "nas", "path": "/data"}}]),
        "spec.volumes[0].nfs",
        spec(volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]),
    ),
    Case(
        "allowPrivilegeEscalation",
        RESTRICTED,
        {
            "spec": {
                "initContainers": [
                    {"name": "i", "image": "busybox", "securityContext": {"allowPrivilegeEscalation": True}}
                ]
            }
        },
        "spec.initContainers[0].securityContext.allowPrivilegeEscalation",
        {"spec": {"initContainers": [{"name": "i", "image": "busybox"}]}},  # Holmes sets false where unset
    ),
    Case(
        "capabilities_restricted",
        RESTRICTED,
        sc(capabilities={"drop": ["NET_RAW"]}),
        "spec.containers[0].securityContext.capabilities.drop",
        sc(capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}),
    ),
    Case(
        "capabilities_restricted",
        RESTRICTED,
        sc(capabilities={"add": ["CHOWN"]}),
        "spec.containers[0].securityContext.capabilities.add",
        sc(capabilities={"add": ["NET_BIND_SERVICE"]}),
    ),
    Case(
        "runAsNonRoot",
        RESTRICTED,
        psc(runAsNonRoot=False),
        "spec.securityContext.runAsNonRoot",
        psc(runAsUser=1000),  # Holmes sets runAsNonRoot: true where unset
    ),
    Case(
        "runAsNonRoot",
        RESTRICTED,
        sc(runAsNonRoot=False),
        "spec.containers[0].securityContext.runAsNonRoot",
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
                    {
                        "name": "i",
                        "image": "busybox",
                        "securityContext": {"seccompProfile": {"type": "Unconfined"}},
                    }
                ]
            }
        },
        "spec.initContainers[0].securityContext.seccompProfile.type",
        {"spec": {"initContainers": [{"name": "i", "image": "busybox"}]}},
    ),
    Case(
        "runAsUser",
        RESTRICTED,
        sc(runAsUser=0),
        "spec.containers[0].securityContext.runAsUser",
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
        {
            "spec": {
                "hostUsers": False,
                "containers": [{"name": "trainer", "securityContext": {"procMount": "Default"}}],
            }
        },
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
