"""The one kubelet endpoint worth having here: container logs, so `kubectl logs` works.

kube-apiserver proxies `kubectl logs` to https://<node InternalIP>:<kubelet port>/containerLogs/
<ns>/<pod>/<container>; every simulated node points at this server (127.0.0.1, own port, the
apiserver does not verify the kubelet's certificate unless told to). Log files hold every start
of a container, each after a "==== localkube:" header line; like the kubelet we serve the
current start, or the one before with ?previous=true.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

HEADER = b"==== localkube:"


def segments(data: bytes) -> list[bytes]:
    """The container's starts, oldest first, without their header lines."""
    out, cur = [], None
    for line in data.splitlines(keepends=True):
        if line.startswith(HEADER):
            if cur is not None:
                out.append(b"".join(cur))
            cur = []
        elif cur is not None:
            cur.append(line)
    if cur is not None:
        out.append(b"".join(cur))
    return out


def select(data: bytes, previous: bool, tail: int | None) -> bytes:
    segs = segments(data)
    want = -2 if previous else -1
    if len(segs) < (2 if previous else 1):
        return b""
    text = segs[want]
    if tail is not None:
        lines = text.splitlines(keepends=True)
        text = b"".join(lines[-tail:]) if tail > 0 else b""
    return text


def serve(
    pods_dir: Path, cert: Path, key: Path, port: int, is_running: Callable[[str, str], bool]
) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):
            url = urlparse(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404, "only /containerLogs/<ns>/<pod>/<container> is served here")
                return
            _, ns, pod, container = parts
            q = parse_qs(url.query)
            path = pods_dir / ns / pod / f"{container}.log"
            if not path.exists():
                self.send_error(404, f"no log for container {container} of pod {ns}/{pod}")
                return
            previous = q.get("previous", ["false"])[0] == "true"
            tail = int(q["tailLines"][0]) if "tailLines" in q else None
            follow = q.get("follow", ["false"])[0] == "true" and not previous
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            try:
                self.wfile.write(select(data, previous, tail))
                self.wfile.flush()
                offset, starts = len(data), data.count(HEADER)
                while follow and is_running(ns, pod):
                    time.sleep(0.2)
                    data = path.read_bytes()
                    if data.count(HEADER) != starts:  # restarted: the kubelet ends the stream too
                        break
                    if len(data) > offset:
                        self.wfile.write(data[offset:])
                        self.wfile.flush()
                        offset = len(data)
            except (BrokenPipeError, ConnectionResetError):
                pass

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True, name="logserver").start()
    return httpd
