"""Pure rendering of a HolmesJob attempt's children: objects in, objects out, no I/O.

- ``build_configmap``: layout.json (the Layout contract) and job.yaml (the spec) for the trainer,
  and the files a framework's arguments name (framework_launch.config_files).
- ``build_service``: headless Service whose name is the pods' subdomain (rendezvous by DNS).
- ``build_pod``: one pod per planned node, pinned there by required node affinity on
  kubernetes.io/hostname, with rank/rendezvous env (also as torchrun's PET_* variables), its
  network route (routes.py: NCCL env of the fabric, resolver hints, GPU and RDMA resources or
  SR-IOV VFs and Multus networks, IPC_LOCK only where an island opts in, host network), a
  memory-backed /dev/shm and the layout mounted at /etc/holmes; secure defaults (seccomp
  RuntimeDefault, no privilege escalation, capabilities dropped, no service-account token; where
  the namespace enforces Pod Security restricted, runAsNonRoot and every container hardened:
  template.secure_defaults) unless the template says otherwise. The user's template is respected: image,
  command/args, env (wins over ours), resources (win over ours), volumes, tolerations,
  schedulerName, labels, annotations and any other PodSpec field. For ``spec.framework`` other
  than holmes the same pass runs the user's command under Holmes' launcher (framework_launch.launch:
  its command, variables, volume and init container).

Owner references are added by the caller (kopf.adopt), so these stay plain dicts.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from holmes.contract import JobSpec, Layout
from holmes.contract.names import (
    API_VERSION,
    ENV_GRACE_SECONDS,
    ENV_OUTER_ADDR,
    ENV_REPLICA,
    ENV_REPLICAS,
    KIND,
    LABEL_NIC,
    RESOURCE_GPU,
)

from . import child_names, compute_domains
from .framework_launch import Launch
from .routes import CLAIM, IPC_LOCK, PodRoute
from .template import PRIVILEGED, TemplatePolicy, harden_container, secure_defaults

HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class RenderSettings:
    """Operator-wide choices for rendering and pacing (command-line flags of the operator)."""

    image: str = "holmes-trainer:latest"
    master_port: int = 29500
    metrics_port: int = 29510  # the rank-0 trainer's Prometheus endpoint (off dcgm-exporter's 9400)
    gpu_resource: str = RESOURCE_GPU  # each reconcile sets the cost model's nicMapping.gpuResource (state.py)
    # Pods sharing a network namespace (hostNetwork: true, or the local node agent) cannot all
    # listen on one fixed port: with a range, each attempt gets its own pair of ports.
    port_range: tuple[int, int] | None = None
    policy: TemplatePolicy = TemplatePolicy()  # what job templates may set (template.py)
    # Namespaces whose jobs may set runPolicy.priority, a raw number (--raw-priority-namespaces):
    # elsewhere priority comes from objects admins own (PriorityClass, WorkloadPriorityClass).
    raw_priority_namespaces: tuple[str, ...] = ()
    # the Pod Security level the job's namespace enforces (template.enforced_level): set per
    # reconcile from the namespace's label, it picks the defaults Holmes fills in
    pod_security: str = PRIVILEGED
    # Seconds between reads of a running trainer's metrics (and so between progress patches):
    # the one periodic API write per running job; pod changes are watched, not polled.
    progress_interval: float = 10.0


def job_ports(job: JobRef, settings: RenderSettings) -> tuple[int, int]:
    """(rendezvous port, trainer metrics port) of an attempt: fixed, or drawn from the range by
    a hash of namespace/name/attempt (stable, so a restarted operator renders the same pods)."""
    if not settings.port_range:
        return settings.master_port, settings.metrics_port
    lo, hi = settings.port_range
    slots = max(1, (hi - lo + 1) // 2)
    slot = int(child_names.digest(f"{job.namespace}/{job.name}/{job.attempt}"), 16) % slots
    return lo + 2 * slot, lo + 2 * slot + 1


@dataclass(frozen=True)
class ReplicaSlot:
    """One replica of a job across islands as replicas (core/replicas.py): a torch world of its
    own inside the job's pods. Its pods are numbered on from ``first`` (pod names and node-rank
    labels count over all replicas, so the gang is tracked as one); its rendezvous is its own
    first pod, on its own ``ports`` (rendezvous, metrics: pods sharing a host network must not
    clash); its layout is ``layout_file`` in the job's ConfigMap; ``outer_addr`` is where the
    outer group meets (replica 0's first pod serves that store)."""

    index: int
    count: int
    first: int
    ports: tuple[int, int]
    outer_addr: str
    layout_file: str


@dataclass(frozen=True)
class JobRef:
    """What rendering needs to know of the HolmesJob object itself."""

    name: str
    namespace: str
    attempt: int
    spec_hash: str = ""
    model_hash: str = ""
    launch_spec: str = ""  # spec_change.launch_record of the job's own spec (not a replica's share)


# ---- ConfigMap and Service -------------------------------------------------------------------


def child_labels(job: JobRef) -> dict[str, str]:
    return {child_names.LABEL_JOB: job.name, child_names.LABEL_MANAGED_BY: child_names.MANAGED_BY}


def build_configmap(
    job: JobRef, layout: Layout, spec: JobSpec, files: Mapping[str, str] | None = None
) -> dict:
    """The Layout and the job (its typed spec, defaults filled in) as the trainer reads them;
    ``files``: more files for /etc/holmes (framework_launch.config_files)."""
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": job.name, "namespace": job.namespace},
        "spec": spec.to_spec(),
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": child_names.layout_configmap_name(job.name),
            "namespace": job.namespace,
            "labels": child_labels(job),
            "annotations": {
                child_names.ANN_ATTEMPT: str(job.attempt),
                child_names.ANN_SPEC_HASH: job.spec_hash,
                child_names.ANN_MODEL_HASH: job.model_hash,
            },
        },
        "data": {
            child_names.LAYOUT_FILE: layout.to_json(indent=1),
            child_names.JOB_FILE: yaml.safe_dump(manifest, sort_keys=False),
            **({child_names.LAUNCH_SPEC_FILE: job.launch_spec} if job.launch_spec else {}),
            **(files or {}),
        },
    }


def build_service(job: JobRef, settings: RenderSettings) -> dict:
    # A headless Service needs no ports for its per-pod DNS records; list the port when fixed.
    ports = (
        []
        if settings.port_range
        else [{"name": "rendezvous", "port": settings.master_port, "targetPort": settings.master_port}]
    )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": child_names.service_name(job.name),
            "namespace": job.namespace,
            "labels": child_labels(job),
        },
        "spec": {
            "clusterIP": "None",  # headless: DNS records per pod, no proxy
            "publishNotReadyAddresses": True,  # rendezvous happens before readiness
            "selector": {child_names.LABEL_JOB: job.name},
            **({"ports": ports} if ports else {}),
        },
    }


# ---- Pods --------------------------------------------------------------------------------------


def default_command(
    layout: Layout, node_rank: int, master: str, master_port: int, layout_file: str = child_names.LAYOUT_FILE
) -> list[str]:
    """torchrun's arguments (a static rendezvous: node ranks are the layout's node order) under
    Holmes' launcher, which exits with the workers' own code (83: preempted) where torchrun
    would say 1 (holmes.trainer.run)."""
    return [
        "python",
        "-m",
        "holmes.trainer.run",
        f"--nnodes={len(layout.nodes)}",
        f"--nproc-per-node={layout.gpus_per_node}",
        f"--node-rank={node_rank}",
        "--rdzv-backend=static",
        f"--master-addr={master}",
        f"--master-port={master_port}",
        "-m",
        "holmes.trainer",
        "--job",
        f"{child_names.LAYOUT_MOUNT}/{child_names.JOB_FILE}",
        "--layout",
        f"{child_names.LAYOUT_MOUNT}/{layout_file}",
    ]


def rank_env(
    job: JobRef,
    layout: Layout,
    node_rank: int,
    settings: RenderSettings,
    master: str | None = None,
    replica: ReplicaSlot | None = None,
) -> dict[str, str]:
    """``master``: the rendezvous address (rank 0's IP across member clusters); default: rank
    0's DNS name through the headless Service. ``replica``: the variables of a replica's world
    (its ports, its layout file, where the outer group meets)."""
    master = master or child_names.master_addr(job.name, job.namespace, job.attempt)
    master_port, metrics_port = replica.ports if replica else job_ports(job, settings)
    layout_file = env_layout_file(replica)
    nnodes, nproc = len(layout.nodes), layout.gpus_per_node
    env = {
        "MASTER_ADDR": master,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(layout.world_size),
        "NNODES": str(nnodes),
        "NODE_RANK": str(node_rank),
        "NPROC_PER_NODE": str(nproc),
    }
    # torchrun reads PET_<FLAG> as the default of --<flag> (Kubeflow's convention too).
    env.update(
        {
            "PET_MASTER_ADDR": master,
            "PET_MASTER_PORT": str(master_port),
            "PET_NNODES": str(nnodes),
            "PET_NODE_RANK": str(node_rank),
            "PET_NPROC_PER_NODE": str(nproc),
        }
    )
    env.update(
        {
            "HOLMES_JOB_NAME": job.name,
            "HOLMES_ATTEMPT": str(job.attempt),
            "HOLMES_LAYOUT": f"{child_names.LAYOUT_MOUNT}/{layout_file}",
            "HOLMES_JOB": f"{child_names.LAYOUT_MOUNT}/{child_names.JOB_FILE}",
            "HOLMES_METRICS_PORT": str(metrics_port),
        }
    )
    if replica:
        env.update(
            {
                ENV_REPLICA: str(replica.index),
                ENV_REPLICAS: str(replica.count),
                ENV_OUTER_ADDR: replica.outer_addr,
            }
        )
    return env


def env_layout_file(replica: ReplicaSlot | None) -> str:
    return replica.layout_file if replica else child_names.LAYOUT_FILE


# A dead peer leaves NCCL ranks blocked in a collective: the watchdog aborts the communicator
# and ends the process when a collective times out (3: without waiting on the cleanup, which
# can itself hang), and the heartbeat monitor ends a process whose watchdog is stuck. The pod
# then fails and the operator tears the gang down and relaunches, instead of waiting out the
# NCCL timeout on every rank.
TORCH_NCCL_ENV = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_NCCL_ENABLE_MONITORING": "1",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "300",
}


def torch_env() -> dict[str, str]:
    """torch.distributed's variables for a trainer pod: the NCCL watchdog above. gloo's
    interface (GLOO_SOCKET_IFNAME), like NCCL's, is resolved inside the pod by the launcher:
    a host's netdev names do not exist in a pod's own network namespace."""
    return dict(TORCH_NCCL_ENV)


def build_pod(
    job: JobRef,
    layout: Layout,
    node_rank: int,
    *,
    route: PodRoute,
    template: Mapping[str, Any] | None,
    settings: RenderSettings,
    hostname_label: str | None = None,
    master: str | None = None,
    launch: Launch | None = None,
    replica: ReplicaSlot | None = None,
) -> dict:
    """The pod for node ``layout.nodes[node_rank]`` of this attempt. ``route``: how it reaches
    the network (routes.pod_route: host network or its own, RDMA devices, Multus networks, NCCL
    env); ``master``: the rendezvous address when not rank 0's DNS name (rank 0's IP, for a job
    across member clusters); ``launch``: the launcher's part for ``spec.framework`` other than
    holmes (framework_launch.launch), None to run Holmes' trainer; ``replica``: the replica
    whose world this pod is part of (acrossIslands replicas), ``node_rank`` counting inside it."""
    node = layout.nodes[node_rank]
    pod_index = node_rank + (replica.first if replica else 0)
    template = copy.deepcopy(dict(template or {}))
    tmeta = template.get("metadata") or {}
    pspec: dict[str, Any] = dict(template.get("spec") or {})
    name = child_names.pod_name(job.name, job.attempt, pod_index)
    stage = layout.rank_info(node_rank * layout.gpus_per_node).stage

    labels = {k: v for k, v in (tmeta.get("labels") or {}).items() if not k.startswith("holmes.dev/")}
    labels.update(child_labels(job))
    labels.update(
        {
            child_names.LABEL_ATTEMPT: str(job.attempt),
            child_names.LABEL_NODE_RANK: str(pod_index),
            child_names.LABEL_STAGE: str(stage),
            LABEL_NIC: route.nic,
        }
    )
    if replica:
        labels[child_names.LABEL_REPLICA] = str(replica.index)
    annotations = dict(tmeta.get("annotations") or {})
    annotations.update(route.annotations)
    annotations.update({child_names.ANN_NODE: node, child_names.ANN_SPEC_HASH: job.spec_hash})
    if route.claim is not None and route.claim.gpus:  # no GPU limit: capacity.held counts these
        annotations[child_names.ANN_CLAIM_GPUS] = str(layout.gpus_per_node)

    containers = [dict(c) for c in pspec.get("containers") or []]
    idx = next((i for i, c in enumerate(containers) if c.get("name") == child_names.TRAINER_CONTAINER), 0)
    if not containers:
        containers = [{"name": child_names.TRAINER_CONTAINER}]
    # volumes of these names are Holmes': a template's own are replaced (pod and trainer alike)
    replaced = {
        child_names.LAYOUT_VOLUME,
        child_names.SHM_VOLUME,
        *([launch.volume["name"]] if launch else []),
    }
    shm = not any(  # a memory-backed /dev/shm unless the user mounts their own
        m.get("mountPath") == "/dev/shm" and m.get("name") not in replaced
        for m in containers[idx].get("volumeMounts") or []
    )
    if replica and not master:  # the replica's own first pod
        master = child_names.pod_addr(job.name, job.namespace, job.attempt, replica.first)
    master = master or child_names.master_addr(job.name, job.namespace, job.attempt)
    ours = dict(launch.env) if launch else {}  # the launcher's first; ours win on a clash
    ours.update(rank_env(job, layout, node_rank, settings, master, replica))
    ours.update(route.env)
    ours.update(torch_env())
    # the trainer saves on SIGTERM only when it fits in what the kubelet grants (default 30 s)
    grace = pspec.get("terminationGracePeriodSeconds")
    ours[ENV_GRACE_SECONDS] = str(30 if grace is None else grace)
    master_port, metrics_port = replica.ports if replica else job_ports(job, settings)
    containers[idx] = _trainer_container(
        containers[idx],
        env=ours,
        route=route,
        gpus=layout.gpus_per_node,
        command=default_command(layout, node_rank, master, master_port, env_layout_file(replica)),
        settings=settings,
        ports=(master_port, metrics_port if node_rank == 0 else None),
        launch=launch,
        replaced=replaced,
        shm=shm,
    )

    volumes = [v for v in pspec.get("volumes") or [] if v.get("name") not in replaced]
    volumes.append(
        {
            "name": child_names.LAYOUT_VOLUME,
            "configMap": {"name": child_names.layout_configmap_name(job.name)},
        }
    )
    if shm:
        volumes.append({"name": child_names.SHM_VOLUME, "emptyDir": {"medium": "Memory"}})
    if launch:
        volumes.append(copy.deepcopy(dict(launch.volume)))

    pspec.update(
        {
            "containers": containers,
            "volumes": volumes,
            "restartPolicy": "Never",  # a failed pod fails the attempt: the operator restarts the gang
            "hostname": name,
            "subdomain": child_names.service_name(job.name),
            "affinity": _pin_to(pspec.get("affinity"), hostname_label or node),
        }
    )
    if route.claim is not None:  # DRA devices: the pod's ResourceClaim from the job's template
        pspec["resourceClaims"] = [c for c in pspec.get("resourceClaims") or [] if c.get("name") != CLAIM] + [
            {"name": CLAIM, "resourceClaimTemplateName": route.claim_template_name(job.name)}
        ]
    if route.nvlink_channel is not None:  # the IMEX channel of the job's ComputeDomain
        pspec["resourceClaims"] = [
            c for c in pspec.get("resourceClaims") or [] if c.get("name") != compute_domains.CLAIM
        ] + [{"name": compute_domains.CLAIM, "resourceClaimTemplateName": route.nvlink_channel}]
    if route.host_network:  # the node's own interfaces; cluster DNS still resolves
        pspec["hostNetwork"] = True
        pspec.setdefault("dnsPolicy", "ClusterFirstWithHostNet")
    pspec.setdefault("enableServiceLinks", False)
    secure_defaults(pspec, settings.pod_security)  # no API token, seccomp; restricted: non-root...
    if launch:  # the launcher's copy runs first (written within the restricted level already)
        init = launch.init_container
        users = [i for i in pspec.get("initContainers") or [] if i.get("name") != init["name"]]
        pspec["initContainers"] = [copy.deepcopy(dict(init)), *users]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": job.namespace, "labels": labels, "annotations": annotations},
        "spec": pspec,
    }


def _trainer_container(
    c: dict,
    *,
    env: Mapping[str, str],
    route: PodRoute,
    gpus: int,
    command: Sequence[str],
    settings: RenderSettings,
    ports: tuple[int, int | None],
    launch: Launch | None,
    replaced: set[str],
    shm: bool,
) -> dict:
    c = dict(c)
    c.setdefault("name", child_names.TRAINER_CONTAINER)
    c.setdefault("image", settings.image)
    if launch:  # the user's command and args under the launcher, the plan's arguments appended
        c["command"] = list(launch.command)
        c.pop("args", None)
    elif "command" not in c:
        c["command"] = list(command) + list(c.pop("args", None) or [])  # user args extend the trainer's
    user_env = list(c.get("env") or [])
    user_names = {e.get("name") for e in user_env}
    ours: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in env.items() if k not in user_names]
    if "HOLMES_METRICS_ADDR" not in user_names:
        # Bind the trainer's metrics to the pod IP (where the operator reads them); on a shared
        # host network (the local node agent) 0.0.0.0 would clash between pods.
        ours.append({"name": "HOLMES_METRICS_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    c["env"] = ours + user_env

    resources = copy.deepcopy(c.get("resources") or {})
    limits = resources.setdefault("limits", {})
    if route.claim is None or not route.claim.gpus:  # else the GPUs come with the DRA claim
        limits.setdefault(settings.gpu_resource, gpus)
    for name, quantity in route.resources.items():  # RDMA devices or SR-IOV VFs
        limits.setdefault(name, quantity)
    claims = ([CLAIM] if route.claim is not None else []) + (
        [compute_domains.CLAIM] if route.nvlink_channel is not None else []
    )
    if claims:
        resources["claims"] = [c for c in resources.get("claims") or [] if c.get("name") not in claims] + [
            {"name": name} for name in claims
        ]
    c["resources"] = resources

    mounts = [m for m in c.get("volumeMounts") or [] if m.get("name") not in replaced]
    mounts.append(
        {"name": child_names.LAYOUT_VOLUME, "mountPath": child_names.LAYOUT_MOUNT, "readOnly": True}
    )
    if shm:
        mounts.append({"name": child_names.SHM_VOLUME, "mountPath": "/dev/shm"})
    if launch:
        mounts.append(dict(launch.mount))
    c["volumeMounts"] = mounts

    # Secure defaults the template may override: no privilege escalation, every capability
    # dropped. IPC_LOCK only on the RDMA routes of an island that opts in (spec.islands[].ipcLock):
    # the memlock limit ibv_reg_mr needs comes from the container runtime (docs/install.md).
    c = harden_container(c)
    caps = c["securityContext"]["capabilities"]
    add = list(caps.get("add") or [])
    if route.ipc_lock and IPC_LOCK not in add:
        add.append(IPC_LOCK)
    if add:
        caps["add"] = add

    declared = [p for p in c.get("ports") or [] if p.get("name") not in ("rendezvous", "metrics")]
    declared.append({"name": "rendezvous", "containerPort": ports[0]})
    if ports[1] is not None:  # rank 0 serves the trainer's metrics
        declared.append({"name": "metrics", "containerPort": ports[1]})
    c["ports"] = declared
    return c


def _pin_to(affinity: Mapping[str, Any] | None, hostname: str) -> dict:
    """The user's affinity with the required node affinity replaced by 'this node only'."""
    out = copy.deepcopy(dict(affinity or {}))
    na = out.setdefault("nodeAffinity", {})
    na["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [hostname]}]}
        ]
    }
    return out
