"""The bounded meeting point after the Hugging Face weights are loaded (load_barrier.py): a rank
on slow storage stops the run with its name before any rank waits in a pipeline send."""

from __future__ import annotations

import time

import torch

from holmes.trainer import load_barrier
from tests.trainer.test_huggingface import LLAMA, llama_dir, with_init
from tests.trainer.trainer_harness import make_layout, run_ranks, tiny_config

LAYOUT = make_layout(3, 1, [1, 1, 1], 1, 3)  # three stages: the first send waits on the next


def _train(rank: int, cfg, layout, slow_rank: int | None, delay: float) -> dict:
    from holmes.trainer import hf
    from holmes.trainer.engine import Trainer

    real = hf.load_stage

    def load_stage(*args, **kwargs):  # this rank's volume is slower than the others'
        if rank == slow_rank:
            time.sleep(delay)
        return real(*args, **kwargs)

    hf.load_stage = load_stage
    t = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    t.train()
    return {"took": t.weight_load_seconds}


def test_every_rank_reports_its_load_time(tmp_path):
    cfg = tiny_config(model=with_init(LLAMA, llama_dir(tmp_path)), micro_batch_size=1, global_batch_size=3)
    out = run_ranks(3, _train, cfg.with_(iterations=1), LAYOUT, None, 0.0)
    for rank in range(3):
        took = out[rank][1]["took"]
        assert sorted(took) == [0, 1, 2] and all(s >= 0 for s in took.values()), took


def test_a_stage_on_slow_storage_is_named_before_the_first_send_times_out(tmp_path):
    """Before: ranks 0 and 1 went on to their first pipeline send/receive and failed there after
    the process-group timeout, with gloo's (NCCL's) words about a collective, not the slow rank."""
    cfg = tiny_config(
        model=with_init(LLAMA, llama_dir(tmp_path)),
        micro_batch_size=1,
        global_batch_size=3,
        iterations=1,
        timeout_seconds=4.0,  # the meeting waits 2 s, rank 2 loads 8 s longer than the others
    )
    out = run_ranks(3, _train, cfg, LAYOUT, 2, 8.0, allow_exit=True, timeout=90)
    for rank in (0, 1):
        status, text = out[rank]
        assert status == "error" and "WeightLoadError" in text, out[rank]
        assert "rank(s) 2 did not finish loading the Hugging Face weights" in text, text
        assert "HOLMES_TIMEOUT_SECONDS" in text and "faster volume" in text
    assert out[2][0] == "error" and "WeightLoadError" in out[2][1], out[2]


def test_the_message_names_every_late_rank_and_what_each_took():
    msg = load_barrier.late_message([2, 5], 300.0, {0: 12.0, 1: 14.5}, "the weights")
    assert msg.startswith("rank(s) 2, 5 did not finish loading the weights within 300 s")
    assert "rank 0: 12.0 s, rank 1: 14.5 s" in msg
