"""The project's images run as real OCI containers by localkube.container (runc): each as its
image's user on a read-only root, its ENTRYPOINT merged with the pod's args, volumes bind-mounted,
inside a given network namespace, stopped the way a kubelet stops one.

Needs root and the images `make images` builds (make test builds them first)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from holmes_dev import images

from localkube import container as ct
from localkube.ociconfig import Mount
from localkube.podspec import Unsupported

pytestmark = pytest.mark.timeout(300)
RO_ROOT = {"readOnlyRootFilesystem": True}


@pytest.fixture(scope="module", autouse=True)
def built_images():
    assert os.geteuid() == 0, "the container runner needs root (runc, overlay mounts)"
    for target in images.TARGETS:
        ref = images.image_ref(target)
        proc = subprocess.run(["podman", "image", "inspect", ref], capture_output=True, text=True)
        assert proc.returncode == 0, f"{ref} is not built: run `make images` ({proc.stderr.strip()})"
    yield
    ct.release_images()


def run(tmp_path: Path, image: str, **kw) -> tuple[int, str]:
    """Run one container to its end; (exit code, its output)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    log = tmp_path / f"{name}.log"
    req = ct.ContainerRequest(
        id=name, image=image, bundle=tmp_path / name, hostname=kw.pop("hostname", name), **kw
    )
    with open(log, "wb") as out:
        c = ct.start(req, stdout=out)
    try:
        code = c.proc.wait(timeout=240)
    finally:
        c.cleanup()
    assert not (tmp_path / name).exists(), "cleanup left the bundle"
    return code, log.read_text()


PROBE = """
import os
print(os.getuid()); print(os.getgid()); print(os.getcwd())
for path in ("/probe", "/tmp/probe"):
    try:
        open(path, "w").close()
        print("wrote", path)
    except OSError as e:
        print(e)
"""


def test_operator_image_runs_its_entrypoint_as_its_user_on_a_read_only_root(tmp_path):
    op = images.image_ref("operator")
    code, out = run(tmp_path, op, args=["--help"], security_context=RO_ROOT)
    assert code == 0, out
    assert out.startswith("usage: python -m holmes.operator"), out[:500]
    # the operator image has Python and no shell (docker/rootfs.py): the probe is Python
    code, out = run(tmp_path, op, command=["python", "-c", PROBE], security_context=RO_ROOT)
    assert code == 0, out
    uid, gid, cwd, *rest = out.splitlines()
    assert (uid, gid, cwd) == ("65532", "65532", "/tmp"), out  # the image's USER and WORKDIR
    assert "Read-only file system" in rest[0] and "Read-only file system" in rest[1], out


def test_trainer_image_imports_torch_and_the_trainer_as_its_user(tmp_path):
    code, out = run(
        tmp_path,
        images.image_ref("trainer"),
        command=[
            "python",
            "-c",
            "import os, torch, holmes.trainer; print(os.getuid(), os.getcwd(), torch.__version__)",
        ],
        security_context=RO_ROOT,
    )
    assert code == 0, out
    uid, cwd, version = out.split()
    assert (uid, cwd) == ("65532", "/home/holmes") and version.startswith("2.13.0"), out


# Everything on stdout, the refused write's error too: `runc run` copies the container's stdout and
# stderr through two pipes, one goroutine each, so lines of the two streams can come out of order.
SCRIPT = """
import os, socket
print(open("/data/in").read(), end="")
print(os.environ["GREETING"], os.environ["HOSTNAME"], socket.gethostname(), os.getuid())
print(*sorted(os.listdir("/sys/class/net")), sep="\\n")
open("/scratch/out", "w").write("x\\n")
try:
    open("/data/x", "w").write("y\\n")
except OSError as e:
    print(e)
    raise SystemExit(1)
"""


def test_volumes_env_user_override_and_a_network_namespace(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "in").write_text("from the host\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o777)
    scratch.chmod(0o777)
    netns = f"holmes-t-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        code, out = run(
            tmp_path,
            images.image_ref("operator"),
            hostname="rank-0",
            command=["python", "-c", SCRIPT],
            env={"GREETING": "hello"},
            mounts=[Mount(str(data), "/data", ro=True), Mount(str(scratch), "/scratch")],
            netns=f"/run/netns/{netns}",
            security_context={**RO_ROOT, "runAsUser": 1234},
        )
    finally:
        subprocess.run(["ip", "netns", "delete", netns], check=True)
    lines = out.splitlines()
    assert lines[:3] == ["from the host", "hello rank-0 rank-0 1234", "lo"], out
    assert (scratch / "out").read_text() == "x\n"
    assert "Read-only file system" in out and code != 0  # the last write, to the read-only volume


def test_stopped_like_a_kubelet_stops_a_container(tmp_path):
    name = f"t-{uuid.uuid4().hex[:8]}"
    req = ct.ContainerRequest(
        id=name,
        image=images.image_ref("operator"),
        bundle=tmp_path / name,
        hostname=name,
        command=["python", "-c", "import time; time.sleep(600)"],
    )
    c = ct.start(req, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["runc", "state", name], capture_output=True).returncode != 0:
            assert c.proc.poll() is None and time.monotonic() < deadline, "the container did not start"
            time.sleep(0.2)
        c.signal(signal.SIGTERM)  # pid 1 without a handler ignores it, as in a pod
        with pytest.raises(subprocess.TimeoutExpired):
            c.proc.wait(timeout=2)
        c.signal(signal.SIGKILL)
        assert c.proc.wait(timeout=30) == 128 + signal.SIGKILL
    finally:
        c.cleanup()
    assert subprocess.run(["runc", "state", name], capture_output=True).returncode != 0, "runtime state left"


def test_unknown_image_is_a_clear_error(tmp_path):
    with pytest.raises(Unsupported, match="make images"):
        ct.start(
            ct.ContainerRequest(
                id="x", image="localhost/no-such-image:0", bundle=tmp_path / "x", hostname="x"
            )
        )
