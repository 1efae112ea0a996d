"""Topology files: which simulated GPU nodes a local cluster has and who plays each (pure, no
Kubernetes I/O).

A topology YAML looks like::

    defaults: {gpus: 2, cpu: "32", memory: 256Gi}
    nodes:
      - name: ib-0
        cluster: east                 # the fabric island
        nic: infiniband               # the truth: infiniband | roce | ethernet
        gbps: 200
        advertise: holmes             # which label scheme the node carries (see below)
        rdmaResource: rdma/rdma_shared_device_a   # optional device-plugin resource
        labels: {pool: llm}           # optional extra labels
        annotations: {team: a}        # optional extra annotations
        taints: [{key: pool, value: llm, effect: NoSchedule}]   # optional
        playedBy: agent               # who runs its pods: agent (default) | kubelet | kwok
        dra: false                    # its GPUs and NICs as DRA devices (kubelet nodes only)
    kwok: {leaseSeconds: 10, statusSeconds: 300, startSeconds: 1, parallelism: 8}   # optional

``playedBy`` says what plays the node (a topology may mix them):
  - ``agent``: Holmes' node agent (hack/localkube/agent.py) registers it and runs its pods;
  - ``kubelet``: a real kubelet on its own containerd, with CNI, Multus and CoreDNS
    (hack/localkube/realnode.py; ``make node`` builds them). It reports the host's CPU and
    memory, so ``cpu`` and ``memory`` do not apply; ``gpus`` and ``rdmaResource`` become
    extended resources of its status.
  - ``kwok``: a hollow node: registered with its labels, annotations, taints and resources
    (``cpu``, ``memory``, ``pods``, ``gpus``, ``rdmaResource``) and played by the cluster's one
    kwok process (``sigs.k8s.io/kwok``, built by hack/build-k8s.sh) with Holmes' Stages
    (kwok-stages.yaml): kwok renews its Lease, reports it Ready, and its pods Running without
    any process, then ending as their ``hollow.holmes.dev/*`` annotations say (hollow_nodes.py
    names them). The top-level ``kwok`` mapping sets that process's pace: the Lease renewal
    period (``leaseSeconds``; the Lease lasts four of them, as a kubelet's), how often a node's
    status is rewritten (``statusSeconds``), bound to Running (``startSeconds``) and kwok's
    parallel stage players (``parallelism``).

``taints`` apply to every node (a real kubelet's Node gets them once it registered).

``dra: true`` (real nodes only) makes the node's GPUs and NICs DRA devices instead: its DRA
kubelet plugin (hack/dra-plugin, started by realnode.py) publishes them in ResourceSlices, as
NVIDIA's GPU driver (``gpu.nvidia.com``: ``gpus`` GPUs) and DRANET (``dra.net``: eth0 and, on an
RDMA node, one RDMA NIC per GPU on that GPU's PCIe root) would, and the node has no
``nvidia.com/gpu`` or ``rdmaResource`` extended resource. With ``advertise: none`` Holmes then
finds its NICs and GPUs from the slices alone, as on a cluster that runs those drivers.

``advertise`` selects what a real cluster would show for that node:
  - ``holmes``: Holmes' own labels holmes.dev/nic, holmes.dev/nic-gbps, holmes.dev/cluster
  - ``nfd``: Node Feature Discovery labels (rdma.capable / rdma.available / pci-15b3.present on
    RDMA nodes; NFD cannot tell InfiniBand from RoCE) plus holmes.dev/cluster, which an admin sets
  - ``none``: no NIC labels at all (only holmes.dev/cluster)
The true NIC kind is also written as the annotation ``localkube.holmes.dev/true-nic`` so tests can
compare what discovery found with the truth; the operator must not read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

NIC_KINDS = ("infiniband", "roce", "ethernet")
SCHEMES = ("holmes", "nfd", "none")
TRUE_NIC_ANNOTATION = "localkube.holmes.dev/true-nic"
CLUSTER_LABEL = "holmes.dev/cluster"
NFD = "feature.node.kubernetes.io/"
AGENT, KUBELET, KWOK = "agent", "kubelet", "kwok"
PLAYERS = (AGENT, KUBELET, KWOK)
_PLAYED_BY = "agent: Holmes' node agent; kubelet: a real kubelet on containerd; kwok: a hollow node"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_TOP_KEYS = {"defaults", "nodes", "kwok"}
_DEFAULTS = {
    "gpus": 8,
    "cpu": "64",
    "memory": "512Gi",
    "pods": "110",
    "advertise": "holmes",
    "playedBy": AGENT,
}
_NODE_KEYS = {
    "name",
    "cluster",
    "nic",
    "gbps",
    "gpus",
    "cpu",
    "memory",
    "pods",
    "advertise",
    "rdmaResource",
    "labels",
    "annotations",
    "playedBy",
    "taints",
    "dra",
}


class TopologyError(ValueError):
    """A topology file that cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class KwokSettings:
    """The pace of the cluster's kwok process (the top-level ``kwok`` mapping)."""

    lease_seconds: float = 10.0  # a kubelet's Lease renewal period
    status_seconds: float = 300.0  # a kubelet's nodeStatusReportFrequency
    start_seconds: float = 1.0
    parallelism: int = 8


_KWOK_KEYS = {
    "leaseSeconds": "lease_seconds",
    "statusSeconds": "status_seconds",
    "startSeconds": "start_seconds",
    "parallelism": "parallelism",
}


@dataclass(frozen=True)
class SimNode:
    name: str
    cluster: str
    nic: str
    gbps: float
    gpus: int
    cpu: str
    memory: str
    pods: str
    advertise: str
    rdma_resource: str | None = None
    extra_labels: dict = field(default_factory=dict)
    extra_annotations: dict = field(default_factory=dict)
    played_by: str = AGENT
    taints: tuple = ()  # of v1 Taint mappings (key, value, effect)
    dra: bool = False  # GPUs and NICs as DRA devices (realnode.dra_devices), not extended resources

    @property
    def labels(self) -> dict[str, str]:
        out = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            CLUSTER_LABEL: self.cluster,
        }
        rdma = self.nic in ("infiniband", "roce")
        if self.advertise == "holmes":
            out["holmes.dev/nic"] = self.nic
            out["holmes.dev/nic-gbps"] = f"{self.gbps:g}"
        elif self.advertise == "nfd" and rdma:
            out.update(
                {
                    NFD + "rdma.capable": "true",
                    NFD + "rdma.available": "true",
                    NFD + "pci-15b3.present": "true",
                }
            )
        out.update(self.extra_labels)
        return out

    @property
    def annotations(self) -> dict[str, str]:
        return {TRUE_NIC_ANNOTATION: self.nic, **self.extra_annotations}

    @property
    def allocatable(self) -> dict[str, str]:
        out = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods,
            "ephemeral-storage": "1Ti",
        }
        if self.dra:  # its GPUs and NICs are in ResourceSlices
            return out
        out["nvidia.com/gpu"] = str(self.gpus)
        if self.rdma_resource:
            out[self.rdma_resource] = "1k"  # what k8s-rdma-shared-dev-plugin advertises by default
        return out

    def node_object(self) -> dict:
        """The v1 Node the agent registers (status included: nodes accept status on create)."""
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": self.labels, "annotations": self.annotations},
            "spec": {"taints": [dict(t) for t in self.taints]} if self.taints else {},
            "status": {
                "capacity": self.allocatable,
                "allocatable": self.allocatable,
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.name},
                ],
                "nodeInfo": {
                    "kubeletVersion": "v1.20.2-localkube",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "containerRuntimeVersion": "localkube://process",
                    "kernelVersion": "",
                    "osImage": "localkube simulated node",
                    "kubeProxyVersion": "",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                },
            },
        }


@dataclass(frozen=True)
class Topology:
    path: str
    nodes: tuple[SimNode, ...]
    kwok: KwokSettings = KwokSettings()

    def node(self, name: str) -> SimNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def by_nic(self, nic: str) -> list[SimNode]:
        return [n for n in self.nodes if n.nic == nic]

    def played_by(self, player: str) -> Topology:
        """The nodes ``player`` (agent, kubelet or kwok) plays."""
        return Topology(self.path, tuple(n for n in self.nodes if n.played_by == player), self.kwok)


def differences_but_players(base: Topology, other: Topology) -> list[str]:
    """What makes ``other`` more than ``base`` with its nodes played differently: each node
    missing, added, or changed in anything but ``playedBy`` (empty when they are the same nodes)."""
    from dataclasses import replace

    a = {n.name: replace(n, played_by=AGENT) for n in base.nodes}
    b = {n.name: replace(n, played_by=AGENT) for n in other.nodes}
    out = [f"node {name} missing" for name in a if name not in b]
    out += [f"node {name} added" for name in b if name not in a]
    out += [
        f"node {name} differs: {b[name]} instead of {a[name]}"
        for name in a
        if name in b and a[name] != b[name]
    ]
    if [n.name for n in base.nodes] != [n.name for n in other.nodes] and not out:
        out.append(f"nodes in another order: {other.names} instead of {base.names}")
    return out


def parse_topology(doc: object, path: str = "<topology>") -> Topology:
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not doc["nodes"]:
        raise TopologyError(f"{path}: expected a mapping with a non-empty 'nodes' list")
    unknown = set(doc) - _TOP_KEYS
    if unknown:
        raise TopologyError(f"{path}: unknown top-level keys {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
    defaults = {**_DEFAULTS, **(doc.get("defaults") or {})}
    nodes, seen = [], set()
    for i, raw in enumerate(doc["nodes"]):
        where = f"{path}: nodes[{i}]"
        if not isinstance(raw, dict):
            raise TopologyError(f"{where}: expected a mapping")
        unknown = set(raw) - _NODE_KEYS
        if unknown:
            raise TopologyError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_NODE_KEYS)}")
        d = {**defaults, **raw}
        for key in ("name", "cluster", "nic"):
            if not d.get(key):
                raise TopologyError(f"{where}: '{key}' is required")
        name = str(d["name"])
        if name in seen:
            raise TopologyError(f"{where}: duplicate node name {name!r}")
        seen.add(name)
        if d["nic"] not in NIC_KINDS:
            raise TopologyError(f"{where}: nic must be one of {NIC_KINDS}, got {d['nic']!r}")
        if d["advertise"] not in SCHEMES:
            raise TopologyError(f"{where}: advertise must be one of {SCHEMES}, got {d['advertise']!r}")
        if d["playedBy"] not in PLAYERS:
            raise TopologyError(
                f"{where}: playedBy must be one of {PLAYERS} ({_PLAYED_BY}), got {d['playedBy']!r}"
            )
        try:
            int(d["pods"])
        except (TypeError, ValueError):
            raise TopologyError(f"{where}: pods must be a whole number, got {d['pods']!r}") from None
        gbps = d.get("gbps", {"infiniband": 200, "roce": 100, "ethernet": 25}[d["nic"]])
        try:
            gbps, gpus = float(gbps), int(d["gpus"])
        except (TypeError, ValueError):
            raise TopologyError(f"{where}: gbps and gpus must be numbers") from None
        if gbps <= 0 or gpus < 0:
            raise TopologyError(f"{where}: gbps must be > 0 and gpus >= 0")
        rdma = d.get("rdmaResource")
        if rdma and d["nic"] == "ethernet":
            raise TopologyError(f"{where}: an ethernet node cannot advertise RDMA resource {rdma!r}")
        dra = d.get("dra", False)
        if not isinstance(dra, bool):
            raise TopologyError(f"{where}: dra must be true or false, got {dra!r}")
        if dra and d["playedBy"] != KUBELET:
            raise TopologyError(
                f"{where}: dra: true needs playedBy: kubelet (a real node's DRA kubelet plugin "
                "prepares the devices; the node agent prepares nothing)"
            )
        if dra and rdma:
            raise TopologyError(
                f"{where}: a dra: true node offers its NICs as DRA devices: remove rdmaResource {rdma!r}"
            )
        nodes.append(
            SimNode(
                name=name,
                cluster=str(d["cluster"]),
                nic=d["nic"],
                gbps=gbps,
                gpus=gpus,
                cpu=str(d["cpu"]),
                memory=str(d["memory"]),
                pods=str(d["pods"]),
                advertise=d["advertise"],
                rdma_resource=rdma,
                extra_labels={str(k): str(v) for k, v in (d.get("labels") or {}).items()},
                extra_annotations={str(k): str(v) for k, v in (d.get("annotations") or {}).items()},
                played_by=d["playedBy"],
                taints=_taints(d.get("taints"), where),
                dra=dra,
            )
        )
    return Topology(path=path, nodes=tuple(nodes), kwok=_kwok(doc.get("kwok"), path))


def _taints(raw: object, where: str) -> tuple:
    if raw is None:
        return ()
    fix = "a list of {key, value (optional), effect} mappings, e.g. [{key: pool, effect: NoSchedule}]"
    if not isinstance(raw, list):
        raise TopologyError(f"{where}: taints must be {fix}; got {raw!r}")
    out = []
    for j, t in enumerate(raw):
        at = f"{where}: taints[{j}]"
        if not isinstance(t, dict) or not t.get("key") or set(t) - {"key", "value", "effect"}:
            raise TopologyError(
                f"{at}: expected a mapping with key, optional value, effect (only); got {t!r}"
            )
        if t.get("effect") not in TAINT_EFFECTS:
            raise TopologyError(f"{at}: effect must be one of {TAINT_EFFECTS}, got {t.get('effect')!r}")
        out.append(
            {
                "key": str(t["key"]),
                **({"value": str(t["value"])} if "value" in t else {}),
                "effect": t["effect"],
            }
        )
    return tuple(out)


def _kwok(raw: object, path: str) -> KwokSettings:
    if raw is None:
        return KwokSettings()
    where = f"{path}: kwok"
    if not isinstance(raw, dict) or set(raw) - set(_KWOK_KEYS):
        raise TopologyError(f"{where}: expected a mapping with keys among {sorted(_KWOK_KEYS)}; got {raw!r}")
    vals = {}
    for key, attr in _KWOK_KEYS.items():
        if key not in raw:
            continue
        v = raw[key]
        whole = key == "parallelism"
        ok = isinstance(v, int) if whole else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok or v < (1 if whole else 0) or (key != "startSeconds" and v == 0):
            want = (
                "a whole number >= 1"
                if whole
                else ("seconds >= 0" if key == "startSeconds" else "seconds > 0")
            )
            raise TopologyError(f"{where}.{key} must be {want}, got {v!r}")
        vals[attr] = int(v) if whole else float(v)
    return KwokSettings(**vals)


def load_topology(path: str | Path) -> Topology:
    p = Path(path)
    if not p.is_file():
        raise TopologyError(f"topology file not found: {p}")
    try:
        # libyaml's loader when there: a bench's topology of 2,000 hollow nodes parses in a second
        doc = yaml.load(p.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        raise TopologyError(f"{p}: not valid YAML: {e}") from None
    return parse_topology(doc, str(p))
