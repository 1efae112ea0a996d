"""NVLS per rank (holmes.contract.nvls): on where a tp/dp group inside an NVSwitch node pays,
its memory counted by the planner's estimate per stage (and by the dry run, with the same
function)."""

from __future__ import annotations

from holmes.contract import nvls

MiB = 2**20


def test_it_pays_for_tensor_parallel_groups_inside_an_h100_node():
    c = nvls.choose("H100", 8, 2, 2, 8, 0, tied=True)  # T=8 fills the node
    assert c.enabled and "tp" in c.why
    # world (8 local, never reduces large messages), tp (8: 8 heads x 32 MiB), dp (1 per
    # node), p2p out (1), embedding (1): NCCL 2.30 allocates NVLS buffers for tp only
    assert c.communicators == 1 and c.bytes == 256 * MiB
    assert c.env() == {"NCCL_NVLS_ENABLE": "2"}


def test_on_is_written_2_never_1():
    """Before: on was NCCL_NVLS_ENABLE=1, with which NCCL 2.21-2.30 skips the multicast-support
    check (ncclNvlsInit) and every communicator of 2+ GPUs on the node fails at init where
    multicast does not work; 2 checks and falls back quietly."""
    assert nvls.ON == "2"
    d = nvls.decide(["H100"] * 2, 8, 1, 2, 8, tied=False)
    assert all(d.nodes) and {d.node_env(n)["NCCL_NVLS_ENABLE"] for n in range(2)} == {"2"}


def test_buffers_are_what_nccl_2_30_allocates():
    """Before: 1 GiB per communicator (older NCCLs' 4 MiB steps), about four times NCCL 2.30's
    ncclNvlsBufferSetup: channels x 2 x 128 KiB x 8 steps per GPU of the communicator on the
    node; and communicators that never reduce large messages (world, p2p) allocate none, since
    NCCL sets the buffers up lazily, when a collective first picks NVLS."""
    span = nvls.GroupSpan
    assert nvls.communicator_bytes(span("tp", 8, 1), blackwell=False) == 256 * MiB
    assert nvls.communicator_bytes(span("dp", 4, 1), blackwell=False) == 128 * MiB
    assert nvls.communicator_bytes(span("tp", 8, 1), blackwell=True) == 384 * MiB  # 24 channels
    assert nvls.communicator_bytes(span("dp", 8, 2), blackwell=True) == 512 * MiB  # 32 across nodes
    assert not span("world", 8, 1).eligible and not span("p2p", 2, 1).eligible
    assert span("embedding", 2, 1).eligible and not span("tp", 1, 2).eligible
    b = nvls.choose("B200", 8, 1, 2, 8, 0, tied=False)
    assert b.enabled and b.bytes == 384 * MiB and "tp 384 MiB" in b.why


def test_it_stays_off_where_it_would_cost_memory_only():
    # P=8 on one 8-GPU node: p2p pairs and the world group only, nothing pays
    c = nvls.choose("NVIDIA H100 80GB HBM3", 1, 1, 8, 8, 3, tied=False)
    assert not c.enabled and c.communicators == 0 and c.bytes == 0
    assert c.env() == {"NCCL_NVLS_ENABLE": "0"}


def test_no_nvswitch_no_nvls():
    for gpu, g in (("A100", 8), ("H100 PCIe", 8), ("H100 NVL", 2), ("H100+A100", 8), (None, 8), ("H100", 2)):
        assert not nvls.nvswitch_gpu(gpu, g), gpu
        assert nvls.choose(gpu, 8 if g == 8 else 2, 1, 1, g, 0, tied=False).bytes == 0
    assert nvls.nvswitch_gpu("NVIDIA H200", 8) and nvls.nvswitch_gpu("B200", 8)


def _stage_memory_gib(product: str) -> float:
    from holmes.plan import plan
    from tests.helpers.plan.plan_helpers import job_spec, node

    nodes = [node(f"n{i}", "infiniband", labels={"nvidia.com/gpu.product": product}) for i in range(2)]
    model = {"layers": 8, "hidden": 2048, "heads": 16, "seq": 1024, "vocab": 32000}
    job = job_spec(**model, B=64, mb=1, count=2, tensor=8, pipeline=2)
    layout = plan(nodes, job)
    assert (layout.tensor, layout.pipeline, layout.data) == (8, 2, 1)
    return layout.estimate["stages"][0]["memoryGiB"]


def test_the_planner_memory_model_counts_it():
    """NVLS's buffers, which NCCL takes on H100 SXM nodes, are counted per stage. Same job, H100
    SXM against H100 PCIe (same 80 GB, no NVSwitch)."""
    c = nvls.choose("H100", 8, 1, 2, 8, 0, tied=False)
    assert c.enabled and c.communicators == 1 and c.bytes == 256 * MiB  # tp: 8 ranks on the node
    sxm, pcie = _stage_memory_gib("NVIDIA-H100-80GB-HBM3"), _stage_memory_gib("NVIDIA-H100-PCIe")
    assert round(sxm - pcie, 2) == round(c.bytes / 2**30, 2), (sxm, pcie)


def test_a_node_holds_the_stages_its_ranks_belong_to():
    assert nvls.node_stages(4, 1, 4, 8) == [range(0, 2), range(2, 4)]  # two stages a node
    assert nvls.node_stages(8, 2, 2, 8) == [range(0, 1)] * 2 + [range(1, 2)] * 2  # two nodes a stage
    assert nvls.node_stages(1, 6, 4, 8) == [range(0, 2), range(1, 3), range(2, 4)]  # straddling


def test_stages_sharing_a_node_that_disagree_turn_it_off_and_count_nothing():
    """NCCL_NVLS_ENABLE is one per pod: with data 6 on 8-GPU nodes, stages 0 and 3 have their dp
    group inside a node (on) and stages 1 and 2 straddle two (off); every node holds an 'off'
    stage, so every pod is off and no stage counts NVLS's memory."""
    d = nvls.decide(["H100"] * 4, 1, 6, 4, 8, tied=False)
    assert [nvls.choose("H100", 1, 6, 4, 8, s, False).enabled for s in range(4)] == [True, False, False, True]
    assert d.nodes == (False, False, False)
    assert [c.bytes for c in d.stages] == [0, 0, 0, 0]
    assert "node 0 also holds stage 1" in d.stages[0].why
    assert d.node_env(0) == {"NCCL_NVLS_ENABLE": "0"}


def test_a_stage_counts_nvls_when_one_of_its_nodes_runs_with_it():
    """Stage 0 spans nodes 0 and 1; node 1 also holds stage 1 (priced on the A100 of node 2),
    so node 1 is off. Stage 0's ranks on node 0 run with NVLS: its estimate keeps counting it
    (over-counting the ranks on node 1, the safe side)."""
    d = nvls.decide(["H100", "H100+A100"], 4, 3, 2, 8, tied=False)
    assert d.nodes == (True, False, False)
    assert d.stages[0].enabled and d.stages[0].bytes > 0
    assert not d.stages[1].enabled and d.stages[1].bytes == 0
    assert [d.node_env(n)["NCCL_NVLS_ENABLE"] for n in range(3)] == ["2", "0", "0"]


def test_every_stage_on_a_node_on_nvlink_sharp_agrees():
    """Tensor 4 on 8-GPU H100 nodes: two stages a node, both with a tp group of 4 inside it."""
    d = nvls.decide(["H100"] * 4, 4, 1, 4, 8, tied=True)
    assert d.nodes == (True, True) and all(c.enabled for c in d.stages)
    assert [c.bytes for c in d.stages] == [nvls.choose("H100", 4, 1, 4, 8, s, True).bytes for s in range(4)]


def test_each_stage_is_judged_by_the_nodes_that_hold_it_on_every_shape():
    """decide() finds each stage's nodes in one pass over the nodes (issue 47: the scan per
    stage was 38 ms a call on 8,192 nodes); the stages' and nodes' choices must be what looking
    up every node for every stage gives, on every small shape and GPU mix."""
    checked = disagreed = 0
    for G in (4, 8):
        for T in (1, 2, 4, 8):
            for D in (1, 2, 3, 4, 6, 8, 16):
                for P in (1, 2, 3, 4, 7):
                    for mix in (["H100"], ["H100", "A100"], ["H100", "H100", "A100"]):
                        gpus = [mix[s % len(mix)] for s in range(P)]
                        d = nvls.decide(gpus, T, D, P, G, tied=True)
                        on_node = nvls.node_stages(T, D, P, G)
                        own = [nvls.choose(gpus[s], T, D, P, G, s, True) for s in range(P)]
                        assert d.nodes == tuple(all(own[s].enabled for s in st) for st in on_node)
                        for s, c in enumerate(d.stages):
                            mine = [n for n, st in enumerate(on_node) if s in st]
                            assert c.enabled == (own[s].enabled and any(d.nodes[n] for n in mine))
                            assert c.communicators == own[s].communicators
                            disagreed += own[s].enabled and not c.enabled
                        checked += 1
    assert checked == 2 * 4 * 7 * 5 * 3 and disagreed > 0  # both sides of the rule are exercised
