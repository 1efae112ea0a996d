"""Real nodes: the kubelet on containerd, for the topology's nodes with ``playedBy: kubelet``.

Per node (``<state>/nodes/<name>/``), what ``hack/build-node.sh`` and ``hack/build-k8s.sh`` built:

- its own **containerd** (root, state, socket; config version 3): one per kubelet, since a
  kubelet removes every pod sandbox of its runtime that it does not know. This sandbox lacks
  CAP_SYS_RESOURCE, so ``restrict_oom_score_adj`` (else runc fails every sandbox: "can't get final
  child's PID from pipe"); cgroupfs; the pods' network namespaces under its state dir;
  ``localhost/holmes-pause`` (ours, from the cache) as the pinned sandbox image, and the project's
  images imported from the local containers storage (``podman save --format oci-archive``, once
  per image id, into the cache; ``ctr images import`` per node, skipped when the node has it);
- its **kubelet** of the control plane's release: own ``--root-dir``, port, ``podLogsDir`` (the
  default /var/log/pods is garbage-collected by every kubelet on the machine), ``cgroupRoot``
  ``/lk<octet>-<name>`` made beforehand in every cgroup hierarchy (cpuset's cpus and mems copied),
  ``failCgroupV1: false`` (this machine is cgroup v1), ``--node-ip`` its bridge's address (not
  loopback: the API server reaches it there for logs and exec, authenticating with a client
  certificate the kubelet's ``clientCAFile`` trusts);
- its **pod network**: a bridge ``lkn<octet>`` holding the host's address ``<a>.<b>.<octet>.1``
  in its own /24 of ``HOLMES_POD_SUBNET`` (the node's InternalIP, the pods' gateway and DNS
  server), with forwarding on for that bridge alone (the machine's ``ip_forward`` is left as it
  is; the bridge plugin's ``isGateway`` would turn it on for the whole host); **Multus** (thin
  plugin) as the node's CNI with the bridge conflist as its one delegate, so a pod asking for a
  NetworkAttachmentDefinition in ``k8s.v1.cni.cncf.io/networks`` gets ``net1``... and the
  ``network-status`` annotation, as with the NVIDIA Network Operator;
- **NIC fabrics**: one NetworkAttachmentDefinition per fabric (``<cluster>-<nic>``, the island,
  in namespace ``default``), a ``bridge`` on a host bridge ``lkf<octet>`` of that fabric alone
  with ``host-local`` addresses from its /24 of the /16 after the pod subnet: pods of one fabric
  share an L2 segment, pods of different fabrics do not;
- its **resources**: the host's CPU and memory (the kubelet's own report), and the topology's
  GPUs and RDMA resource as extended resources in ``status.capacity`` (a PATCH, as the
  Kubernetes docs advertise extended resources; the kubelet keeps them);
- **CoreDNS**, once per cluster, on port 53 of every real node's bridge address (the kubelets'
  ``clusterDNS``), with its ``kubernetes`` plugin reading the admin kubeconfig;
- **kube-proxy** of the control plane's release, once per cluster (not per node: the nodes share
  the host's network namespace, where kube-proxy's nftables table ``kube-proxy`` is one per
  namespace), in ``nftables`` mode: Service ClusterIPs route to their pods, and pods reach the API
  server through the ``kubernetes`` Service (the API server of a cluster with real nodes listens
  on its first node's bridge address: :meth:`RealNodes.claim`). One per machine at a time: a lock
  that the kube-proxy process itself holds (``/run/localkube/kube-proxy.lock``); a second cluster
  starts without one and says so.

Every process is recorded by its own PID in ``cluster.json`` (``pids``); :func:`stop` stops
them, deletes kube-proxy's nftables tables, kills what containerd's shims left, unmounts what
kubelet and containerd mounted under the node dirs (volumes, root filesystems, network
namespaces), removes the cgroups and the bridges it made, and keeps each node's image store
(``containerd/root``) for the next start.
Pure parts (plans, configurations) come first; the commands that apply them after.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import podnet
from .topology import KUBELET, SimNode, Topology

CACHE = Path(os.environ.get("HOLMES_CACHE", Path.home() / ".cache" / "holmes"))
CNI_BIN = CACHE / "cni" / "bin"
NODE_CACHE = CACHE / "node"
PAUSE_REF = "localhost/holmes-pause:1"  # hack/build-node.sh builds it
NODE_BINARIES = (
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "coredns",
    "kubelet",
    "kube-proxy",
    "dra-plugin",
)
# kube-proxy's nftables tables (pkg/proxy/nftables: one name per address family, not configurable)
KUBE_PROXY_TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"))
KUBE_PROXY_LOCK = "kube-proxy.lock"  # in podnet.LOCK_DIR, held by the running kube-proxy
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap", "multus")
NAD_NAMESPACE = "default"
CLUSTER_DOMAIN = "cluster.local"
NODE_BRIDGE, FABRIC_BRIDGE = podnet.NODE_BRIDGE, podnet.FABRIC_BRIDGE  # + octet
CGROUP_ROOT = Path("/sys/fs/cgroup")
CNI_VERSION = "1.0.0"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The DRA drivers a `dra: true` node's plugin publishes, as NVIDIA's GPU driver and DRANET name them
GPU_DRIVER, NIC_DRIVER = "gpu.nvidia.com", "dra.net"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
DRA_GPU_PRODUCT, DRA_GPU_MEMORY = "NVIDIA A100-SXM4-80GB", "80Gi"


class RealNodeError(RuntimeError):
    """A real node could not be planned or started; the message says what to do."""


# ---- pure planning -------------------------------------------------------------------------------
def fabric_of(node: SimNode) -> str:
    """The NetworkAttachmentDefinition of the node's NIC fabric: its island, ``<cluster>-<nic>``."""
    name = f"{node.cluster}-{node.nic}".lower()
    if len(name) > 63 or not DNS_LABEL.match(name):
        raise RealNodeError(
            f"node {node.name}: its fabric's NetworkAttachmentDefinition would be named {name!r}, "
            "not a DNS label: give the node a cluster of lower-case letters, digits and '-'"
        )
    return name


@dataclass(frozen=True)
class NodePlan:
    name: str
    octet: int
    dir: Path
    kubelet_port: int
    subnet: ipaddress.IPv4Network  # the node's /24 of the pod subnet
    store: Path | None = None  # containerd's root (its images), when not the node dir's own

    @property
    def root(self) -> Path:
        return self.store or self.dir / "containerd" / "root"

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def bridge(self) -> str:
        return f"{NODE_BRIDGE}{self.octet}"

    @property
    def socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    @property
    def cgroup(self) -> str:
        return f"lk{self.octet}-{self.name}"

    @property
    def runc_root(self) -> Path:
        return self.dir / "runc"

    @property
    def cdi_dir(self) -> Path:
        return self.dir / "cdi"


def node_subnet(pod_subnet: ipaddress.IPv4Network, octet: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network((int(pod_subnet.network_address) + (octet << 8), 24))


def fabric_subnet(pod_subnet: ipaddress.IPv4Network, octet: int) -> ipaddress.IPv4Network:
    return node_subnet(podnet.extra_subnet(pod_subnet), octet)


def dra_devices(node: SimNode) -> dict[str, list[dict]]:
    """The ``resource.k8s.io/v1`` devices a ``dra: true`` node's plugin publishes, per driver:
    its GPUs (``gpu-<i>``, each on a PCIe root of its own) and DRANET's NICs (``eth0``; on an
    RDMA node one RDMA NIC ``nic-<i>`` per GPU, HCA ``mlx5_<i>``). The NICs are numbered against
    the GPUs' roots (``nic-0`` beside the last GPU): a pairing that ignored the roots shows.
    Nothing for a node without ``dra``."""
    if not node.dra:
        return {}
    roots = [f"pci0000:{0x10 * (1 + i):02x}" for i in range(node.gpus)]
    gpus = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": DRA_GPU_PRODUCT},
                PCIE_ROOT: {"string": root},
            },
            "capacity": {"memory": {"value": DRA_GPU_MEMORY}},
        }
        for i, root in enumerate(roots)
    ]
    nics: list[dict] = [
        {
            "name": "eth0",
            "attributes": {"dra.net/rdma": {"bool": False}, "dra.net/ifName": {"string": "eth0"}},
        }
    ]
    if node.nic in ("infiniband", "roce"):
        enc = "infiniband" if node.nic == "infiniband" else "ether"
        nics += [
            {
                "name": f"nic-{i}",
                "attributes": {
                    "dra.net/rdma": {"bool": True},
                    "dra.net/rdmaDevice": {"string": f"mlx5_{i}"},
                    "dra.net/encapsulation": {"string": enc},
                    "dra.net/ifName": {"string": f"{'ib' if enc == 'infiniband' else 'eth'}{i + 1}"},
                    PCIE_ROOT: {"string": root},
                },
            }
            for i, root in enumerate(reversed(roots))
        ]
    return {GPU_DRIVER: gpus, NIC_DRIVER: nics}


def containerd_config(plan: NodePlan, cni_bin: Path = CNI_BIN) -> str:
    """containerd 2.x's configuration (version 3) for one node."""
    c = plan.dir / "containerd"
    return f"""version = 3
root = {json.dumps(str(plan.root))}
state = {json.dumps(str(c / "state"))}
# NRI's socket is one path per machine: several containerds cannot share it
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = {json.dumps(str(plan.socket))}

[plugins.'io.containerd.cri.v1.runtime']
  # no CAP_SYS_RESOURCE here: never ask for an oom_score_adj below our own
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  # the node's DRA kubelet plugin writes the specs of the devices it prepared here
  cdi_spec_dirs = [{json.dumps(str(plan.cdi_dir))}]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = {json.dumps(str(plan.runc_root))}
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [{json.dumps(str(cni_bin))}]
    conf_dir = {json.dumps(str(plan.dir / "cni" / "net.d"))}
    max_conf_num = 1

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {json.dumps(PAUSE_REF)}

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = {json.dumps(plan.gateway)}
  stream_server_port = "0"
"""


def kubelet_config(plan: NodePlan, client_ca: Path, max_pods: int) -> dict:
    """The kubelet's KubeletConfiguration (written as JSON, which is YAML)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": plan.gateway,
        "port": plan.kubelet_port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "containerRuntimeEndpoint": f"unix://{plan.socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{plan.cgroup}",
        "failCgroupV1": False,  # this machine's cgroups are v1; 1.35+ refuses them otherwise
        "failSwapOn": False,
        "podLogsDir": str(plan.dir / "pod-logs"),
        "clusterDNS": [plan.gateway],
        "clusterDomain": CLUSTER_DOMAIN,
        "maxPods": max_pods,
        # the iptables chains are the machine's, shared with everyone: no kubelet writes them here
        "makeIPTablesUtilChains": False,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        # a disk and memory shared with other work: never evict pods or collect images for it.
        # Absolute floors, not percentages (1% of this 252 GB disk is 2.5 GB, which other work
        # dipped below for a moment and every pod was evicted), and a pressure condition that
        # lifts 10 s after the dip, not the default 5 min during which no pod is admitted.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "256Mi",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "256Mi",
        },
        "evictionPressureTransitionPeriod": "10s",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
    }


def bridge_conflist(plan: NodePlan, data_dir: Path) -> dict:
    """The node's pod network: its bridge, addresses from its /24, the bridge's address the
    pods' gateway (set by us, not the plugin: its isGateway turns on the host's ip_forward)."""
    return {
        "cniVersion": CNI_VERSION,
        "name": f"localkube-{plan.name}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": plan.bridge,
                "isGateway": False,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(data_dir),
                    "ranges": [
                        [
                            {
                                "subnet": str(plan.subnet),
                                "rangeStart": str(plan.subnet.network_address + 2),
                                "gateway": plan.gateway,
                            }
                        ]
                    ],
                    "routes": [{"dst": "0.0.0.0/0", "gw": plan.gateway}],
                },
            },
        ],
    }


def multus_conf(plan: NodePlan, kubeconfig: Path, delegate: dict, cni_bin: Path = CNI_BIN) -> dict:
    """Multus' thin plugin in front of the node's network (its one delegate, the cluster network)."""
    return {
        "cniVersion": CNI_VERSION,
        "name": "multus-cni-network",
        "type": "multus",
        "kubeconfig": str(kubeconfig),
        "binDir": str(cni_bin),
        "cniDir": str(plan.dir / "multus"),
        "confDir": str(plan.dir / "cni" / "multus.d"),
        "logFile": str(plan.dir / "multus.log"),
        "logLevel": "error",
        "delegates": [delegate],
    }


def network_attachment(name: str, octet: int, subnet: ipaddress.IPv4Network, data_dir: Path) -> dict:
    """The NetworkAttachmentDefinition of one fabric: a bridge of its own, host-local addresses
    (one pool for every node of the machine: dataDir is shared)."""
    config = {
        "cniVersion": CNI_VERSION,
        "name": name,
        "type": "bridge",
        "bridge": f"{FABRIC_BRIDGE}{octet}",
        "isGateway": False,
        "ipMasq": False,
        "ipam": {"type": "host-local", "dataDir": str(data_dir), "ranges": [[{"subnet": str(subnet)}]]},
    }
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {
            "name": name,
            "namespace": NAD_NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "localkube"},
        },
        "spec": {"config": json.dumps(config)},
    }


def corefile(addresses: list[str], kubeconfig: Path) -> str:
    """CoreDNS for the cluster's names, on port 53 of each address (never 0.0.0.0: other clusters'
    CoreDNS bind theirs); no health, ready or metrics ports (fixed ports clash between clusters)."""
    return f""".:53 {{
    bind {" ".join(addresses)}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} localkube
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
}}
"""


def kube_proxy_config(
    kubeconfig: Path,
    node: str,
    cluster_cidr: ipaddress.IPv4Network,
    addresses: list[str],
    ports: tuple[int, int],
) -> dict:
    """kube-proxy's KubeProxyConfiguration (JSON, which is YAML): nftables mode, whose rules match
    only the cluster's Service IPs (and NodePorts on ``addresses``, the nodes' bridge addresses),
    so the machine's own traffic is untouched; its servers on the first address; the machine's
    conntrack sysctls and its own OOM score left as they are (0 means "do not set")."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node,
        "bindAddress": addresses[0],  # its idea of the node's primary IP (it binds nothing there)
        "healthzBindAddress": f"{addresses[0]}:{ports[0]}",
        "metricsBindAddress": f"{addresses[0]}:{ports[1]}",
        "mode": "nftables",
        "detectLocalMode": "ClusterCIDR",
        "clusterCIDR": str(cluster_cidr),  # pods' traffic to a Service is not masqueraded
        "nodePortAddresses": [f"{a}/32" for a in addresses],
        "oomScoreAdj": 0,  # no CAP_SYS_RESOURCE here to lower it
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def mountpoints_under(mountinfo: str, root: Path) -> list[str]:
    """Mount points at or below ``root`` (from /proc/self/mountinfo), deepest first."""
    r = str(root)
    out = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            mp = re.sub(r"\\(\d{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if mp == r or mp.startswith(r + "/"):
                out.append(mp)
    return sorted(set(out), key=lambda p: (-p.count("/"), p))


def shim_pids(procs: dict[int, list[str]], sockets: set[str]) -> list[int]:
    """PIDs of containerd shims started by a containerd listening on one of ``sockets``."""
    out = []
    for pid, argv in procs.items():
        if argv and argv[0].endswith("containerd-shim-runc-v2") and "-address" in argv:
            i = argv.index("-address")
            if i + 1 < len(argv) and argv[i + 1] in sockets:
                out.append(pid)
    return sorted(out)


# ---- applying it ---------------------------------------------------------------------------------
def _run(argv: list[str], check: bool = True, timeout: float | None = None, **kw) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode:
        raise RealNodeError(f"`{' '.join(argv)}` failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
    return r.stdout


def preflight(bin_dir: Path) -> None:
    """Fail with the fix when real nodes cannot start here."""
    if os.geteuid() != 0:
        raise RealNodeError("real nodes (kubelet, containerd) need root")
    missing = [str(bin_dir / b) for b in NODE_BINARIES if not os.access(bin_dir / b, os.X_OK)]
    missing += [str(CNI_BIN / p) for p in CNI_PLUGINS if not os.access(CNI_BIN / p, os.X_OK)]
    missing += [str(NODE_CACHE / f) for f in ("pause.tar", "nad-crd.yaml") if not (NODE_CACHE / f).is_file()]
    if missing:
        raise RealNodeError(
            f"missing {', '.join(missing)}: build them with `make node` (hack/build-node.sh; "
            "the kubelet and kube-proxy: `hack/build-k8s.sh node`, which `make node` runs)"
        )
    if not shutil.which("runc"):
        raise RealNodeError("`runc` not found: apt-get install runc (`make node` does)")
    if not shutil.which("nft"):
        raise RealNodeError("`nft` not found (kube-proxy's nftables mode runs it): apt-get install nftables")


def _bridge_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def claim_bridges(
    count: int, addresses: Callable[[int], str | None], exclude: set[int], made: Callable[[str], None]
) -> list[int]:
    """``count`` octets free on this machine and not in ``exclude`` (the cluster's agent's, which
    it may not have locked yet), each with its bridge made at once (while bridges.lock is held,
    so two clusters starting together never pick the same); ``made(name)`` records each."""
    got: list[int] = []
    with podnet._Flock("bridges.lock", block=True):
        for o in podnet.OCTETS:
            if len(got) == count:
                break
            if o in exclude:
                continue
            lock = podnet._octet_lock(o)
            if lock is None:
                continue
            lock.close()
            if podnet.octet_bridged(o):
                continue
            got.append(o)
            made(make_bridge(o, addresses(o)))
    if len(got) < count:
        raise RealNodeError(f"only {len(got)} of {count} pod-IP octets are free on this machine")
    return got


def make_bridge(octet: int, address: str | None) -> str:
    """A node bridge (``address`` its host address, forwarding on for it alone) or, with no
    address, a fabric bridge (pure L2)."""
    name = f"{NODE_BRIDGE if address else FABRIC_BRIDGE}{octet}"
    _run(["ip", "link", "add", name, "type", "bridge"])
    if address:
        _run(["ip", "addr", "add", address, "dev", name])
        Path(f"/proc/sys/net/ipv4/conf/{name}/forwarding").write_text("1\n")
    _run(["ip", "link", "set", name, "up"])
    return name


def make_cgroups(name: str) -> list[str]:
    """``/<name>`` in every cgroup hierarchy (cpuset's cpus and mems copied from the root)."""
    made = []
    for h in sorted(CGROUP_ROOT.iterdir()):
        if not h.is_dir() or not (h / "cgroup.procs").exists():
            continue
        d = h / name
        d.mkdir(exist_ok=True)
        made.append(str(d))
        if (h / "cpuset.cpus").exists() and (d / "cpuset.cpus").exists():
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((h / f).read_text())
    return made


def remove_cgroups(dirs: list[str]) -> None:
    for top in dirs:
        for root, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
            try:
                os.rmdir(root)
            except OSError:
                pass


def store_in_use(root: Path) -> bool:
    """Whether a running containerd holds ``root`` (its metadata database is flocked)."""
    db = root / "io.containerd.metadata.v1.bolt" / "meta.db"
    try:
        fd = os.open(db, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def image_archive(ref: str, log) -> Path | None:
    """The OCI archive of a local image (``podman save``, once per image id, into the cache);
    None when the local containers storage lacks it."""
    if not shutil.which("podman"):
        return None
    r = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True
    )
    if r.returncode:
        log(f"{ref} is not in the local containers storage (`make images`): its pods will not start")
        return None
    image_id = r.stdout.strip()
    d = NODE_CACHE / "images"
    d.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^a-z0-9]+", "-", ref.rsplit(":", 1)[0].lower())
    out = d / f"{stem}-{image_id[:16]}.tar"
    if not out.exists():
        t0 = time.monotonic()
        for old in d.glob(f"{stem}-*.tar"):
            old.unlink()
        tmp = out.with_suffix(f".part{os.getpid()}")  # several checkouts share the cache
        _run(["podman", "save", "--quiet", "--format", "oci-archive", "-o", str(tmp), ref])
        tmp.rename(out)
        log(f"saved {ref} as {out} in {time.monotonic() - t0:.0f}s")
    return out


class RealNodes:
    """The real nodes of one cluster (its ControlPlane's state dir and spawn)."""

    def __init__(self, cp, st: dict, bins: dict[str, str], log):
        self.cp, self.st, self.bins, self.log = cp, st, bins, log
        self.kubeconfig = cp.kubeconfig
        self.client_ca = cp.dir / "pki" / "kubelet-ca.crt"
        self.subnet = podnet.pod_subnet()

    def _record(self) -> None:
        self.cp._save(self.st)

    def _kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return _run(
            [self.bins["kubectl"], f"--kubeconfig={self.kubeconfig}", *args], check=check, input=input
        )

    # -- start -----------------------------------------------------------------------------------
    def claim(self, topology: Topology) -> str:
        """Each real node's bridge and each fabric's, made now (before the API server, which
        listens on the first node's bridge address: pods reach it there through the ``kubernetes``
        Service); that address."""
        nodes = [n for n in topology.nodes if n.played_by == KUBELET]
        fabrics = sorted({fabric_of(n) for n in nodes})
        if not self.st.get("realNodes"):
            self.st["realNodes"] = {"nodes": {}, "fabrics": {}, "bridges": [], "cgroups": [], "octets": {}}
        rn = self.st["realNodes"]
        if not rn.get("octets"):

            def made(bridge: str) -> None:
                rn["bridges"].append(bridge)
                self._record()

            agent = {self.st["podIPOctet"]}
            gateway = lambda o: f"{node_subnet(self.subnet, o).network_address + 1}/24"  # noqa: E731
            octets = claim_bridges(len(nodes), gateway, agent, made)
            fab_octets = claim_bridges(len(fabrics), lambda o: None, agent, made)
            rn["fabrics"] = dict(zip(fabrics, fab_octets, strict=True))
            rn["octets"] = {n.name: o for n, o in zip(nodes, octets, strict=True)}
            self._record()
        first = rn["octets"][nodes[0].name]
        return str(node_subnet(self.subnet, first).network_address + 1)

    # -- start -----------------------------------------------------------------------------------
    def start(self, topology: Topology) -> None:
        nodes = [n for n in topology.nodes if n.played_by == KUBELET]
        self.claim(topology)
        rn = self.st["realNodes"]
        octets = [rn["octets"][n.name] for n in nodes]
        from holmes_dev.ports import free_port

        # Each node's images live in the cache, kept across clusters (an import is minutes per
        # node for the trainer image), unless another running cluster's node of that name holds
        # them: that node gets a store of its own. Chosen, and containerd started on it, under
        # one lock, so two clusters starting at once never pick the same.
        stores = NODE_CACHE / "stores"
        stores.mkdir(parents=True, exist_ok=True)
        with open(stores / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            plans = []
            for node, octet in zip(nodes, octets, strict=True):
                shared = stores / node.name
                plan = NodePlan(
                    node.name,
                    octet,
                    self.cp.dir / "nodes" / node.name,
                    free_port(),
                    node_subnet(self.subnet, octet),
                    None if store_in_use(shared) else shared,
                )
                rn["nodes"][node.name] = {"octet": octet, "dir": str(plan.dir), "socket": str(plan.socket)}
                rn["cgroups"] += make_cgroups(plan.cgroup)
                self._record()
                plans.append(plan)
            for plan in plans:
                self._start_containerd(plan)
        self._import_images(plans)
        self._start_coredns(plans)
        for plan, node in zip(plans, nodes, strict=True):
            self._start_kubelet(plan, int(node.pods))
        self._install_fabrics(rn["fabrics"])
        for plan, node in zip(plans, nodes, strict=True):
            self._register(plan, node)
        for plan, node in zip(plans, nodes, strict=True):
            self._start_dra_plugin(plan, node)
        for plan, node in zip(plans, nodes, strict=True):
            self._wait_slices(plan, node)
        self._start_kube_proxy(plans)

    def _start_kube_proxy(self, plans: list[NodePlan], timeout: float = 60) -> None:
        """kube-proxy for the cluster's Services (module docstring), unless another cluster's runs
        on this machine; started under the guard lock so a stopping cluster never deletes the
        tables of one starting (:func:`stop`)."""
        from holmes_dev.ports import free_port

        cfg = self.cp.dir / "kube-proxy.json"
        addresses = [p.gateway for p in plans]
        ports = (free_port(addresses[0]), free_port(addresses[0]))
        config = kube_proxy_config(self.kubeconfig, plans[0].name, self.subnet, addresses, ports)
        cfg.write_text(json.dumps(config, indent=2))
        with podnet._Flock(KUBE_PROXY_LOCK + ".guard", block=True):
            fd = os.open(podnet.LOCK_DIR / KUBE_PROXY_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    owner = os.pread(fd, 4096, 0).decode(errors="replace").strip()
                    self.st["kubeProxy"] = {"skipped": owner}
                    self._record()
                    self.log(
                        f"kube-proxy not started: the cluster in {owner} runs this machine's one (its "
                        "nftables table is one per network namespace); this cluster's Service "
                        "ClusterIPs do not route"
                    )
                    return
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(self.cp.dir).encode(), 0)
                # the lock's holder is the kube-proxy process itself: it is free when it exits
                self.log(f"starting kube-proxy (nftables; health on {addresses[0]}:{ports[0]})")
                self.cp._spawn(
                    self.st, "kube-proxy", [self.bins["kube-proxy"], f"--config={cfg}"], pass_fds=(fd,)
                )
            finally:
                os.close(fd)
            self.st["kubeProxy"] = {"config": str(cfg)}
            self._record()
        # ready once its first sync wrote the `kubernetes` Service's ClusterIP
        self._poll(
            "kube-proxy's first sync (nft list set ip kube-proxy cluster-ips)",
            "kube-proxy",
            lambda: "10.96.0.1" in _run(["nft", "list", "set", "ip", "kube-proxy", "cluster-ips"], False),
            timeout,
        )

    def _start_containerd(self, plan: NodePlan) -> None:
        for sub in ("containerd", "cni/net.d", "cni/multus.d", "pod-logs", "kubelet", "multus", "cdi"):
            (plan.dir / sub).mkdir(parents=True, exist_ok=True)
        shutil.rmtree(plan.dir / "containerd" / "state", ignore_errors=True)
        (plan.dir / "containerd.toml").write_text(containerd_config(plan))
        delegate = bridge_conflist(plan, plan.dir / "cni" / "ipam")
        multus = multus_conf(plan, self.kubeconfig, delegate)
        (plan.dir / "cni" / "net.d" / "00-multus.conf").write_text(json.dumps(multus, indent=2))
        # the shim next to containerd; runc from the host
        env = {
            **os.environ,
            "PATH": f"{CACHE / 'bin'}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
        }
        name = f"containerd-{plan.name}"
        self.log(f"starting {name} ({plan.socket})")
        self.cp._spawn(
            self.st, name, [self.bins["containerd"], "--config", str(plan.dir / "containerd.toml")], env=env
        )
        self.cp._wait(f"{name}'s socket", self.st, name, lambda: self._ctr(plan, "version", check=False), 60)

    def _ctr(self, plan: NodePlan, *args: str, check: bool = True, timeout: float | None = None):
        r = subprocess.run(
            [self.bins["ctr"], "--address", str(plan.socket), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and r.returncode:
            raise RealNodeError(f"ctr {' '.join(args)} on {plan.name}: {(r.stderr or r.stdout).strip()}")
        return r.returncode == 0 and r.stdout

    def _import_images(self, plans: list[NodePlan]) -> None:
        """The pause image and the project's images, into every node's containerd (in parallel;
        a node that has an image already is skipped)."""
        from holmes_dev import images

        archives = {PAUSE_REF: NODE_CACHE / "pause.tar"}
        for target in images.TARGETS:
            ref = images.image_ref(target)
            if (a := image_archive(ref, self.log)) is not None:
                archives[ref] = a

        def one(plan: NodePlan) -> None:
            have = str(self._ctr(plan, "images", "ls", "-q"))
            marker = plan.root.with_name(plan.root.name + ".imported.json")
            done = json.loads(marker.read_text()) if marker.exists() else {}
            for ref, archive in archives.items():
                if ref in have.split() and done.get(ref) == archive.name:
                    continue
                t0 = time.monotonic()
                # --local: read here, unpacked at once; the layers' blobs then go (the snapshots
                # hold them). --base-name: the archive's name whether it gives the full
                # reference or only the tag (podman's oci-archive)
                base = ref.rsplit(":", 1)[0]
                args = ["images", "import", "--local", "--discard-unpacked-layers", "--base-name", base]
                self._ctr(plan, *args, str(archive), timeout=1800)
                done[ref] = archive.name
                marker.write_text(json.dumps(done))
                self.log(f"imported {ref} into {plan.name}'s containerd in {time.monotonic() - t0:.0f}s")

        with ThreadPoolExecutor(max_workers=len(plans) or 1) as pool:
            for f in [pool.submit(one, p) for p in plans]:
                f.result()

    def _start_coredns(self, plans: list[NodePlan]) -> None:
        d = self.cp.dir / "coredns"
        d.mkdir(exist_ok=True)
        (d / "Corefile").write_text(corefile([p.gateway for p in plans], self.kubeconfig))
        self.log(f"starting CoreDNS on {', '.join(p.gateway + ':53' for p in plans)}")
        self.cp._spawn(self.st, "coredns", [self.bins["coredns"], "-conf", str(d / "Corefile")])

    def _start_kubelet(self, plan: NodePlan, max_pods: int) -> None:
        cfg = plan.dir / "kubelet.json"
        cfg.write_text(json.dumps(kubelet_config(plan, self.client_ca, max_pods), indent=2))
        name = f"kubelet-{plan.name}"
        self.log(f"starting {name} on {plan.gateway}:{plan.kubelet_port}")
        self.cp._spawn(
            self.st,
            name,
            [
                self.bins["kubelet"],
                f"--config={cfg}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={plan.dir / 'kubelet'}",
                # its serving certificate: the default /var/lib/kubelet/pki is the machine's
                f"--cert-dir={plan.dir / 'kubelet' / 'pki'}",
                f"--hostname-override={plan.name}",
                f"--node-ip={plan.gateway}",
                "--v=1",
            ],
        )

    def _start_dra_plugin(self, plan: NodePlan, node: SimNode) -> None:
        """The node's DRA kubelet plugin (hack/dra-plugin): it publishes the node's DRA devices
        (``dra: true``) and registers with the kubelet for every driver whose slices name the
        node, so the kubelet has it prepare what the scheduler allocated."""
        argv = [
            self.bins["dra-plugin"],
            f"--node-name={plan.name}",
            f"--kubeconfig={self.kubeconfig}",
            f"--kubelet-dir={plan.dir / 'kubelet'}",
            f"--plugin-dir={plan.dir / 'dra'}",  # its sockets: short paths (a socket's is 108 bytes)
            f"--cdi-dir={plan.cdi_dir}",
        ]
        if devices := dra_devices(node):
            f = plan.dir / "dra-devices.json"
            f.write_text(json.dumps(devices, indent=1))
            argv.append(f"--devices={f}")
        self.log(f"starting dra-plugin-{plan.name}" + (f" ({', '.join(devices)})" if devices else ""))
        self.cp._spawn(self.st, f"dra-plugin-{plan.name}", argv)

    def _wait_slices(self, plan: NodePlan, node: SimNode, timeout: float = 60) -> None:
        """Until the node's slices of each driver its plugin publishes are served (the kubelet
        deletes a node's slices when it starts: the plugin's are made again after that)."""
        want = set(dra_devices(node))
        if not want:
            return

        def published() -> bool:
            out = self._kubectl(
                "get",
                "resourceslices",
                f"--field-selector=spec.nodeName={plan.name}",
                "-o",
                "json",
                check=False,
            )
            have = {s["spec"]["driver"] for s in json.loads(out or "{}").get("items", [])}
            return want <= have

        self._poll(
            f"{plan.name}'s ResourceSlices ({', '.join(sorted(want))})",
            f"dra-plugin-{plan.name}",
            published,
            timeout,
        )

    def _install_fabrics(self, fabrics: dict[str, int]) -> None:
        self._kubectl("apply", "--server-side", "-f", str(NODE_CACHE / "nad-crd.yaml"))
        self._kubectl(
            "wait", "--for=condition=Established", "crd/network-attachment-definitions.k8s.cni.cncf.io"
        )
        data = self.cp.dir / "nodes" / "fabric-ipam"
        nads = [
            network_attachment(name, o, fabric_subnet(self.subnet, o), data / name)
            for name, o in fabrics.items()
        ]
        self._kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nads})
        )
        self.log(f"NIC fabrics (NetworkAttachmentDefinitions in {NAD_NAMESPACE}): {', '.join(fabrics)}")

    def _register(self, plan: NodePlan, node: SimNode, timeout: float = 120) -> None:
        """Once the kubelet registered its Node: the topology's labels and annotations, its GPUs
        and RDMA resource as extended resources, and (Ready) the topology's taints with the
        not-ready taint lifted at once (the node lifecycle controller would, on its next pass)."""
        name = f"kubelet-{plan.name}"
        self._poll(f"{name} to register", name, lambda: self._node(plan.name) is not None, timeout)
        meta = {"metadata": {"labels": node.labels, "annotations": node.annotations}}
        self._kubectl("patch", "node", plan.name, "--type=merge", "-p", json.dumps(meta))
        extended = {k: v for k, v in node.allocatable.items() if "/" in k}
        status = {"status": {"capacity": extended, "allocatable": extended}}
        self._kubectl(
            "patch", "node", plan.name, "--subresource=status", "--type=merge", "-p", json.dumps(status)
        )

        def ready() -> bool:
            n = self._node(plan.name) or {}
            conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
            alloc = n.get("status", {}).get("allocatable", {})
            return conds.get("Ready") == "True" and all(k in alloc for k in extended)

        self._poll(f"{plan.name} to be Ready", name, ready, timeout)
        taints = (self._node(plan.name) or {}).get("spec", {}).get("taints") or []
        kept = [t for t in taints if not t["key"].startswith("node.kubernetes.io/not-ready")]
        have = {(t["key"], t["effect"]) for t in kept}
        kept += [dict(t) for t in node.taints if (t["key"], t["effect"]) not in have]  # the topology's
        if kept != taints:
            self._kubectl(
                "patch",
                "node",
                plan.name,
                "--type=merge",
                "-p",
                json.dumps({"spec": {"taints": kept or None}}),
            )

    def _poll(self, what: str, name: str, ok: Callable[[], bool], timeout: float) -> None:
        """cp._wait (fails at once when process ``name`` exits), asking once a second: each ask
        is a kubectl run, on a machine shared with other work."""

        def slow() -> bool:
            if ok():
                return True
            time.sleep(0.8)
            return False

        self.cp._wait(what, self.st, name, slow, timeout)

    def _node(self, name: str) -> dict | None:
        out = self._kubectl("get", "node", name, "-o", "json", "--ignore-not-found", check=False)
        return json.loads(out) if out.strip() else None


# ---- stopping ------------------------------------------------------------------------------------
def _procs() -> dict[int, list[str]]:
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                out[int(p.name)] = [
                    a.decode(errors="replace") for a in (p / "cmdline").read_bytes().split(b"\0") if a
                ]
            except OSError:
                pass
    return out


def stop_kube_proxy(cp, st: dict, log, grace: float = 10.0) -> None:
    """Stop the cluster's kube-proxy and delete its nftables tables (kube-proxy leaves them when
    it exits), under the guard lock that starting one takes; tables are deleted only while no
    kube-proxy holds the machine's lock, so never those of another cluster's running one."""
    from .controlplane import stop_pid

    pids = st.get("pids", {})
    if "kube-proxy" not in pids and not st.get("kubeProxy"):
        return
    with podnet._Flock(KUBE_PROXY_LOCK + ".guard", block=True):
        if cp._alive(pids.get("kube-proxy")):
            log(f"stopping kube-proxy (pid {pids['kube-proxy']})")
            stop_pid(pids["kube-proxy"], grace)
        pids.pop("kube-proxy", None)
        free = None
        owner = podnet.LOCK_DIR / KUBE_PROXY_LOCK
        # ours for a moment more: the lock's descriptor also went to the `nft` runs kube-proxy
        # started (Go closes only its own descriptors on exec), which end just after it
        end = time.monotonic() + (10 if owner.exists() and owner.read_text() == str(cp.dir) else 0)
        while free is None:
            try:
                free = podnet._Flock(KUBE_PROXY_LOCK, block=False)
            except BlockingIOError:  # another cluster's kube-proxy runs: its tables
                if time.monotonic() > end:
                    break
                time.sleep(0.2)
        if free is not None:
            with free:
                for family, table in KUBE_PROXY_TABLES:
                    if _run(["nft", "list", "table", family, table], check=False):
                        _run(["nft", "delete", "table", family, table], check=False)
    st.pop("kubeProxy", None)
    cp._save(st)


def stop(cp, st: dict, log, grace: float = 10.0) -> None:
    """Stop a cluster's real nodes and clean up after them (see the module docstring); safe to
    call again and after a crash (it works from what ``cluster.json`` recorded)."""
    from .controlplane import stop_pid

    rn = st.get("realNodes")
    if not rn:
        return
    pids = st.get("pids", {})
    stop_kube_proxy(cp, st, log, grace)
    # the DRA plugins first: each stops its helpers, which remove their sockets
    names = [n for n in pids if n.startswith("dra-plugin-")]
    names += [n for n in pids if n.startswith("kubelet-")] + ["coredns"]
    for name in names:
        if cp._alive(pids.get(name)):
            log(f"stopping {name} (pid {pids[name]})")
            stop_pid(pids[name], grace)
        pids.pop(name, None)
    runc = shutil.which("runc") or "runc"
    for node in rn["nodes"].values():  # the pods' containers (pause included), gone at once
        for root in (Path(node["dir"]) / "runc").glob("*"):
            ids = _run([runc, "--root", str(root), "list", "-q"], check=False).split()
            for cid in ids:
                _run([runc, "--root", str(root), "delete", "--force", cid], check=False)
    for name in [n for n in pids if n.startswith("containerd-")]:
        if cp._alive(pids.get(name)):
            log(f"stopping {name} (pid {pids[name]})")
            stop_pid(pids[name], grace)
        pids.pop(name, None)
    sockets = {node["socket"] for node in rn["nodes"].values()}
    for pid in shim_pids(_procs(), sockets):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    mountinfo = Path("/proc/self/mountinfo").read_text()
    for node in rn["nodes"].values():
        for mp in mountpoints_under(mountinfo, Path(node["dir"])):
            if subprocess.run(["umount", mp], capture_output=True).returncode:
                subprocess.run(["umount", "-l", mp], capture_output=True)
        d = Path(node["dir"])
        # kept: containerd/root, the node's images, for the next start (`rm -rf` it to free the disk)
        for sub in ("kubelet", "containerd/state", "pod-logs", "runc", "cni/ipam", "multus", "cdi", "dra"):
            shutil.rmtree(d / sub, ignore_errors=True)
    shutil.rmtree(cp.dir / "nodes" / "fabric-ipam", ignore_errors=True)
    remove_cgroups(rn.get("cgroups", []))
    for b in rn.get("bridges", []):
        if podnet.REAL_BRIDGE.match(b) and _bridge_exists(b):
            _run(["ip", "link", "del", b], check=False)
    st.pop("realNodes", None)
    cp._save(st)
