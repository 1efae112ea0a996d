"""GPU type per node, from the labels NVIDIA's GPU Feature Discovery (GFD) publishes, and the
FLOP rate and memory the cost model prices a stage's GPUs with.

GFD writes ``nvidia.com/gpu.product`` (the product name with spaces as dashes:
``NVIDIA-H100-80GB-HBM3``, ``NVIDIA-A100-SXM4-40GB``, ``NVIDIA-H100-PCIe``, ``NVIDIA-L40S``),
``nvidia.com/gpu.memory`` (MiB per GPU) and ``nvidia.com/gpu.count``. A product is looked up in
:data:`PRODUCTS` (extended or overridden by the cost model's ``gpuProducts``): an entry matches
when its first word is the label's model (``H100``, after an ``NVIDIA-``/``Tesla-`` prefix) and
its other words all appear in the label (``H100-PCIe`` beats ``H100`` for ``NVIDIA-H100-PCIe``);
an entry whose name is the whole label wins over all. The memory label, when present, beats the
table (it is what the node really has).

Peak figures are **dense** bf16 tensor-core TFLOP/s from NVIDIA's data sheets (the sheets print
the 2:4-sparsity figure, twice these, first; training does not use sparsity). The cost model
multiplies them by ``computeEfficiency`` as it did the single ``gpuPeakTflops``. A product's
NVLink bandwidth per GPU (one direction) is in the table only for the rack-scale parts (GB200,
GB300: NVLink 5, 1.8 TB/s both ways), whose NVLink domain spans nodes; every other GPU takes the
cost model's ``nvlinkGbps``, and ``gpuProducts`` may give any product its own ``nvlinkGbps``.

A node without the label but with GPUs that NVIDIA's DRA driver publishes in ResourceSlices
(discovery.py, dra.py) is looked up by their ``productName`` (``NVIDIA A100-SXM4-80GB``: words
split on spaces as on dashes) and their ``memory`` capacity stands in for the memory label.

A node without a product label or DRA product is priced with ``gpuPeakTflops`` / ``gpuMemoryGib`` (the
single-type setting, for clusters without GFD); a product the table does not know, or a MIG
slice, is priced the same way and its note says so (``holmes plan``'s ``why:`` lines show it).
A measured rate, the label ``holmes.dev/measured-tflops`` (achieved TFLOP/s per GPU on this
job's layers), replaces both: calibration (:mod:`.calibrate`) puts it on its in-memory copy of
the nodes a job re-plans on; an admin may also label a node known to run slower than its type.

A stage runs at its slowest GPU: its DP groups step together, so the slowest member sets every
member's pace; its memory cap is its smallest GPU's.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from holmes.contract import names

from .costmodel import CostModelConfig, GpuProduct

if TYPE_CHECKING:
    from .discovery import NodeNic


# Dense bf16 tensor-core TFLOP/s (data-sheet figure without sparsity) and memory in GiB as sold.
PRODUCTS: tuple[tuple[str, GpuProduct], ...] = (
    # GB200/GB300 NVL72 (GFD: NVIDIA-GB200): 180 PFLOP/s dense bf16 per 72 GPUs, 2.5 per GPU;
    # 186 / 288 GB HBM3e; NVLink 5 at 900 GB/s each way = 7200 Gbit/s
    ("GB200", GpuProduct(2500.0, 186.0, 7200.0)),
    ("GB300", GpuProduct(2500.0, 288.0, 7200.0)),
    ("B200", GpuProduct(2250.0, 180.0)),  # HGX B200: 4.5 PFLOP/s sparse
    ("H200", GpuProduct(989.4, 141.0)),  # H200 SXM: same Hopper die as H100 SXM
    ("H200-NVL", GpuProduct(835.0, 141.0)),
    ("H100", GpuProduct(989.4, 80.0)),  # H100 SXM5 (GFD: NVIDIA-H100-80GB-HBM3): 1979 sparse
    ("H100-PCIe", GpuProduct(756.0, 80.0)),  # 1513 sparse
    ("H100-NVL", GpuProduct(835.0, 94.0)),  # 1671 sparse
    ("A100", GpuProduct(312.0, 80.0)),  # SXM4 and PCIe alike: 624 sparse
    ("A100-40GB", GpuProduct(312.0, 40.0)),
    ("A100-80GB", GpuProduct(312.0, 80.0)),
    ("L40S", GpuProduct(362.05, 48.0)),  # 733 sparse
    ("L40", GpuProduct(181.05, 48.0)),  # 362 sparse
    ("L4", GpuProduct(121.0, 24.0)),  # 242 sparse
    ("A10", GpuProduct(125.0, 24.0)),  # 250 sparse
)

UNLABELLED = "unlabelled"  # the type name of nodes GFD has not labelled


@dataclass(frozen=True)
class NodeGpu:
    """What the cost model prices one node's GPUs with."""

    name: str  # short product name (GFD label without "NVIDIA-"), or UNLABELLED
    peak_tflops: float  # dense bf16 peak per GPU (or measured / computeEfficiency)
    memory_gib: float
    source: str  # table | gpuProducts | gpuPeakTflops | measured
    note: str | None = None  # why the node is priced with the fallback
    nvlink_gbps: float | None = None  # per GPU, one direction (None: the config's nvlinkGbps)

    @property
    def key(self) -> tuple[str, float, float]:
        return (self.name, self.peak_tflops, self.memory_gib)


@functools.lru_cache(maxsize=4096)
def _split(text: str) -> tuple[str, ...]:
    return tuple(w for w in re.split(r"[-_ ]+", text.strip().upper()) if w)


def _words(text: str) -> list[str]:
    return list(_split(text))


def _model_words(product: str) -> list[str]:
    words = _words(product)
    while words and words[0] in ("NVIDIA", "TESLA"):
        words = words[1:]
    return words


def short_name(product: str) -> str:
    return re.sub(r"^(NVIDIA|Tesla)[-_ ]+", "", product.strip(), flags=re.IGNORECASE)


def lookup(product: str, extra: Iterable[tuple[str, GpuProduct]] = ()) -> tuple[str, GpuProduct] | None:
    """The table entry for a GFD product label (``extra`` first: the cost model's gpuProducts),
    or None. Remembered: the planner asks for every node on each search."""
    return _lookup(product, tuple(extra))


@functools.lru_cache(maxsize=1024)
def _lookup(product: str, extra: tuple[tuple[str, GpuProduct], ...]) -> tuple[str, GpuProduct] | None:
    words = _model_words(product)
    if not words:
        return None
    whole = product.strip().upper()
    for name, spec in extra:
        if name.strip().upper() in (whole, short_name(product).upper()):
            return name, spec
    best: tuple[int, int, str, GpuProduct] | None = None
    for rank, (name, spec) in enumerate(extra + PRODUCTS):
        key = _model_words(name)
        if not key or key[0] != words[0] or not set(key[1:]) <= set(words[1:]):
            continue
        score = (len(key), -rank)  # the most specific entry; gpuProducts before the table
        if best is None or score > best[:2]:
            best = (*score, name, spec)
    return None if best is None else (best[2], best[3])


def _positive(text: str | None) -> float | None:
    try:
        x = float(text) if text is not None else 0.0
    except ValueError:
        return None
    return x if 0 < x < float("inf") else None


def _memory_label(labels: Mapping[str, str]) -> float | None:
    mib = _positive(labels.get(names.LABEL_GPU_MEMORY))
    return None if mib is None else mib / 1024


def node_gpu(node: NodeNic, cfg: CostModelConfig) -> NodeGpu:
    """The GPU type of one node and what it is priced with (see the module docstring)."""
    labels = node.labels or {}
    product = labels.get(names.LABEL_GPU_PRODUCT)
    where = names.LABEL_GPU_PRODUCT
    mem_label = _memory_label(labels)
    if not product and node.gpu_product:  # the DRA driver's, when GFD has not labelled the node
        product, where = node.gpu_product, "DRA productName"
        mem_label = mem_label or node.gpu_memory_gib
    measured = _positive(labels.get(names.LABEL_MEASURED_TFLOPS))
    if not product:
        name, peak, mem, note = UNLABELLED, cfg.gpu_peak_tflops, cfg.gpu_memory_gib, None
        source, nvlink = "gpuPeakTflops", None
    else:
        name = short_name(product)
        hit = None if "MIG" in _words(product) else lookup(product, cfg.gpu_products)
        nvlink = hit[1].nvlink_gbps if hit else None
        if hit is None:
            why = "a MIG slice" if "MIG" in _words(product) else "not in the GPU table"
            peak, mem, source = cfg.gpu_peak_tflops, cfg.gpu_memory_gib, "gpuPeakTflops"
            note = (
                f"{where}={product} is {why}: priced as gpuPeakTflops "
                f"{cfg.gpu_peak_tflops:g}; add it under the cost model's gpuProducts"
            )
        else:
            key, spec = hit
            peak, mem, note = spec.peak_tflops, spec.memory_gib, None
            source = "gpuProducts" if any(k == key for k, _ in cfg.gpu_products) else "table"
    if mem_label is not None:
        mem = mem_label
    if measured is not None:
        peak, source = measured / cfg.compute_efficiency, "measured"
    return NodeGpu(name, peak, mem, source, note, nvlink)


@dataclass(frozen=True)
class StageGpu:
    """A stage's GPUs: the slowest member's rate, the smallest memory, the types it holds."""

    names: tuple[str, ...]  # distinct type names, sorted
    peak_tflops: float
    memory_gib: float
    notes: tuple[str, ...] = ()
    nvlink_gbps: float | None = None  # the slowest member's NVLink per GPU (None: the config's)

    @property
    def mixed(self) -> bool:
        return len(self.names) > 1

    @property
    def name(self) -> str:
        return "+".join(self.names)


def stage_gpu(nodes: Sequence[NodeNic], cfg: CostModelConfig) -> StageGpu:
    return stage_gpu_of([node_gpu(n, cfg) for n in nodes])


def stage_gpu_of(gpus: Sequence[NodeGpu]) -> StageGpu:
    """The stage of nodes with these GPUs (each node's :func:`node_gpu`, in the stage's order)."""
    gpus = list({id(g): g for g in gpus}.values())  # node_gpus shares one per type: each once
    return StageGpu(
        names=tuple(sorted({g.name for g in gpus})),
        peak_tflops=min(g.peak_tflops for g in gpus),
        memory_gib=min(g.memory_gib for g in gpus),
        notes=tuple(dict.fromkeys(g.note for g in gpus if g.note)),
        nvlink_gbps=None
        if any(g.nvlink_gbps is None for g in gpus)
        else min(g.nvlink_gbps or 0 for g in gpus),
    )


def node_gpus(nodes: Iterable[NodeNic], cfg: CostModelConfig) -> dict[str, NodeGpu]:
    """:func:`node_gpu` of each node by name, worked out once per distinct set of the facts it
    reads (a search over thousands of nodes of a few types asks for each node many times)."""
    seen: dict[tuple[str | None, str | None, str | None, str | None, float | None], NodeGpu] = {}
    out = {}
    for n in nodes:
        labels = n.labels or {}
        key = (
            labels.get(names.LABEL_GPU_PRODUCT),
            labels.get(names.LABEL_GPU_MEMORY),
            labels.get(names.LABEL_MEASURED_TFLOPS),
            n.gpu_product,
            n.gpu_memory_gib,
        )
        g = seen.get(key)
        if g is None:
            g = seen[key] = node_gpu(n, cfg)
        out[n.name] = g
    return out
