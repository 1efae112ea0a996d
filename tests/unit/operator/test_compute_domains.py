"""The IMEX channels of a job on rack-scale NVLink (compute_domains.py): a ComputeDomain of NVIDIA's
DRA driver per NVLink domain holding two or more of the job's nodes, each pod there claiming its
channel, and NCCL's multi-node NVLink switches; as `holmes plan --pods` renders them."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from holmes.cli import main
from holmes.contract import names
from holmes.operator.core import compute_domains as cd
from holmes.operator.core.render import RenderSettings
from holmes.operator.core.routes import NodeNetwork, PodRoute, with_compute_domains
from holmes.operator.preview import children

ROOT = Path(__file__).resolve().parents[3]
NODES_FILE = ROOT / "examples/nodes/gb200-nvl72.yaml"
JOB_FILE = ROOT / "examples/jobs/llama3-70b-gb200.yaml"
NODES = yaml.safe_load(NODES_FILE.read_text())["items"]
JOB = yaml.safe_load(JOB_FILE.read_text())


def clique_of(nodes: list[dict]) -> dict[str, str | None]:
    return {n["metadata"]["name"]: n["metadata"]["labels"].get(names.LABEL_GPU_CLIQUE) for n in nodes}


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_plan_pods_renders_a_compute_domain_per_nvlink_domain_and_each_pod_claims_its_channel(
    tmp_path, capsys
):
    assert main(["plan", "--nodes", str(NODES_FILE), "--job", str(JOB_FILE), "--pods"]) == 0
    items = yaml.safe_load(capsys.readouterr().out)["items"]
    domains = [o for o in items if o["kind"] == "ComputeDomain"]
    assert len(domains) == 2 and {o["apiVersion"] for o in domains} == {"resource.nvidia.com/v1beta1"}
    assert [o["spec"]["numNodes"] for o in domains] == [18, 18]
    channel = {o["spec"]["channel"]["resourceClaimTemplate"]["name"] for o in domains}
    assert channel == {o["metadata"]["name"] + "-channel" for o in domains}
    clique = clique_of(NODES)
    by_domain: dict[str, set[str]] = {}
    pods = [o for o in items if o["kind"] == "Pod"]
    assert len(pods) == 36
    for pod in pods:
        claims = {c["name"]: c["resourceClaimTemplateName"] for c in pod["spec"]["resourceClaims"]}
        assert claims[cd.CLAIM] in channel
        assert {"name": cd.CLAIM} in pod["spec"]["containers"][0]["resources"]["claims"]
        by_domain.setdefault(claims[cd.CLAIM], set()).add(
            clique[pod["metadata"]["annotations"]["holmes.dev/node"]]
        )
        env = env_of(pod)
        assert env["NCCL_MNNVL_ENABLE"] == "2" and env["NCCL_CUMEM_ENABLE"] == "1"
    assert all(len(v) == 1 for v in by_domain.values())  # one ComputeDomain never spans two domains


def _render(nodes: list[dict], job: dict) -> list[dict]:
    return children(copy.deepcopy(job), nodes, RenderSettings())


def node_bound_job(**parallelism) -> dict:
    doc = copy.deepcopy(JOB)
    doc["spec"]["parallelism"].update({"tensor": 4, **parallelism})
    return doc


def test_nodes_without_a_domain_get_no_compute_domain_and_no_mnnvl_switch():
    nodes = copy.deepcopy(NODES)
    for n in nodes:
        del n["metadata"]["labels"][names.LABEL_GPU_CLIQUE]
    out = _render(nodes, node_bound_job())
    assert not [o for o in out if o["kind"] == "ComputeDomain"]
    pod = next(o for o in out if o["kind"] == "Pod")
    assert "resourceClaims" not in pod["spec"] and "NCCL_MNNVL_ENABLE" not in env_of(pod)


def test_a_domain_holding_one_of_the_jobs_nodes_gets_no_channel_and_mnnvl_off():
    """Every node its own domain: no two of the job's nodes share one, so no IMEX channel, and
    NCCL's auto MNNVL, which would fail a communicator's init without one, is switched off."""
    nodes = copy.deepcopy(NODES)
    for i, n in enumerate(nodes):
        n["metadata"]["labels"][names.LABEL_GPU_CLIQUE] = f"{i:04d}-rack.1"
    out = _render(nodes, node_bound_job())
    assert not [o for o in out if o["kind"] == "ComputeDomain"]
    pod = next(o for o in out if o["kind"] == "Pod")
    assert "resourceClaims" not in pod["spec"] and env_of(pod)["NCCL_MNNVL_ENABLE"] == "0"


def test_a_templates_own_mnnvl_setting_wins():
    job = copy.deepcopy(JOB)
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "NCCL_MNNVL_ENABLE", "value": "1"}]
    pod = next(o for o in _render(NODES, job) if o["kind"] == "Pod")
    assert [e for e in pod["spec"]["containers"][0]["env"] if e["name"] == "NCCL_MNNVL_ENABLE"] == [
        {"name": "NCCL_MNNVL_ENABLE", "value": "1"}
    ]


def test_a_compute_domain_is_named_by_its_content_since_the_driver_refuses_spec_changes():
    from holmes.contract import Layout

    layout = Layout.from_json(
        next(o for o in _render(NODES, JOB) if o["kind"] == "ConfigMap")["data"]["layout.json"]
    )
    clique = clique_of(NODES)
    a = cd.job_domains("j", layout, clique)
    fewer = dict(clique, **{layout.nodes[-1]: None})  # the last node out of its domain
    b = cd.job_domains("j", layout, fewer)
    assert a[0].name == b[0].name and a[-1].name != b[-1].name
    assert [d.nodes for d in a] == [tuple(n for n in layout.nodes if clique[n] == d.domain) for d in a]


def test_without_compute_domains_served_pods_on_a_domain_get_mnnvl_off():
    nets = {"a": NodeNetwork("infiniband", nvlink_domain="u.1"), "b": NodeNetwork("infiniband")}
    routes = with_compute_domains({n: PodRoute("infiniband") for n in nets}, [], nets)
    assert routes["a"].env == {"NCCL_MNNVL_ENABLE": "0"} and routes["a"].nvlink_channel is None
    assert routes["b"].env == {}


def test_megatron_forms_its_tensor_groups_over_the_nodes_of_one_domain():
    """An external engine builds its tensor groups from consecutive ranks, and each pod's node
    rank is its node's place in the Layout: so Megatron's groups of 8 are the Layout's, two nodes
    of one NVLink domain each."""
    job = copy.deepcopy(JOB)
    job["spec"]["framework"] = "megatron"
    job["spec"]["template"]["spec"]["containers"][0].update(
        image="nemo:x", command=["python", "pretrain_gpt.py"]
    )
    pods = [o for o in _render(NODES, job) if o["kind"] == "Pod"]
    argv = pods[0]["spec"]["containers"][0]["command"]
    assert argv[argv.index("--tensor-model-parallel-size") + 1] == "8"
    clique = clique_of(NODES)
    by_rank = {
        int(p["metadata"]["labels"]["holmes.dev/node-rank"]): clique[
            p["metadata"]["annotations"]["holmes.dev/node"]
        ]
        for p in pods
    }
    assert all(by_rank[r] == by_rank[r + 1] for r in range(0, len(by_rank), 2))
