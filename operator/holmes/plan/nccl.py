"""NCCL environment per NIC kind (design §6), a pure function so the operator can render pod env.

These variables are read once per process, so they belong to the pod; a node has one NIC kind.
Only facts of the *fabric* are set here, never names of the *host*: a pod in its own network
namespace has ``eth0`` (and Multus' ``net1``...) and sees only its own VFs, not the host's
``ens9f0np0`` or ``mlx5_3``; so ``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME`` and
``NCCL_IB_HCA`` are resolved inside the pod by the launcher from what the pod sees (the operator
passes the host's HCAs as a hint for hostNetwork pods only). ``NCCL_IB_GID_INDEX`` is left to
NCCL, which since 2.21 picks a RoCE v2 GID itself when it is unset.

What is set:

- ``NCCL_IB_DISABLE``: 1 on Ethernet nodes (no RDMA device), 0 on InfiniBand and RoCE;
- ``NCCL_IB_TC`` / ``NCCL_IB_SL``: the fabric's lossless traffic class / service level, from the
  job's per-island settings (``spec.islands``); unset, NCCL's defaults (0) apply;
- ``NCCL_SOCKET_NTHREADS`` / ``NCCL_NSOCKS_PERTHREAD`` on nodes whose groups use NCCL's socket
  transport: by default it runs one TCP flow per connection from the proxy thread (no helper
  threads; ``src/transport/net_socket.cc``), far below a 25-400 Gbit/s link.

The per-group network (``IB`` or ``Socket``, or a vendor plugin's) is *not* an environment
variable: the trainer passes it per communicator (``ProcessGroupNCCL.Options().config.net_name``).
That is why ``NCCL_NET`` is never set here: it would override that per-group choice for every
communicator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from holmes.contract.frameworks import trainer_container
from holmes.contract.names import ETHERNET, INFINIBAND, ROCE

from .discovery import NodeNic

# NCCL's socket transport (src/transport/net_socket.cc): at most MAX_THREADS helper threads per
# connection, and MAX_SOCKETS sockets in all (NTHREADS x NSOCKS_PERTHREAD above it is cut down).
SOCKET_MAX_THREADS = 16
SOCKET_MAX_FLOWS = 64
# Sockets per helper thread: NCCL's documentation suggests 4 threads x 4 sockets on a generic
# 100 Gbit/s network; more flows are added as threads (each thread drives its sockets in turn).
SOCKS_PER_THREAD = 4


def socket_threads(link_gbps: float, flow_gbps: float) -> tuple[int, int]:
    """(NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD) for a link: enough TCP flows of
    ``flow_gbps`` each to fill ``link_gbps``, within NCCL's limits (1..16 threads, 64 flows)."""
    if not (link_gbps > 0 and flow_gbps > 0):
        raise ValueError(f"link and per-flow Gbit/s must be > 0, got {link_gbps} and {flow_gbps}")
    flows = min(SOCKET_MAX_FLOWS, max(1, math.ceil(link_gbps / flow_gbps - 1e-9)))
    socks = min(SOCKS_PER_THREAD, flows)
    threads = min(SOCKET_MAX_THREADS, math.ceil(flows / socks))
    return threads, socks


def fixed_socket_threads(template: Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    """(NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD) as the template's trainer container sets
    them (its env wins over Holmes'); None where it does not set an integer."""
    env = {e.get("name"): e.get("value") for e in (trainer_container(template) or {}).get("env") or []}

    def number(name: str) -> int | None:
        try:
            return int(str(env[name]).strip())
        except (KeyError, ValueError):
            return None

    return number("NCCL_SOCKET_NTHREADS"), number("NCCL_NSOCKS_PERTHREAD")


def nccl_env(
    nic: NodeNic | str,
    *,
    traffic_class: int | None = None,
    service_level: int | None = None,
    socket: tuple[int, int] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """NCCL variables for a pod on a node of this NIC kind (a classified node or a kind string).

    ``traffic_class``/``service_level`` apply to InfiniBand and RoCE only; ``socket``: (threads,
    sockets per thread) when the pod's groups use NCCL's socket transport (:func:`socket_threads`).
    ``extra`` is merged last (user overrides), except that ``NCCL_NET`` is refused.
    """
    kind = nic.nic if isinstance(nic, NodeNic) else nic
    if kind not in (INFINIBAND, ROCE, ETHERNET):
        raise ValueError(f"unknown NIC kind {kind!r}: use infiniband, roce or ethernet")
    env: dict[str, str] = {"NCCL_IB_DISABLE": "1" if kind == ETHERNET else "0"}
    if kind != ETHERNET:
        if traffic_class is not None:
            env["NCCL_IB_TC"] = str(int(traffic_class))
        if service_level is not None:
            env["NCCL_IB_SL"] = str(int(service_level))
    if socket is not None:
        env["NCCL_SOCKET_NTHREADS"], env["NCCL_NSOCKS_PERTHREAD"] = (str(socket[0]), str(socket[1]))
    if extra:
        if "NCCL_NET" in extra:
            raise ValueError(
                "NCCL_NET must not be set: it overrides the per-group network (IB/Socket) "
                "the layout chooses; remove it from the pod env"
            )
        env.update({str(k): str(v) for k, v in extra.items()})
    return env
