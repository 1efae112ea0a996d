"""bench/outer_overlap.py: its pure parts, and its small mode over a shaped link (root)."""

from __future__ import annotations

import json

import outer_overlap as bench  # bench/ is on pytest's pythonpath
import pytest

from tests.helpers.bench.bench_run import run_bench


def lines(outer_at: dict[int, dict], n: int, compute: float) -> list[dict]:
    """n iteration lines of ``compute`` seconds; those in ``outer_at`` carry an outer record and
    last its exposed seconds longer."""
    out = []
    for i in range(1, n + 1):
        line = {"iteration": i, "iterationSeconds": compute}
        if i in outer_at:
            line["outer"] = outer_at[i]
            line["iterationSeconds"] += outer_at[i].get("waitSeconds", outer_at[i]["seconds"])
        out.append(line)
    return out


def test_the_hidden_share_is_what_the_overlap_took_off_the_exposed_exchange():
    sync = lines({4: {"seconds": 0.8}, 8: {"seconds": 0.8}, 12: {"seconds": 0.8}}, 12, 0.1)
    # tau 2: each exchange waited 0.6 of its 0.8 s after two steps of compute
    two = lines({6: {"seconds": 0.6, "waitSeconds": 0.6}, 10: {"seconds": 0.6, "waitSeconds": 0.6}}, 12, 0.1)
    got = bench.summarize({0: sync, 2: two}, fragments=2)
    assert got["computeSeconds"] == pytest.approx(0.1) and got["exchangeSeconds"] == pytest.approx(0.8)
    zero, tau2 = got["runs"]
    assert zero["hiddenMeasured"] == 0.0 and zero["exposedSeconds"] == pytest.approx(0.2)
    assert tau2["exposedSeconds"] == pytest.approx(0.6 / 4) and tau2["hiddenMeasured"] == pytest.approx(0.25)
    # the planner: two steps of 0.1 s against one fragment's 0.8 s exchange
    assert tau2["hiddenPlanned"] == pytest.approx(0.25)


def test_the_link_is_two_namespaces_of_this_run_shaped_both_ways():
    cmds = bench.link_commands(("hov1-a", "hov1-b"), 20)
    assert cmds[:2] == [["ip", "netns", "add", "hov1-a"], ["ip", "netns", "add", "hov1-b"]]
    shaped = [c for c in cmds if c[0] == "tc"]
    assert [c[2] for c in shaped] == ["hov1-a", "hov1-b"] and all("20mbit" in c for c in shaped)
    assert all(
        c[0] != "ip" or c[1] == "netns" or c[2] in ("hov1-a", "hov1-b") for c in cmds
    )  # never the host's


@pytest.mark.timeout(300)
def test_small_mode_measures_each_overlap_beside_the_plan(fabric):
    p = run_bench("outer_overlap", "--smoke", timeout=280)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    last = json.loads(p.stdout.strip().splitlines()[-1])
    (only,) = last["rounds"]
    assert [r["overlapSteps"] for r in only["runs"]] == [0, 2] and set(last["medianHidden"]) == {"2"}
    assert only["computeSeconds"] > 0 and only["exchangeSeconds"] > 0
