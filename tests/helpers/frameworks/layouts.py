"""Layouts the launcher and network-hook tests share (the Layout JSON, as the operator writes it)."""

# 6 nodes x 2 GPUs; stage 0 on a 2-node InfiniBand island, stage 1 on 2 RoCE nodes, stage 2 on
# Ethernet nodes of two clusters (a mixed stage): islands of unequal speed and kind.
THREE = {
    "gpusPerNode": 2,
    "tensor": 2,
    "data": 2,
    "pipeline": 3,
    "nodes": ["ib-0", "ib-1", "roce-0", "roce-1", "eth-0", "eth-1"],
    "stages": [
        {"island": "east/infiniband", "nic": "infiniband", "layers": [0, 3]},
        {"island": "west/roce", "nic": "roce", "layers": [3, 6]},
        {"island": "mixed:east+west/ethernet", "nic": "ethernet", "layers": [6, 8]},
    ],
}
