"""Free TCP ports for servers a test, a bench or a demo starts."""

from __future__ import annotations

import socket

# Sockets that hold each port handed out, for as long as this process lives.
_reserved: list[socket.socket] = []


def free_port(host: str = "127.0.0.1") -> int:
    """A port kept for whoever binds it next with SO_REUSEADDR (TCPStore, asyncio, http.server
    and Go servers all do).

    A port picked and let go is free only until the kernel hands it out again: gloo's mesh opens
    hundreds of client sockets, and one of them took a rendezvous port between its pick and the
    store's bind (EADDRINUSE in CI). So the picking socket stays bound, never listening, until
    this process ends: the kernel gives a bound port to no other bind(0) nor client socket, while
    a listener with SO_REUSEADDR may still share it, and a client gets "connection refused"."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    _reserved.append(s)
    return s.getsockname()[1]
