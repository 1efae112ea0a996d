"""A plain torchrun program, as many training scripts are written, run by the tests as the user's
command of a ``framework: torchrun`` HolmesJob: ``init_process_group()`` with no backend (torch
picks: NCCL on CUDA, gloo here), one ``new_group`` per data-parallel group of the Layout Holmes
hands it (``HOLMES_LAYOUT``), and a few all-reduces on its own DP group and the world. Each rank
prints one JSON line ``{"plainTorchrun": {...}}``: its DP group's ranks and what the all-reduces
returned, which the test checks against the sums the ranks must produce."""

import json
import os

import torch
import torch.distributed as dist

from holmes.contract import Layout

ROUNDS = 3


def main() -> None:
    dist.init_process_group()
    rank = dist.get_rank()
    with open(os.environ["HOLMES_LAYOUT"]) as f:
        layout = Layout.from_json(f.read())
    mine = None
    for g in layout.process_groups():  # every rank creates every group, in the same order
        if g.kind == "dp":
            pg = dist.new_group(list(g.ranks))
            if rank in g.ranks:
                mine = (list(g.ranks), pg)
    assert mine is not None, f"rank {rank} is in no DP group of the Layout"
    dp = torch.full((4,), float(rank + 1))
    for _ in range(ROUNDS):
        dist.all_reduce(dp, group=mine[1])
    world = torch.full((4,), float(rank + 1))
    dist.all_reduce(world)
    out = {"rank": rank, "dp": mine[0], "dpSum": dp[0].item(), "worldSum": world[0].item()}
    print(json.dumps({"plainTorchrun": out}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
