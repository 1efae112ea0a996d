"""The tied embedding's gradient all-reduce (dist_optimizer.py), seen in the dry run's recorded
collectives: started in backward, as soon as the gradient is final, and in gradReduceDtype."""

from __future__ import annotations

from tests.trainer.test_dryrun import dry_run, job
from tests.trainer.trainer_harness import make_layout

GRADIENT_BYTES = 128 * 64 * 2  # test_dryrun.job's vocabulary x hidden size, in bfloat16
ITERATIONS = 2  # the dry run's


def test_the_embedding_all_reduce_starts_in_backward_in_the_reduce_dtype(tmp_path):
    """Before: synchronous, in fp32, after the whole pipeline had drained (finish_grad_sync):
    on the last stage it came after the iteration's last gradient send."""
    layout = make_layout(2, 2, [2, 2], 2, 4, embedding=True)
    path = job(tmp_path, pipeline=2, data=2, tensor=1, gradReduceDtype="bfloat16")
    code, out, err = dry_run(path, layout, tmp_path, "--ranks", "all", "--collectives")
    assert code == 0 and out["problems"] == [], (err, out.get("problems"))
    embedding = {tuple(g.ranks) for g in layout.process_groups("embedding")}
    M = layout.micro_batches
    for r in out["ranks"]:
        calls = r["collectives"]
        # the gradient's all-reduces (the fabric check's probes on the group are a few bytes)
        emb = [
            i
            for i, c in enumerate(calls)
            if tuple(c["group"]) in embedding and c["op"] == "allreduce_" and c["bytes"] >= GRADIENT_BYTES
        ]
        assert len(emb) == ITERATIONS, [calls[i] for i in emb]
        assert {calls[i]["dtype"] for i in emb} == {"bfloat16"}
        if r["stage"] == 1:  # the last stage sends one input gradient per micro-batch
            sends = [i for i, c in enumerate(calls) if c["op"] == "send"]
            assert emb[0] < sends[M - 1], "the all-reduce waited for the pipeline to drain"
