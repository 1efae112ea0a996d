"""Training data: which samples make up iteration i, and how a DP rank gets its share.

The global batch of iteration i is samples ``[i*B, (i+1)*B)`` of a deterministic stream that
depends only on the seed, never on the pipeline/data degrees; DP rank d takes the contiguous
slice ``[d*B/D, (d+1)*B/D)`` of it. So two layouts of the same job see the same data, and
resuming needs only the iteration number.

Sources:
- ``SyntheticSource``: sample k is an arithmetic progression ``(a + t*c) mod V`` with (a, c) drawn
  from a generator seeded by (seed, k) -- learnable, so the loss falls.
- ``TokenFileSource``: a flat binary file of token ids (uint16 or uint32, little endian),
  memory-mapped; sample k is window ``perm[k mod n]`` of ``n = (N-1)//s`` windows of s+1
  tokens (consecutive windows share one token: each token is a target once per epoch), with a
  fresh seeded permutation per epoch.
- ``BlendSource``: several sources drawn in proportion to their weights. The weights become
  counts per block of ``BLEND_BLOCK`` samples (largest remainders), spread evenly over the block;
  every block has the same pattern, so sample k's source and its index in that source are
  computed directly from k (resuming at any iteration costs nothing).

``TokenWindows`` is evaluation's view of a token file: all consecutive non-overlapping windows
of s+1 tokens, each once, in file order.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import torch

from .tokenize import sidecar_path

TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


class DataError(ValueError):
    pass


class SyntheticSource:
    def __init__(self, vocab_size: int, seq_length: int, seed: int):
        self.vocab, self.seq, self.seed = vocab_size, seq_length, seed

    def sample(self, k: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 7_919 + k + 1)
        a = torch.randint(0, self.vocab, (1,), generator=g)
        c = torch.randint(1, min(self.vocab, 8), (1,), generator=g)
        return (a + c * torch.arange(self.seq + 1)) % self.vocab


def open_tokens(path: str, vocab_size: int, dtype: str | None = None) -> np.memmap:
    """A token file, memory-mapped, after checking its sidecar against the vocabulary."""
    if not os.path.isfile(path):
        raise DataError(
            f"token file {path!r} does not exist (make one with `python -m holmes.trainer.tokenize`)"
        )
    meta = {}
    if os.path.isfile(sidecar_path(path)):
        with open(sidecar_path(path)) as f:
            meta = json.load(f)
    dtype = dtype or meta.get("dtype", "uint16")
    if dtype not in TOKEN_DTYPES:
        raise DataError(f"token dtype {dtype!r} is not one of {', '.join(TOKEN_DTYPES)}")
    if meta.get("vocabSize", 0) > vocab_size:
        raise DataError(
            f"token file {path!r} was made for a vocabulary of {meta['vocabSize']} "
            f"but model.vocabSize is {vocab_size}: raise vocabSize"
        )
    return np.memmap(path, dtype=TOKEN_DTYPES[dtype], mode="r")


def _checked(window: np.ndarray, vocab: int, path: str) -> torch.Tensor:
    ids = torch.from_numpy(window.astype(np.int64))
    if ids.numel() and int(ids.max()) >= vocab:
        raise DataError(f"token id {int(ids.max())} in {path!r} is >= model.vocabSize {vocab}")
    return ids


class TokenFileSource:
    def __init__(self, path: str, vocab_size: int, seq_length: int, seed: int, dtype: str | None = None):
        self.path = path
        self.tokens = open_tokens(path, vocab_size, dtype)
        self.seq, self.seed, self.vocab = seq_length, seed, vocab_size
        self.windows = (len(self.tokens) - 1) // seq_length
        if self.windows < 1:
            raise DataError(
                f"token file {path!r} holds {len(self.tokens)} tokens, fewer than one "
                f"sample of seqLength+1 = {seq_length + 1}"
            )
        self._epoch = -1
        self._perm: torch.Tensor | None = None  # the windows' order in epoch _epoch

    def sample(self, k: int) -> torch.Tensor:
        epoch, pos = divmod(k, self.windows)
        perm = self._perm
        if perm is None or epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 104_729 + epoch)
            perm = self._perm = torch.randperm(self.windows, generator=g)
            self._epoch = epoch
        start = int(perm[pos]) * self.seq
        return _checked(self.tokens[start : start + self.seq + 1], self.vocab, self.path)


BLEND_BLOCK = 1024  # weights resolve to 1/1024 of the samples


class BlendSource:
    def __init__(self, sources: list, weights: list[float], block: int = BLEND_BLOCK):
        total = sum(weights)
        exact = [w / total * block for w in weights]
        counts = [int(x) for x in exact]
        by_remainder = sorted(range(len(weights)), key=lambda j: (counts[j] - exact[j], j))
        for j in by_remainder[: block - sum(counts)]:
            counts[j] += 1
        for j, c in enumerate(counts):
            if c == 0:
                raise DataError(
                    f"spec.training.data.blend[{j}].weight: {weights[j]} is under 1/{block} of the total "
                    f"{total}: the blend would never draw it; raise it or remove the entry"
                )
        # spread each source over the block: slot i goes to the source furthest behind its share
        self.pattern: list[tuple[int, int]] = []  # slot -> (source, index of the sample in the block)
        drawn = [0] * len(counts)
        for i in range(block):
            j = max(range(len(counts)), key=lambda j: (counts[j] * (i + 1) / block - drawn[j], -j))
            self.pattern.append((j, drawn[j]))
            drawn[j] += 1
        self.sources, self.counts, self.block = sources, counts, block

    def sample(self, k: int) -> torch.Tensor:
        blocks, slot = divmod(k, self.block)
        j, within = self.pattern[slot]
        return self.sources[j].sample(blocks * self.counts[j] + within)


class TokenWindows:
    """Consecutive non-overlapping windows of s+1 tokens of one file (evaluation)."""

    def __init__(self, path: str, vocab_size: int, seq_length: int, dtype: str | None = None):
        self.path, self.vocab, self.span = path, vocab_size, seq_length + 1
        self.tokens = open_tokens(path, vocab_size, dtype)
        self.count = len(self.tokens) // self.span
        if self.count < 1:
            raise DataError(
                f"token file {path!r} holds {len(self.tokens)} tokens, fewer than one window of "
                f"seqLength+1 = {self.span}"
            )

    def window(self, w: int) -> torch.Tensor:
        return _checked(self.tokens[w * self.span : (w + 1) * self.span], self.vocab, self.path)


@dataclass(frozen=True)
class Sharding:
    global_batch: int
    dp_size: int
    dp_rank: int

    def __post_init__(self) -> None:
        if self.global_batch % self.dp_size:
            raise DataError(
                f"global batch {self.global_batch} is not divisible by data parallelism {self.dp_size}"
            )

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.dp_size


class BatchLoader:
    """``batch(i)`` -> (inputs, targets) of shape [local_batch, s] for iteration i on this DP rank."""

    def __init__(self, source, sharding: Sharding):
        self.source, self.sharding = source, sharding

    def sample_ids(self, iteration: int) -> range:
        sh = self.sharding
        first = iteration * sh.global_batch + sh.dp_rank * sh.local_batch
        return range(first, first + sh.local_batch)

    def batch(self, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([self.source.sample(k) for k in self.sample_ids(iteration)])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def make_source(
    data_path: str | None,
    vocab_size: int,
    seq_length: int,
    seed: int,
    token_dtype: str | None = None,
    blend: tuple[tuple[str, float], ...] = (),
):
    """The sample stream: a blend of token files (each with its own seeded permutation), one
    token file, or synthetic data."""
    if blend:
        sources = [
            TokenFileSource(path, vocab_size, seq_length, seed + 7 * j, token_dtype)
            for j, (path, _) in enumerate(blend)
        ]
        return BlendSource(sources, [w for _, w in blend])
    if data_path is None:
        return SyntheticSource(vocab_size, seq_length, seed)
    return TokenFileSource(data_path, vocab_size, seq_length, seed, token_dtype)
