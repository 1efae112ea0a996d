"""A stand-in for Megatron-LM's ``pretrain_gpt.py`` up to its model build, run by the tests as
the user's command of a ``framework: megatron`` HolmesJob: it reads the arguments Holmes
appends (as Megatron-LM's argument parser would), builds the process groups with the real
``megatron.core.parallel_state.initialize_model_parallel`` and derives the layers per stage
from the ``--pipeline-model-parallel-layout`` string with Megatron's own parser. Each rank
prints one JSON line ``{"megatron": {...}}``: its groups' global ranks, the stage sizes, and the
communicator file's nets (which Megatron itself would read on NCCL; on the CPU wheel it cannot,
ProcessGroupNCCL does not exist there). For a mixture of experts ``--expert-model-parallel-size``
reaches ``initialize_model_parallel`` as Megatron-LM passes it, and the expert groups
megatron-core forms are printed under their communicator-file names.
"""

import argparse
import json

import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tensor-model-parallel-size", type=int, required=True)
    p.add_argument("--pipeline-model-parallel-size", type=int, required=True)
    p.add_argument("--num-layers", type=int, required=True)
    p.add_argument("--micro-batch-size", type=int, required=True)
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--pipeline-model-parallel-layout", default=None)
    p.add_argument("--nccl-communicator-config-path", default=None)
    p.add_argument("--expert-model-parallel-size", type=int, default=1)
    args, _ = p.parse_known_args()

    dist.init_process_group("gloo")
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    ps.initialize_model_parallel(
        args.tensor_model_parallel_size,
        args.pipeline_model_parallel_size,
        expert_model_parallel_size=args.expert_model_parallel_size,
        nccl_communicator_config_path=args.nccl_communicator_config_path
        if dist.is_nccl_available()
        else None,
    )
    getters = {
        "dp": ps.get_data_parallel_group,
        "tp": ps.get_tensor_model_parallel_group,
        "pp": ps.get_pipeline_model_parallel_group,
        "mp": ps.get_model_parallel_group,
        "tp_dp": ps.get_tensor_and_data_parallel_group,
        "embd": ps.get_embedding_group,
        # the expert groups, keyed as megatron-core names them in the communicator file
        "ep": ps.get_expert_model_parallel_group,
        "ep_tp": ps.get_expert_tensor_parallel_group,
        "tp_ep_mp": ps.get_expert_tensor_and_model_parallel_group,
        "tp_ep_pp": ps.get_expert_tensor_model_pipeline_parallel_group,
        "ep_dp": ps.get_expert_data_parallel_group,
    }
    groups = {}
    for kind, get in getters.items():
        try:
            g = get()
        except AssertionError:
            continue
        if g is not None and dist.get_rank() in dist.get_process_group_ranks(g):
            groups[kind] = dist.get_process_group_ranks(g)
    pp = args.pipeline_model_parallel_size
    layers = [args.num_layers]
    if args.pipeline_model_parallel_layout:
        layout = PipelineParallelLayerLayout(args.pipeline_model_parallel_layout, pp)
        layout.validate_layer_layout(args.num_layers, None)
        layers = [layout.layout[s][0].count(LayerType.decoder) for s in range(pp)]
    cfg = {}
    if args.nccl_communicator_config_path:
        import yaml

        with open(args.nccl_communicator_config_path) as f:
            cfg = {k: v["net_name"] for k, v in yaml.safe_load(f).items()}
    out = {
        "rank": dist.get_rank(),
        "stage": ps.get_pipeline_model_parallel_rank(),
        "groups": groups,
        "stageLayers": layers,
        "communicatorNets": cfg,
        "dataParallelSize": ps.get_data_parallel_world_size(),
        "expertParallelSize": ps.get_expert_model_parallel_world_size(),
    }
    print(json.dumps({"megatron": out}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
