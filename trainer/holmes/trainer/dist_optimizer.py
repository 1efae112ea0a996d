"""The overlapped distributed optimizer (ZeRO-1 with Megatron-style overlap), written here.

Layout in memory: all parameters of a stage live in one contiguous buffer (model dtype) and
their gradients in one contiguous fp32 buffer, both cut into the same buckets. Parameters are
laid out in reverse registration order (roughly the order backward produces gradients). Each
parameter starts at a multiple of ``ALIGN_ELEMENTS`` and each bucket is padded to a multiple of
``ALIGN_ELEMENTS`` x the DP size (even shards for the reduce-scatter, and aligned ones) and DP
rank r owns shard r of every bucket: fp32 master weights and optimizer state exist only for that shard.

One iteration:
1. Backward of each micro-batch runs each parameter's post-accumulate-grad hook, which adds the
   gradient into the fp32 buffer. When a parameter has seen all M micro-batches it is done; when
   every parameter of a bucket is done, the bucket is scaled by 1/(M*D) and its
   ``reduce_scatter_tensor`` starts asynchronously (overlap on) while backward goes on.
   A tied embedding's bucket is first summed over the embedding group (first and last stage,
   often across islands): its all-reduce starts, asynchronously and in the reduce dtype
   (``gradReduceDtype``), as soon as its M-th gradient has landed.
2. ``finish_grad_sync`` waits for those (exposed communication): the tied embedding's
   all-reduce, then its DP reduce-scatter; with sequence parallelism, the replicated
   parameters' partial gradients summed over the tp group (a bucket of their own); and fails
   loudly if any parameter missed a gradient.
3. The engine all-reduces ``local_grad_sq()`` across all ranks -> the global norm (a parameter
   every tp rank holds whole counts on tp rank 0 only, a tied copy once); ``step``
   clips, runs AdamW/SGD on the shard, writes it back in model dtype and starts each bucket's
   ``all_gather_into_tensor``; a forward pre-hook on each module waits for its buckets only when
   the next forward first needs them.
With ``overlap=False`` the same collectives run synchronously in the same order: same math.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .config import OptimizerConfig
from .tensor_parallel import TensorParallel
from .timing import Stopwatch

# Every parameter view, bucket and shard of the flat buffers starts at a multiple of this many
# elements: 256 bytes in bf16, 512 in fp32, so cuBLAS and NCCL get aligned pointers whatever D
# is (unpadded, D = 3 or 6 shifts every shard off alignment). Megatron pads parameters to 64
# elements and buckets to lcm(D, 128); 128 and 128*D keep the shards aligned too. The padding
# is zeros that no parameter owns: no gradient, no norm, no update.
ALIGN_ELEMENTS = 128


def _pad(n: int, multiple: int) -> int:
    return math.ceil(n / multiple) * multiple


@dataclass
class _Bucket:
    index: int
    start: int  # offset in the flat buffers
    size: int  # padded, a multiple of dp size
    params: list[int]  # indices into DistributedOptimizer.params
    # set once the flat buffers exist (DistributedOptimizer.__init__), for every bucket:
    shard: slice = field(init=False)  # this rank's part, as offsets in the flat buffers
    master: torch.Tensor = field(init=False)  # fp32 master weights of the shard
    grad_shard: torch.Tensor = field(init=False)  # its reduced gradient, fp32
    decay: torch.Tensor = field(init=False)  # bool mask over the shard: which elements get weight decay
    # summed over this group before the DP reduce-scatter (after backward, not overlapped): the
    # tied embedding over the embedding group, sequence-parallel partial sums over the tp group
    pre_reduce: Any = None
    pre_watch: str = ""  # which CommTimes stopwatch times that all-reduce
    in_norm: bool = True  # False for the last stage's copy of a tied embedding
    norm_mask: torch.Tensor | None = None  # bool over the shard: elements in the grad norm (None: all)
    pending: int = 0  # parameters still waiting for their last micro-batch
    grad_work: Any = None
    pre_work: Any = None  # the tied embedding's all-reduce in flight
    pre_in: torch.Tensor | None = None  # its bucket cast to the reduce dtype, alive while in flight
    gather_work: Any = None
    launched: bool = False
    reduce_in: torch.Tensor | None = None  # the bucket cast to the reduce dtype, alive while in flight
    reduce_out: torch.Tensor | None = None  # this rank's reduced shard in the reduce dtype
    # more fp32 state shaped as the shard, kept by others (outer.py's anchor and momentum), saved
    # and resharded with the moments
    extra: dict[str, torch.Tensor] | None = None
    exp_avg: torch.Tensor | None = None  # Adam's moments (adamw only)
    exp_avg_sq: torch.Tensor | None = None
    gather_src: torch.Tensor | None = None


@dataclass
class CommTimes:
    """Exposed communication of one iteration, by what it waited for (see timing.Stopwatch)."""

    grad_wait: Stopwatch  # waiting for reduce-scatters after backward
    param_wait: Stopwatch  # waiting for all-gathers in forward pre-hooks (or inside step when synchronous)
    embedding: Stopwatch  # tied-embedding all-reduce
    tp: Stopwatch  # sequence parallelism: replicated parameters' gradients summed over the tp group

    @classmethod
    def on(cls, device: torch.device) -> CommTimes:
        return cls(Stopwatch(device), Stopwatch(device), Stopwatch(device), Stopwatch(device))

    def reset(self) -> None:
        for w in (self.grad_wait, self.param_wait, self.embedding, self.tp):
            w.reset()


class DistributedOptimizer:
    def __init__(
        self,
        module: nn.Module,
        cfg: OptimizerConfig,
        *,
        dp_group: Any,
        dp_size: int,
        dp_rank: int,
        micro_batches: int,
        overlap: bool = True,
        bucket_elements: int = 40_000_000,
        embedding_group: Any = None,
        tied_param_name: str | None = None,
        tied_in_norm: bool = True,
        reduce_dtype: torch.dtype = torch.float32,
        tp: TensorParallel | None = None,
        tp_replicated: Collection[str] = (),
    ):
        self.cfg, self.dp_group, self.D, self.r = cfg, dp_group, dp_size, dp_rank
        self.M, self.overlap, self.embedding_group = micro_batches, overlap, embedding_group
        self.step_count = 0
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the stage has no trainable parameters")
        named.reverse()
        # tensor parallelism: parameters every tp rank holds whole count once in the grad norm
        # (tp rank 0's); with sequence parallelism their gradients are partial sums over the
        # sequence, summed over the tp group first (in buckets of their own)
        tp = tp or TensorParallel()
        replicated = set(tp_replicated) if tp.size > 1 else set()
        partial = replicated if tp.sequence_parallel else set()
        named = [x for x in named if x[0] not in partial] + [x for x in named if x[0] in partial]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.dtype = self.params[0].dtype
        device = self.params[0].device
        self.times = CommTimes.on(device)
        # bfloat16 halves the reduce-scatter's bytes (slow Socket DP groups); gradients still
        # accumulate and land in fp32, only the wire format is narrower
        self.reduce_dtype = reduce_dtype if dp_size > 1 else torch.float32
        # the tied embedding's all-reduce crosses the slow link whatever D is: the same wire dtype
        self.embedding_dtype = reduce_dtype
        self.grad_scale = 1.0 / (micro_batches * dp_size)

        # ---- buckets (the tied embedding gets a bucket of its own) -----------------------
        self.buckets: list[_Bucket] = []
        self.offsets: list[int] = []
        cur: list[int] = []
        cur_elems, pos = 0, 0

        def close(tied: bool = False) -> None:
            nonlocal cur, cur_elems, pos
            if not cur:
                return
            size = _pad(cur_elems, ALIGN_ELEMENTS * dp_size)  # every shard starts aligned too
            b = _Bucket(len(self.buckets), pos, size, cur)
            if tied:
                b.pre_reduce, b.pre_watch, b.in_norm = embedding_group, "embedding", tied_in_norm
            elif self.names[cur[0]] in partial:
                b.pre_reduce, b.pre_watch = tp.group, "tp"
            self.buckets.append(b)
            pos += size
            cur, cur_elems = [], 0

        for i, (n, p) in enumerate(named):
            tied = n == tied_param_name
            if tied or cur and (n in partial) != (self.names[cur[0]] in partial):
                close()  # the tied embedding and the partial parameters get buckets of their own
            cur_elems = _pad(cur_elems, ALIGN_ELEMENTS)
            self.offsets.append(pos + cur_elems)
            cur.append(i)
            cur_elems += p.numel()
            if tied or cur_elems >= bucket_elements:
                close(tied)
        close()
        total = pos
        self.param_buffer = torch.zeros(total, dtype=self.dtype, device=device)
        self.grad_buffer = torch.zeros(total, dtype=torch.float32, device=device)
        self.bucket_of = [0] * len(self.params)
        for b in self.buckets:
            for i in b.params:
                self.bucket_of[i] = b.index

        # ---- params become views of the flat buffer -------------------------------------
        with torch.no_grad():
            for i, p in enumerate(self.params):
                view = self.param_buffer[self.offsets[i] : self.offsets[i] + p.numel()].view_as(p)
                view.copy_(p.data)
                p.data = view
        self.main_grads = [
            self.grad_buffer[self.offsets[i] : self.offsets[i] + p.numel()].view_as(p)
            for i, p in enumerate(self.params)
        ]

        # ---- this rank's shard of each bucket: master weights + state -------------------
        for b in self.buckets:
            s = b.size // dp_size
            b.shard = slice(b.start + dp_rank * s, b.start + (dp_rank + 1) * s)
            b.master = self.param_buffer[b.shard].detach().clone().float()
            b.grad_shard = torch.zeros(s, dtype=torch.float32, device=device)
            if self.reduce_dtype != torch.float32:
                b.reduce_out = torch.empty(s, dtype=self.reduce_dtype, device=device)
            if cfg.kind == "adamw":
                b.exp_avg = torch.zeros_like(b.master)
                b.exp_avg_sq = torch.zeros_like(b.master)
            # biases and norms: no weight decay; a tp duplicate: not in this rank's grad norm
            b.decay = self._mask(b, lambda i: self.params[i].ndim >= 2)
            if replicated and tp.rank > 0:
                b.norm_mask = self._mask(b, lambda i: self.names[i] not in replicated)
            if self.dtype != torch.float32:
                b.gather_src = torch.empty(s, dtype=self.dtype, device=device)

        # ---- hooks ----------------------------------------------------------------------
        self._reset_pending()
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(self._make_grad_hook(i))
        index_of = self._index_of = {id(p): i for i, p in enumerate(self.params)}
        self.expected = [micro_batches] * len(self.params)  # gradients per iteration (count_uses)
        for mod in module.modules():
            ids = sorted(
                {self.bucket_of[index_of[id(p)]] for p in mod.parameters(recurse=False) if id(p) in index_of}
            )
            if ids:
                mod.register_forward_pre_hook(self._make_gather_wait(ids))

    def _mask(self, b: _Bucket, keep: Callable[[int], bool]) -> torch.Tensor:
        """A bool mask over bucket b's shard: True on the elements of the parameters ``keep``
        accepts (padding stays False)."""
        mask = torch.zeros(b.shard.stop - b.shard.start, dtype=torch.bool, device=self.grad_buffer.device)
        for i in b.params:
            lo = max(self.offsets[i], b.shard.start)
            hi = min(self.offsets[i] + self.params[i].numel(), b.shard.stop)
            if lo < hi and keep(i):
                mask[lo - b.shard.start : hi - b.shard.start] = True
        return mask

    # ---- gradient side --------------------------------------------------------------------
    def _reset_pending(self) -> None:
        """A fresh iteration: no gradient seen yet, no reduce-scatter started."""
        for b in self.buckets:
            b.pending, b.launched, b.grad_work = len(b.params), False, None
        self.seen = [0] * len(self.params)

    def _make_grad_hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(p: torch.Tensor) -> None:
            self._land(i, p)

        return hook

    def count_uses(self, chunks: list[list[nn.Parameter]]) -> None:
        """Virtual stages run their backwards separately: a parameter two chunks use (a tied
        embedding whose first and last virtual stage share a rank) gets a gradient from each, per
        micro-batch. Its bucket is final after all of them."""
        for i, p in enumerate(self.params):
            self.expected[i] = self.M * max(1, sum(any(q is p for q in c) for c in chunks))

    def collect_grads(self, params: Collection[torch.Tensor]) -> None:
        """Land the gradients a backward left in ``.grad`` without accumulating through autograd
        (a split backward's weight step assigns ``.grad`` itself: no post-accumulate-grad hook
        fires). The pipeline stage calls it after each backward chunk, so a bucket's
        reduce-scatter starts when its last weight gradient is final, whatever the schedule."""
        for p in params:
            if p.grad is not None and id(p) in self._index_of:
                self._land(self._index_of[id(p)], p)

    def _land(self, i: int, p: torch.Tensor) -> None:
        """Parameter i's gradient of one micro-batch into the fp32 buffer; the bucket's
        reduction starts with the last one."""
        self.main_grads[i].add_(p.grad)
        p.grad = None
        self.seen[i] += 1
        if self.seen[i] > self.expected[i]:
            raise RuntimeError(
                f"parameter {self.names[i]} received {self.seen[i]} gradients in one "
                f"iteration of {self.M} micro-batches: zero_grad/step were skipped"
            )
        if self.seen[i] == self.expected[i]:
            b = self.buckets[self.bucket_of[i]]
            b.pending -= 1
            if b.pending == 0 and self.overlap and b.pre_reduce is None:
                self._launch_reduce(b, async_op=True)
            elif b.pending == 0 and self.overlap and b.pre_watch == "embedding":
                self._launch_embedding(b, async_op=True)

    def _launch_reduce(self, b: _Bucket, async_op: bool) -> None:
        full = self.grad_buffer[b.start : b.start + b.size]
        full.mul_(self.grad_scale)
        b.launched = True
        if self.D == 1:
            b.grad_shard.copy_(full)
            return
        if b.reduce_out is None:
            out, src = b.grad_shard, full
        else:
            b.reduce_in = full.to(self.reduce_dtype)
            out, src = b.reduce_out, b.reduce_in
        b.grad_work = dist.reduce_scatter_single(out, src, group=self.dp_group, async_op=async_op)

    def _launch_embedding(self, b: _Bucket, async_op: bool) -> None:
        """Sum the tied embedding's gradient over the embedding group, in the reduce dtype."""
        full = self.grad_buffer[b.start : b.start + b.size]
        if self.embedding_dtype != torch.float32:
            b.pre_in = full.to(self.embedding_dtype)
        b.pre_work = dist.all_reduce(
            full if b.pre_in is None else b.pre_in, group=b.pre_reduce, async_op=async_op
        )

    def _finish_embedding(self, b: _Bucket) -> None:
        if b.pre_work is None and b.pre_in is None:  # not started in backward (overlap off)
            self._launch_embedding(b, async_op=False)
        if b.pre_work is not None:
            b.pre_work.wait()
        if b.pre_in is not None:  # back into the fp32 buffer the reduce-scatter reads
            self.grad_buffer[b.start : b.start + b.size].copy_(b.pre_in)
        b.pre_work, b.pre_in = None, None

    def finish_grad_sync(self) -> None:
        """All gradients reduced into this rank's shards; raises if a parameter missed one."""
        missing = [
            f"{self.names[i]} ({self.seen[i]}/{self.expected[i]})"
            for i in range(len(self.params))
            if self.seen[i] != self.expected[i]
        ]
        if missing:
            raise RuntimeError(
                "these parameters did not receive a gradient from every micro-batch, so "
                "their buckets can never be reduced: "
                + ", ".join(missing[:8])
                + (" ..." if len(missing) > 8 else "")
                + ". Every parameter must take part in the loss (or set requires_grad=False)."
            )
        for b in self.buckets:
            if b.pre_watch == "embedding":
                with self.times.embedding.span():
                    self._finish_embedding(b)
            elif b.pre_reduce is not None:  # sequence-parallel partial sums
                with self.times.tp.span():
                    dist.all_reduce(self.grad_buffer[b.start : b.start + b.size], group=b.pre_reduce)
            if not b.launched:
                with self.times.grad_wait.span():
                    self._launch_reduce(b, async_op=False)
        with self.times.grad_wait.span():  # the stream waits; the host does not
            for b in self.buckets:
                if b.grad_work is not None:
                    b.grad_work.wait()
                    b.grad_work = None
        for b in self.buckets:
            if b.reduce_out is not None:  # back to the fp32 shard the step reads
                b.grad_shard.copy_(b.reduce_out)
                b.reduce_in = None

    def local_grad_sq(self) -> torch.Tensor:
        """Sum of squares of this rank's reduced gradient shards (the tied copy counted once)."""
        total = torch.zeros((), dtype=torch.float32, device=self.grad_buffer.device)
        for b in self.buckets:
            if not b.in_norm:
                continue
            sq = b.grad_shard.pow(2)
            total += (sq if b.norm_mask is None else torch.where(b.norm_mask, sq, 0.0)).sum()
        return total

    # ---- the step --------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, lr: float, clip_coef: float = 1.0) -> None:
        self.step_count += 1
        c = self.cfg
        for b in self.buckets:
            g = b.grad_shard
            if clip_coef != 1.0:
                g.mul_(clip_coef)
            if c.weight_decay and c.kind == "adamw":
                b.master.sub_(torch.where(b.decay, b.master, 0.0), alpha=lr * c.weight_decay)
            if c.kind == "adamw":
                m, v = b.exp_avg, b.exp_avg_sq
                assert m is not None and v is not None, "every bucket of an adamw optimizer has moments"
                beta1, beta2 = c.betas
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                bc1 = 1 - beta1**self.step_count
                bc2 = 1 - beta2**self.step_count
                denom = (v.sqrt() / math.sqrt(bc2)).add_(c.eps)
                b.master.addcdiv_(m, denom, value=-lr / bc1)
            else:  # plain SGD (tests compare parameters with it)
                if c.weight_decay:
                    g = g + torch.where(b.decay, b.master, 0.0) * c.weight_decay
                b.master.add_(g, alpha=-lr)
        self.grad_buffer.zero_()
        self._reset_pending()
        self._gather_params()

    def _gather_params(self) -> None:
        """Launch every bucket's all-gather. Overlapped: left in flight, each waited on by the
        forward pre-hook of the first module that needs it; synchronous: exposed here."""
        for b in reversed(self.buckets):  # forward order is reverse bucket order
            src = b.master if b.gather_src is None else b.gather_src.copy_(b.master)
            if self.D == 1:
                self.param_buffer[b.shard].copy_(src)
                continue
            out = self.param_buffer[b.start : b.start + b.size]
            if self.overlap:
                b.gather_work = dist.all_gather_single(out, src, group=self.dp_group, async_op=True)
            else:
                with self.times.param_wait.span():
                    dist.all_gather_single(out, src, group=self.dp_group)

    def _make_gather_wait(self, ids: list[int]) -> Callable[..., None]:
        def pre_hook(module: nn.Module, args: Any) -> None:
            for i in ids:
                b = self.buckets[i]
                if b.gather_work is not None:
                    with self.times.param_wait.span():
                        b.gather_work.wait()
                    b.gather_work = None

        return pre_hook

    def wait_param_gathers(self) -> None:
        """Wait for every outstanding all-gather (before a checkpoint or leaving training)."""
        for b in self.buckets:
            if b.gather_work is not None:
                b.gather_work.wait()
                b.gather_work = None

    # ---- checkpoint state (this rank's shards) --------------------------------------------
    def shard_pieces(self) -> Iterator[tuple[int, _Bucket, int, int, int]]:
        """(i, bucket, lo, hi, at) for each parameter this rank's shards touch: the shard of
        ``bucket`` holds elements [lo, hi) of parameter i's flattened tensor at offset ``at``
        (padding is in no piece). Together the DP ranks' pieces tile every parameter once."""
        for b in self.buckets:
            for i in b.params:
                start = self.offsets[i]
                lo, hi = max(start, b.shard.start), min(start + self.params[i].numel(), b.shard.stop)
                if lo < hi:
                    yield i, b, lo - start, hi - start, lo - b.shard.start

    def shard_states(self, b: _Bucket) -> dict[str, torch.Tensor]:
        """Bucket b's fp32 optimizer state on this rank: master weights and, with AdamW, moments."""
        out = {"master": b.master}
        if b.exp_avg is not None:
            out.update(exp_avg=b.exp_avg, exp_avg_sq=b.exp_avg_sq)
        out.update(b.extra or {})
        return out

    def masters(self) -> list[torch.Tensor]:
        """This rank's fp32 master shard of every bucket, in bucket order (outer.py's operand)."""
        return [b.master for b in self.buckets]

    def add_shard_state(self, name: str, tensors: list[torch.Tensor]) -> None:
        """Keep ``tensors`` (one per bucket, shaped as its master shard) as state ``name``: saved
        and loaded with the optimizer's own (checkpoint.optimizer_tensors)."""
        if len(tensors) != len(self.buckets):
            raise ValueError(f"state {name}: {len(tensors)} tensors for {len(self.buckets)} buckets")
        for b, t in zip(self.buckets, tensors):
            if t.shape != b.master.shape:
                raise ValueError(f"state {name}: shape {tuple(t.shape)} != shard {tuple(b.master.shape)}")
            b.extra = {**(b.extra or {}), name: t}

    def republish(self) -> None:
        """The parameters again from the master shards, after someone else changed them."""
        self.wait_param_gathers()
        self._gather_params()

    def bucket_state_dict(self, prefix: str) -> dict[str, Any]:
        """The per-bucket keys of checkpoints of format 1 (read only under their own layout)."""
        out: dict[str, Any] = {f"{prefix}.step": torch.tensor(self.step_count)}
        for b in self.buckets:
            for kind, t in self.shard_states(b).items():
                out[f"{prefix}.bucket{b.index}.{kind}"] = t
        return out
