"""The environment names the operator renders into a trainer pod about its network, and the ones
the pod resolves itself (``podnet``). Defined here, standard library only, because this package
is copied alone into users' images; ``holmes.contract.names`` holds the same names for the
operator, and a test keeps the two equal.

Host facts (the labeller's netdev and HCA names) are true in the node's network namespace, not
in a pod's own: the operator renders hints, the pod resolves the names it uses.
"""

from __future__ import annotations

# Rendered by the operator: hints.
ENV_POD_NETWORK = "HOLMES_POD_NETWORK"  # the pod's route: podNetwork | hostNetwork
POD_NETWORK, HOST_NETWORK = "podNetwork", "hostNetwork"
ENV_NIC = "HOLMES_NIC"  # the node's NIC kind: infiniband | roce | ethernet
INFINIBAND, ROCE, ETHERNET = "infiniband", "roce", "ethernet"
# the node's compute-rail HCAs as the host names them, comma-separated: exact under
# hostNetwork; in a pod's namespace only where the pod sees the host's names (shared RDMA mode)
ENV_HOST_HCAS = "HOLMES_HOST_HCAS"
# Set by the admin in the pod template: "routed" when the RoCE rails' addresses are routed between
# every pod of the job (across its islands too), so NCCL's Socket transport may use the rails
ENV_SOCKET_RAILS = "HOLMES_SOCKET_RAILS"
RAILS_ROUTED = "routed"

# Resolved in the pod. Present in the pod env = set by the user's template: it wins, and a value
# that names what the pod does not have stops the pod with a message naming it.
SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"  # NCCL's bootstrap and Socket transport
GLOO_IFNAME = "GLOO_SOCKET_IFNAME"  # torch's gloo groups (host collectives)
IB_HCA = "NCCL_IB_HCA"
IB_GID_INDEX = "NCCL_IB_GID_INDEX"  # RoCE: left to NCCL (>= 2.21 picks a RoCE v2 GID) unless set
RESOLVED = (SOCKET_IFNAME, GLOO_IFNAME, IB_HCA, IB_GID_INDEX)
