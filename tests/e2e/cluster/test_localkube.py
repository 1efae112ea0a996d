"""The local cluster against the real kube-apiserver: simulated nodes, pods run as processes."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.helpers.cluster.pods import apply, pod

pytestmark = pytest.mark.node_agent


@pytest.mark.compat
def test_the_server_and_kubectl_are_the_release_asked_for(cluster):
    """`make test` runs the release built into bin/; `make compat` the oldest the chart supports."""
    from localkube.controlplane import K8S_VERSION, built_version

    want = K8S_VERSION or built_version("kube-apiserver")
    versions = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert versions["serverVersion"]["gitVersion"] == want, versions
    assert versions["clientVersion"]["gitVersion"] == want, versions


def test_nodes_carry_the_topology(cluster):
    nodes = {n["metadata"]["name"]: n for n in cluster.get_json("nodes")["items"]}
    assert set(nodes) == set(cluster.topology.names)
    for sim in cluster.topology.nodes:
        node = nodes[sim.name]
        assert sim.labels.items() <= node["metadata"]["labels"].items()
        alloc = node["status"]["allocatable"]
        assert alloc["nvidia.com/gpu"] == str(sim.gpus)
        if sim.rdma_resource:
            assert alloc[sim.rdma_resource] == "1k"
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"
        assert not [t for t in node["spec"].get("taints") or [] if "not-ready" in t["key"]]
    # The default topology mixes label schemes: some RDMA nodes advertise only through NFD.
    nfd = [
        n for n in nodes.values() if "feature.node.kubernetes.io/rdma.available" in n["metadata"]["labels"]
    ]
    assert nfd and all("holmes.dev/nic" not in n["metadata"]["labels"] for n in nfd)
    assert {s.nic for s in cluster.topology.nodes} == {"infiniband", "roce", "ethernet"}


def test_pinned_pod_runs_with_resolved_env_and_volumes(cluster, namespace):
    target = cluster.topology.by_nic("roce")[-1].name
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg"},
        "data": {"layout.json": '{"worldSize": 8}', "greeting": "hi"},
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "sec"},
        "stringData": {"pw": "s3cret"},
    }
    script = """
        import json, os, socket
        out = {k: v for k, v in os.environ.items() if k.startswith(("MY_", "CFG_", "KUBERNETES_SERVICE"))}
        out["hostname"] = socket.gethostname()
        out["layout"] = open("/etc/holmes/layout.json").read()
        mounts = [line.split() for line in open("/proc/mounts")]
        out["shm_is_tmpfs"] = any(m[1] == "/dev/shm" and m[2] == "tmpfs" for m in mounts)
        open("/dev/shm/probe", "w").write("x")
        print("RESULT " + json.dumps(out))
    """
    p = pod("envpod", script, node=target, hostname="worker-0", subdomain="job")
    c = p["spec"]["containers"][0]
    c["env"] = [
        {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "MY_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "MY_APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "MY_GREETING", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}}},
        {"name": "MY_PW", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "pw"}}},
        {"name": "MY_EXPANDED", "value": "$(MY_NAME)@$(MY_NODE)"},
        {
            "name": "MY_MEM_MI",
            "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
        },
    ]
    c["envFrom"] = [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}]
    c["resources"] = {"limits": {"nvidia.com/gpu": "2", "memory": "3Gi"}}
    c["volumeMounts"] = [
        {"name": "cfg", "mountPath": "/etc/holmes", "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    p["spec"]["volumes"] = [
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    apply(cluster, namespace, cm, secret, p)
    done = cluster.wait_pod(namespace, "envpod")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["spec"]["nodeName"] == target
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    line = [
        ln for ln in cluster.pod_log(namespace, "envpod", "main").splitlines() if ln.startswith("RESULT ")
    ]
    got = json.loads(line[-1][len("RESULT ") :])
    assert got["MY_NAME"] == "envpod" and got["MY_NS"] == namespace
    assert got["MY_UID"] == done["metadata"]["uid"] and got["MY_APP"] == "envpod"
    assert got["MY_IP"] == done["status"]["podIP"] and got["MY_IP"].startswith("10.244.")
    assert got["MY_NODE"] == target and got["MY_EXPANDED"] == f"envpod@{target}"
    assert got["MY_GREETING"] == "hi" and got["MY_PW"] == "s3cret" and got["CFG_greeting"] == "hi"
    assert got["MY_MEM_MI"] == "3072"
    assert got["hostname"] == "worker-0" and got["layout"] == '{"worldSize": 8}'
    assert got["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert got["shm_is_tmpfs"]
    assert not os.path.exists("/dev/shm/probe"), "the pod's /dev/shm must be its own, not the host's"


def test_failing_command_gives_failed_with_exit_code(cluster, namespace):
    apply(cluster, namespace, pod("fails", "import sys; print('bye'); sys.exit(3)"))
    done = cluster.wait_pod(namespace, "fails")
    assert done["status"]["phase"] == "Failed"
    cs = done["status"]["containerStatuses"][0]
    assert cs["state"]["terminated"]["exitCode"] == 3 and cs["state"]["terminated"]["reason"] == "Error"
    assert cs["restartCount"] == 0
    assert "bye" in cluster.pod_log(namespace, "fails", "main")
    assert cluster.kubectl("logs", "fails", "-n", namespace).stdout == "bye\n"  # via the agent's log server


def test_on_failure_restarts_and_counts(cluster, namespace):
    # Fails twice, then succeeds; the counter lives in an emptyDir, which survives restarts.
    script = """
        import os, sys
        f = "/scratch/attempts"
        n = int(open(f).read()) if os.path.exists(f) else 0
        open(f, "w").write(str(n + 1))
        print("attempt", n)
        sys.exit(0 if n >= 2 else 7)
    """
    p = pod("flaky", script, restart="OnFailure", volumes=[{"name": "scratch", "emptyDir": {}}])
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    apply(cluster, namespace, p)
    done = cluster.wait_pod(namespace, "flaky", timeout=60)
    assert done["status"]["phase"] == "Succeeded"
    cs = done["status"]["containerStatuses"][0]
    assert cs["restartCount"] == 2
    assert cs["lastState"]["terminated"]["exitCode"] == 7
    assert cluster.pod_log(namespace, "flaky", "main").count("attempt") == 3
    assert cluster.kubectl("logs", "flaky", "-n", namespace).stdout == "attempt 2\n"
    assert cluster.kubectl("logs", "flaky", "-n", namespace, "--previous").stdout == "attempt 1\n"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_deleting_a_running_pod_ends_its_processes(cluster, namespace, tmp_path):
    # The container ignores SIGTERM and has a child: both must be gone after the grace period.
    script = """
        import os, signal, subprocess, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(["sleep", "1000"])
        open("/out/pids", "w").write(f"{os.getpid()} {child.pid}")
        time.sleep(1000)
    """
    p = pod("longrun", script, volumes=[{"name": "out", "hostPath": {"path": str(tmp_path)}}])
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "out", "mountPath": "/out"}]
    apply(cluster, namespace, p)
    running = cluster.wait_pod(namespace, "longrun", phases=("Running",))
    assert running["status"]["containerStatuses"][0]["state"]["running"]
    end = time.monotonic() + 20
    while not (tmp_path / "pids").exists() and time.monotonic() < end:
        time.sleep(0.1)
    pids = [int(x) for x in (tmp_path / "pids").read_text().split()]
    assert all(_alive(p) for p in pids)
    t0 = time.monotonic()
    cluster.kubectl(
        "delete", "pod", "longrun", "-n", namespace, "--grace-period=2", "--wait=true", timeout=30
    )
    took = time.monotonic() - t0
    end = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
    assert 1.5 <= took < 15, f"deletion took {took:.1f}s; expected the 2 s grace period, then SIGKILL"


def test_service_account_gets_only_what_rbac_allows(cluster, namespace):
    rbac = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    ]
    apply(cluster, namespace, *rbac)
    # The admission controller refuses the pod until its service account exists.
    end = time.monotonic() + 30
    while (
        not cluster.kubectl("get", "sa", "reader", "-n", namespace, "-o", "jsonpath={.metadata.name}").stdout
        and time.monotonic() < end
    ):
        time.sleep(0.2)
    script = """
        from kubernetes import client, config
        from kubernetes.client.rest import ApiException
        config.load_incluster_config()              # token + CA from /var/run/secrets/kubernetes.io/...
        ns = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
        v1 = client.CoreV1Api()
        names = [p.metadata.name for p in v1.list_namespaced_pod(ns).items]
        print("ALLOWED list pods:", names)
        try:
            v1.list_namespaced_secret(ns)
            print("UNEXPECTED secrets listed")
        except ApiException as e:
            print("FORBIDDEN list secrets:", e.status)
    """
    apply(cluster, namespace, pod("rbac", script, serviceAccountName="reader"))
    done = cluster.wait_pod(namespace, "rbac", timeout=60)
    out = cluster.pod_log(namespace, "rbac", "main")
    assert done["status"]["phase"] == "Succeeded", out
    assert "ALLOWED list pods: ['rbac']" in out
    assert "FORBIDDEN list secrets: 403" in out


def test_pods_find_each_other_by_name_and_share_ports(cluster, namespace):
    """Headless-Service style names resolve through the hosts file to pod IPs, so two pods can
    each listen on 29500 (like two jobs' rank-0 pods) and dial each other by name."""
    server = """
        import socket
        s = socket.create_server((socket.gethostbyname(socket.gethostname()), 29500))
        conn, _ = s.accept()
        conn.sendall(socket.gethostname().encode())
        conn.close()
    """
    client_src = """
        import socket, time
        deadline = time.monotonic() + 80      # the server pod may start later on a busy machine
        while True:
            try:
                c = socket.create_connection(("{host}.job.{ns}.svc", 29500), timeout=2)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise SystemExit(f"never reached {host}.job.{ns}.svc:29500: {{e}}")
                time.sleep(0.2)
        print("GOT", c.recv(100).decode())
    """
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "job"},
        "spec": {"clusterIP": "None", "selector": {"job": "j"}, "ports": [{"port": 29500}]},
    }
    docs = [headless]
    for i in range(2):
        srv = pod(f"srv-{i}", server, hostname=f"rank{i}", subdomain="job")
        srv["metadata"]["labels"]["job"] = "j"
        docs.append(srv)
        docs.append(pod(f"cli-{i}", client_src.format(host=f"rank{i}", ns=namespace)))
    apply(cluster, namespace, *docs)
    for i in range(2):
        done = cluster.wait_pod(namespace, f"cli-{i}", timeout=120)
        assert done["status"]["phase"] == "Succeeded", cluster.pod_log(namespace, f"cli-{i}", "main")
        assert f"GOT rank{i}" in cluster.pod_log(namespace, f"cli-{i}", "main")
        assert cluster.wait_pod(namespace, f"srv-{i}")["status"]["phase"] == "Succeeded"


def test_multi_container_pod_is_refused_with_a_clear_message(cluster, namespace):
    p = pod("two", "print(1)")
    p["spec"]["containers"].append({"name": "sidecar", "image": "x", "command": ["true"]})
    apply(cluster, namespace, p)
    done = cluster.wait_pod(namespace, "two")
    assert done["status"]["phase"] == "Failed"
    assert "exactly one container" in done["status"]["message"]


def test_init_containers_run_first_and_always_restarts_even_on_success(cluster, namespace):
    # The volume sits at /work, over the parent of this repo in the dev tree: .venv must stay visible.
    p = pod(
        "staged",
        "import time; print(open('/work/msg').read()); time.sleep(0.2)",
        restart="Always",
        volumes=[{"name": "work", "emptyDir": {}}],
    )
    p["spec"]["initContainers"] = [
        {
            "name": "prepare",
            "image": "x",
            "command": ["sh", "-c", "echo ready > /work/msg"],
            "volumeMounts": [{"name": "work", "mountPath": "/work"}],
        }
    ]
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "work", "mountPath": "/work"}]
    apply(cluster, namespace, p)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        st = cluster.get_json("pod", "staged", "-n", namespace)["status"]
        if st.get("containerStatuses") and st["containerStatuses"][0]["restartCount"] >= 2:
            break
        time.sleep(0.3)
    assert st["phase"] == "Running" and st["containerStatuses"][0]["restartCount"] >= 2, st
    init = st["initContainerStatuses"][0]["state"]["terminated"]
    assert init["exitCode"] == 0 and init["reason"] == "Completed"
    assert cluster.pod_log(namespace, "staged", "main").count("ready") >= 2
    events = cluster.get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=staged")
    assert {"Started"} <= {e["reason"] for e in events["items"]}


def test_a_powered_off_node_kills_its_pods_and_stays_deleted_until_powered_on(cluster, namespace, tmp_path):
    node = cluster.topology.names[-1]
    script = """
        import os, time
        open("/out/pid", "w").write(str(os.getpid()))
        time.sleep(1000)
    """
    p = pod("victim", script, node=node, volumes=[{"name": "out", "hostPath": {"path": str(tmp_path)}}])
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "out", "mountPath": "/out"}]
    apply(cluster, namespace, p)
    cluster.wait_pod(namespace, "victim", phases=("Running",))
    end = time.monotonic() + 20
    while not (tmp_path / "pid").exists() and time.monotonic() < end:
        time.sleep(0.1)
    pid = int((tmp_path / "pid").read_text())
    try:
        cluster.power(node, on=False)
        end = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < end:
            time.sleep(0.1)
        assert not _alive(pid), "the machine is off: its processes are gone"
        cluster.kubectl("delete", "node", node, "--wait=true", timeout=30)
        time.sleep(12)  # longer than a heartbeat: a powered node would have registered again
        assert cluster.kubectl("get", "node", node, check=False).returncode != 0
        # nothing is reported for a dark node's pods: the API still says Running
        assert cluster.get_json("pod", "victim", "-n", namespace)["status"]["phase"] == "Running"
    finally:
        cluster.power(node, on=True)
    end = time.monotonic() + 10
    while cluster.kubectl("get", "node", node, check=False).returncode != 0 and time.monotonic() < end:
        time.sleep(0.2)
    ready = cluster.get_json("node", node)["status"]["conditions"]
    assert {"type": "Ready", "status": "True"}.items() <= next(
        c for c in ready if c["type"] == "Ready"
    ).items()
    cluster.kubectl("delete", "pod", "victim", "-n", namespace, "--grace-period=0", "--force", check=False)
