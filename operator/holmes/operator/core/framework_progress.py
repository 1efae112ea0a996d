"""Training progress of external frameworks (``spec.framework`` other than holmes), read from
the log line each framework prints per logged iteration (pure parsing; the caller reads the
bounded log tail through the API).

- Megatron-LM prints ``iteration 12/ 100 | ... elapsed time per iteration (ms): 812.3 |
  throughput per GPU (TFLOP/s/GPU): 141.2 | ... lm loss: 7.123456E+00 | ...`` on the *last*
  rank (the last pipeline stage holds the loss): read from the last node rank's pod;
- torchtitan: ``step: 12  loss:  7.12345  ...  tps: 5,123  tflops: 141.20  mfu: ...`` (ANSI
  colours stripped), on rank 0 with its default LOG_RANK: node rank 0's pod;
- DeepSpeed's pipeline engine: ``steps: 12 loss: 7.1234 iter time (s): 0.812 samples/sec: ...``
  on global rank 0: node rank 0's pod;
- torchrun: nothing known; phase, layout and restarts only.
"""

from __future__ import annotations

import re
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"([-+]?[0-9][0-9,]*\.?[0-9]*(?:[eE][-+]?[0-9]+)?)"
PATTERNS: dict[str, tuple[re.Pattern, dict[str, re.Pattern]]] = {
    "megatron": (
        re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|"),
        {
            "loss": re.compile(r"\blm loss:\s*" + _NUM),
            "iterationSeconds": re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM),
            "tflopsPerGpu": re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _NUM),
        },
    ),
    "torchtitan": (
        re.compile(r"\bstep:\s*(\d+)\s+loss:"),
        {
            "loss": re.compile(r"\bloss:\s*" + _NUM),
            "tokensPerSecond": re.compile(r"\btps:\s*" + _NUM),
            "tflopsPerGpu": re.compile(r"\btflops:\s*" + _NUM),
        },
    ),
    "deepspeed": (
        re.compile(r"\bsteps:\s*(\d+)\s+loss:"),
        {
            "loss": re.compile(r"\bloss:\s*" + _NUM),
            "iterationSeconds": re.compile(r"iter time \(s\):\s*" + _NUM),
        },
    ),
}
SCALE = {("megatron", "iterationSeconds"): 1e-3}  # Megatron prints milliseconds


def reporting_node_rank(framework: str, nodes: int) -> int:
    """The node rank whose pod prints the framework's iteration lines."""
    return nodes - 1 if framework == "megatron" else 0


def from_log(framework: str, text: str) -> dict[str, Any]:
    """The numbers of the last iteration line in ``text`` (a log tail); {} when there is none."""
    if framework not in PATTERNS:
        return {}
    head, fields = PATTERNS[framework]
    for line in reversed(_ANSI.sub("", text or "").splitlines()):
        m = head.search(line)
        if not m:
            continue
        out: dict[str, Any] = {"iteration": int(m.group(1))}
        rest = line[m.start() :]
        for key, pattern in fields.items():
            f = pattern.search(rest)
            if f:
                try:
                    value = float(f.group(1).replace(",", "")) * SCALE.get((framework, key), 1.0)
                except ValueError:
                    continue
                if value == value:  # NaN: Megatron prints nan losses on skipped iterations
                    out[key] = round(value, 6)
        return out
    return {}
