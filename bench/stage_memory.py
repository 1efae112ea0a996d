"""Host memory to build one pipeline stage, measured in a fresh process.

    .venv/bin/python bench/stage_memory.py [--layers 24 --hidden 2048 --heads 16 --seq 2048
                                            --vocab 50257 --stage-layers 12 --first]

Default: the first stage (embedding + 12 of 24 layers) of a 1.3B GPT (GPT-3 XL shape), fp32 on
the CPU; ``--tensor T`` builds tensor-parallel rank 0's slice of it instead. Prints the stage's
fp32 parameter bytes, the peak RSS the build added (VmHWM after minus VmRSS before, the peak mark
reset first) and their ratio. The stage is built on the meta device and initialised parameter
by parameter, a block of rows at a time (trainer/holmes/trainer/model.py), so the ratio stays
near 1.0 plus torch's own lazily allocated state (~75 MB): the parameters themselves and at
most one 4 MiB block of temporaries.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys
import torch
from holmes.contract import ModelSpec
from holmes.trainer.model import build_stage
from holmes.trainer.tensor_parallel import TensorParallel

a = json.loads(sys.argv[1])

def kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

spec = ModelSpec(layers=a["layers"], hidden_size=a["hidden"], attention_heads=a["heads"],
                 seq_length=a["seq"], vocab_size=a["vocab"])
torch.set_num_threads(1)
open("/proc/self/clear_refs", "w").write("5")      # reset the peak mark to the current RSS
before = kib("VmRSS")
first = a["first"]
start = 0 if first else a["layers"] - a["stage_layers"]
tp = TensorParallel(a.get("tensor", 1), 0)  # rank 0's slice (building needs no group)
m = build_stage(spec, start, start + a["stage_layers"], first, not first, seed=1, tp=tp)
peak = kib("VmHWM")
params = sum(p.numel() for p in m.parameters())
print(json.dumps({"params": params, "param_bytes": params * 4, "added_bytes": (peak - before) * 1024}))
"""


def measure(**a) -> dict:
    """Build the stage in a fresh interpreter (nothing allocated before counts)."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(a)], capture_output=True, text=True, check=True
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["ratio"] = r["added_bytes"] / r["param_bytes"]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--stage-layers", type=int, default=12)
    ap.add_argument("--last", action="store_true", help="the last stage (layers + head) instead of the first")
    ap.add_argument("--tensor", type=int, default=1, help="build tensor-parallel rank 0's slice")
    a = ap.parse_args()
    r = measure(
        layers=a.layers,
        hidden=a.hidden,
        heads=a.heads,
        seq=a.seq,
        vocab=a.vocab,
        stage_layers=a.stage_layers,
        first=not a.last,
        tensor=a.tensor,
    )
    print(
        f"stage of {r['params'] / 1e6:.0f}M parameters: fp32 bytes {r['param_bytes'] / 2**30:.2f} GiB, "
        f"build added {r['added_bytes'] / 2**30:.2f} GiB peak RSS: {r['ratio']:.3f}x"
    )


if __name__ == "__main__":
    main()
