"""Installed for real (issue 35): the chart's operator Deployment runs from the operator image that
`make images` built (localhost/holmes-operator), as a runc container under the release's own
ServiceAccount (RBAC enforced by the real API server), and trains a HolmesJob whose pods run from
the trainer image (localhost/holmes-trainer) to Succeeded.

"From the image" is checked on the processes themselves, not on the agent's word: the running
container's root is an overlay whose files are the image's (/opt/holmes, which the host lacks), its
uid is the image's USER, and the token it reads names the release's ServiceAccount.

Needs root and the images (make test builds them before pytest)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path

import pytest
from holmes_dev import images

from holmes.operator.core import child_names
from tests.helpers.packaging.chart_release import Env, apply_job, job_obj, operator_pod, tiny_job
from tests.helpers.polling import wait_for

pytestmark = [pytest.mark.timeout(900), pytest.mark.node_agent]  # runc's state: the agent's runner
# /var/run/secrets/..., where Debian's /var/run is a link to /run: read from the host through
# /proc/PID/root, an absolute link would resolve against the host's root, so follow it here.
SA_DIR = Path("var/run/secrets/kubernetes.io/serviceaccount")  # where the kubelet mounts it


def local_image_id(ref: str) -> str:
    proc = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True
    )
    assert proc.returncode == 0, f"{ref} is not built: run `make images` ({proc.stderr.strip()})"
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def env(cluster):
    yield from Env(cluster.kubeconfig, built_images=True).provisioned()


def container_process(status: dict) -> tuple[dict, Path]:
    """The runtime's state of a pod's running container and its init's /proc directory."""
    cid = status["containerID"]
    assert cid.startswith("runc://"), f"not run as a container: {status}"
    proc = subprocess.run(["runc", "state", cid.removeprefix("runc://")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    return state, Path(f"/proc/{state['pid']}")


def assert_runs_from_image(status: dict, image: str, uid: int) -> Path:
    assert status["imageID"] == f"sha256:{local_image_id(image)}", status
    state, proc = container_process(status)
    root = next(line for line in (proc / "mountinfo").read_text().splitlines() if line.split()[4] == "/")
    assert " - overlay overlay " in root and f"upperdir={state['bundle']}/upper" in root, root
    assert (proc / "root" / "opt" / "holmes" / "pyvenv.cfg").is_file(), "the image's venv is not its root's"
    assert not Path("/opt/holmes").exists(), "the host has /opt/holmes: the check above proves nothing"
    uids = next(line for line in (proc / "status").read_text().splitlines() if line.startswith("Uid:"))
    assert uids.split()[1:] == [str(uid)] * 4, uids
    return proc


def leader(env: Env) -> str | None:
    got = env.kubectl("get", "lease", env.fullname, "-n", env.release_ns, "-o", "json", check=False)
    return json.loads(got.stdout)["spec"].get("holderIdentity") if got.returncode == 0 else None


def token_subject(token: str) -> str:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["sub"]


@pytest.mark.compat
def test_chart_operator_runs_from_its_image_and_trains_a_job_on_the_trainer_image(env, cluster):
    env.install()
    pod = operator_pod(env)
    assert pod and pod["status"]["phase"] == "Running"
    assert pod["spec"]["containers"][0]["image"] == images.image_ref("operator")
    assert pod["spec"]["serviceAccountName"] == env.fullname
    proc = assert_runs_from_image(pod["status"]["containerStatuses"][0], images.image_ref("operator"), 65532)
    cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    assert cmdline[:3] == [b"python", b"-m", b"holmes.operator"], cmdline
    # its root holds Python and the venv, no shell and no package manager (docker/rootfs.py)
    root = proc / "root"
    for tool in ("bin/sh", "bin/bash", "usr/bin/apt-get", "usr/bin/dpkg", "usr/bin/pip"):
        assert not (root / tool).exists(), f"the operator image carries {tool}"
    # the credentials it runs with: the release's ServiceAccount, read inside its own root
    token = (proc / "root" / SA_DIR / "token").read_text()
    assert token_subject(token) == f"system:serviceaccount:{env.release_ns}:{env.fullname}"
    wait_for(
        "the operator to take the leader Lease",
        lambda: leader(env) == pod["metadata"]["name"],
        timeout=120,
        detail=lambda: cluster.pod_log(env.release_ns, pod["metadata"]["name"], "operator")[-3000:],
    )

    apply_job(env, tiny_job("imaged", training__iterations=20))
    selector = f"{child_names.LABEL_JOB}=imaged"

    def running_trainer() -> dict | None:
        for p in env.get("pods", "-n", env.job_ns, "-l", selector)["items"]:
            for st in p["status"].get("containerStatuses") or []:
                if "running" in st.get("state", {}):
                    return st
        return None

    st = wait_for("a trainer pod to run", running_trainer, timeout=240, every=0.2)
    assert st["image"] == images.image_ref("trainer")
    trainer = assert_runs_from_image(st, images.image_ref("trainer"), 65532)
    assert (trainer / "root" / "opt" / "holmes" / "lib" / "python3.11" / "site-packages" / "torch").is_dir()

    obj = wait_for(
        "HolmesJob imaged to finish",
        lambda: (lambda o: o if o.get("status", {}).get("phase") in ("Succeeded", "Failed") else None)(
            job_obj(env, "imaged")
        ),
        timeout=420,
    )
    logs = {
        p["metadata"]["name"]: cluster.pod_log(
            env.job_ns, p["metadata"]["name"], p["spec"]["containers"][0]["name"]
        )
        for p in env.get("pods", "-n", env.job_ns, "-l", selector)["items"]
    }
    assert obj["status"]["phase"] == "Succeeded", (
        json.dumps(obj["status"], indent=1)[:3000] + str(logs)[-3000:]
    )
    finished = env.get("pods", "-n", env.job_ns, "-l", selector)["items"]
    assert len(finished) == 2
    for p in finished:
        (cs,) = p["status"]["containerStatuses"]
        assert p["status"]["phase"] == "Succeeded" and cs["state"]["terminated"]["exitCode"] == 0
        assert cs["imageID"] == f"sha256:{local_image_id(images.image_ref('trainer'))}"
        assert cs["containerID"].startswith("runc://")
    # the operator, confined to its RBAC by the real API server, never hit a refusal
    log = cluster.pod_log(env.release_ns, pod["metadata"]["name"], "operator")
    # 403 as a number of its own: a port such as 40341 or a hex suffix is not a refusal
    assert "Forbidden" not in log and not re.search(r"(?<![\w.:-])403(?![\w.-])", log), log[-3000:]
