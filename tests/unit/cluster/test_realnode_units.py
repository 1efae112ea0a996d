"""Real nodes' plans and configurations (hack/localkube/realnode.py), the topology field that asks
for them, and the pause image's archive (hack/holmes_dev/ociarchive.py): pure, nothing started."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
from pathlib import Path

import pytest
import tomllib
from holmes_dev import ociarchive

from localkube import podnet, realnode
from localkube.topology import AGENT, KUBELET, TopologyError, parse_topology

SUBNET = ipaddress.IPv4Network("10.231.0.0/16")
PLAN = realnode.NodePlan("rk-0", 40, Path("/state/nodes/rk-0"), 10250, realnode.node_subnet(SUBNET, 40))


def test_played_by_defaults_to_the_agent_and_kubelet_nodes_are_split_off():
    topo = parse_topology(
        {
            "defaults": {"playedBy": KUBELET},
            "nodes": [
                {"name": "a", "cluster": "east", "nic": "roce"},
                {"name": "b", "cluster": "west", "nic": "roce", "playedBy": AGENT},
            ],
        }
    )
    assert [n.played_by for n in topo.nodes] == [KUBELET, AGENT]
    assert topo.played_by(KUBELET).names == ["a"] and topo.played_by(AGENT).names == ["b"]
    plain = parse_topology({"nodes": [{"name": "c", "cluster": "x", "nic": "ethernet"}]})
    assert plain.nodes[0].played_by == AGENT


def test_a_bad_played_by_names_the_field_and_the_choices():
    with pytest.raises(
        TopologyError, match=r"nodes\[0\]: playedBy must be one of \('agent', 'kubelet', 'kwok'\).*'hollow'"
    ):
        parse_topology({"nodes": [{"name": "a", "cluster": "x", "nic": "roce", "playedBy": "hollow"}]})


def test_each_node_and_fabric_gets_its_own_slash24_and_the_node_its_gateway():
    assert PLAN.subnet == ipaddress.IPv4Network("10.231.40.0/24")
    assert (PLAN.gateway, PLAN.bridge, PLAN.cgroup) == ("10.231.40.1", "lkn40", "lk40-rk-0")
    assert realnode.fabric_subnet(SUBNET, 41) == ipaddress.IPv4Network("10.232.41.0/24")
    assert podnet.REAL_BRIDGE.match("lkn40") and podnet.REAL_BRIDGE.match("lkf7")
    assert not podnet.REAL_BRIDGE.match("holmes-pods0") and not podnet.REAL_BRIDGE.match("lkn40x")


def test_the_fabric_is_the_island_and_must_make_a_nad_name():
    topo = parse_topology({"nodes": [{"name": "a", "cluster": "East", "nic": "roce"}]})
    assert realnode.fabric_of(topo.nodes[0]) == "east-roce"
    bad = parse_topology({"nodes": [{"name": "a", "cluster": "east_1", "nic": "roce"}]})
    with pytest.raises(realnode.RealNodeError, match="node a: .*'east_1-roce', not a DNS label"):
        realnode.fabric_of(bad.nodes[0])


def test_containerd_config_is_version_3_with_what_this_sandbox_needs():
    cfg = tomllib.loads(realnode.containerd_config(PLAN, Path("/cache/cni/bin")))
    assert cfg["version"] == 3
    assert (cfg["root"], cfg["state"]) == (
        "/state/nodes/rk-0/containerd/root",
        "/state/nodes/rk-0/containerd/state",
    )
    assert cfg["grpc"]["address"] == "/state/nodes/rk-0/containerd/containerd.sock"
    runtime = cfg["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE here
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"SystemdCgroup": False, "Root": "/state/nodes/rk-0/runc"}
    assert runtime["cni"]["bin_dirs"] == ["/cache/cni/bin"]
    assert runtime["cni"]["conf_dir"] == "/state/nodes/rk-0/cni/net.d"
    assert cfg["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == realnode.PAUSE_REF
    assert "io.containerd.nri.v1.nri" in cfg["disabled_plugins"]  # one socket per machine
    assert runtime["cdi_spec_dirs"] == ["/state/nodes/rk-0/cdi"]  # the node's DRA plugin writes there


def dra_topology(**node) -> object:
    return parse_topology(
        {"nodes": [{"name": "rk-0", "cluster": "east", "nic": "infiniband", "playedBy": KUBELET, **node}]}
    )


def test_a_dra_node_has_its_gpus_and_nics_in_slices_not_extended_resources():
    (node,) = dra_topology(dra=True, gpus=2, advertise="none").nodes
    assert node.dra and "nvidia.com/gpu" not in node.allocatable
    assert not any(k.startswith("holmes.dev/nic") for k in node.labels)
    (plain,) = dra_topology(gpus=2, rdmaResource="rdma/ib").nodes
    assert not plain.dra and plain.allocatable["nvidia.com/gpu"] == "2" and realnode.dra_devices(plain) == {}
    devices = realnode.dra_devices(node)
    assert sorted(devices) == [realnode.NIC_DRIVER, realnode.GPU_DRIVER]
    root = lambda d: d["attributes"][realnode.PCIE_ROOT]["string"]  # noqa: E731
    gpus = {d["name"]: root(d) for d in devices[realnode.GPU_DRIVER]}
    nics = {d["name"]: root(d) for d in devices[realnode.NIC_DRIVER] if d["name"] != "eth0"}
    assert gpus == {"gpu-0": "pci0000:10", "gpu-1": "pci0000:20"}
    # one NIC per root, numbered against the GPUs: pairing by name would cross the roots
    assert nics == {"nic-0": "pci0000:20", "nic-1": "pci0000:10"}
    (roce,) = dra_topology(dra=True, gpus=1, nic="roce").nodes
    (nic,) = [d for d in realnode.dra_devices(roce)[realnode.NIC_DRIVER] if d["name"] != "eth0"]
    assert nic["attributes"]["dra.net/encapsulation"] == {"string": "ether"}  # RoCE
    (eth,) = dra_topology(dra=True, gpus=1, nic="ethernet").nodes
    assert [d["name"] for d in realnode.dra_devices(eth)[realnode.NIC_DRIVER]] == ["eth0"]


def test_holmes_plans_a_dra_node_from_the_slices_its_plugin_publishes():
    """What the plugin publishes is what Holmes' discovery reads as DRANET's and NVIDIA's: the
    node's NIC kind, its GPUs and their products, and a NIC beside each GPU."""
    from holmes.plan import discovery, dra

    (node,) = dra_topology(dra=True, gpus=2, advertise="none").nodes
    slices = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"rk-0-{driver}"},
            "spec": {
                "driver": driver,
                "nodeName": "rk-0",
                "pool": {"name": "rk-0", "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }
        for driver, devices in realnode.dra_devices(node).items()
    ]
    (joined,) = dra.join([node.node_object()], slices)
    nic = discovery.classify_node(joined)
    assert (nic.source, nic.nic, nic.gpus, nic.gpu_source) == ("dra", "infiniband", 2, "dra"), nic
    assert (
        not nic.problems and nic.gpu_product == realnode.DRA_GPU_PRODUCT and nic.hcas == ("mlx5_0", "mlx5_1")
    )
    assert nic.devices is not None and nic.devices.aligned_pairs(2)


def test_dra_is_for_real_nodes_and_replaces_the_rdma_resource():
    with pytest.raises(TopologyError, match=r"nodes\[0\]: dra: true needs playedBy: kubelet"):
        dra_topology(dra=True, playedBy=AGENT)
    with pytest.raises(TopologyError, match=r"nodes\[0\]: a dra: true node .*remove rdmaResource 'rdma/ib'"):
        dra_topology(dra=True, rdmaResource="rdma/ib")
    with pytest.raises(TopologyError, match=r"nodes\[0\]: dra must be true or false, got 'yes'"):
        dra_topology(dra="yes")


def test_kubelet_config_is_the_nodes_own_and_touches_nothing_shared():
    cfg = realnode.kubelet_config(PLAN, Path("/state/pki/kubelet-ca.crt"), 110)
    assert (cfg["address"], cfg["port"], cfg["clusterDNS"]) == ("10.231.40.1", 10250, ["10.231.40.1"])
    assert cfg["containerRuntimeEndpoint"] == "unix:///state/nodes/rk-0/containerd/containerd.sock"
    assert (cfg["cgroupDriver"], cfg["cgroupRoot"], cfg["failCgroupV1"]) == ("cgroupfs", "/lk40-rk-0", False)
    assert cfg["podLogsDir"] == "/state/nodes/rk-0/pod-logs"
    assert cfg["makeIPTablesUtilChains"] is False
    assert cfg["authentication"]["anonymous"] == {"enabled": False}
    assert cfg["authentication"]["x509"] == {"clientCAFile": "/state/pki/kubelet-ca.crt"}
    assert (cfg["readOnlyPort"], cfg["healthzPort"]) == (0, 0)


def test_the_pod_network_routes_through_the_bridge_without_the_plugin_turning_on_ip_forward(tmp_path):
    conf = realnode.bridge_conflist(PLAN, tmp_path)
    (bridge,) = conf["plugins"]
    assert (bridge["bridge"], bridge["isGateway"], bridge["ipMasq"]) == ("lkn40", False, False)
    assert bridge["ipam"]["ranges"] == [
        [{"subnet": "10.231.40.0/24", "rangeStart": "10.231.40.2", "gateway": "10.231.40.1"}]
    ]
    assert bridge["ipam"]["routes"] == [{"dst": "0.0.0.0/0", "gw": "10.231.40.1"}]
    multus = realnode.multus_conf(PLAN, Path("/state/kubeconfig"), conf, Path("/cache/cni/bin"))
    assert (multus["type"], multus["delegates"], multus["binDir"]) == ("multus", [conf], "/cache/cni/bin")
    assert multus["kubeconfig"] == "/state/kubeconfig"


def test_a_fabrics_attachment_is_a_bridge_of_its_own_in_the_default_namespace(tmp_path):
    nad = realnode.network_attachment("east-roce", 41, realnode.fabric_subnet(SUBNET, 41), tmp_path)
    assert nad["kind"] == "NetworkAttachmentDefinition" and nad["metadata"]["namespace"] == "default"
    cfg = json.loads(nad["spec"]["config"])
    assert (cfg["name"], cfg["type"], cfg["bridge"], cfg["isGateway"]) == (
        "east-roce",
        "bridge",
        "lkf41",
        False,
    )
    assert cfg["ipam"] == {
        "type": "host-local",
        "dataDir": str(tmp_path),
        "ranges": [[{"subnet": "10.232.41.0/24"}]],
    }


def test_coredns_binds_only_the_nodes_addresses_and_no_fixed_port():
    text = realnode.corefile(["10.231.40.1", "10.231.41.1"], Path("/state/kubeconfig"))
    assert "bind 10.231.40.1 10.231.41.1" in text
    assert "kubeconfig /state/kubeconfig localkube" in text and "kubernetes cluster.local" in text
    for fixed in ("health", "ready", "prometheus", "0.0.0.0"):
        assert fixed not in text


def test_the_corefile_uses_only_plugins_the_built_coredns_has():
    """bin/coredns is hack/coredns, CoreDNS with a chosen set of plugins (hack/build-node.sh): a
    directive of another plugin would fail at start ("unknown directive")."""
    text = realnode.corefile(["10.231.40.1"], Path("/state/kubeconfig"))
    directives, depth = set(), 0
    for line in text.splitlines():
        if depth == 1 and line.strip() not in ("", "}"):
            directives.add(line.split()[0])
        depth += line.count("{") - line.count("}")
    assert directives == {"bind", "errors", "kubernetes"}
    main = (Path(realnode.__file__).parents[1] / "coredns" / "main.go").read_text()
    for d in directives:
        assert f'"github.com/coredns/coredns/plugin/{d}"' in main, f"hack/coredns/main.go lacks {d}"


def test_kube_proxy_is_nftables_scoped_to_the_clusters_addresses_and_leaves_the_machine_alone():
    cfg = realnode.kube_proxy_config(Path("/k"), "rk-0", SUBNET, ["10.231.40.1", "10.231.41.1"], (5001, 5002))
    assert cfg["kind"] == "KubeProxyConfiguration" and cfg["mode"] == "nftables"
    assert cfg["hostnameOverride"] == "rk-0" and cfg["clientConnection"]["kubeconfig"] == "/k"
    # its servers on a node's bridge address, never 0.0.0.0 (the defaults) or fixed ports
    assert cfg["healthzBindAddress"] == "10.231.40.1:5001" and cfg["metricsBindAddress"] == "10.231.40.1:5002"
    # NodePorts only on the nodes' own addresses (not the machine's), pods' traffic not masqueraded
    assert cfg["nodePortAddresses"] == ["10.231.40.1/32", "10.231.41.1/32"]
    assert cfg["detectLocalMode"] == "ClusterCIDR" and cfg["clusterCIDR"] == "10.231.0.0/16"
    # 0: the machine's conntrack sysctls and kube-proxy's OOM score are not set
    assert set(cfg["conntrack"].values()) == {0, "0s"} and cfg["oomScoreAdj"] == 0


def test_mountpoints_under_a_dir_come_deepest_first_with_escapes_undone():
    info = "\n".join(
        [
            "22 27 0:21 / /proc rw - proc proc rw",
            "90 27 0:50 / /state/nodes/rk-0/kubelet/pods/u/volumes/a\\040b rw - tmpfs tmpfs rw",
            "91 27 0:51 / /state/nodes/rk-0/containerd/state/x/rootfs rw - overlay overlay rw",
            "92 27 0:52 / /state/nodes/rk-0/containerd/state/x/rootfs/dev rw - tmpfs tmpfs rw",
            "93 27 0:53 / /state/nodes/rk-00/other rw - tmpfs tmpfs rw",
        ]
    )
    assert realnode.mountpoints_under(info, Path("/state/nodes/rk-0")) == [
        "/state/nodes/rk-0/containerd/state/x/rootfs/dev",
        "/state/nodes/rk-0/kubelet/pods/u/volumes/a b",
        "/state/nodes/rk-0/containerd/state/x/rootfs",
    ]


def test_only_the_shims_of_our_own_containerd_sockets_are_ours():
    procs = {
        10: [
            "/cache/bin/containerd-shim-runc-v2",
            "-namespace",
            "k8s.io",
            "-id",
            "a",
            "-address",
            "/s/ours.sock",
        ],
        11: [
            "/usr/bin/containerd-shim-runc-v2",
            "-namespace",
            "k8s.io",
            "-id",
            "b",
            "-address",
            "/run/theirs",
        ],
        12: ["python", "-address", "/s/ours.sock"],
    }
    assert realnode.shim_pids(procs, {"/s/ours.sock"}) == [10]


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def test_the_pause_archive_is_an_oci_layout_named_for_ctr_and_reproducible():
    archive = ociarchive.image_archive(b"\x7fELF...", "pause", "localhost/holmes-pause:1")
    assert archive == ociarchive.image_archive(b"\x7fELF...", "pause", "localhost/holmes-pause:1")
    files = _members(archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():  # every blob is stored under its own digest
        if name.startswith("blobs/sha256/"):
            assert name.rsplit("/", 1)[1] == hashlib.sha256(data).hexdigest()
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/holmes-pause:1"
    manifest = json.loads(files["blobs/sha256/" + entry["digest"].split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["config"] == {"Entrypoint": ["/pause"], "User": "65535:65535"}
    layer = _members(files["blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1]])
    assert layer == {"pause": b"\x7fELF..."}
    with pytest.raises(ValueError, match="full reference with a tag"):
        ociarchive.image_archive(b"", "pause", "holmes-pause")


def test_a_nodes_store_links_the_seeds_immutable_parts_and_copies_the_rest(tmp_path):
    import os

    seed, root = tmp_path / "seed", tmp_path / "node" / "containerd" / "root"
    files = {
        "io.containerd.content.v1.content/blobs/sha256/ab": b"manifest",
        "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/bin/sh": b"ELF",
        "io.containerd.snapshotter.v1.overlayfs/metadata.db": b"snapshots",
        "io.containerd.metadata.v1.bolt/meta.db": b"images",
        "io.containerd.grpc.v1.introspection/uuid": b"the seed's",
    }
    for name, data in files.items():
        (seed / name).parent.mkdir(parents=True, exist_ok=True)
        (seed / name).write_bytes(data)
    (seed / "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/lib").symlink_to("usr/lib")
    (seed / "io.containerd.snapshotter.v1.overlayfs/snapshots/1/work").mkdir()
    (root / "stale").mkdir(parents=True)  # the last cluster's copy is replaced
    realnode.clone_store(seed, root)
    inode = lambda p: os.lstat(p).st_ino  # noqa: E731
    for name in list(files)[:2]:  # the same files: no bytes per node
        assert inode(root / name) == inode(seed / name)
    for name in list(files)[2:4]:  # each containerd writes its own databases
        assert (root / name).read_bytes() == files[name] and inode(root / name) != inode(seed / name)
    assert not (root / "io.containerd.grpc.v1.introspection/uuid").exists() and not (root / "stale").exists()
    assert os.readlink(root / "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/lib") == "usr/lib"
    assert (root / "io.containerd.snapshotter.v1.overlayfs/snapshots/1/work").is_dir()


def test_a_layers_snapshot_is_named_by_its_chain_id_as_the_oci_image_spec_defines():
    a, b, c = (f"sha256:{x * 64}" for x in "abc")
    ab = "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    assert realnode.chain_ids([a, b, c]) == [
        a,
        ab,
        "sha256:" + hashlib.sha256(f"{ab} {c}".encode()).hexdigest(),
    ]
    assert realnode.chain_ids([]) == []


def test_a_stored_images_archive_holds_its_manifest_and_config_named_for_ctr_and_no_layer():
    config, manifest = b'{"rootfs":{}}', b'{"schemaVersion":2}'
    files = _members(ociarchive.layout("localhost/holmes-trainer:0.1.0", manifest, "application/x", [config]))
    index = json.loads(files["index.json"])["manifests"][0]
    assert (
        index["digest"] == "sha256:" + hashlib.sha256(manifest).hexdigest()
        and index["mediaType"] == "application/x"
    )
    assert index["annotations"][ociarchive.IMAGE_NAME] == "localhost/holmes-trainer:0.1.0"
    blobs = {n for n in files if n.startswith("blobs/")}
    assert blobs == {f"blobs/sha256/{hashlib.sha256(b).hexdigest()}" for b in (config, manifest)}


def test_the_seeds_containerd_runs_no_cri_on_its_own_socket():
    cfg = tomllib.loads(realnode.seed_config(Path("/c/node/seed"), Path("/c/node/seed-state")))
    assert cfg["root"] == "/c/node/seed" and cfg["grpc"]["address"] == "/c/node/seed-state/containerd.sock"
    assert {"io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"} <= set(cfg["disabled_plugins"])


class _FakeControlPlane:
    """What RealNodes and stop_kube_proxy use of a ControlPlane: its dir, state and spawn."""

    def __init__(self, d: Path):
        self.dir, self.kubeconfig, self.spawned = d, d / "kubeconfig", []

    def _save(self, st: dict) -> None:
        pass

    def _spawn(self, st: dict, name: str, argv: list[str], pass_fds: tuple[int, ...] = ()) -> None:
        import fcntl
        import os

        # the child would hold the lock through the passed descriptor: a dup stands for it
        self.held = os.dup(pass_fds[0])
        fcntl.flock(self.held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st["pids"][name] = 4242
        self.spawned.append(argv)

    def _alive(self, pid) -> bool:
        return False


def test_one_kube_proxy_per_machine_a_second_cluster_starts_none_and_never_deletes_its_tables(
    tmp_path, monkeypatch
):
    import os

    from holmes_dev import ports

    monkeypatch.setattr(podnet, "LOCK_DIR", tmp_path / "locks")
    monkeypatch.setattr(ports, "free_port", lambda host="": 5000)
    ran: list[list[str]] = []
    monkeypatch.setattr(realnode, "_run", lambda argv, check=True, **kw: ran.append(argv) or "table")
    first, second = _FakeControlPlane(tmp_path / "a"), _FakeControlPlane(tmp_path / "b")
    sts = [{"pids": {}}, {"pids": {}}]
    for cp, st in zip((first, second), sts, strict=True):
        cp.dir.mkdir()
        nodes = realnode.RealNodes(cp, st, {"kube-proxy": "/bin/kube-proxy"}, lambda m: None)
        monkeypatch.setattr(nodes, "_poll", lambda *a: None)
        nodes._start_kube_proxy([PLAN])
    assert len(first.spawned) == 1 and "kube-proxy" in sts[0]["pids"]
    assert first.spawned[0][1] == f"--config={first.dir / 'kube-proxy.json'}"
    # the second cluster: none started, and it says whose runs
    assert second.spawned == [] and sts[1]["kubeProxy"] == {"skipped": str(first.dir)}
    realnode.stop_kube_proxy(second, sts[1], lambda m: None)
    assert not [a for a in ran if a[:2] == ["nft", "delete"]]  # the first's tables are kept
    os.close(first.held)  # the first's kube-proxy exits: its tables go at its cluster-down
    realnode.stop_kube_proxy(first, sts[0], lambda m: None)
    assert [a for a in ran if a[:2] == ["nft", "delete"]] == [
        ["nft", "delete", "table", "ip", "kube-proxy"],
        ["nft", "delete", "table", "ip6", "kube-proxy"],
    ]


def test_a_pods_processes_are_those_in_its_cgroup_below_the_node(tmp_path):
    """cgroup_pids: every cgroup.procs of the tree, or only below a pod<uid> directory (a power
    cut kills the first)."""
    node = tmp_path / "lk16-ib-0"
    files = {
        node / "cgroup.procs": "",
        node / "kubepods" / "besteffort" / "podA" / "c1" / "cgroup.procs": "11\n12\n",
        node / "kubepods" / "besteffort" / "podA" / "cgroup.procs": "10\n",
        node / "kubepods" / "burstable" / "podB" / "c2" / "cgroup.procs": "21\n",
        node / "kubepods" / "burstable" / "podAB" / "cgroup.procs": "31\n",
    }
    for f, text in files.items():
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    assert realnode.cgroup_pids(node) == [10, 11, 12, 21, 31]
    assert realnode.cgroup_pids(node, "podA") == [10, 11, 12]
    assert realnode.cgroup_pids(node, "podC") == []
    assert realnode.cgroup_pids(tmp_path / "gone") == []
