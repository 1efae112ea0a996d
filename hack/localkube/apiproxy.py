"""The `kubernetes` Service inside a pod's network namespace, as kube-proxy would provide it.

The API server listens on the host's 127.0.0.1 only. For each pod in a namespace of its own the
agent opens a listening socket on 127.0.0.1:<api port> *inside* that namespace (a short-lived
thread enters it with setns(2), which switches only the calling thread's network namespace,
binds, and ends) and relays every accepted connection to the host's API server. So
KUBERNETES_SERVICE_HOST/PORT and the API server's certificate stay what they were, and nothing
listens on an address outside loopback or the pods' namespaces. Stopped with the pod.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import socket
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def listen_in(netns_path: str, port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:``port`` in the network namespace at ``netns_path``."""
    out: dict = {}

    def enter() -> None:
        try:
            target = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            out["error"] = e
            return
        try:
            _setns(target)  # this thread only; it ends right after, so it never needs to go back
            out["sock"] = socket.create_server(("127.0.0.1", port))
        except OSError as e:
            out["error"] = e
        finally:
            os.close(target)

    t = threading.Thread(target=enter, name="apiproxy-bind")
    t.start()
    t.join()
    if "error" in out:
        raise OSError(f"cannot listen on 127.0.0.1:{port} in {netns_path}: {out['error']}")
    return out["sock"]


def _relay(a: socket.socket, b: socket.socket, stop: threading.Event) -> None:
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    try:
        while not stop.is_set():
            for key, _ in sel.select(timeout=0.5):
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                if not data:
                    return
                key.data.sendall(data)
    except OSError:
        pass
    finally:
        sel.close()
        a.close()
        b.close()


class ApiForwarder:
    """Relays connections accepted in a pod's namespace to the API server on the host."""

    def __init__(self, netns_path: str, port: int, host: str = "127.0.0.1"):
        self.port, self.host = port, host  # host: where the API server listens (controlplane.api_host)
        self.stop_event = threading.Event()
        self.listener = listen_in(netns_path, port)
        self.listener.settimeout(0.5)
        self.thread = threading.Thread(target=self._accept, daemon=True, name=f"apiproxy-{netns_path}")
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop_event.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            try:  # this thread was started from the host's namespace, so this dials the host
                up = socket.create_connection((self.host, self.port), timeout=5)
                up.settimeout(None)
            except OSError:
                conn.close()
                continue
            threading.Thread(target=_relay, args=(conn, up, self.stop_event), daemon=True).start()

    def stop(self) -> None:
        self.stop_event.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept() at once
        except OSError:
            pass
        self.thread.join(timeout=2)
        self.listener.close()
