"""The names every part of Holmes agrees on: the HolmesJob API's identity, the NIC kinds, and the
label keys Holmes reads (a node's NIC kind, speed and cluster; a job's Kueue queue). Defined
once here, without aliases; the operator adds the names of the children it creates
(``holmes.operator.core.child_names``)."""

from __future__ import annotations

GROUP = "holmes.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
# Every version the API serves, the storage version (VERSION, which the operator and the
# plugin use) first. Their schemas are the same, so the CRD converts with strategy None (the API
# server rewrites apiVersion only); a version whose schema differs needs a conversion webhook
# first (docs/api.md#api-versions).
SERVED_VERSIONS = (VERSION, "v1beta1")
KIND = "HolmesJob"
PLURAL = "holmesjobs"

# A HolmesJob's name: a pod is <job>-<attempt>-<node rank> and doubles as its DNS hostname (a
# 63-character DNS-1035 label), and the job's Service carries the name itself. The CRD's CEL rules
# refuse other names at admission (hack/crdgen); the operator checks them again (a CRD without
# its rules, objects stored before them).
MAX_JOB_NAME = 50
JOB_NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"  # DNS-1035

# NIC kinds: what holmes.dev/nic says, what discovery classifies a node as, what a Layout's
# stages carry. RDMA kinds are the ones NCCL's IB transport drives.
INFINIBAND, ROCE, ETHERNET = "infiniband", "roce", "ethernet"
NIC_KINDS = (INFINIBAND, ROCE, ETHERNET)
RDMA_KINDS = (INFINIBAND, ROCE)

# Node labels (set by an admin, by ``holmes.labeller`` or by nothing: see plan/discovery.py).
LABEL_NIC = "holmes.dev/nic"  # infiniband | roce | ethernet
LABEL_NIC_GBPS = "holmes.dev/nic-gbps"  # all NICs of the node together, Gbit/s
LABEL_CLUSTER = "holmes.dev/cluster"  # the default of spec.nodes.clusterLabel
LABEL_LINK_LAYER = "holmes.dev/link-layer"  # InfiniBand | Ethernet (of the RDMA ports)
# Node annotations (values too long or too free-form for labels).
ANN_NIC_HCAS = "holmes.dev/nic-hcas"  # the host's rail HCAs: the pods' HOLMES_HOST_HCAS hint
ANN_SOCKET_IFNAME = "holmes.dev/socket-ifname"  # the host's netdev, never a pod's setting
ANN_NIC_PROBLEM = "holmes.dev/nic-problem"  # why the labeller could not decide
# Node Feature Discovery's labels that say a node has RDMA (but not which kind).
NFD_RDMA_LABELS = (
    "feature.node.kubernetes.io/rdma.capable",
    "feature.node.kubernetes.io/rdma.available",
    "feature.node.kubernetes.io/pci-15b3.present",
)
# The extended resource a node offers GPUs as, and a pod asks for them by.
RESOURCE_GPU = "nvidia.com/gpu"
# spec.managedBy: the controller that runs a HolmesJob. Absent or Holmes' own name: this cluster's
# Holmes operator; any other domain-prefixed path (at most 63 characters, as batch/v1 Job's
# managedBy): another controller, and the operator leaves the job alone. MultiKueue's name is the
# one Kueue gives its own (apis/kueue/v1beta2 MultiKueueControllerName; its adapter for outside
# kinds reads .spec.managedBy): it dispatches the job to a worker cluster and copies its status back.
MANAGED_BY_HOLMES = "holmes.dev/operator"
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"
MAX_MANAGED_BY = 63
# a domain (DNS-1123 subdomain characters), "/", a path; the same text is the CRD's CEL rule
MANAGED_BY_PATTERN = "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[-A-Za-z0-9_.~/]+$"
# A HolmesJob label: the Kueue LocalQueue that admits it (see docs/api.md).
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
# Kueue's WorkloadPriorityClass of a job (it wins over the pods' PriorityClass, as in Kueue)
LABEL_KUEUE_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
# The Workload a job uses instead of one of its own: MultiKueue labels the copy it creates on a
# worker cluster with the Workload it made there (Kueue's constants.PrebuiltWorkloadLabel)
LABEL_KUEUE_PREBUILT_WORKLOAD = "kueue.x-k8s.io/prebuilt-workload-name"

# How a job's pods reach each other (spec.network): their own network namespace or the node's.
POD_NETWORK, HOST_NETWORK = "podNetwork", "hostNetwork"
NETWORKS = (POD_NETWORK, HOST_NETWORK)
# Hints the operator renders into every trainer pod for the in-pod resolver (holmes.launch), which
# turns them into NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME and NCCL_IB_HCA from what the pod itself
# sees: host netdev and HCA names are facts of the host, not of a pod's namespace.
ENV_POD_NETWORK = "HOLMES_POD_NETWORK"  # podNetwork | hostNetwork
ENV_NIC = "HOLMES_NIC"  # the node's NIC kind: infiniband | roce | ethernet
ENV_HOST_HCAS = "HOLMES_HOST_HCAS"  # the node's compute-rail HCAs, comma-separated (hostNetwork only)

# The trainer and the operator agree on how a graceful stop is told apart from a failure.
EXIT_PREEMPTED = 83  # the trainer stopped on SIGTERM (preemption, eviction, deletion): a disruption
ENV_GRACE_SECONDS = "HOLMES_GRACE_SECONDS"  # the pod's terminationGracePeriodSeconds, for the trainer
# spec.training.acrossIslands.mode replicas: which replica a pod's trainers belong to, how many
# there are, and host:port of the outer group's store (served by replica 0's rank 0).
ENV_REPLICA = "HOLMES_REPLICA"
ENV_REPLICAS = "HOLMES_REPLICAS"
ENV_OUTER_ADDR = "HOLMES_OUTER_ADDR"

# GPU Feature Discovery's node labels (NVIDIA's gpu-feature-discovery): the GPU type per node.
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"  # e.g. NVIDIA-H100-80GB-HBM3
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB per GPU, e.g. 81559
LABEL_GPU_COUNT = "nvidia.com/gpu.count"  # GPUs on the node
# A node's NVLink domain on rack-scale NVLink (GB200/GB300 NVL72): "<cluster UUID>.<clique id>",
# the same on every node whose GPUs one NVLink fabric joins (GFD reads it from NVML's fabric info).
# It is a node label already, so it is also the NVLink-domain level of a published topology (a
# Kueue Topology level above the hostname and below the island): no label of Holmes' own copies it
LABEL_GPU_CLIQUE = "nvidia.com/gpu.clique"
# A node's achieved TFLOP/s per GPU, measured (calibration sets it on a job's in-memory view of
# its nodes when it re-plans; an admin may set it on a node known to run slower than its type).
LABEL_MEASURED_TFLOPS = "holmes.dev/measured-tflops"

# What the pod resolves itself (holmes.launch.podnet) and the operator never renders: present in a
# pod's env only when the user's template sets it, and then it wins (a wrong one stops the pod).
POD_RESOLVED_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX")
