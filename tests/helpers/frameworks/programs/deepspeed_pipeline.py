"""A stand-in for a DeepSpeed pipeline program, run by the tests as the user's command of a
``framework: deepspeed`` HolmesJob: it builds a ``PipelineModule`` (an embedding, the model's
transformer blocks, a head; ``partition_method="type:Block"`` as Megatron-DeepSpeed does with its
transformer class) with ``num_stages`` from the Layout, over gloo, and prints one JSON line per
rank: its stage, DeepSpeed's cut and its data-parallel group."""

import json
import os
import sys

import torch.distributed as dist
from torch import nn


class Embed(nn.Linear):
    pass


class Block(nn.Linear):
    pass


class Head(nn.Linear):
    pass


def main() -> None:
    import deepspeed.comm as dscomm
    from deepspeed.runtime.pipe.module import LayerSpec, PipelineModule

    # DeepSpeed compiles its CPU shared-memory allreduce op on first use (minutes of C++ on two
    # cores); nothing here runs a collective it would serve
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None

    with open(os.environ["HOLMES_LAYOUT"]) as f:
        layout = json.load(f)
    layers = layout["stages"][-1]["layers"][1]
    dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    specs = (
        [LayerSpec(Embed, 4, 4)] + [LayerSpec(Block, 4, 4) for _ in range(layers)] + [LayerSpec(Head, 4, 4)]
    )
    pm = PipelineModule(layers=specs, num_stages=layout["pipeline"], partition_method="type:Block")
    blocks = sum(isinstance(m, Block) for m in pm.forward_funcs)
    out = {
        "rank": dist.get_rank(),
        "stage": pm.stage_id,
        "parts": pm.parts,
        "blocks": blocks,
        "dpGroup": dist.get_process_group_ranks(pm._grid.get_data_parallel_group()),
        "patched": getattr(PipelineModule._partition_layers, "__holmes_hook__", False),
    }
    print(json.dumps({"deepspeed": out}), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
