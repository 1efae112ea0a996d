"""The names every part of Holmes agrees on: the HolmesJob API's identity and the node label
keys that say a node's NIC kind, speed and cluster. Defined once here; the operator adds the
names of the children it creates (``holmes.operator.core.names``)."""

from __future__ import annotations

GROUP = "holmes.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "HolmesJob"
PLURAL = "holmesjobs"

# Node labels (set by an admin, by ``holmes.labeller`` or by nothing: see plan/discovery.py).
LABEL_NIC = "holmes.dev/nic"  # infiniband | roce | ethernet
LABEL_NIC_GBPS = "holmes.dev/nic-gbps"  # all NICs of the node together, Gbit/s
LABEL_CLUSTER = "holmes.dev/cluster"  # the default of spec.nodes.clusterLabel
LABEL_LINK_LAYER = "holmes.dev/link-layer"  # InfiniBand | Ethernet (of the RDMA ports)
# Node annotations (values too long or too free-form for labels).
ANN_NIC_HCAS = "holmes.dev/nic-hcas"  # HCA names for NCCL_IB_HCA
ANN_SOCKET_IFNAME = "holmes.dev/socket-ifname"
ANN_NIC_PROBLEM = "holmes.dev/nic-problem"  # why the labeller could not decide

# The trainer and the operator agree on how a graceful stop is told apart from a failure.
EXIT_PREEMPTED = 83  # the trainer stopped on SIGTERM (preemption, eviction, deletion): a disruption
ENV_GRACE_SECONDS = "HOLMES_GRACE_SECONDS"  # the pod's terminationGracePeriodSeconds, for the trainer
