"""GPU types from GPU Feature Discovery labels, their table and overrides, and GPU-aware plans."""

import json
from pathlib import Path

import pytest

from holmes.cli import main
from holmes.plan import CostModelConfig, plan
from holmes.plan.costmodel import GpuProduct
from holmes.plan.costmodel_file import CostModelError, dump_yaml, from_mapping, load_yaml_text
from holmes.plan.discovery import classify_node
from holmes.plan.estimate import reestimate, without_gpu_types
from holmes.plan.gpus import lookup, node_gpu
from tests.helpers.plan.plan_helpers import job_spec, node

ROOT = Path(__file__).resolve().parents[3]
MIXED = str(ROOT / "examples" / "nodes" / "mixed-gpus.yaml")
JOB = str(ROOT / "examples" / "jobs" / "gpt-7b.yaml")


def gfd(product, memory_mib=None, count="8"):
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": count}
    if memory_mib is not None:
        labels["nvidia.com/gpu.memory"] = str(memory_mib)
    return labels


def gpu_of(labels, cfg=None):
    return node_gpu(classify_node(node("n", labels=labels)), cfg or CostModelConfig())


# product label values as gpu-feature-discovery writes them (nvidia-smi's name, spaces -> dashes)
@pytest.mark.parametrize(
    "product,memory_mib,peak,mem_gib",
    [
        ("NVIDIA-H100-80GB-HBM3", 81559, 989.4, 81559 / 1024),  # H100 SXM5
        ("NVIDIA-H100-PCIe", None, 756.0, 80.0),
        ("NVIDIA-H100-NVL", 95830, 835.0, 95830 / 1024),
        ("NVIDIA-H200", 143771, 989.4, 143771 / 1024),
        ("NVIDIA-A100-SXM4-80GB", 81920, 312.0, 80.0),
        ("NVIDIA-A100-SXM4-40GB", None, 312.0, 40.0),
        ("NVIDIA-A100-80GB-PCIe", None, 312.0, 80.0),
        ("NVIDIA-A100-PCIE-40GB", 40960, 312.0, 40.0),
        ("NVIDIA-L40S", 46068, 362.05, 46068 / 1024),
        ("NVIDIA-L4", None, 121.0, 24.0),
    ],
)
def test_products_from_real_gfd_labels(product, memory_mib, peak, mem_gib):
    g = gpu_of(gfd(product, memory_mib))
    assert (g.peak_tflops, g.source, g.note) == (peak, "table", None)
    assert g.memory_gib == pytest.approx(mem_gib)  # the memory label, when there, beats the table
    assert g.name == product.removeprefix("NVIDIA-")


def test_similar_names_do_not_match_each_other():
    assert lookup("NVIDIA-L40")[0] == "L40" and lookup("NVIDIA-L40S")[0] == "L40S"
    assert lookup("NVIDIA-GH200-480GB") is None  # not an H200 (no table entry: the fallback)
    assert lookup("Tesla-V100-SXM2-16GB") is None


def test_nodes_without_labels_keep_the_single_type_setting():
    cfg = CostModelConfig(gpu_peak_tflops=500.0, gpu_memory_gib=64.0)
    g = gpu_of({}, cfg)
    assert (g.name, g.peak_tflops, g.memory_gib, g.source) == ("unlabelled", 500.0, 64.0, "gpuPeakTflops")


def test_unknown_product_and_mig_are_priced_with_the_fallback_and_say_so():
    g = gpu_of(gfd("NVIDIA-Future-X1"))
    assert g.peak_tflops == 312.0 and "not in the GPU table" in g.note and "gpuProducts" in g.note
    mig = gpu_of(gfd("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"))
    assert mig.peak_tflops == 312.0 and "MIG slice" in mig.note


def test_cost_model_file_extends_and_overrides_the_table():
    cfg = load_yaml_text(
        "gpuProducts:\n"
        "  NVIDIA-Future-X1: {peakTflops: 1500, memoryGib: 192}\n"
        "  H100: {peakTflops: 900, memoryGib: 80}\n"
    )
    assert dict(cfg.gpu_products)["NVIDIA-Future-X1"] == GpuProduct(1500.0, 192.0)
    new = gpu_of(gfd("NVIDIA-Future-X1"), cfg)
    assert (new.peak_tflops, new.memory_gib, new.source) == (1500.0, 192.0, "gpuProducts")
    over = gpu_of(gfd("NVIDIA-H100-80GB-HBM3"), cfg)
    assert (over.peak_tflops, over.source) == (900.0, "gpuProducts")
    # still the table's more specific entry for a PCIe card
    assert gpu_of(gfd("NVIDIA-H100-PCIe"), cfg).peak_tflops == 756.0
    assert load_yaml_text(dump_yaml(cfg)) == cfg  # printed config reads back


@pytest.mark.parametrize(
    "doc,message",
    [
        ({"gpuProducts": {"X": {"peakTflops": 100}}}, "gpuProducts.X: missing memoryGib"),
        ({"gpuProducts": {"X": {"peakTflops": 0, "memoryGib": 8}}}, "gpuProducts.X.peakTflops"),
        ({"gpuProducts": {"X": {"peakTflop": 1, "memoryGib": 8}}}, "did you mean peakTflops?"),
        ({"gpuProducts": {"X": 5}}, "gpuProducts.X: expected a mapping"),
    ],
)
def test_bad_gpu_products_name_the_key(doc, message):
    with pytest.raises(CostModelError, match=message.replace("?", r"\?")):
        from_mapping(doc)


def mixed_nodes(h100=4, a100=4, one_island=False):
    out = []
    for i in range(h100 + a100):
        h = i < h100
        out.append(
            node(
                f"n{i}",
                "infiniband",
                "east" if h or one_island else "west",
                labels=gfd("NVIDIA-H100-80GB-HBM3" if h else "NVIDIA-A100-SXM4-80GB"),
            )
        )
    return out


def stages(layout):
    return [(s["gpu"], s["layers"]) for s in layout.estimate["stages"]]


def test_faster_gpus_take_more_layers_and_the_plan_beats_the_single_type_plan():
    nodes, job = mixed_nodes(), job_spec(tensor=1, pipeline=2)
    lay = plan(nodes, job)
    per = dict(stages(lay))
    assert per["H100-80GB-HBM3"] > 2 * per["A100-SXM4-80GB"]
    assert any("GPU types kept apart" in x for x in lay.explanation)
    blind = plan(without_gpu_types(nodes), job)
    assert [s.num_layers for s in blind.stages] == [18, 18]
    real = reestimate(nodes, job, blind, CostModelConfig())
    assert real.estimate["iterationSeconds"] > 1.3 * lay.estimate["iterationSeconds"]


def test_unlabelled_cluster_plans_as_before():
    nodes, job = mixed_nodes(), job_spec()
    blind = without_gpu_types(nodes)
    a, b = plan(blind, job), plan(blind, job, CostModelConfig(gpu_products=(("X", GpuProduct(1.0, 1.0)),)))
    assert a.estimate == b.estimate and {s["gpu"] for s in a.estimate["stages"]} == {"unlabelled"}


def test_stages_keep_gpu_types_apart_inside_one_island():
    # one island, names interleaving the types: name order would mix them in every stage
    nodes = mixed_nodes(one_island=True)
    nodes = sorted(nodes, key=lambda n: int(n["metadata"]["name"][1:]) % 2)
    lay = plan(nodes, job_spec(tensor=1, pipeline=2, data=32))
    assert {s["gpu"] for s in lay.estimate["stages"]} == {"H100-80GB-HBM3", "A100-SXM4-80GB"}


def test_a_stage_that_must_mix_runs_at_its_slowest_gpu_and_says_so():
    # 3 H100 + 1 A100 nodes, 2 nodes per stage: one stage must hold both types
    nodes = mixed_nodes(h100=3, a100=1, one_island=True)
    lay = plan(nodes, job_spec(count=4, tensor=1, pipeline=2, data=16))
    gpus = [s["gpu"] for s in lay.estimate["stages"]]
    assert "A100-SXM4-80GB+H100-80GB-HBM3" in gpus
    mixed = gpus.index("A100-SXM4-80GB+H100-80GB-HBM3")
    assert lay.estimate["stages"][mixed]["gpuPeakTflops"] == 312.0
    assert lay.stages[mixed].num_layers < lay.stages[1 - mixed].num_layers
    assert any("mix GPU types" in x and "slowest GPU" in x for x in lay.explanation)


def test_holmes_plan_on_mixed_gpus_shows_types_and_the_single_type_comparison(capsys):
    assert main(["plan", "--nodes", MIXED, "--job", JOB]) == 0
    out = capsys.readouterr().out
    assert "H100-80GB-HBM3" in out and "A100-SXM4-80GB" in out and "gpu" in out.splitlines()[2]
    assert "Single-type plan" in out and "x the single-type plan's speed" in out
    assert main(["plan", "--nodes", MIXED, "--job", JOB, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["singleType"]["speedup"] > 1.3
