"""Topology files: which simulated GPU nodes the node agent registers (pure, no Kubernetes I/O).

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
        playedBy: agent               # who runs its pods: agent (default) | kubelet
        dra: false                    # its GPUs and NICs as DRA devices (kubelet nodes only)

``playedBy`` says what plays the node:
  - ``agent``: Holmes' node agent (hack/localkube/agent.py) registers it and runs its pods;
  - ``kubelet``: a real kubelet on its own containerd, with CNI, Multus and CoreDNS
    (hack/localkube/realnode.py; ``make node`` builds them). It reports the host's CPU and
    memory, so ``cpu`` and ``memory`` do not apply; ``gpus`` and ``rdmaResource`` become
    extended resources of its status.

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
AGENT, KUBELET = "agent", "kubelet"
PLAYERS = (AGENT, KUBELET)
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
    "dra",
}


class TopologyError(ValueError):
    """A topology file that cannot be used; the message says what to fix."""


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
            "spec": {},
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
        """The nodes ``player`` (agent or kubelet) plays."""
        return Topology(path=self.path, nodes=tuple(n for n in self.nodes if n.played_by == player))


def parse_topology(doc: object, path: str = "<topology>") -> Topology:
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not doc["nodes"]:
        raise TopologyError(f"{path}: expected a mapping with a non-empty 'nodes' list")
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
                f"{where}: playedBy must be one of {PLAYERS} (agent: the node agent; kubelet: a real "
                f"kubelet on containerd), got {d['playedBy']!r}"
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
                dra=dra,
            )
        )
    return Topology(path=path, nodes=tuple(nodes))


def load_topology(path: str | Path) -> Topology:
    p = Path(path)
    if not p.is_file():
        raise TopologyError(f"topology file not found: {p}")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise TopologyError(f"{p}: not valid YAML: {e}") from None
    return parse_topology(doc, str(p))
