"""A packet-level delay line between two TAP devices: every Ethernet frame read from one is written
to the other ``delay`` seconds later, in the order it came, each direction on its own.

This kernel has no ``sch_netem``, so bench/fabric_netns.py makes a WAN's one-way delay with this:
the trunk between the islands is two TAP devices, each on its island's bridge, and this process
(started in the switch namespace) is the wire between them. The bandwidth stays with the kernel's
``tbf`` on each TAP (as on today's veth trunk): its rate is exact and costs no Python, and this
process only sees what tbf let through, so it never queues more than rate x delay.

    python delay_line.py TAP_A TAP_B DELAY_MS   # prints "ready" once both are attached

The pure part (:class:`DelayQueue`, the loop's timeout) is unit-tested; attaching to a TAP needs
root (and CONFIG_TUN).
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import sys
import time
from collections import deque

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
MAX_FRAME = 65536
MAX_QUEUED = 20_000  # frames per direction: far above rate x delay for the rates tbf lets through


class DelayQueue:
    """Frames waiting for their deadline (arrival + delay). One delay for all, so arrival order
    is deadline order: a FIFO keeps the order, and only its head is ever due first."""

    def __init__(self, delay_s: float, limit: int = MAX_QUEUED) -> None:
        if delay_s < 0:
            raise ValueError(f"delay must be >= 0 s, got {delay_s}")
        self.delay_s = delay_s
        self.limit = limit
        self.frames: deque[tuple[float, bytes]] = deque()
        self.dropped = 0

    def push(self, now: float, frame: bytes) -> None:
        if len(self.frames) >= self.limit:
            self.dropped += 1  # a full queue drops, as a router's would: TCP backs off
            return
        self.frames.append((now + self.delay_s, frame))

    def due(self, now: float) -> list[bytes]:
        out = []
        while self.frames and self.frames[0][0] <= now:
            out.append(self.frames.popleft()[1])
        return out

    def wait_s(self, now: float) -> float | None:
        """Seconds until the head is due (0 if it is), None when empty (wait for a frame)."""
        return max(0.0, self.frames[0][0] - now) if self.frames else None


def next_timeout(queues: list[DelayQueue], now: float) -> float | None:
    waits = [w for q in queues if (w := q.wait_s(now)) is not None]
    return min(waits) if waits else None


# ---- I/O (root) --------------------------------------------------------------------------------


def attach_tap(name: str) -> int:
    """An fd on the existing TAP device ``name`` (made with `ip tuntap add`), frames without the
    packet-information header, non-blocking."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    except OSError as e:
        os.close(fd)
        raise SystemExit(f"cannot attach to TAP device {name!r}: {e.strerror}") from None
    return fd


def forward(fd_a: int, fd_b: int, delay_s: float) -> None:
    """Until killed (SIGTERM's default action: there is nothing to flush, the frames in flight
    are lost as on a cut wire): read every frame that arrived, write every frame that is due."""
    queues = {fd_a: DelayQueue(delay_s), fd_b: DelayQueue(delay_s)}  # by the fd frames came from
    other = {fd_a: fd_b, fd_b: fd_a}
    while True:
        now = time.monotonic()
        for src, q in queues.items():
            for frame in q.due(now):
                try:
                    os.write(other[src], frame)
                except OSError:
                    q.dropped += 1  # the far end is down (being torn down): nothing to deliver to
        ready, _, _ = select.select([fd_a, fd_b], [], [], next_timeout(list(queues.values()), now))
        now = time.monotonic()
        for fd in ready:
            while True:
                try:
                    frame = os.read(fd, MAX_FRAME)
                except BlockingIOError:
                    break
                queues[fd].push(now, frame)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        raise SystemExit("usage: delay_line.py TAP_A TAP_B DELAY_MS")
    tap_a, tap_b, delay_ms = argv[0], argv[1], float(argv[2])
    fd_a, fd_b = attach_tap(tap_a), attach_tap(tap_b)
    print("ready", flush=True)
    forward(fd_a, fd_b, delay_ms / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
