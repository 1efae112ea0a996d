"""NCCL_NVLS_ENABLE in the rendered pods (routes.job_routes, holmes.contract.nvls.from_layout):
NCCL reads it once per process, so the operator puts the planner's decision into each pod's
environment from the start; the planner's memory estimate and the variable come from one
decision, and a template's value wins as for every other variable."""

from __future__ import annotations

from holmes.contract import Layout, nvls
from holmes.operator.core.render import RenderSettings
from holmes.operator.preview import children
from tests.helpers.operator.opfixtures import manifest
from tests.helpers.plan.plan_helpers import node

H100_SXM, H100_PCIE, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-A100-SXM4-80GB"
MODEL = {"layers": 8, "hiddenSize": 2048, "attentionHeads": 16, "seqLength": 1024, "vocabSize": 32000}
TRAINING = {"globalBatchSize": 64, "microBatchSize": 1, "iterations": 5, "learningRate": 1.0e-4}


def job(parallelism: dict, count: int = 2, template_env: list | None = None, layers: int = 8) -> dict:
    model = {**MODEL, "layers": layers}
    m = manifest(count=count, gpus=8, model=model, training=TRAINING, parallelism=parallelism, template={})
    if template_env is not None:
        m["spec"]["template"] = {"spec": {"containers": [{"name": "trainer", "env": template_env}]}}
    return m


def rendered(m: dict, products: list[str]) -> tuple[Layout, dict[int, dict[str, str]]]:
    """The layout (from the ConfigMap) and each node rank's trainer env, as `holmes plan --pods`."""
    label = "nvidia.com/gpu.product"
    nodes = [node(f"n{i}", "infiniband", labels={label: p}) for i, p in enumerate(products)]
    out = children(m, nodes, RenderSettings())
    cm = next(o for o in out if o["kind"] == "ConfigMap")
    layout = Layout.from_json(cm["data"]["layout.json"])
    envs = {}
    for p in (o for o in out if o["kind"] == "Pod"):
        rank = int(p["metadata"]["labels"]["holmes.dev/node-rank"])
        envs[rank] = {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
    return layout, envs


def test_h100_sxm_tensor_8_pods_get_nvls_on_and_the_estimate_counts_it():
    """Before: no pod carried NCCL_NVLS_ENABLE, so NCCL's default applied whatever the
    estimate had counted."""
    layout, envs = rendered(job({"tensor": 8, "pipeline": 2}), [H100_SXM, H100_SXM])
    assert (layout.tensor, layout.pipeline) == (8, 2)
    assert [envs[r]["NCCL_NVLS_ENABLE"] for r in (0, 1)] == ["2", "2"]  # never 1 (nvls.ON)
    # one decision: the pods' switch and the memory the estimate counted (against the same job
    # on PCIe cards of the same 80 GB, which have no NVSwitch)
    decision = nvls.from_layout(layout, tied=False)
    pcie, _ = rendered(job({"tensor": 8, "pipeline": 2}), [H100_PCIE, H100_PCIE])
    for s, (sxm_row, pcie_row) in enumerate(zip(layout.estimate["stages"], pcie.estimate["stages"])):
        assert decision.stages[s].enabled and decision.nodes[s]
        extra = sxm_row["memoryGiB"] - pcie_row["memoryGiB"]
        assert round(extra, 2) == round(decision.stages[s].bytes / 2**30, 2), (s, extra)


def test_pcie_and_a100_pods_get_nvls_off_explicitly():
    """Off is written, not left to NCCL, whose default turns NVLS on where the hardware has it
    (the memory the estimate did not count; NeMo sets 0 for the same reason)."""
    for product in (H100_PCIE, A100):
        _, envs = rendered(job({"tensor": 8, "pipeline": 2}), [product, product])
        assert [envs[r]["NCCL_NVLS_ENABLE"] for r in (0, 1)] == ["0", "0"], product


def test_an_h100_stage_without_a_paying_group_stays_off():
    """Tensor 1, data 1: sixteen stages of one rank on two nodes; no tp/dp group pays."""
    layout, envs = rendered(job({"tensor": 1, "pipeline": 16}, layers=16), [H100_SXM, H100_SXM])
    assert layout.pipeline == 16
    assert {e["NCCL_NVLS_ENABLE"] for e in envs.values()} == {"0"}


def test_the_templates_value_wins():
    m = job({"tensor": 8, "pipeline": 2}, template_env=[{"name": "NCCL_NVLS_ENABLE", "value": "0"}])
    _, envs = rendered(m, [H100_SXM, H100_SXM])
    assert [envs[r]["NCCL_NVLS_ENABLE"] for r in (0, 1)] == ["0", "0"]
