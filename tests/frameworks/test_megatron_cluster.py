"""``framework: megatron`` on the local control plane: a three-island plan (an InfiniBand, a RoCE
and an Ethernet stage, uneven layers), pods created by the operator, the user's command run by
Holmes' launcher under torchrun, Megatron's own ``initialize_model_parallel`` building the groups
from the appended arguments (megatron-core 0.16.1, gloo on CPU)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from holmes.contract import Layout
from localkube.operatorproc import OperatorProcess, install_crd
from tests import polling

pytestmark = pytest.mark.timeout(480)
PROGRAM = Path(__file__).resolve().parent / "programs" / "megatron_groups.py"
RDMA = ("infiniband", "roce")
LINK_LAYER = {"infiniband": "InfiniBand", "roce": "Ethernet"}


def megatron_job(name: str, ns: str) -> dict:
    return {
        "apiVersion": "holmes.dev/v1alpha1",
        "kind": "HolmesJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "framework": "megatron",
            "model": {"layers": 8, "hiddenSize": 64, "attentionHeads": 4, "seqLength": 32, "vocabSize": 128},
            "training": {"globalBatchSize": 24, "microBatchSize": 1, "iterations": 1, "learningRate": 1.0e-3},
            # One site (every node's kubernetes.io/os is linux), so an island is a NIC kind: the
            # default topology's two Ethernet nodes sit in two clusters otherwise.
            "nodes": {"count": 6, "gpusPerNode": 2, "clusterLabel": "kubernetes.io/os"},
            "parallelism": {"pipeline": 3, "tensor": 2},
            "runPolicy": {"backoffLimit": 0},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "registry.example/megatron-lm:test",
                            "command": [sys.executable, str(PROGRAM), "--seq-length", "32"],
                        }
                    ]
                }
            },
        },
    }


def json_lines(text: str, key: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        start = line.find("{")
        if start < 0 or f'"{key}"' not in line:
            continue
        try:
            out.append(json.loads(line[start:])[key])
        except (ValueError, KeyError):
            continue
    return out


@pytest.fixture
def one_site(cluster):
    """The NFD-advertised nodes' link layer as the labeller would publish it (in one site the
    operator's per-cluster --cluster-rdma-kind cannot tell InfiniBand from RoCE); removed after."""
    link = {n.name: LINK_LAYER[n.nic] for n in cluster.topology.nodes if n.nic in LINK_LAYER}
    for node, layer in link.items():
        cluster.kubectl("label", "node", node, f"holmes.dev/link-layer={layer}", "--overwrite")
    yield cluster
    for node in link:
        cluster.kubectl("label", "node", node, "holmes.dev/link-layer-", check=False)


def test_megatron_forms_holmes_groups_on_their_networks(one_site, namespace, tmp_path):
    cluster = one_site
    install_crd(cluster)
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log").start()
    try:
        started = time.monotonic()
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(megatron_job("mg", namespace)))

        def finished():
            r = cluster.kubectl("get", "hj", "mg", "-n", namespace, "-o", "json", check=False)
            st = json.loads(r.stdout).get("status", {}) if r.returncode == 0 else {}
            stalled = [
                c for c in st.get("conditions") or [] if c["type"] == "Stalled" and c["status"] == "True"
            ]
            if stalled:
                return "Stalled: " + stalled[0].get("message", "")
            return st.get("phase") if st.get("phase") in ("Succeeded", "Failed") else None

        phase = polling.wait_for("the megatron job to finish", finished, 420, 2, detail=lambda: op.tail(40))
        elapsed = time.monotonic() - started
        pods = cluster.get_json("pods", "-n", namespace, "-l", "holmes.dev/job-name=mg")["items"]
        logs = {
            int(p["metadata"]["labels"]["holmes.dev/node-rank"]): cluster.pod_log(
                namespace, p["metadata"]["name"], "trainer"
            )
            for p in pods
        }
        assert phase == "Succeeded", "\n".join(v[-3000:] for v in logs.values()) + op.tail(40)
    finally:
        op.stop()

    cm = cluster.get_json("configmap", "mg-layout", "-n", namespace)
    layout = Layout.from_json(cm["data"]["layout.json"])
    nic = {n.name: n.nic for n in cluster.topology.nodes}
    G = layout.gpus_per_node
    node_nic = [nic[n] for n in layout.nodes]

    # the plan: one stage per island, uneven layers
    assert sorted(s.nic for s in layout.stages) == ["ethernet", "infiniband", "roce"]
    counts = [s.num_layers for s in layout.stages]
    assert sum(counts) == 8 and len(set(counts)) > 1, counts

    ranks = {}
    groups = []
    for text in logs.values():
        for m in json_lines(text, "megatron"):
            ranks[m["rank"]] = m
        groups += json_lines(text, "holmesGroup")
    assert sorted(ranks) == list(range(layout.world_size))

    def truth(members):  # IB iff every member's node is on one RDMA island (one site: one NIC kind)
        kinds = {node_nic[r // G] for r in members}
        return "IB" if len(kinds) == 1 and kinds <= set(RDMA) else "Socket"

    logged = {tuple(g["ranks"]): g for g in groups}
    expected = {(pg.kind, pg.ranks): pg.net for pg in layout.process_groups()}
    for r, m in ranks.items():
        info = layout.rank_info(r)
        assert (
            m["stage"] == info.stage and m["stageLayers"] == counts
        )  # Megatron's reading of the layout string
        mg = {k: tuple(v) for k, v in m["groups"].items()}
        assert mg["dp"] == layout.groups_of(r)["dp"].ranks and mg["tp"] == layout.groups_of(r)["tp"].ranks
        assert mg["pp"] == layout.groups_of(r)["pp"].ranks
        assert len({node_nic[x // G] for x in mg["dp"]}) == 1  # every DP group inside one island
        for kind, members in mg.items():
            assert members in logged, f"rank {r}: Megatron's {kind} group {members} was not seen by the hook"
            assert logged[members]["net"] == truth(members)
            if (kind, members) in expected:
                assert logged[members]["net"] == expected[(kind, members)], (kind, members)
        stage = layout.stages[info.stage]
        assert m["communicatorNets"]["dp"] == stage.dp_net  # this pod's communicator file
    assert all(g["net"] == truth(g["ranks"]) for g in groups)
    assert {g["net"] for g in groups if len({node_nic[r // G] for r in g["ranks"]}) == 1 and g["ranks"]} >= {
        "IB"
    }

    summary = {
        "seconds": round(elapsed, 1),
        "stages": [(s.island, s.nic, s.num_layers, s.dp_net) for s in layout.stages],
        "groups": len(groups),
        "megatron": {
            k: sorted(
                {
                    (tuple(m["groups"][k]), logged[tuple(m["groups"][k])]["net"])
                    for m in ranks.values()
                    if k in m["groups"]
                }
            )
            for k in ("dp", "tp", "pp", "embd")
        },
    }
    print("MEGATRON-SUMMARY " + json.dumps(summary))
