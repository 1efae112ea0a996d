import torch

# Forked workers inherit this; one intra-op thread per process keeps the 2-core CI honest and
# avoids OpenMP pools created before fork.
torch.set_num_threads(1)
