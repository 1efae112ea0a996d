"""NCCL environment per NIC kind (design §6), a pure function so the operator can render pod env.

These variables are read once per process, so they belong to the pod; a node has one NIC kind.
The per-group network (``IB`` or ``Socket``) is *not* an environment variable: the trainer passes
it per communicator (``ProcessGroupNCCL.Options().config.net_name``). That is why ``NCCL_NET`` is
never set here: it would override that per-group choice for every communicator.
"""

from __future__ import annotations

from collections.abc import Mapping

from holmes.contract.names import ETHERNET, INFINIBAND, ROCE

from .discovery import NodeNic

DEFAULT_GID_INDEX = 3  # RoCE v2 over IPv4 on most Mellanox setups


def nccl_env(
    nic: NodeNic | str,
    *,
    hcas: tuple[str, ...] | list[str] | None = None,
    socket_ifname: str | None = None,
    gid_index: int | None = DEFAULT_GID_INDEX,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """NCCL variables for a pod on a node of this NIC kind.

    ``nic`` is a classified node (its HCAs and socket interface are used when known) or a kind
    string. Explicit ``hcas``/``socket_ifname`` override the node's. ``gid_index`` applies to RoCE
    only (None leaves NCCL's own choice). ``extra`` is merged last (user overrides), except that
    ``NCCL_NET`` is refused.
    """
    if isinstance(nic, NodeNic):
        kind = nic.nic
        hcas = nic.hcas if hcas is None else hcas
        socket_ifname = socket_ifname or nic.socket_ifname
    else:
        kind = nic
    if kind not in (INFINIBAND, ROCE, ETHERNET):
        raise ValueError(f"unknown NIC kind {kind!r}: use infiniband, roce or ethernet")
    env: dict[str, str] = {}
    if kind == ETHERNET:
        env["NCCL_IB_DISABLE"] = "1"
    else:
        env["NCCL_IB_DISABLE"] = "0"
        if hcas:
            env["NCCL_IB_HCA"] = ",".join(hcas)
        if kind == ROCE and gid_index is not None:
            env["NCCL_IB_GID_INDEX"] = str(int(gid_index))
    # Sockets carry bootstrap and every Socket-net group, on RDMA nodes too.
    if socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = socket_ifname
    if extra:
        if "NCCL_NET" in extra:
            raise ValueError(
                "NCCL_NET must not be set: it overrides the per-group network (IB/Socket) "
                "the layout chooses; remove it from the pod env"
            )
        env.update({str(k): str(v) for k, v in extra.items()})
    return env
