"""The launcher's JobSet mode (holmes.launch.jobset): a labelled JobSet's pod takes its rank env
from its entry in Holmes' plan, written by the operator's own plan code (core/jobset_plan.py)."""

from __future__ import annotations

import json

import pytest

from holmes.launch import __main__ as launcher
from holmes.launch import jobset
from holmes.operator.core import jobset_plan as jp
from tests.helpers.operator.jobset_plans import jobset as labelled
from tests.helpers.operator.jobset_plans import plan


def write_plan(tmp_path, **ann: str):
    js = labelled(**ann)
    cm = jp.configmap(js, plan(js))
    for name, text in cm["data"].items():
        (tmp_path / name).write_text(text)
    return tmp_path / jp.PLAN_FILE


def test_the_pods_entry_sets_the_rank_env_and_the_nodes_env(tmp_path):
    path = write_plan(tmp_path, **{jp.ANN_DATA: "2"})
    env = {"HOLMES_PLAN": str(path), "HOSTNAME": "js-w-1-0", "NCCL_DEBUG": "WARN", "NODE_RANK": "9"}
    notes = jobset.from_plan(env)
    assert env["NODE_RANK"] == "2" and env["NNODES"] == "4" and env["NPROC_PER_NODE"] == "1"
    assert env["MASTER_ADDR"] == "js-w-0-0.js.ns.svc" and env["MASTER_PORT"] == "29500"
    assert env["HOLMES_LAYOUT"] == str(tmp_path / "layout.json")
    assert env["HOLMES_NIC"] in ("infiniband", "roce") and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert env["NCCL_DEBUG"] == "WARN"  # the pod's own env stays
    assert "NODE_RANK=9 replaced" in notes[0] and "node rank 2 of 4" in notes[-1]
    argv = launcher.torchrun_argv(env, ["x.py"])
    assert "--node-rank=2" in argv and "--rdzv-backend=static" in argv


def test_the_default_mount_is_read_only_in_a_pod_without_its_own_rank(tmp_path):
    path = write_plan(tmp_path)
    assert jobset.plan_path({}, str(path)) == path
    assert jobset.plan_path({"NODE_RANK": "0"}, str(path)) is None  # a HolmesJob's pod
    assert jobset.plan_path({}, str(tmp_path / "none.json")) is None
    assert jobset.from_plan({"NODE_RANK": "0", "HOLMES_PLAN": ""}) == []


def test_a_missing_entry_waits_then_names_what_to_check(tmp_path):
    path = write_plan(tmp_path)
    t = [0.0]

    def sleep(s: float) -> None:
        t[0] += s

    with pytest.raises(
        jobset.PlanMissing, match="no entry for this pod's hostname 'other'.*operator running"
    ):
        jobset.wait_entry(path, "other", 5, sleep=sleep, clock=lambda: t[0])
    assert t[0] >= 5
    doc, entry = jobset.wait_entry(path, "js-w-0-1", 5)
    assert entry["nodeRank"] == 1 and doc["nnodes"] == 4


def test_main_stops_with_the_reason_when_the_plan_has_no_entry(tmp_path, capsys):
    path = write_plan(tmp_path)
    env = {
        "HOLMES_PLAN": str(path),
        "HOSTNAME": "stranger",
        "HOLMES_PLAN_WAIT": "0",
        "HOLMES_NET_HOOK": "off",
    }
    assert launcher.main(["--", "python", "x.py"], env) == 2
    assert "no entry for this pod's hostname 'stranger'" in capsys.readouterr().err
    assert json.loads(path.read_text())["pods"]
