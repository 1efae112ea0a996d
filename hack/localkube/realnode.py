"""Real nodes: the kubelet on containerd, for the topology's nodes with ``playedBy: kubelet``.

Per node (``<state>/nodes/<name>/``), what ``hack/build-node.sh`` and ``hack/build-k8s.sh`` built:

- its own **containerd** (root, state, socket; config version 3): one per kubelet, since a
  kubelet removes every pod sandbox of its runtime that it does not know. This sandbox lacks
  CAP_SYS_RESOURCE, so ``restrict_oom_score_adj`` (else runc fails every sandbox: "can't get final
  child's PID from pipe"); cgroupfs; the pods' network namespaces under its state dir;
  ``localhost/holmes-pause`` (ours, from the cache) as the pinned sandbox image, and the project's
  images (and the tests' images built, ``make frameworks-image``) from the local containers
  storage. Images go once per image id into one **seed**
  store in the cache (``node/seed``, a containerd root): each layer podman's overlay driver holds
  unpacked becomes the committed snapshot of its chain ID from hard links to podman's files, and
  an archive of the stored manifest and config, without layers, is imported (the unpack finds
  every snapshot); where podman's storage is not that (another driver or filesystem, a link
  refused), ``podman save --format docker-archive`` streamed into ``ctr images import``. Each
  node's root (``containerd/root`` of its dir) is a copy of the seed's made at start: its
  metadata databases copied, its content blobs and overlayfs snapshots hard links to the seed's
  (a node's containerd keeps its own metadata, so it collects only its own). All of these files
  are immutable (a blob is named by its digest; an image layer, podman's or a committed
  snapshot, is only ever a read-only lower layer), and each store removes only its own links.
  Seconds, and a few MB per node;
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
namespaces), removes the cgroups and the bridges it made, and each node's copy of the seed (the
seed stays in the cache for the next start).
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

from holmes_dev.kubectl import require_established

from . import podnet
from .topology import KUBELET, SimNode, Topology

CACHE = Path(os.environ.get("HOLMES_CACHE", Path.home() / ".cache" / "holmes"))
CNI_BIN = CACHE / "cni" / "bin"
NODE_CACHE = CACHE / "node"
SEED = NODE_CACHE / "seed"  # the containerd root every node's is copied from (its images: seed.json)
# What a node's copy shares with the seed by hard links: immutable once written. The rest (the
# metadata databases, small) is copied; the introspection UUID is each containerd's own.
SEED_LINKED = ("io.containerd.content.v1.content/blobs", "io.containerd.snapshotter.v1.overlayfs/snapshots")
# cp -a --link from podman's overlay driver home, seen without the bind mount of itself that
# containers/storage puts there (link(2) refuses to link across two mounts of one filesystem)
LINK_FROM_STORAGE = [
    *("unshare", "--mount", "--propagation", "private", "sh", "-c"),
    'while mountpoint -q "$1"; do umount -l "$1" || exit 1; done; shift; exec cp -a --link -t "$@"',
    "sh",
]
SEED_SKIPPED = (
    "io.containerd.grpc.v1.introspection/uuid",
    "tmpmounts",
    "io.containerd.content.v1.content/ingest",
)
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

    @property
    def root(self) -> Path:
        return self.dir / "containerd" / "root"

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
        return node_cgroup(self.octet, self.name)

    @property
    def runc_root(self) -> Path:
        return self.dir / "runc"

    @property
    def cdi_dir(self) -> Path:
        return self.dir / "cdi"


def node_cgroup(octet: int, name: str) -> str:
    """A real node's cgroup (in every hierarchy): its kubelet's cgroupRoot."""
    return f"lk{octet}-{name}"


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


def seed_config(root: Path, state: Path) -> str:
    """The configuration of the containerd that imports into the seed: no CRI (nothing runs
    there); ``ctr``'s default snapshotter, overlayfs, is the nodes'."""
    return f"""version = 3
root = {json.dumps(str(root))}
state = {json.dumps(str(state))}
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"]

[grpc]
  address = {json.dumps(str(state / "containerd.sock"))}
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


def cgroup_pids(top: Path, part: str | None = None) -> list[int]:
    """The processes in the cgroup tree ``top`` of one hierarchy; with ``part``, only those in a
    cgroup below a directory of that name (a pod's: ``pod<uid>``, as the cgroupfs driver names it)."""
    out = []
    for d, _, _ in os.walk(top):
        if part is not None and part not in Path(d).relative_to(top).parts:
            continue
        try:
            out += [int(x) for x in (Path(d) / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            pass
    return sorted(set(out))


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


def image_id(ref: str, log) -> str | None:
    """The local containers storage's id of an image; None (said) when podman or the image is
    missing."""
    if not shutil.which("podman"):
        return None
    r = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True
    )
    if r.returncode:
        log(f"{ref} is not in the local containers storage (`make images`): its pods will not start")
        return None
    return r.stdout.strip()


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The OCI chain ID of each layer (bottom first): the name of its committed snapshot."""
    import hashlib

    out = [diff_ids[0]] if diff_ids else []
    for d in diff_ids[1:]:
        out.append("sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


@dataclass(frozen=True)
class StoredImage:
    """An image as the local containers storage (podman's overlay driver) holds it: its manifest
    and config as stored (the config's digest is the image id), each layer unpacked."""

    manifest: bytes
    config: bytes
    diff_ids: list[str]
    dirs: list[Path]  # each layer's files, bottom first, in overlayfs' format (as containerd's)


def stored_image(ref: str) -> StoredImage | None:
    """``ref`` read from podman's storage, when its driver is overlay and what it stores checks
    out (the config's digest is the id, one directory per layer); else None."""
    import base64
    import hashlib

    r = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{json .}}", ref], capture_output=True, text=True
    )
    if r.returncode:
        return None
    info = json.loads(r.stdout)
    info = info[0] if isinstance(info, list) else info
    driver = info.get("GraphDriver") or {}
    if driver.get("Name") != "overlay":
        return None
    data = driver.get("Data") or {}
    if not data.get("UpperDir"):
        return None
    dirs = [Path(d) for d in reversed((data.get("LowerDir") or "").split(":")) if d] + [
        Path(data["UpperDir"])
    ]
    diff_ids = (info.get("RootFS") or {}).get("Layers") or []
    image_dir = dirs[-1].parent.parent.parent / "overlay-images" / info["Id"]
    key = "=" + base64.b64encode(f"sha256:{info['Id']}".encode()).decode()
    try:
        manifest, config = (image_dir / "manifest").read_bytes(), (image_dir / key).read_bytes()
    except OSError:
        return None
    if hashlib.sha256(config).hexdigest() != info["Id"] or len(diff_ids) != len(dirs):
        return None
    if not all(d.is_dir() for d in dirs):
        return None
    return StoredImage(manifest, config, diff_ids, dirs)


def file_digest(path: Path) -> str:
    import hashlib

    with open(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


def clone_store(seed: Path, root: Path) -> None:
    """A node's containerd root made from the seed's (module docstring): ``SEED_LINKED`` hard
    links, ``SEED_SKIPPED`` left out, the rest copied (metadata, modes, xattrs: overlayfs' opaque
    directories are marked by one). The seed must not change meanwhile (its lock)."""
    if root.exists():
        if mounted := mountpoints_under(Path("/proc/self/mountinfo").read_text(), root):
            raise RealNodeError(f"{root} still has mounts ({mounted[0]}...): `make cluster-down` first")
        shutil.rmtree(root)
    leave = {seed / p for p in SEED_LINKED + SEED_SKIPPED}
    shutil.copytree(
        seed, root, symlinks=True, ignore=lambda d, names: [n for n in names if Path(d, n) in leave]
    )
    for part in SEED_LINKED:
        if (seed / part).exists():
            (root / part).parent.mkdir(parents=True, exist_ok=True)
            _run(["cp", "-a", "--link", str(seed / part), str(root / part)])


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

        plans = []
        for node, octet in zip(nodes, octets, strict=True):
            plan = NodePlan(
                node.name,
                octet,
                self.cp.dir / "nodes" / node.name,
                free_port(),
                node_subnet(self.subnet, octet),
            )
            rn["nodes"][node.name] = {
                "octet": octet,
                "dir": str(plan.dir),
                "socket": str(plan.socket),
                "subnet": str(plan.subnet),
            }
            rn["cgroups"] += make_cgroups(plan.cgroup)
            self._record()
            plans.append(plan)
        # the seed brought up to date and copied under one lock: several checkouts share it
        NODE_CACHE.mkdir(parents=True, exist_ok=True)
        with open(NODE_CACHE / "seed.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._seed_images()
            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=len(plans) or 1) as pool:  # waits on the disk
                list(pool.map(lambda plan: clone_store(SEED, plan.root), plans))
            self.log(f"copied the seed's images to {len(plans)} node(s) in {time.monotonic() - t0:.1f}s")
        for plan in plans:
            self._start_containerd(plan)
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

    def power(self, node: SimNode, on: bool) -> None:
        """Switch a real node's machine off: its kubelet, DRA plugin, containerd, shims and every
        process of its pods killed at once (SIGKILL, as a power cut), its Node left to go
        NotReady (or to whoever deletes it); or on again: containerd, the kubelet (which
        registers the Node anew if it was deleted) and the DRA plugin started, and waited for."""
        from holmes_dev.ports import free_port

        rec = self.st["realNodes"]["nodes"][node.name]
        rn, pids = self.st["realNodes"], self.st["pids"]
        off = set(rn.get("off", []))
        if not on:
            for name in (f"dra-plugin-{node.name}", f"kubelet-{node.name}", f"containerd-{node.name}"):
                if self.cp._alive(pids.get(name)):
                    os.kill(pids[name], signal.SIGKILL)
                pids.pop(name, None)
            top = CGROUP_ROOT / "pids" / node_cgroup(rec["octet"], node.name)
            for _ in range(50):  # a dying process's children: until none is left
                victims = shim_pids(_procs(), {rec["socket"]}) + cgroup_pids(top)
                if not victims:
                    break
                for pid in victims:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.1)
            rn["off"] = sorted(off | {node.name})
            self._record()
            self.log(f"{node.name}: switched off")
            return
        if node.name not in off:
            return
        plan = self._plan(node.name, free_port())
        # what the killed containers left mounted (root filesystems, network namespaces): a new
        # containerd starts from an empty state dir
        mountinfo = Path("/proc/self/mountinfo").read_text()
        for mp in mountpoints_under(mountinfo, plan.dir / "containerd" / "state"):
            if subprocess.run(["umount", mp], capture_output=True).returncode:
                subprocess.run(["umount", "-l", mp], capture_output=True)
        self._start_containerd(plan)
        self._start_kubelet(plan, int(node.pods))
        self._register(plan, node)
        self._start_dra_plugin(plan, node)
        self._wait_slices(plan, node)
        if self.st.get("kubeProxy", {}).get("config") and not self.cp._alive(pids.get("kube-proxy")):
            # the cluster's one kube-proxy runs as its first node's and exits once that Node is
            # deleted: started again with the node back
            self._start_kube_proxy([self._plan(name, 0) for name in rn["nodes"]])
        rn["off"] = sorted(off - {node.name})
        self._record()
        self.log(f"{node.name}: switched on")

    def _plan(self, name: str, kubelet_port: int) -> NodePlan:
        """A started node's plan, from what ``start`` recorded (HOLMES_POD_SUBNET may differ in
        this process: its subnet as recorded)."""
        rec = self.st["realNodes"]["nodes"][name]
        subnet = (
            ipaddress.ip_network(rec["subnet"]) if "subnet" in rec else node_subnet(self.subnet, rec["octet"])
        )
        return NodePlan(name, rec["octet"], Path(rec["dir"]), kubelet_port, subnet)

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

    def _seed_images(self) -> None:
        """The pause image, the project's images and the tests' images the local containers
        storage holds into the seed (module docstring), each imported once per image id, by a
        containerd of its own started for that. A project image missing is said (its pods will
        not start); a test image (``holmes_dev.images.TEST_IMAGES``, e.g. ``make
        frameworks-image``) is built only for the tests that need it, so one missing is not:
        those tests fail naming its make target."""
        from holmes_dev import images

        wanted = {PAUSE_REF: file_digest(NODE_CACHE / "pause.tar")}
        refs = [(images.image_ref(t), self.log) for t in images.TARGETS]
        refs += [(images.test_image_ref(name), lambda m: None) for name in images.TEST_IMAGES]
        for ref, log in refs:
            if (got := image_id(ref, log)) is not None:
                wanted[ref] = got
        record = NODE_CACHE / "seed.json"
        have = (
            json.loads(record.read_text())
            if record.exists() and (SEED / "io.containerd.metadata.v1.bolt").exists()
            else {}
        )
        todo = [ref for ref, key in wanted.items() if have.get(ref) != key]
        if not todo:
            return
        state = NODE_CACHE / "seed-state"
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir(parents=True)
        (state / "containerd.toml").write_text(seed_config(SEED, state))
        ctr = [self.bins["ctr"], "--address", str(state / "containerd.sock"), "-n", "k8s.io"]
        log = open(state / "containerd.log", "w")
        proc = subprocess.Popen(
            [self.bins["containerd"], "--config", str(state / "containerd.toml")], stdout=log, stderr=log
        )
        try:
            end = time.monotonic() + 60
            while subprocess.run([*ctr, "version"], capture_output=True).returncode:
                if proc.poll() is not None or time.monotonic() > end:
                    raise RealNodeError(
                        f"the seed's containerd did not start: see {state / 'containerd.log'}"
                    )
                time.sleep(0.2)
            for ref in todo:
                t0 = time.monotonic()
                # --local: unpacked at once, then the layers' blobs go (the snapshots hold them)
                imp = [*ctr, "images", "import", "--local", "--discard-unpacked-layers"]
                if ref == PAUSE_REF:  # an OCI archive naming only the tag: --base-name
                    _run(
                        [*imp, "--base-name", ref.rsplit(":", 1)[0], str(NODE_CACHE / "pause.tar")],
                        timeout=600,
                    )
                elif (stored := stored_image(ref)) is not None and self._seed_from_storage(ctr, ref, stored):
                    pass
                else:  # streamed: no archive on disk, its layers uncompressed (no gzip either way)
                    save = subprocess.Popen(
                        ["podman", "save", "--quiet", "--format", "docker-archive", ref],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                    )
                    r = subprocess.run(
                        [*imp, "-"], stdin=save.stdout, capture_output=True, text=True, timeout=1800
                    )
                    save.stdout.close()
                    err = save.stderr.read().decode(errors="replace")
                    if save.wait() or r.returncode:
                        raise RealNodeError(
                            f"importing {ref} into the seed: {(err or r.stderr or r.stdout).strip()}"
                        )
                if ref not in _run([*ctr, "images", "ls", "-q"]).split():
                    raise RealNodeError(f"importing {ref} into the seed left no image of that name")
                have[ref] = wanted[ref]
                record.write_text(json.dumps(have))
                self.log(f"imported {ref} into the seed in {time.monotonic() - t0:.0f}s")
            # what the replaced images held alone goes now: removing a tag with --sync collects
            gc = PAUSE_REF.rsplit(":", 1)[0] + ":gc"
            _run([*ctr, "images", "tag", "--force", PAUSE_REF, gc])
            _run([*ctr, "images", "rm", "--sync", gc], timeout=600)
        finally:
            from .controlplane import stop_pid

            stop_pid(proc.pid, 30)
            proc.wait()
            log.close()
        shutil.rmtree(state, ignore_errors=True)

    def _seed_from_storage(self, ctr: list[str], ref: str, image: StoredImage) -> bool:
        """``ref`` into the seed without an archive: each layer the seed lacks is committed as
        the snapshot of its chain ID from hard links to podman's files (immutable too), then the
        manifest and config imported (an archive without layers: the unpack finds every
        snapshot). False, the seed unchanged, when podman's files are on another filesystem than
        the seed's or a link is refused."""
        from holmes_dev import ociarchive

        if any(d.stat().st_dev != SEED.stat().st_dev for d in image.dirs):
            return False
        home = image.dirs[-1].parent.parent  # the overlay driver's
        have = set(_run([*ctr, "snapshots", "ls"]).split())
        parent, made = "", []
        for chain, src in zip(chain_ids(image.diff_ids), image.dirs, strict=True):
            if chain not in have:
                key = f"holmes-seed-{os.getpid()}-{chain}"
                prepare = [*ctr, "snapshots", "prepare", "--mounts", key, *([parent] if parent else [])]
                mounts = json.loads(_run(prepare))
                try:
                    # the new snapshot's own directory: the upper one, or the bind mount's source
                    opts = [o for m in mounts for o in m.get("Options") or []]
                    upper = [o.split("=", 1)[1] for o in opts if o.startswith("upperdir=")]
                    fs = Path(upper[0] if upper else mounts[0]["Source"])
                    # what the layer holds, not its root's mode (containerd's, as its unpack leaves it)
                    entries = sorted(str(e) for e in src.iterdir())
                    r = subprocess.run(
                        [*LINK_FROM_STORAGE, str(home), str(fs), *entries], capture_output=True, text=True
                    )
                    if entries and r.returncode:
                        why = (r.stderr.strip().splitlines() or ["?"])[-1]
                        self.log(f"{ref}: podman's files not linked ({why}): saved and imported instead")
                        _run([*ctr, "snapshots", "delete", key], check=False)
                        self._ungc(ctr, made)
                        return False
                    if not src.is_dir():  # podman removed the layer meanwhile: the copy may lack files
                        raise RealNodeError(f"{src} went while it was copied: start again")
                    _run([*ctr, "snapshots", "commit", chain, key])  # a GC root until imported
                    made.append(chain)
                except BaseException:
                    _run([*ctr, "snapshots", "delete", key], check=False)
                    raise
            parent = chain
        manifest = json.loads(image.manifest)
        archive = ociarchive.layout(ref, image.manifest, manifest["mediaType"], [image.config])
        imp = [*ctr, "images", "import", "--local", "--base-name", ref.rsplit(":", 1)[0], "-"]
        r = subprocess.run(imp, input=archive, capture_output=True, timeout=600)
        if r.returncode:
            raise RealNodeError(
                f"importing {ref}'s manifest into the seed: {r.stderr.decode(errors='replace')}"
            )
        self._ungc(ctr, made)  # the image holds them now: collected with it
        return True

    @staticmethod
    def _ungc(ctr: list[str], chains: list[str]) -> None:
        for chain in chains:
            _run([*ctr, "snapshots", "label", chain, "containerd.io/gc.root="])

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
        try:
            require_established(
                self.bins["kubectl"], str(self.kubeconfig), "network-attachment-definitions.k8s.cni.cncf.io"
            )
        except RuntimeError as e:
            raise RealNodeError(str(e)) from None
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
        # containerd/root too: the node's copy of the seed (its links; the seed keeps the images)
        for sub in ("kubelet", "containerd", "pod-logs", "runc", "cni/ipam", "multus", "cdi", "dra"):
            shutil.rmtree(d / sub, ignore_errors=True)
    shutil.rmtree(cp.dir / "nodes" / "fabric-ipam", ignore_errors=True)
    remove_cgroups(rn.get("cgroups", []))
    for b in rn.get("bridges", []):
        if podnet.REAL_BRIDGE.match(b) and _bridge_exists(b):
            _run(["ip", "link", "del", b], check=False)
    st.pop("realNodes", None)
    cp._save(st)
