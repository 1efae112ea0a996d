"""Which ACTIVE RDMA ports are the node's compute rails (pure: no I/O).

A GPU server has compute rails (one HCA per GPU or pair of GPUs, behind the GPU's PCIe switch)
and other ports: front-end, storage, in-band management, often in another link layer (a DGX's
storage ConnectX ports in Ethernet mode beside InfiniBand rails) or slower. First rule that
decides wins:

1. an admin's selector (node annotation, else the labeller's ``--rails``): HCA names or globs;
2. PCIe locality: the HCAs that share a PCIe bridge (switch port or root port) with an NVIDIA GPU,
   what ``nvidia-smi topo -m`` calls PIX/PXB and where NCCL uses GPUDirect RDMA by default;
3. NUMA: the HCAs on a NUMA node that has a GPU, when that leaves some out (on a two-socket
   server with GPUs on both sockets it says nothing);
4. the fastest ACTIVE ports, and among them the link layer most of them have; a tie is left to
   the caller as rails that disagree.

SR-IOV virtual functions (their own HCAs on a host with VFs enabled) are never chosen by rules
2-4: they share their physical function's port, so counting them would count its rate twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from .sysfs import PciDevice, RdmaPort


@dataclass(frozen=True)
class RailSelector:
    """HCA names or globs an admin gave, and where they were given (for messages)."""

    patterns: tuple[str, ...]
    source: str  # e.g. "node annotation holmes.dev/nic-rails"

    @classmethod
    def parse(cls, text: str | None, source: str) -> RailSelector | None:
        patterns = tuple(p.strip() for p in (text or "").split(",") if p.strip())
        return cls(patterns, source) if patterns else None

    def matches(self, hca: str) -> bool:
        return any(fnmatchcase(hca, p) for p in self.patterns)

    def __str__(self) -> str:
        return f"{self.source} {','.join(self.patterns)!r}"


@dataclass(frozen=True)
class RailChoice:
    rails: tuple[RdmaPort, ...]
    left_out: tuple[tuple[RdmaPort, str], ...]  # (port, why it is not a rail)
    how: str  # the rule that chose, for the summary and messages
    problem: str | None = None  # the selector named no ACTIVE port


def link_of(p: RdmaPort) -> str:
    return (p.link_layer or "").strip().lower()


def choose_rails(
    ports: Sequence[RdmaPort], gpus: Sequence[PciDevice], selector: RailSelector | None = None
) -> RailChoice:
    """The rails among ``ports`` (ACTIVE, with a known link layer) and why the others are not."""
    if not ports:
        return RailChoice((), (), "no ACTIVE RDMA port")
    if selector is not None:
        named = tuple(p for p in ports if selector.matches(p.hca))
        others = tuple((p, f"not named by {selector}") for p in ports if not selector.matches(p.hca))
        if not named:
            hcas = ", ".join(dict.fromkeys(p.hca for p in ports))
            return RailChoice(
                (),
                others,
                str(selector),
                f"{selector} names none of the HCAs with an ACTIVE port ({hcas}): set it to the "
                f"compute rails' HCA names or globs, comma-separated",
            )
        return RailChoice(named, others, str(selector))

    candidates = [p for p in ports if p.pci is None or not p.pci.physfn]
    left_out = [
        (p, f"SR-IOV virtual function of {p.pci.physfn}") for p in ports if p not in candidates and p.pci
    ]
    if not candidates:  # only VFs are ACTIVE (PFs without a port of their own): choose among them
        candidates, left_out = list(ports), []

    gpu_bridges = {b for g in gpus for b in g.bridges}
    near = [p for p in candidates if p.pci is not None and gpu_bridges & set(p.pci.bridges)]
    if near:
        far = [(p, "shares no PCIe switch or root port with a GPU") for p in candidates if p not in near]
        return RailChoice(
            tuple(near), tuple(left_out + far), "PCIe locality (a PCIe bridge shared with a GPU)"
        )

    gpu_numa = {g.numa_node for g in gpus if g.numa_node is not None}
    near = [p for p in candidates if p.pci is not None and p.pci.numa_node in gpu_numa]
    if near and len(near) < len(candidates):
        far = [(p, _numa_reason(p)) for p in candidates if p not in near]
        nodes = ",".join(str(n) for n in sorted(gpu_numa))
        return RailChoice(tuple(near), tuple(left_out + far), f"NUMA locality (the GPUs' NUMA node {nodes})")

    fastest = max(p.rate_gbps or 0.0 for p in candidates)
    fast = [p for p in candidates if (p.rate_gbps or 0.0) == fastest]
    slow = [(p, f"slower than the fastest ports ({fastest:g} Gb/s)") for p in candidates if p not in fast]
    counts = Counter(link_of(p) for p in fast).most_common()
    how = "the fastest ACTIVE ports' majority link layer (no GPU locality in sysfs)"
    if len(counts) > 1 and counts[0][1] == counts[1][1]:  # a tie: the caller reports rails that disagree
        return RailChoice(
            tuple(fast), tuple(left_out + slow), "the fastest ACTIVE ports (no GPU locality in sysfs)"
        )
    winner = counts[0][0]
    rails = [p for p in fast if link_of(p) == winner]
    minority = [
        (p, f"link layer {p.link_layer} while most of the fastest ports are {rails[0].link_layer}")
        for p in fast
        if p not in rails
    ]
    return RailChoice(tuple(rails), tuple(left_out + slow + minority), how)


def _numa_reason(p: RdmaPort) -> str:
    numa = p.pci.numa_node if p.pci is not None else None
    if numa is None:
        return "NUMA node unknown, the GPUs' is known"
    return f"on NUMA node {numa}, which has no GPU"
