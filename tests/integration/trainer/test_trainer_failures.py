"""Failing loudly and in bounded time: a dying rank among forked gloo ranks (in-process:
tests/unit/trainer/test_trainer_failures.py)."""

import os
import time

from tests.helpers.trainer.trainer_harness import make_layout, run_ranks, tiny_config, train_on_layout


def test_a_dying_rank_makes_the_others_fail_within_the_timeout():
    def die(trainer, record):
        if trainer.rank == 3 and trainer.iteration == 2:
            os._exit(3)

    cfg = tiny_config(iterations=50, timeout_seconds=6.0)
    t0 = time.monotonic()
    res = run_ranks(
        4,
        train_on_layout,
        cfg,
        make_layout(2, 2, [3, 1], 2, 4),
        die,
        allow_exit=True,
        pg_timeout=6.0,
        timeout=60,
    )
    elapsed = time.monotonic() - t0
    assert res[3] == ("exit", 3)
    for r in (0, 1, 2):
        assert res[r][0] == "error", res[r]
    assert elapsed < 30, f"survivors took {elapsed:.0f}s to notice"
