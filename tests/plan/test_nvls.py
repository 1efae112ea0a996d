"""NVLS per rank (holmes.contract.nvls): on where a tp/dp group inside an NVSwitch node pays,
its memory counted by the planner's estimate per stage (and by the dry run, with the same
function)."""

from __future__ import annotations

from holmes.contract import nvls


def test_it_pays_for_tensor_parallel_groups_inside_an_h100_node():
    c = nvls.choose("H100", 8, 2, 2, 8, 0, tied=True)  # T=8 fills the node
    assert c.enabled and "tp" in c.why
    # world (8 local), tp (8), dp (1 per node: not eligible), p2p out (1), embedding (1)
    assert c.communicators == 2 and c.bytes == 2 * nvls.COMMUNICATOR_BYTES
    assert c.env() == {"NCCL_NVLS_ENABLE": "1"}


def test_it_stays_off_where_it_would_cost_memory_only():
    # P=8 on one 8-GPU node: every p2p pair and the world group are eligible, nothing pays
    c = nvls.choose("NVIDIA H100 80GB HBM3", 1, 1, 8, 8, 3, tied=False)
    assert not c.enabled and c.communicators == 3 and c.bytes == 0
    assert c.env() == {"NCCL_NVLS_ENABLE": "0"}


def test_no_nvswitch_no_nvls():
    for gpu, g in (("A100", 8), ("H100 PCIe", 8), ("H100 NVL", 2), ("H100+A100", 8), (None, 8), ("H100", 2)):
        assert not nvls.nvswitch_gpu(gpu, g), gpu
        assert nvls.choose(gpu, 8 if g == 8 else 2, 1, 1, g, 0, tied=False).bytes == 0
    assert nvls.nvswitch_gpu("NVIDIA H200", 8) and nvls.nvswitch_gpu("B200", 8)


def _stage_memory_gib(product: str) -> float:
    from holmes.plan import plan

    from .plan_helpers import job_spec, node

    nodes = [node(f"n{i}", "infiniband", labels={"nvidia.com/gpu.product": product}) for i in range(2)]
    model = {"layers": 8, "hidden": 2048, "heads": 16, "seq": 1024, "vocab": 32000}
    job = job_spec(**model, B=64, mb=1, count=2, tensor=8, pipeline=2)
    layout = plan(nodes, job)
    assert (layout.tensor, layout.pipeline, layout.data) == (8, 2, 1)
    return layout.estimate["stages"][0]["memoryGiB"]


def test_the_planner_memory_model_counts_it():
    """Before: 100 MiB per communicator on any GPU; NVLS's gigabyte per communicator, which
    NCCL takes on H100 SXM nodes, was not counted, so a stage the estimate fitted could run
    out of memory there. Same job, H100 SXM against H100 PCIe (same 80 GB, no NVSwitch)."""
    c = nvls.choose("H100", 8, 1, 2, 8, 0, tied=False)
    assert c.enabled and c.communicators == 2  # world and tp: 8 ranks on the node each
    sxm, pcie = _stage_memory_gib("NVIDIA-H100-80GB-HBM3"), _stage_memory_gib("NVIDIA-H100-PCIe")
    assert round(sxm - pcie, 2) == round(c.bytes / 2**30, 2), (sxm, pcie)
