"""Issue 34's "done when", on the local control plane: nodes annotated exactly as the NIC labeller
annotates real hosts (host netdevs ``eno12399np0``/``ens9f0np0``, HCAs ``mlx5_0,mlx5_1``: names
that exist nowhere inside a pod), pods in network namespaces of their own (the testbed's CNI
bridge) and, with ``spec.network: hostNetwork``, in the node's. A Holmes-engine job and a plain
torchrun program (``init_process_group()`` with no backend, ``new_group`` per DP group) reach
Succeeded on both routes; every pod logs what it resolved (``{"holmesNet": ...}``) and every
group its network (``{"holmesGroup": ...}``, from the launcher's hook and from the engine's
group builder). Before issue 34 the host name went into every pod as ``NCCL_SOCKET_IFNAME`` and
gloo died with ``Unable to find address for: eno12399np0``: forcing that name through the
template now stops the pod with the resolver's message naming the variable.

One operator serves every job (the namespace enforces no Pod Security level, so hostNetwork is
allowed); the two jobs of a route run side by side (one GPU per node each). The testbed has no
HCAs, so the IB ports and GIDs NCCL would use stay unproven here: the pods say so in ``problems``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time

import pytest
import yaml
from holmes_dev.jobs import tiny_job

from holmes.contract import Layout
from holmes.labeller.labels import RECORD_ANNOTATION, desired_labels, plan_patch
from holmes.labeller.sysfs import read_sysfs
from localkube.operatorproc import OperatorProcess, install_crd
from localkube.podnet import pod_subnet
from tests.helpers import polling
from tests.helpers.frameworks.cluster_jobs import framework_job, island_net, json_lines
from tests.helpers.labeller.fakesysfs import FakeSysfs

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(os.geteuid() != 0, reason="pod network namespaces need root"),
]

FRONT_END = "eno12399np0"  # a Dell/HPE onboard 25-100 GbE port: the host's routed interface
RAILS = ("mlx5_0", "mlx5_1")
ETH_IFNAME = "ens9f0np0"


def host_sysfs(root, nic: str) -> tuple[FakeSysfs, str | None]:
    """A GPU host's sysfs as the labeller reads it, and its default route's interface: two
    compute rails of the node's kind beside a front-end port (InfiniBand, RoCE), or one
    25 GbE port (Ethernet)."""
    fs = FakeSysfs(root).base_host()
    if nic == "infiniband":
        for i, hca in enumerate(RAILS):
            fs.hca(
                hca, [("InfiniBand", "200 Gb/sec (4X HDR)", "4: ACTIVE")], netdevs=[(f"ibp{i}s0", 200000, 32)]
            )
        fs.netdev(FRONT_END, speed_mbps=100000)
        return fs, FRONT_END
    if nic == "roce":
        for i, hca in enumerate(RAILS):
            fs.hca(
                hca, [("Ethernet", "100 Gb/sec (4X EDR)", "4: ACTIVE")], netdevs=[(f"ens9f{i}np0", 100000, 1)]
            )
        fs.netdev(FRONT_END, speed_mbps=25000)
        return fs, FRONT_END  # the rails' netdevs are faster: the routed front end is chosen
    fs.netdev(ETH_IFNAME, speed_mbps=25000)
    return fs, None


def snapshot(cluster, node: str) -> dict:
    meta = cluster.get_json("node", node)["metadata"]
    return {part: dict(meta.get(part) or {}) for part in ("labels", "annotations")}


def restore(cluster, node: str, snap: dict) -> None:
    """The node's labels and annotations back to ``snap`` (the session's other tests share it)."""
    cur = snapshot(cluster, node)
    patch = {}
    for part in ("labels", "annotations"):
        diff = {k: None for k in cur[part] if k not in snap[part]}
        diff.update({k: v for k, v in snap[part].items() if cur[part].get(k) != v})
        if diff:
            patch[part] = diff
    if patch:
        cluster.kubectl("patch", "node", node, "--type=merge", "-p", json.dumps({"metadata": patch}))


@pytest.fixture(scope="module")
def labelled(cluster, tmp_path_factory):
    """Every node patched with what the labeller's own code decides for a real host's sysfs;
    yields {node: its annotations}; restored afterwards."""
    root = tmp_path_factory.mktemp("sysfs")
    snaps = {n.name: snapshot(cluster, n.name) for n in cluster.topology.nodes}
    written = {}
    try:
        for n in cluster.topology.nodes:
            _, route = host_sysfs(root / n.name, n.nic)
            desired = desired_labels(read_sysfs(root / n.name), default_route=route)

            def patched(node=n.name, desired=desired):  # the node agent's heartbeats: 409, again
                plan = plan_patch(cluster.get_json("node", node)["metadata"], desired)
                assert plan.patch is not None, node
                body = json.dumps(plan.patch)
                return (
                    cluster.kubectl("patch", "node", node, "--type=merge", "-p", body, check=False).returncode
                    == 0
                )

            polling.wait_for(f"the labeller's patch of {n.name}", patched, 30, 0.2)
            written[n.name] = snapshot(cluster, n.name)["annotations"]
        yield written
    finally:
        for node, snap in snaps.items():
            restore(cluster, node, snap)


@pytest.fixture(scope="module")
def netns(cluster):
    """A namespace for this module's jobs, with its default service account."""
    name = cluster.new_namespace("t-net")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(cluster, netns, labelled, tmp_path_factory):
    install_crd(cluster.kubeconfig)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = OperatorProcess(cluster.kubeconfig, [netns], log, extra=[]).start()
    yield op
    op.stop()


def engine_job(name: str, ns: str, count: int = 6, **spec) -> dict:
    """The Holmes engine on ``count`` nodes, one GPU each (a route's two jobs share the nodes)."""
    return tiny_job(name, ns, count=count, gpus=1, iterations=2, run_policy={"backoffLimit": 0}, **spec)


def torchrun_job(cluster, name: str, ns: str, **spec) -> dict:
    job = framework_job(name, ns, "torchrun", cluster.framework_image("torchrun"), "plain_groups.py", gpus=1)
    job["spec"].update(spec)
    return job


def run_jobs(cluster, op, ns: str, jobs: list[dict], timeout: float = 300) -> dict[str, dict]:
    """Apply the jobs together and wait until each is Succeeded or Failed; per job: phase, Layout
    (None when it never got one), {node rank: (pod, trainer log)}."""
    for job in jobs:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    names = [j["metadata"]["name"] for j in jobs]

    def phases():
        got = {}
        for n in names:
            r = cluster.kubectl("get", "hj", n, "-n", ns, "-o", "jsonpath={.status.phase}", check=False)
            got[n] = r.stdout.strip()
        return got if all(p in ("Succeeded", "Failed") for p in got.values()) else None

    done = polling.wait_for(f"jobs {names} to finish", phases, timeout, 2, detail=lambda: op.tail(40))
    out = {}
    for n in names:
        pods = cluster.get_json("pods", "-n", ns, "-l", f"holmes.dev/job-name={n}")["items"]
        r = cluster.kubectl("get", "configmap", f"{n}-layout", "-n", ns, "-o", "json", check=False)
        layout = Layout.from_json(json.loads(r.stdout)["data"]["layout.json"]) if r.returncode == 0 else None
        logs = {
            int(p["metadata"]["labels"]["holmes.dev/node-rank"]): (
                p,
                cluster.pod_log(ns, p["metadata"]["name"], "trainer"),
            )
            for p in pods
        }
        out[n] = {"phase": done[n], "layout": layout, "pods": logs}
    return out


def check_resolved(result: dict, nic_of: dict[str, str], network: str, ifname: str) -> None:
    """Each pod logged one holmesNet line: the interface it reaches the rendezvous through (not
    the host's), set for NCCL and gloo, the node's kind, and, on RDMA nodes, what NCCL's IB
    transport will miss on a testbed without HCAs."""
    for rank, (pod, log) in sorted(result["pods"].items()):
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert not {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA"} & set(env), env
        nets = json_lines(log, "holmesNet")
        assert len(nets) == 1, f"rank {rank}: {nets}\n{log[-2000:]}"
        net = nets[0]
        node = pod["spec"]["nodeName"]
        assert net["podNetwork"] == network and net["nic"] == nic_of[node], net
        assert net["socket"]["ifname"] == ifname and net["gloo"]["ifname"] == ifname, net
        assert net["set"]["NCCL_SOCKET_IFNAME"] == f"={ifname}" and net["set"]["GLOO_SOCKET_IFNAME"] == ifname
        assert FRONT_END not in json.dumps(net["set"]) and ETH_IFNAME not in json.dumps(net["set"])
        trainer = pod["spec"]["containers"][0]
        rdma = [k for k in trainer["resources"]["limits"] if k.startswith("rdma/")]
        added = (trainer.get("securityContext") or {}).get("capabilities", {}).get("add") or []
        assert bool(pod["spec"].get("hostNetwork")) == (network == "hostNetwork")
        assert bool(rdma) == (nic_of[node] in ("infiniband", "roce")) and "IPC_LOCK" not in added, trainer
        if nic_of[node] in ("infiniband", "roce"):  # no HCA on this machine: named, not hidden
            assert net["hca"]["value"] is None and net["problems"], net
            if network == "hostNetwork":  # the node's rails, as the operator passed them
                assert any("HOLMES_HOST_HCAS names mlx5_0, mlx5_1" in p for p in net["problems"]), net
        else:
            assert "hca" not in net and not net["problems"], net
        assert "Unable to find address" not in log


def check_engine(result: dict, nic_of: dict[str, str]) -> None:
    """Every group the engine built is logged by its lowest rank with the net it was planned on
    (null inside one node), which for a DP group is its island's."""
    layout = result["layout"]
    G, W = layout.gpus_per_node, layout.world_size
    logged = {}
    for _, log in result["pods"].values():
        for g in json_lines(log, "holmesGroup"):
            assert (g["kind"], tuple(g["ranks"])) not in logged, g
            logged[(g["kind"], tuple(g["ranks"]))] = g
    want = [("world", tuple(range(W)), layout.world_net)]
    want += [(g.kind, g.ranks, g.net) for g in layout.process_groups() if len(g.ranks) > 1]
    for kind, ranks, net in want:
        if kind == "embedding" and (kind, ranks) not in logged:
            continue  # built only for a tied model split across stages
        g = logged.get((kind, ranks))
        assert g is not None, f"{kind} group {ranks} was not logged: {sorted(logged)}"
        spans = len({r // G for r in ranks}) > 1
        assert g["net"] == (net if spans else None) and g["backend"] == "gloo" and g["applied"] is False, g
        if kind == "dp":
            assert g["net"] == island_net(layout, nic_of, ranks), g


def check_torchrun(result: dict, nic_of: dict[str, str]) -> None:
    """Every DP group (new_group under init_process_group() without a backend) was seen by the
    hook with its island's net; the all-reduces summed what the ranks gave."""
    layout = result["layout"]
    groups, ranks = {}, {}
    for _, log in result["pods"].values():
        for g in json_lines(log, "holmesGroup"):
            groups[tuple(g["ranks"])] = g
        for m in json_lines(log, "plainTorchrun"):
            ranks[m["rank"]] = m
    W = layout.world_size
    assert sorted(ranks) == list(range(W))
    world = tuple(range(W))
    assert groups[world]["backend"] == "undefined" and groups[world]["net"] == layout.world_net, groups[world]
    for pg in layout.process_groups("dp"):
        g = groups.get(pg.ranks)
        assert g is not None, f"DP group {pg.ranks} was not seen by the hook: {sorted(groups)}"
        assert g["backend"] == "undefined" and g["net"] == island_net(layout, nic_of, pg.ranks) == pg.net, g
        assert g["applied"] is False and "nccl" not in g["devices"].values(), g  # gloo on CPU
    for r, m in ranks.items():
        dp = layout.groups_of(r)["dp"].ranks
        assert tuple(m["dp"]) == dp
        assert m["dpSum"] == sum(x + 1 for x in dp) * len(dp) ** 2  # three rounds
        assert m["worldSum"] == W * (W + 1) / 2


def host_ifname_holding(address: str) -> str:
    """The host's interface holding ``address`` (its own address, else a network of its that
    contains it: the agent's 127.x node addresses are lo's 127.0.0.0/8)."""
    ip = ipaddress.ip_address(address)
    links = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, check=True).stdout)
    nets = [(a["local"], a["prefixlen"], link["ifname"]) for link in links for a in link.get("addr_info", [])]
    exact = [name for local, _, name in nets if ipaddress.ip_address(local) == ip]
    wide = [name for local, n, name in nets if ip in ipaddress.ip_network(f"{local}/{n}", strict=False)]
    assert exact or wide, f"no interface of this host holds {address}: {nets}"
    return (exact or wide)[0]


def route_jobs(cluster, operator, ns, network: str, ifname: str | None) -> None:
    """Both jobs on ``network``; each pod resolved ``ifname`` (None: the host's interface holding
    the job's rank 0 address, hostNetwork's rendezvous)."""
    nic_of = {n.name: n.nic for n in cluster.topology.nodes}
    extra = {} if network == "podNetwork" else {"network": network}
    started = time.monotonic()
    results = run_jobs(
        cluster,
        operator,
        ns,
        [
            engine_job(f"eng-{network.lower()}", ns, **extra),
            torchrun_job(cluster, f"tr-{network.lower()}", ns, **extra),
        ],
    )
    print(f"{network}: both jobs finished in {time.monotonic() - started:.0f} s")
    for name, result in results.items():
        tails = "\n".join(log[-3000:] for _, log in result["pods"].values())
        assert result["phase"] == "Succeeded", f"{name}: {result['phase']}\n{tails}\n{operator.tail(40)}"
        rank0 = result["pods"][0][0]["status"]["podIP"]
        check_resolved(result, nic_of, network, ifname or host_ifname_holding(rank0))
    eng, tr = results.values()
    check_engine(eng, nic_of)
    check_torchrun(tr, nic_of)


def test_pod_network_jobs_resolve_the_pods_own_interface(cluster, operator, netns):
    route_jobs(cluster, operator, netns, "podNetwork", "eth0")


def test_host_network_jobs_resolve_the_interface_that_reaches_the_rendezvous(cluster, operator, netns):
    # Every node of this testbed shares the host's network namespace: the rendezvous (rank 0's
    # node address) is a local address, reached through the interface holding it, which is lo
    # for the agent's 127.x nodes and the node's bridge for a real node.
    route_jobs(cluster, operator, netns, "hostNetwork", None)


def test_a_host_name_forced_through_the_template_stops_the_pod_naming_the_variable(
    cluster, operator, netns, labelled
):
    assert {a["holmes.dev/socket-ifname"] for a in labelled.values()} == {FRONT_END, ETH_IFNAME}
    assert all(RECORD_ANNOTATION in a for a in labelled.values())
    template = {
        "spec": {
            "containers": [{"name": "trainer", "env": [{"name": "NCCL_SOCKET_IFNAME", "value": FRONT_END}]}]
        }
    }
    result = run_jobs(cluster, operator, netns, [engine_job("forced", netns, count=2, template=template)])
    pod_net = ".".join(str(pod_subnet().network_address).split(".")[:2]) + "."  # HOLMES_POD_SUBNET's
    res = result["forced"]
    assert res["phase"] == "Failed"
    assert res["pods"], "no pod of the failed job is left to show why"

    def settled():
        """The pods the operator keeps (the one whose failure failed the job), each stopped; the
        others gone: a real kubelet takes a while over both."""
        pods = cluster.get_json("pods", "-n", netns, "-l", "holmes.dev/job-name=forced")["items"]
        states = [(p.get("status", {}).get("containerStatuses") or [{}])[0].get("state", {}) for p in pods]
        gone = not any(p["metadata"].get("deletionTimestamp") for p in pods)
        return pods if pods and gone and all("terminated" in st for st in states) else None

    for pod in polling.wait_for("the failed job's pods to settle", settled, 60, 1):
        log = cluster.pod_log(netns, pod["metadata"]["name"], "trainer")
        term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == 2, term
        assert f"NCCL_SOCKET_IFNAME={FRONT_END} (set in the pod template) matches no interface" in log, log
        assert "the pod has " in log and f"eth0 ({pod_net}" in log and "(Holmes resolves eth0 here)" in log, (
            log
        )
        assert "Unable to find address" not in log and "Traceback" not in log
