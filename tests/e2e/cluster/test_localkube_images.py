"""The node agent runs a pod whose image is in the local containers storage from that image, as a
real OCI container (runc): its root filesystem and user, the pod's volumes, env and service-account
token, the `kubernetes` Service inside the pod's network namespace, its exit code and a graceful
delete. A missing localhost/ image is ErrImagePull, then ImagePullBackOff, never a host process.

Needs root and the images `make images` builds (make test builds them first)."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from holmes_dev import images

from localkube.imagepolicy import HOST_IMAGE_ID
from tests.helpers.cluster.pods import apply, pod
from tests.helpers.polling import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.node_agent]
OPERATOR = images.image_ref("operator")

# Runs in the operator image as its user: what the pod sees of its spec, and the API server
# through the relay with the pod's own token (RBAC: the default account may not list pods).
PROBE = r"""
import json, os, pathlib, ssl, urllib.error, urllib.request
sa = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
ctx = ssl.create_default_context(cafile=str(sa / "ca.crt"))
base = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
def get(path):
    auth = {"Authorization": "Bearer " + (sa / "token").read_text()}
    req = urllib.request.Request(base + path, headers=auth)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
pathlib.Path("/scratch/out").write_text("x")
try:
    pathlib.Path("/probe").write_text("x")
    root_ro = False
except OSError:
    root_ro = True
print(json.dumps({
    "uid": os.getuid(), "cwd": os.getcwd(), "home": os.environ.get("HOME"),
    "pod": os.environ.get("MY_POD"), "greeting": open("/config/greeting").read(),
    "root_ro": root_ro, "namespace": (sa / "namespace").read_text(),
    "api": get("/api"), "pods": get(f"/api/v1/namespaces/{(sa / 'namespace').read_text()}/pods"),
    "hosts": open("/etc/hosts").read(), "prefix": __import__("sys").prefix,
}))
raise SystemExit(3)
"""


def image_pod(name: str, script: str, image: str = OPERATOR, **container) -> dict:
    body = pod(name, "", restart="Never")
    body["spec"]["containers"] = [
        {"name": "main", "image": image, "command": ["python", "-c", textwrap.dedent(script)], **container}
    ]
    return body


def test_pod_runs_from_its_image_with_its_volumes_token_and_exit_code(cluster, namespace):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"greeting": "hi"}}
    body = image_pod(
        "probe",
        PROBE,
        env=[{"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        securityContext={"readOnlyRootFilesystem": True},
        volumeMounts=[{"name": "cfg", "mountPath": "/config"}, {"name": "scratch", "mountPath": "/scratch"}],
    )
    body["spec"]["volumes"] = [
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    apply(cluster, namespace, cm, body)
    done = cluster.wait_pod(namespace, "probe", timeout=120)
    log = cluster.pod_log(namespace, "probe", "main")
    assert done["status"]["phase"] == "Failed", log
    (status,) = done["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 3, log
    assert status["containerID"].startswith("runc://") and status["imageID"].startswith("sha256:")
    image_id = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", OPERATOR], capture_output=True, text=True
    ).stdout.strip()
    assert status["imageID"] == f"sha256:{image_id}"
    seen = json.loads(log.strip().splitlines()[-1])
    # the image's USER and WORKDIR, its passwd's home, its own python (not the repository's venv)
    assert (seen["uid"], seen["cwd"], seen["home"]) == (65532, "/tmp", "/nonexistent"), seen
    assert seen["prefix"] == "/opt/holmes", seen
    assert seen["pod"] == "probe" and seen["greeting"] == "hi" and seen["root_ro"], seen
    assert seen["namespace"] == namespace and "\tprobe" in seen["hosts"]
    # the API server through the relay in the pod's network namespace, with the pod's own token:
    # discovery is allowed to every account, listing pods is not granted to `default`
    assert (seen["api"], seen["pods"]) == (200, 403), seen


def test_running_container_is_the_image_rootfs_and_stops_on_delete_with_sigterm(cluster, namespace):
    script = """
        import signal, sys, time
        def term(*_):
            print("got SIGTERM", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, term)
        print("ready", flush=True)
        time.sleep(600)
    """
    apply(cluster, namespace, image_pod("sleeper", script))
    running = cluster.wait_pod(namespace, "sleeper", phases=("Running",), timeout=120)
    cid = running["status"]["containerStatuses"][0]["containerID"].removeprefix("runc://")
    wait_for("the container to print ready", lambda: "ready" in cluster.pod_log(namespace, "sleeper", "main"))
    runc_state = subprocess.run(["runc", "state", cid], capture_output=True, text=True, check=True)
    state = json.loads(runc_state.stdout)
    pid = state["pid"]
    proc = Path(f"/proc/{pid}")
    assert (proc / "root" / "opt" / "holmes" / "pyvenv.cfg").is_file()  # the image's venv
    assert not Path("/opt/holmes").exists(), "the host must not have the image's files for this check"
    root = next(line for line in (proc / "mountinfo").read_text().splitlines() if line.split()[4] == "/")
    assert " - overlay overlay " in root and f"upperdir={state['bundle']}/upper" in root, root
    uids = next(line for line in (proc / "status").read_text().splitlines() if line.startswith("Uid:"))
    assert uids.split()[1:] == ["65532"] * 4, uids
    cluster.kubectl("delete", "pod", "sleeper", "-n", namespace, "--grace-period=20", "--wait=false")
    start = time.monotonic()
    wait_for(
        "the pod to go",
        lambda: cluster.kubectl("get", "pod", "sleeper", "-n", namespace, check=False).returncode != 0,
        timeout=30,
    )
    assert time.monotonic() - start < 15, "SIGTERM did not reach the container's process"
    assert "got SIGTERM" in cluster.pod_log(namespace, "sleeper", "main")
    assert subprocess.run(["runc", "state", cid], capture_output=True).returncode != 0, "runtime state left"


def test_missing_localhost_image_is_err_image_pull_then_back_off(cluster, namespace):
    apply(cluster, namespace, image_pod("nopull", "print('ran')", image="localhost/holmes-no-such-image:0"))

    def waiting_reason(reason: str):
        p = cluster.get_json("pod", "nopull", "-n", namespace)
        st = (p["status"].get("containerStatuses") or [{}])[0].get("state", {})
        return p if st.get("waiting", {}).get("reason") == reason else None

    first = wait_for("ErrImagePull", lambda: waiting_reason("ErrImagePull"), timeout=60)
    assert first["status"]["phase"] == "Pending"
    assert "make images" in first["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    later = wait_for("ImagePullBackOff", lambda: waiting_reason("ImagePullBackOff"), timeout=60)
    assert later["status"]["phase"] == "Pending"
    assert "ran" not in cluster.pod_log(namespace, "nopull", "main")


def test_a_stand_in_image_runs_on_the_host_and_says_so(cluster, namespace):
    apply(cluster, namespace, pod("standin", "import sys; print(sys.prefix)"))
    done = cluster.wait_pod(namespace, "standin", timeout=60)
    assert done["status"]["phase"] == "Succeeded"
    assert done["status"]["containerStatuses"][0]["imageID"] == HOST_IMAGE_ID
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=standin")
    assert any(e["reason"] == "HostProcess" and "hostImages" in e["message"] for e in events["items"])
