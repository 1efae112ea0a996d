"""torchtitan's mesh and DeepSpeed's pipeline partition on a Holmes plan, with the real packages
(torchtitan 0.3.0, DeepSpeed 0.19.8) on CPU: every rank of a 12- or 6-rank world is built in this
process in turn over torch's fake process group, with the launcher's hook installed as in a pod."""

import io
import json
import os
import sys

import pytest
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from holmes.contract import Layout
from holmes.launch import hook, stages
from holmes.launch.islands import Islands
from holmes.operator.core import framework_launch as fw
from tests.helpers.frameworks.framework_helpers import job, launched, titan_config


@pytest.fixture(scope="module")
def layout() -> Layout:
    """The planner's three-stage layout on the default topology (6 nodes x 2 GPUs, tensor 2)."""
    _, d = launched(job("torchtitan", ["python", "-m", "torchtitan.train"]))
    out = Layout.from_json(d.configmap["data"]["layout.json"])
    assert out.pipeline == 3 and len({s.num_layers for s in out.stages}) > 1  # uneven stages
    return out


@pytest.fixture
def hooked(layout):
    log = io.StringIO()
    h = hook.install(Islands.from_layout(layout.to_dict()), log=log)
    yield h, log
    hook.uninstall()
    if dist.is_initialized():
        dist.destroy_process_group()


def test_torchtitan_parses_the_plan_and_its_mesh_forms_holmes_groups(layout, hooked, monkeypatch):
    import torchtitan.distributed.parallel_dims as pdm

    h, log = hooked
    cfg = titan_config(fw.torchtitan_args(layout))
    par = cfg.parallelism
    assert (par.pipeline_parallel_degree, par.tensor_parallel_degree) == (layout.pipeline, layout.tensor)
    assert par.data_parallel_shard_degree == layout.data and par.data_parallel_replicate_degree == 1
    parts = par.module_fqns_per_model_part
    assert [sum(f.startswith("layers.") for f in p) for p in parts] == [s.num_layers for s in layout.stages]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]

    monkeypatch.setattr(pdm, "device_type", "cpu")  # torchtitan assumes cuda
    W = layout.world_size
    mesh_groups = {}
    for rank in range(W):
        dist.init_process_group("fake", rank=rank, world_size=W, store=FakeStore())
        dims = pdm.ParallelDims.from_config(par, W)
        dims.build_mesh()
        for name in ("pp", "dp_shard", "tp"):
            mesh_groups.setdefault(name, set()).add(
                tuple(dist.get_process_group_ranks(dims.get_mesh(name).get_group()))
            )
        dist.destroy_process_group()
    assert mesh_groups["pp"] == {g.ranks for g in layout.process_groups("pp")}
    assert mesh_groups["dp_shard"] == {g.ranks for g in layout.process_groups("dp")}
    assert mesh_groups["tp"] == {g.ranks for g in layout.process_groups("tp")}
    logged = {
        tuple(g["ranks"]): g["net"]
        for g in map(lambda l: json.loads(l)["holmesGroup"], log.getvalue().splitlines())
    }
    for pg in layout.process_groups():
        if pg.kind in ("dp", "tp", "pp"):
            one_node = len({r // layout.gpus_per_node for r in pg.ranks}) == 1  # left to NCCL
            assert logged[pg.ranks] == (None if one_node else pg.net), (pg.kind, pg.ranks)


def test_deepspeed_pipeline_cuts_at_the_layouts_stages(layout, hooked, monkeypatch):
    import deepspeed.comm as dscomm
    import deepspeed.runtime.pipe.module as pipe
    from torch import nn

    # DeepSpeed compiles its CPU shared-memory allreduce op on first use (minutes of C++ on two
    # cores); no collective here would use it
    monkeypatch.setattr(sys.modules["deepspeed.comm.torch"], "build_shm_op", lambda: None)

    class Embed(nn.Linear):
        pass

    class Block(nn.Linear):
        pass

    class Head(nn.Linear):
        pass

    counts = [s.num_layers for s in layout.stages]
    specs = [pipe.LayerSpec(Embed, 2, 2)] + [pipe.LayerSpec(Block, 2, 2) for _ in range(sum(counts))]
    specs.append(pipe.LayerSpec(Head, 2, 2))
    W = layout.pipeline * layout.data  # DeepSpeed's (pipe, data) grid; tensor slices are the user's
    original = pipe.PipelineModule._partition_layers
    seen = []
    try:
        for rank in range(W):
            dist.init_process_group("fake", rank=rank, world_size=W, store=FakeStore())
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(W), LOCAL_RANK="0")
            if not dscomm.is_initialized():
                dscomm.init_distributed(dist_backend="fake", auto_mpi_discovery=False)
            if rank == 0:  # DeepSpeed's own balanced cut, for contrast: not the planner's
                pm = pipe.PipelineModule(
                    layers=specs, num_stages=layout.pipeline, partition_method="type:Block"
                )
                balanced = pm.parts
                stages.patch(pipe, counts)
            pm = pipe.PipelineModule(layers=specs, num_stages=layout.pipeline, partition_method="type:Block")
            seen.append((pm.stage_id, pm._local_start, pm._local_stop))
            dist.destroy_process_group()
    finally:
        pipe.PipelineModule._partition_layers = original
    bounds = [0] + [1 + sum(counts[: s + 1]) for s in range(layout.pipeline - 1)] + [len(specs)]
    assert pm.parts == bounds and balanced != bounds
    for rank, (stage, start, stop) in enumerate(seen):
        assert stage == rank // layout.data and (start, stop) == (bounds[stage], bounds[stage + 1])
        blocks = sum(isinstance(s, pipe.LayerSpec) and s.typename is Block for s in specs[start:stop])
        assert blocks == counts[stage]
