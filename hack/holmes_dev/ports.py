"""Free TCP ports for servers a test, a bench or a demo starts."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now on ``host`` (the kernel's pick; taken again later by
    whoever binds it first, which is what every caller here accepts)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
