"""Pure parts of the localkube harness: topology files, env resolution, hosts files (no cluster)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from localkube import podspec as ps
from localkube.topology import TopologyError, differences_but_players, load_topology, parse_topology

TOPOLOGIES = Path(__file__).resolve().parents[3] / "hack" / "topologies"


def test_shipped_topologies():
    default = load_topology(TOPOLOGIES / "default.yaml")
    assert {k: len(default.by_nic(k)) for k in ("infiniband", "roce", "ethernet")} == {
        "infiniband": 2,
        "roce": 2,
        "ethernet": 2,
    }
    assert len({n.cluster for n in default.nodes}) == 2
    schemes = {n.advertise for n in default.nodes}
    assert {"holmes", "nfd"} <= schemes
    paper = load_topology(TOPOLOGIES / "paper.yaml")
    assert [n.nic for n in paper.nodes].count("infiniband") == 4
    assert [n.nic for n in paper.nodes].count("roce") == 4
    real = load_topology(TOPOLOGIES / "real-nodes.yaml")
    assert {n.played_by for n in real.nodes} == {"kubelet"} and len({n.cluster for n in real.nodes}) == 2
    assert {n.played_by for n in default.nodes} == {"agent"}  # the agent stays the default
    dra = load_topology(TOPOLOGIES / "real-nodes-dra.yaml")
    assert all(n.dra and n.played_by == "kubelet" and n.advertise == "none" for n in dra.nodes)
    assert [n.name for n in dra.nodes] == [n.name for n in real.nodes]  # the same nodes, with DRA
    assert all(n.gpus == 8 for n in paper.nodes)
    mixed = load_topology(TOPOLOGIES / "mixed.yaml")
    assert [n.played_by for n in mixed.nodes] == ["agent"] * 2 + ["kwok"] * 4
    assert all(n.taints and n.gpus == 8 for n in mixed.played_by("kwok").nodes)


def test_default_real_is_the_default_topology_on_real_kubelets():
    """HOLMES_E2E_TOPOLOGY's file (make e2e-on-real-nodes) must not drift from default.yaml."""
    default = load_topology(TOPOLOGIES / "default.yaml")
    real = load_topology(TOPOLOGIES / "default-real.yaml")
    assert differences_but_players(default, real) == []
    assert {n.played_by for n in real.nodes} == {"kubelet"}
    moved = parse_topology({"nodes": [{"name": "ib-1", "cluster": "west", "nic": "infiniband"}]})
    diff = differences_but_players(default, moved)
    assert "node ib-0 missing" in diff and any(d.startswith("node ib-1 differs") for d in diff)


def test_the_example_node_list_is_what_the_agent_registers():
    """examples/nodes/default.yaml (holmes plan's example, the operator's pure tests) must not
    drift from the default topology."""
    example = yaml.safe_load((TOPOLOGIES.parents[1] / "examples" / "nodes" / "default.yaml").read_text())
    assert example["items"] == [n.node_object() for n in load_topology(TOPOLOGIES / "default.yaml").nodes]


def test_label_schemes():
    t = parse_topology(
        {
            "nodes": [
                {"name": "a", "cluster": "x", "nic": "roce", "gbps": 100, "advertise": "holmes"},
                {
                    "name": "b",
                    "cluster": "x",
                    "nic": "infiniband",
                    "advertise": "nfd",
                    "rdmaResource": "rdma/hca",
                },
                {"name": "c", "cluster": "y", "nic": "ethernet", "advertise": "nfd"},
            ]
        }
    )
    a, b, c = t.nodes
    assert a.labels["holmes.dev/nic"] == "roce" and a.labels["holmes.dev/nic-gbps"] == "100"
    assert "holmes.dev/nic" not in b.labels
    assert b.labels["feature.node.kubernetes.io/rdma.available"] == "true"
    assert b.allocatable["rdma/hca"] == "1k"
    assert not any(k.startswith("feature.node") for k in c.labels)  # NFD finds no Mellanox NIC
    assert c.node_object()["metadata"]["annotations"]["localkube.holmes.dev/true-nic"] == "ethernet"


@pytest.mark.parametrize(
    "doc, fragment",
    [
        ({}, "non-empty 'nodes'"),
        ({"nodes": [{"name": "a", "cluster": "x", "nic": "myrinet"}]}, "nic must be one of"),
        ({"nodes": [{"name": "a", "cluster": "x", "nic": "roce", "colour": 1}]}, "unknown keys"),
        ({"nodes": [{"name": "a", "nic": "roce"}]}, "'cluster' is required"),
        ({"nodes": [{"name": "a", "cluster": "x", "nic": "roce"}] * 2}, "duplicate node name"),
        (
            {"nodes": [{"name": "a", "cluster": "x", "nic": "ethernet", "rdmaResource": "rdma/x"}]},
            "cannot advertise RDMA",
        ),
        (
            {"nodes": [{"name": "a", "cluster": "x", "nic": "roce", "playedBy": "kwk"}]},
            r"nodes\[0\]: playedBy must be one of \('agent', 'kubelet', 'kwok'\) .*a hollow node.*'kwk'",
        ),
        (
            {"nodes": [{"name": "a", "cluster": "x", "nic": "roce", "taints": "pool"}]},
            r"nodes\[0\]: taints must be a list of \{key, value \(optional\), effect\} mappings, e\.g\.",
        ),
        (
            {
                "nodes": [
                    {"name": "a", "cluster": "x", "nic": "roce", "taints": [{"key": "p", "effect": "No"}]}
                ]
            },
            r"nodes\[0\]: taints\[0\]: effect must be one of \('NoSchedule', 'PreferNoSchedule', 'NoEx",
        ),
        (
            {"nodes": [{"name": "a", "cluster": "x", "nic": "roce", "taints": [{"effect": "NoSchedule"}]}]},
            r"taints\[0\]: expected a mapping with key",
        ),
        (
            {"nodes": [{"name": "a", "cluster": "x", "nic": "roce"}], "kwok": {"leaseSeconds": 0}},
            r"kwok\.leaseSeconds must be seconds > 0, got 0",
        ),
        (
            {"nodes": [{"name": "a", "cluster": "x", "nic": "roce"}], "kwok": {"parallelism": 1.5}},
            r"kwok\.parallelism must be a whole number >= 1",
        ),
        (
            {"nodes": [{"name": "a", "cluster": "x", "nic": "roce"}], "kwok": {"lease": 2}},
            r"kwok: expected a mapping with keys among \['leaseSeconds', 'parallelism', ",
        ),
        (
            {"nodes": [{"name": "a", "cluster": "x", "nic": "roce"}], "kwk": {}},
            r"unknown top-level keys \['kwk'\]; allowed: \['defaults', 'kwok', 'nodes'\]",
        ),
    ],
)
def test_bad_topologies_say_what_to_fix(doc, fragment):
    with pytest.raises(TopologyError, match=fragment):
        parse_topology(doc)


def test_a_mixed_topology_says_who_plays_each_node():
    """agent, kubelet and kwok nodes in one file; kwok nodes carry their labels, annotations,
    taints and resources into the Node kwok plays, with the kwok annotation it manages by."""
    from localkube import hollow_nodes as hn
    from localkube.topology import AGENT, KUBELET, KWOK, KwokSettings

    taint = {"key": "pool", "value": "hollow", "effect": "NoSchedule"}
    t = parse_topology(
        {
            "defaults": {"gpus": 4, "cpu": "96", "memory": "1Ti"},
            "kwok": {"leaseSeconds": 2, "startSeconds": 0.2, "statusSeconds": 60, "parallelism": 4},
            "nodes": [
                {"name": "a", "cluster": "x", "nic": "roce"},
                {"name": "k", "cluster": "x", "nic": "roce", "playedBy": "kubelet"},
                {
                    "name": "h",
                    "cluster": "y",
                    "nic": "infiniband",
                    "playedBy": "kwok",
                    "rdmaResource": "rdma/hca",
                    "labels": {"pool": "hollow"},
                    "annotations": {"team": "a"},
                    "taints": [taint, {"key": "spot", "effect": "PreferNoSchedule"}],
                },
            ],
        }
    )
    assert [n.names for n in (t.played_by(AGENT), t.played_by(KUBELET), t.played_by(KWOK))] == [
        ["a"],
        ["k"],
        ["h"],
    ]
    assert t.kwok == KwokSettings(lease_seconds=2.0, status_seconds=60.0, start_seconds=0.2, parallelism=4)
    assert t.played_by(KWOK).kwok == t.kwok
    assert t.node("a").node_object()["spec"] == {}
    body = hn.node_body(t.node("h"))
    assert body["metadata"]["labels"]["pool"] == "hollow" and body["metadata"]["labels"]["holmes.dev/nic"]
    assert body["metadata"]["annotations"] == {
        "localkube.holmes.dev/true-nic": "infiniband",
        "team": "a",
        hn.KWOK_NODE: hn.KWOK_MANAGED,
    }
    assert body["spec"]["taints"] == [taint, {"key": "spot", "effect": "PreferNoSchedule"}]
    alloc = body["status"]["allocatable"]
    assert (alloc["cpu"], alloc["memory"], alloc["nvidia.com/gpu"], alloc["rdma/hca"]) == (
        "96",
        "1Ti",
        "4",
        "1k",
    )
    assert "conditions" not in body["status"]
    assert parse_topology({"nodes": [{"name": "a", "cluster": "x", "nic": "roce"}]}).kwok == KwokSettings()


POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "a"}},
    "spec": {"nodeName": "ib-0", "hostname": "w0", "subdomain": "job"},
    "status": {"podIP": "127.16.0.1"},
}


def test_env_order_expansion_and_refs():
    cms = {("ns", "cm"): {"A": "1", "B": "2"}}
    secrets = {("ns", "s"): {"pw": "x"}}
    container = {
        "name": "c",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "P_"}],
        "env": [
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "URL", "value": "$(POD):$(P_A)/$(NOPE)/$$(POD)"},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k", "optional": True}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        ],
        "command": ["run", "$(URL)"],
    }
    env = ps.resolve_env(
        POD, container, {"PATH": "/bin"}, lambda n, k: cms.get((n, k)), lambda n, k: secrets.get((n, k))
    )
    assert env["P_A"] == "1" and env["URL"] == "p:1/$(NOPE)/$(POD)" and env["PW"] == "x"
    assert "OPT" not in env and env["APP"] == "a" and env["PATH"] == "/bin"
    assert ps.container_argv(container, env) == ["run", "p:1/$(NOPE)/$(POD)"]


def test_missing_reference_is_retried_and_images_without_command_refused():
    container = {
        "name": "c",
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}],
    }
    with pytest.raises(ps.ConfigError, match='configmap "cm" not found'):
        ps.resolve_env(POD, container, {}, lambda *_: None, lambda *_: None)
    with pytest.raises(ps.ConfigError, match="couldn't find key k"):
        ps.resolve_env(POD, container, {}, lambda *_: {"other": "1"}, lambda *_: None)
    with pytest.raises(ps.Unsupported, match="runs commands, not images"):
        ps.container_argv({"name": "c", "image": "nginx"}, {})
    with pytest.raises(ps.Unsupported, match="fieldPath"):
        ps.field_value(POD, "status.nonsense")


def test_hosts_file_scopes_short_names_to_the_namespace():
    other = {"metadata": {"name": "q", "namespace": "other"}, "spec": {"hostname": "w0", "subdomain": "job"}}
    entries = [("127.16.0.1", n, s) for n, s in ps.host_names(POD)] + [
        ("127.16.0.9", n, s) for n, s in ps.host_names(other)
    ]
    text = ps.render_hosts(POD, "127.16.0.1", entries)
    assert "127.16.0.1\tw0.job.ns.svc.cluster.local w0.job.ns.svc w0" in text
    assert "127.16.0.9\tw0.job.other.svc" in text  # fully qualified: visible everywhere
    assert "127.16.0.9\tw0.job\n" not in text  # short name of another namespace: not
    assert "127.16.0.1\tw0.job\n" in text


def test_restart_policy_and_backoff():
    assert ps.restart_wanted("Always", 0) and ps.restart_wanted("OnFailure", 1)
    assert not ps.restart_wanted("OnFailure", 0) and not ps.restart_wanted("Never", 1)
    assert ps.backoff_seconds(1) == 0.5 and ps.backoff_seconds(3) == 2 and ps.backoff_seconds(20) == 10
    assert (
        ps.resource_value(
            {"resources": {"limits": {"memory": "1Gi"}}}, {"resource": "limits.memory", "divisor": "1Mi"}, {}
        )
        == "1024"
    )
    assert ps.resource_value({}, {"resource": "limits.cpu"}, {"cpu": "32"}) == "32"


def test_down_signals_only_processes_of_its_own_state_dir(tmp_path):
    """cluster.json outlives its processes (a killed session, a reboot): a recorded PID now used
    by another process must survive `down`; one started for this state dir is stopped."""
    import json
    import subprocess

    from localkube.controlplane import ControlPlane

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    stranger = subprocess.Popen(sleeper)
    ours = subprocess.Popen([*sleeper, f"--state-dir={tmp_path}"])
    try:
        (tmp_path / "cluster.json").write_text(
            json.dumps({"pids": {"etcd": stranger.pid, "node-agent": ours.pid}})
        )
        ControlPlane(tmp_path).down(log=lambda m: None, grace=5)
        ours.wait(5)  # stopped (down reaped it: no exit status here)
        assert stranger.poll() is None, "down killed a process that is not the cluster's"
        assert json.loads((tmp_path / "cluster.json").read_text())["pids"] == {}
    finally:
        for p in (stranger, ours):
            p.kill()
            p.wait()


def test_a_test_outside_e2e_cannot_start_a_control_plane(tmp_path):
    """What keeps `make unit` and `make integration` free of the Kubernetes build: tests/conftest.py
    refuses a control plane outside tests/e2e."""
    from localkube.controlplane import ControlPlane

    with pytest.raises(RuntimeError, match="outside tests/e2e"):
        ControlPlane(tmp_path).up(TOPOLOGIES / "default.yaml")


# Listens on the port it is given; when it stops, a forked child keeps the listening socket
# a second longer: the leader of a multi-threaded process that is gone while a thread still
# holds the files (what made a restarted API server exit with "address already in use").
_LINGERING_LISTENER = """
import os, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
parent = os.getpid()
if os.fork() == 0:
    while os.getppid() == parent:
        time.sleep(0.02)
    time.sleep(1.0)
    os._exit(0)
time.sleep(60)
"""


def test_a_restarted_component_starts_only_once_its_old_port_is_free(tmp_path):
    import json
    import subprocess
    import time

    from localkube.controlplane import ControlPlane, pick_ports, pid_alive, port_free

    port = pick_ports(None)
    (tmp_path / "logs").mkdir()
    argv = [sys.executable, "-c", _LINGERING_LISTENER, str(port), f"--state-dir={tmp_path}"]
    first = subprocess.Popen(argv, start_new_session=True)
    cp = ControlPlane(tmp_path)
    (tmp_path / "cluster.json").write_text(json.dumps({"pids": {"etcd": first.pid}, "etcdPort": port}))
    try:
        for _ in range(100):  # listening
            if not port_free(port):
                break
            time.sleep(0.02)
        cp.restart("etcd", timeout=10)
        first.wait(5)
        time.sleep(1.5)  # a second start that lost the bind race has exited by now
        again = cp.state()["pids"]["etcd"]
        assert again != first.pid and pid_alive(again), (tmp_path / "logs" / "etcd.log").read_text()[-500:]
    finally:
        cp.down(log=lambda m: None, grace=2)
        first.kill()
