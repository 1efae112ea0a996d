"""A stand-in for torchtitan's trainer up to its device mesh, run by the tests as the user's
command of a ``framework: torchtitan`` HolmesJob: it parses the arguments Holmes appends with
torchtitan's own rules and config classes, builds ``ParallelDims`` and its mesh over gloo, and
prints one JSON line per rank: its mesh groups and the modules of each pipeline part."""

import json
import sys
from dataclasses import dataclass, field

import torch.distributed as dist

# torchtitan asks for a "fake" backend on size-1 mesh dimensions, which torch registers here
import torch.testing._internal.distributed.fake_pg  # noqa: F401


def main() -> None:
    import torchtitan.distributed.parallel_dims as pdm
    import tyro
    from torchtitan.config.configs import ParallelismConfig, TrainingConfig
    from torchtitan.config.manager import ConfigManager, custom_registry

    ConfigManager()  # registers torchtitan's tyro rules

    @dataclass
    class Job:
        parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
        training: TrainingConfig = field(default_factory=TrainingConfig)

    cfg = tyro.cli(Job, args=sys.argv[1:], registry=custom_registry)
    dist.init_process_group("gloo")
    pdm.device_type = "cpu"  # torchtitan assumes cuda
    dims = pdm.ParallelDims.from_config(cfg.parallelism, dist.get_world_size())
    dims.build_mesh()
    groups = {}
    for name in ("pp", "dp_shard", "tp", "loss"):
        mesh = dims.get_optional_mesh(name)
        if mesh is not None:
            groups[name] = dist.get_process_group_ranks(mesh.get_group())
    out = {
        "rank": dist.get_rank(),
        "groups": groups,
        "parts": cfg.parallelism.module_fqns_per_model_part,
        "localBatch": cfg.training.local_batch_size,
    }
    print(json.dumps({"torchtitan": out}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
