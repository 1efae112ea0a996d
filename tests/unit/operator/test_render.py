"""Pure rendering: a planned attempt's ConfigMap, Service and pods as objects."""

from __future__ import annotations

import yaml

from holmes.contract import JobSpec, Layout
from holmes.contract.network import IslandNetwork
from holmes.operator.core import child_names
from holmes.operator.core.render import (
    build_configmap,
    build_pod,
    build_service,
    torch_env,
)
from tests.helpers.operator.render_helpers import FACTS, REF, SETTINGS, planned, pod_for, route_for


def env_of(pod):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def rank_of_kind(kind):
    nodes, layout, _ = planned()
    for r, n in enumerate(layout.nodes):
        if FACTS.network(nodes[n]).nic == kind:
            return r
    raise AssertionError(f"no {kind} node in {layout.nodes}")


def test_configmap_holds_the_layout_and_the_spec():
    _, layout, job = planned()
    cm = build_configmap(REF, layout, JobSpec.from_manifest(job))
    assert Layout.from_json(cm["data"]["layout.json"]) == layout
    doc = yaml.safe_load(cm["data"]["job.yaml"])
    # the typed spec, defaults filled in: the trainer reads the job the operator planned
    assert doc["kind"] == "HolmesJob" and JobSpec.from_spec(doc["spec"]) == JobSpec.from_manifest(job)
    assert doc["spec"]["training"]["activationRecompute"] is True
    assert cm["metadata"]["name"] == "tiny-layout"
    assert cm["metadata"]["annotations"][child_names.ANN_ATTEMPT] == "3"


def test_headless_service_selects_the_jobs_pods():
    svc = build_service(REF, SETTINGS)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert svc["spec"]["selector"] == {child_names.LABEL_JOB: "tiny"}
    assert svc["spec"]["ports"][0]["port"] == 29511


def test_pod_is_pinned_by_required_node_affinity_and_named_for_rendezvous():
    pod, layout, node = pod_for(2)
    spec = pod["spec"]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [layout.nodes[2]]}
    ]
    assert "nodeName" not in spec
    assert pod["metadata"]["name"] == spec["hostname"] == "tiny-3-2" and spec["subdomain"] == "tiny"
    assert spec["restartPolicy"] == "Never"
    env = env_of(pod)
    assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "tiny-3-0.tiny.ns.svc"
    assert env["NODE_RANK"] == env["PET_NODE_RANK"] == "2"
    assert env["NPROC_PER_NODE"] == env["PET_NPROC_PER_NODE"] == "2"
    assert env["WORLD_SIZE"] == str(layout.world_size) and env["PET_NNODES"] == str(len(layout.nodes))
    assert env["MASTER_PORT"] == "29511" and env["HOLMES_LAYOUT"] == "/etc/holmes/layout.json"
    cmd = spec["containers"][0]["command"]
    assert cmd[:3] == ["python", "-m", "holmes.trainer.run"] and "--node-rank=2" in cmd
    assert cmd[cmd.index("-m", 3) + 1] == "holmes.trainer"
    assert pod["metadata"]["labels"][child_names.LABEL_ATTEMPT] == "3"


def test_infiniband_pod_gets_ib_env_and_rdma_resource_but_no_ipc_lock():
    """Issue 50, item 5: the memlock limit the verbs API needs comes from the container runtime;
    IPC_LOCK (which Pod Security baseline refuses, and which a non-root trainer cannot use) is not
    added by default."""
    pod, _, node = pod_for(rank_of_kind("infiniband"))
    env = env_of(pod)
    assert env["NCCL_IB_DISABLE"] == "0" and env["HOLMES_NIC"] == "infiniband"
    assert "NCCL_IB_GID_INDEX" not in env and "NCCL_NET" not in env
    c = pod["spec"]["containers"][0]
    rdma = next(k for k in node["status"]["allocatable"] if k.startswith("rdma/"))
    assert c["resources"]["limits"][rdma] == 1 and c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_ipc_lock_only_on_the_rdma_nodes_of_an_island_that_opts_in():
    nodes, layout, _ = planned()
    by_kind = {FACTS.network(nodes[n]).nic: r for r, n in enumerate(layout.nodes)}
    islands = (IslandNetwork(nic="infiniband", ipc_lock=True),)
    for kind, want in (("infiniband", ["IPC_LOCK"]), ("roce", None), ("ethernet", None)):
        r = by_kind[kind]
        route = route_for(layout, r, nodes, islands=islands)
        pod = build_pod(REF, layout, r, route=route, template=None, settings=SETTINGS)
        assert pod["spec"]["containers"][0]["securityContext"]["capabilities"].get("add") == want, kind


def test_roce_pod_leaves_the_gid_to_nccl():
    """Issue 34, defect 2: NCCL >= 2.21 picks a RoCE v2 GID itself when NCCL_IB_GID_INDEX is
    unset; a forced 3 overrode that (and is RoCE v1 or link-local on some hosts)."""
    pod, _, _ = pod_for(rank_of_kind("roce"))
    env = env_of(pod)
    assert env["NCCL_IB_DISABLE"] == "0" and env["HOLMES_NIC"] == "roce"
    assert "NCCL_IB_GID_INDEX" not in env


def test_ethernet_pod_disables_ib_and_asks_no_rdma():
    pod, _, _ = pod_for(rank_of_kind("ethernet"))
    env = env_of(pod)
    c = pod["spec"]["containers"][0]
    assert env["NCCL_IB_DISABLE"] == "1" and env["HOLMES_NIC"] == "ethernet"
    assert not any(k.startswith("rdma/") for k in c["resources"]["limits"])
    assert "add" not in c["securityContext"]["capabilities"]  # no IPC_LOCK without RDMA


def test_every_pod_gets_memory_backed_shm_and_the_layout_mounted():
    pod, _, _ = pod_for(0)
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols[child_names.SHM_VOLUME]["emptyDir"] == {"medium": "Memory"}
    assert vols[child_names.LAYOUT_VOLUME]["configMap"]["name"] == "tiny-layout"
    mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/dev/shm"] == child_names.SHM_VOLUME and mounts["/etc/holmes"] == child_names.LAYOUT_VOLUME


def test_user_template_fields_are_respected():
    template = {
        "metadata": {"labels": {"team": "llm", "holmes.dev/job-name": "spoof"}, "annotations": {"a": "b"}},
        "spec": {
            "schedulerName": "volcano",
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "tokens"}}],
            "priorityClassName": "high",
            "containers": [
                {"name": "sidecar", "image": "busybox"},
                {
                    "name": "trainer",
                    "image": "mine:2",
                    "args": ["--iterations", "3"],
                    "env": [{"name": "NCCL_IB_DISABLE", "value": "1"}, {"name": "EXTRA", "value": "x"}],
                    "resources": {
                        "limits": {"nvidia.com/gpu": 8, "memory": "64Gi"},
                        "requests": {"cpu": "4"},
                    },
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                },
            ],
        },
    }
    pod, _, _ = pod_for(rank_of_kind("infiniband"), template=template)
    spec = pod["spec"]
    assert spec["schedulerName"] == "volcano" and spec["priorityClassName"] == "high"
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert (
        pod["metadata"]["labels"]["team"] == "llm"
        and pod["metadata"]["labels"][child_names.LABEL_JOB] == "tiny"
    )
    assert pod["metadata"]["annotations"]["a"] == "b"
    sidecar, trainer = spec["containers"]
    assert sidecar == {"name": "sidecar", "image": "busybox"}
    assert trainer["image"] == "mine:2" and trainer["command"][-2:] == ["--iterations", "3"]
    env = [e for e in trainer["env"] if e["name"] == "NCCL_IB_DISABLE"]
    assert env == [{"name": "NCCL_IB_DISABLE", "value": "1"}]  # the user's value wins, once
    assert {"name": "EXTRA", "value": "x"} in trainer["env"]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == 8 and trainer["resources"]["requests"] == {
        "cpu": "4"
    }
    assert {"name": "data", "mountPath": "/data"} in trainer["volumeMounts"]
    assert "data" in {v["name"] for v in spec["volumes"]}


def test_default_image_and_user_command_override():
    pod, _, _ = pod_for(0, template={})
    assert pod["spec"]["containers"][0]["image"] == "img:1"
    pod, _, _ = pod_for(
        0, template={"spec": {"containers": [{"name": "trainer", "command": ["sleep", "1"]}]}}
    )
    assert pod["spec"]["containers"][0]["command"] == ["sleep", "1"]


def test_metrics_bind_to_the_pod_ip_and_rank0_exposes_the_port():
    pod, _, _ = pod_for(0)
    env = env_of(pod)
    assert env["HOLMES_METRICS_ADDR"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["HOLMES_METRICS_PORT"] == "9411"
    assert {"name": "metrics", "containerPort": 9411} in pod["spec"]["containers"][0]["ports"]


def test_a_port_range_gives_each_attempt_its_own_ports():
    from dataclasses import replace

    from holmes.operator.core.render import job_ports

    ranged = replace(SETTINGS, port_range=(20000, 29999))
    a1 = job_ports(REF, ranged)
    a2 = job_ports(replace(REF, attempt=4), ranged)
    assert a1 != a2 and all(20000 <= p <= 29999 for p in a1 + a2) and a1[1] == a1[0] + 1
    assert job_ports(REF, ranged) == a1  # stable across operator restarts
    assert job_ports(REF, SETTINGS) == (29511, 9411)
    assert "ports" not in build_service(REF, ranged)["spec"]
    nodes, layout, job = planned()
    pod = build_pod(
        REF,
        layout,
        0,
        route=route_for(layout, 0, nodes),
        template={},
        settings=ranged,
    )
    env = env_of(pod)
    assert env["MASTER_PORT"] == str(a1[0]) and env["HOLMES_METRICS_PORT"] == str(a1[1])
    assert f"--master-port={a1[0]}" in pod["spec"]["containers"][0]["command"]
    assert {"name": "metrics", "containerPort": a1[1]} in pod["spec"]["containers"][0]["ports"]


def test_every_pod_gets_the_nccl_watchdog():
    """A dead peer must end its peers' NCCL waits (watchdog, heartbeat) so the operator tears the
    gang down."""
    for kind in ("infiniband", "roce", "ethernet"):
        pod, _, _ = pod_for(rank_of_kind(kind))
        env = env_of(pod)
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and env["TORCH_NCCL_ENABLE_MONITORING"] == "1"
        assert int(env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]) > 0
    assert torch_env() == {k: env[k] for k in torch_env()}
