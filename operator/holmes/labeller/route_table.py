"""The host's default route, from a table in ``/proc/net/route`` format (IPv4).

The labeller pod is not in the host's network namespace, so its own ``/proc/net/route`` says
nothing about the host: the chart mounts the host's ``/proc/1/net/route`` (the routes of PID 1's
namespace, the host's) and passes it as ``--route-table``. Columns: ``Iface Destination Gateway
Flags RefCnt Use Metric Mask ...``, addresses in hex; the default route has destination and mask 0.
"""

from __future__ import annotations

from pathlib import Path

_RTF_UP = 0x1


def default_route_ifname(table: str) -> str | None:
    """The interface of the lowest-metric default route that is up, or None."""
    best: tuple[int, str] | None = None
    lines = table.splitlines()
    for line in lines[1:]:  # the first line names the columns
        cols = line.split()
        if len(cols) < 8:
            continue
        iface, dest, flags, metric, mask = cols[0], cols[1], cols[3], cols[6], cols[7]
        try:
            if int(dest, 16) or int(mask, 16) or not int(flags, 16) & _RTF_UP:
                continue
            rank = (int(metric), iface)
        except ValueError:
            continue
        if best is None or rank < best:
            best = rank
    return best[1] if best else None


def read_default_route(path: str | None) -> tuple[str | None, str | None]:
    """(interface, None), or (None, why not) when no table was given or it cannot be read."""
    if not path:
        return None, "no route table given (--route-table): the default route is unknown"
    try:
        text = Path(path).read_text()
    except OSError as e:
        return None, f"route table {path}: {e.strerror or e}: the default route is unknown"
    ifname = default_route_ifname(text)
    return ifname, None if ifname else f"route table {path} has no default route"
