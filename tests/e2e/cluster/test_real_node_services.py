"""Services on real nodes (issue 48): kube-proxy v1.37 (nftables mode, hack/localkube/realnode.py)
routes a ClusterIP Service from a pod on one real node to a pod on the other, and a pod's
in-cluster client, with its ServiceAccount's token, reaches the API server through the
`kubernetes` Service (the API server listens on a real node's bridge address, the Service's
endpoint); the chart's operator Deployment runs as a pod on a real node and trains a HolmesJob to
Succeeded on both. `make cluster-down` (ControlPlane.down) then leaves no nftables table, process,
bridge, cgroup or mount behind.

Its own cluster of the two real nodes of hack/topologies/real-nodes.yaml; needs root, `make node`,
`make k8s` and `make images` (the pods run the operator and trainer images, imported into each
node's containerd)."""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from holmes_dev import images

from localkube import podnet
from localkube.controlplane import pid_alive
from localkube.realnode import KUBE_PROXY_LOCK, KUBE_PROXY_TABLES
from tests.helpers.cluster import real_nodes
from tests.helpers.cluster.real_nodes import Cluster
from tests.helpers.packaging.chart_release import Env, apply_job, job_obj, operator_pod, tiny_job
from tests.helpers.polling import wait_for

pytestmark = [pytest.mark.timeout(1500), pytest.mark.real_nodes]
REPO = Path(__file__).resolve().parents[3]
OPERATOR = images.image_ref("operator")
TOPOLOGY = REPO / "hack" / "topologies" / "real-nodes.yaml"


def log(m: str) -> None:
    print(f"[localkube] {m}", file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def real_cluster():
    if shutil.which("podman") and subprocess.run(["podman", "image", "exists", OPERATOR]).returncode:
        pytest.fail(f"{OPERATOR} is not built: run `make images`")
    yield from real_nodes.real_cluster(TOPOLOGY, "svc")


@pytest.fixture(scope="module")
def ns(real_cluster):
    name = f"svc-{uuid.uuid4().hex[:6]}"
    real_cluster.kubectl("create", "namespace", name)
    wait_for(
        "the default service account",
        lambda: real_cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    return name


def pod(name: str, ns: str, node: str, script: str, **spec) -> dict:
    """A pod of the operator image on ``node`` running ``python -c script`` (restricted, non-root)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "image": OPERATOR,
                    "command": ["python", "-c", script],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    **spec.pop("container", {}),
                }
            ],
            **spec,
        },
    }


def finished(c: Cluster, ns: str, name: str) -> dict:
    """The pod once it Succeeded or Failed (with its log), failing the test with both otherwise."""

    def done():
        p = c.get("pod", name, "-n", ns)
        return p if p["status"].get("phase") in ("Succeeded", "Failed") else None

    p = wait_for(f"pod {name} to finish", done, timeout=180, every=1)
    out = c.kubectl("logs", "-n", ns, name, check=False).stdout
    assert p["status"]["phase"] == "Succeeded", f"{name}: {p['status']}\n{out}"
    return {"pod": p, "log": out}


SERVER = """
import http.server, socket
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = socket.gethostname().encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("", 8080), H).serve_forever()
"""

CLIENT = """
import sys, time, urllib.request
urls, got = sys.argv[1:], {}
end = time.monotonic() + 90
while len(got) < len(urls) and time.monotonic() < end:
    for u in urls:
        try:
            got[u] = urllib.request.urlopen(u, timeout=3).read().decode()
        except OSError as e:
            print(u, "not yet:", e, flush=True); time.sleep(1)
for u in urls:
    print("GOT", u, got.get(u), flush=True)
sys.exit(0 if len(got) == len(urls) else 1)
"""

IN_CLUSTER = """
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
config.load_incluster_config()
print("HOST", client.Configuration.get_default_copy().host, flush=True)
print("NODES", " ".join(sorted(n.metadata.name for n in client.CoreV1Api().list_node().items)), flush=True)
try:
    client.CoreV1Api().list_namespaced_secret("default")
    print("SECRETS allowed")
except ApiException as e:
    print("SECRETS", e.status)
"""


def test_kube_proxy_runs_in_nftables_mode_and_the_kubernetes_service_names_the_api_server(real_cluster):
    c = real_cluster
    st = c.cp.state()
    assert "kube-proxy" in st["pids"], f"no kube-proxy in this cluster: {st.get('kubeProxy')}"
    host = st["apiserverHost"]
    # the API server listens on an address of the first real node's bridge, never 0.0.0.0
    assert ipaddress.IPv4Address(host) in podnet.pod_subnet() and host.endswith(".1"), host
    (eps,) = c.get("endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes")["items"]
    assert [a for e in eps["endpoints"] for a in e["addresses"]] == [host], eps
    assert [p["port"] for p in eps["ports"]] == [st["apiserverPort"]], eps
    table = subprocess.run(["nft", "list", "table", "ip", "kube-proxy"], capture_output=True, text=True)
    assert table.returncode == 0 and "10.96.0.1" in table.stdout, table.stderr


def test_a_pod_reaches_a_clusterip_service_of_a_pod_on_the_other_real_node(real_cluster, ns):
    c = real_cluster
    c.apply(
        pod(
            "web",
            ns,
            "rk-east",
            SERVER,
            container={"ports": [{"containerPort": 8080}], "readinessProbe": {"tcpSocket": {"port": 8080}}},
        ),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    c.kubectl("wait", "-n", ns, "--for=condition=Ready", "pod/web", "--timeout=180s", timeout=200)
    svc = c.get("service", "web", "-n", ns)
    ip = svc["spec"]["clusterIP"]
    assert ip.startswith("10.96."), svc["spec"]
    urls = [f"http://{ip}/", f"http://web.{ns}.svc.cluster.local/"]  # by ClusterIP, and its name (CoreDNS)
    c.apply(pod("client", ns, "rk-west", CLIENT, container={"args": urls}))
    # `python -c script arg...`: the URLs are argv[1:]
    out = finished(c, ns, "client")["log"]
    for u in urls:
        assert f"GOT {u} web" in out, out


def test_a_pods_in_cluster_client_lists_nodes_through_the_kubernetes_service_with_its_token(real_cluster, ns):
    c = real_cluster
    c.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "lister", "namespace": ns}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{ns}-node-lister"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{ns}-node-lister"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{ns}-node-lister",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "lister", "namespace": ns}],
        },
    )
    try:
        c.apply(pod("lister", ns, "rk-west", IN_CLUSTER, serviceAccountName="lister"))
        out = finished(c, ns, "lister")["log"]
    finally:
        c.kubectl("delete", "clusterrolebinding,clusterrole", f"{ns}-node-lister", check=False)
    assert "HOST https://10.96.0.1:443" in out, out  # the `kubernetes` Service, as the kubelet set it
    assert "NODES rk-east rk-west" in out, out
    assert "SECRETS 403" in out, out  # its own ServiceAccount's rights, not more


class ImageEnv(Env):
    """A release of the chart whose operator and trainer images are the local ones (imported into
    each real node's containerd)."""

    def values(self) -> list[str]:
        operator, trainer = (images.image_ref(t).rsplit(":", 1)[0] for t in ("operator", "trainer"))
        return [
            *super().values(),
            "--set",
            f"image.repository={operator}",
            "--set",
            f"trainer.image.repository={trainer}",
        ]


def test_the_operator_runs_as_a_deployment_pod_on_a_real_node_and_trains_a_job_to_succeeded(real_cluster):
    env = ImageEnv(Path(real_cluster.kubeconfig))
    release = env.provisioned()
    next(release)
    try:
        env.install()
        op = wait_for("the operator's pod", lambda: operator_pod(env), timeout=120)
        (cs,) = op["status"]["containerStatuses"]
        assert op["spec"]["nodeName"] in ("rk-east", "rk-west"), op["spec"]
        assert cs["containerID"].startswith("containerd://") and cs["ready"], cs
        apply_job(env, tiny_job("by-pod"))

        def done():
            job = job_obj(env, "by-pod")
            return job if job.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        logs = lambda: env.kubectl("logs", "-n", env.release_ns, op["metadata"]["name"], check=False).stdout  # noqa: E731
        job = wait_for("HolmesJob by-pod to finish", done, timeout=600, every=1)
        assert job["status"]["phase"] == "Succeeded", json.dumps(job["status"])[:2000] + logs()[-3000:]
        pods = env.get("pods", "-n", env.job_ns, "-l", "holmes.dev/job-name=by-pod")["items"]
        assert sorted(p["spec"]["nodeName"] for p in pods) == ["rk-east", "rk-west"]
        for p in pods:
            assert p["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    finally:
        next(release, None)


def test_cluster_down_leaves_no_rules_processes_bridges_cgroups_or_mounts(real_cluster):
    cp = real_cluster.cp
    st = cp.state()
    pids = dict(st["pids"])
    rn = st["realNodes"]
    bridges, cgroups = list(rn["bridges"]), list(rn["cgroups"])
    assert bridges and cgroups and "kube-proxy" in pids
    cp.down(log=log)
    alive = {n: p for n, p in pids.items() if pid_alive(p)}
    assert not alive, alive
    ours = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and mentions_dir(p, cp.dir)]
    assert not ours, ours
    assert not [b for b in bridges if Path(f"/sys/class/net/{b}").exists()]
    assert not [g for g in cgroups if Path(g).exists()]
    assert str(cp.dir) not in Path("/proc/self/mountinfo").read_text()
    # kube-proxy's tables are gone, unless another cluster's kube-proxy (which holds the lock) made them since
    try:
        lock = podnet._Flock(KUBE_PROXY_LOCK, block=False)
    except BlockingIOError:
        owner = (podnet.LOCK_DIR / KUBE_PROXY_LOCK).read_text()
        assert owner != str(cp.dir), "our kube-proxy still holds the lock"
    else:
        with lock:
            for family, table in KUBE_PROXY_TABLES:
                r = subprocess.run(["nft", "list", "table", family, table], capture_output=True)
                assert r.returncode != 0, f"nftables table {family} {table} left behind"


def mentions_dir(proc: Path, d: Path) -> bool:
    """The state dir anywhere in the command line (broader than controlplane.mentions, which
    reads only argument values: a shell's `-c` script counts here too)."""
    try:
        return str(d).encode() in (proc / "cmdline").read_bytes()
    except OSError:
        return False
