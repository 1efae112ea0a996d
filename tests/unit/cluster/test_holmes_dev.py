"""hack/holmes_dev, the helpers tests, bench and the demos share: the job they build is one the
spec reader accepts, a picked port is free, and following a job says what the demos show."""

from __future__ import annotations

import socket

import pytest
from holmes_dev.follow import follow_job
from holmes_dev.jobs import TINY_MODEL, holmes_job, tiny_job
from holmes_dev.ports import free_port

from holmes.contract.jobspec import JobSpec


def test_tiny_job_is_a_valid_spec_and_sections_replace_whole():
    job = tiny_job("j", "ns", count=2, gpus=2, command=["sleep", "1"], parallelism={"pipeline": 2})
    assert job["metadata"] == {"name": "j", "namespace": "ns"} and job["kind"] == "HolmesJob"
    spec = JobSpec.from_manifest(job)
    assert (spec.nodes.count, spec.nodes.gpus_per_node, spec.parallelism.pipeline) == (2, 2, 2)
    assert spec.model.hidden_size == TINY_MODEL["hiddenSize"]
    assert job["spec"]["template"]["spec"]["containers"] == [{"name": "trainer", "command": ["sleep", "1"]}]
    assert job["spec"]["runPolicy"] == {"backoffLimit": 2}
    assert tiny_job("j", training={"iterations": 1})["spec"]["training"] == {"iterations": 1}
    assert "namespace" not in holmes_job("j", {})["metadata"]
    tiny_job("k")["spec"]["model"]["layers"] = 99  # each job has its own model section
    assert TINY_MODEL["layers"] == 4


def test_free_port_is_held_for_its_server_and_handed_to_no_one_else():
    for host in ("127.0.0.1", "0.0.0.0"):
        port = free_port(host)
        with socket.socket() as s:  # the kernel counts it as taken: its own picks skip it
            with pytest.raises(OSError, match="in use"):
                s.bind((host, port))
        for _ in range(200):
            with socket.socket() as picked:
                picked.bind((host, 0))
                assert picked.getsockname()[1] != port
        with socket.socket() as s:  # nothing listens there yet: refused at once
            with pytest.raises(ConnectionRefusedError):
                s.connect(("127.0.0.1", port))
        with socket.socket() as server:  # a server that sets SO_REUSEADDR serves it
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((host, port))
            server.listen(1)
            with socket.create_connection(("127.0.0.1", port)):
                server.accept()[0].close()


def test_follow_job_says_each_phase_layout_and_iteration_once(capsys):
    ready = [{"type": "Ready", "message": "2 pods running"}]
    statuses = iter(
        [
            {},
            {"phase": "Pending"},
            {"phase": "Running", "conditions": ready, "layout": {"shape": "2x1x1"}},
            {"phase": "Running", "layout": {}, "progress": {"iteration": 1, "loss": 2.5}},
            {"phase": "Running", "layout": {}, "progress": {"iteration": 1, "loss": 2.5}},
            {"phase": "Succeeded", "layout": {}, "progress": {"iteration": 2, "loss": 2.0}},
        ]
    )
    layouts, seen = [], []
    phase = follow_job(
        "j", lambda: next(statuses), 30, on_layout=layouts.append, on_status=seen.append, every=0
    )
    out = capsys.readouterr().out.splitlines()
    assert phase == "Succeeded" and len(layouts) == 1 and len(seen) == 6
    assert out[:2] == [">> phase Pending: ", ">> phase Running: 2 pods running"]  # none said for {}
    assert [line.split(":")[0].strip() for line in out if "iteration" in line] == [
        "iteration 1",
        "iteration 2",
    ]
    assert out[-2] == ">> phase Succeeded: "  # then its last iteration


def test_follow_job_times_out(capsys):
    assert follow_job("j", lambda: {"phase": "Pending"}, 0.05, on_layout=print, every=0.01) == "Timeout"
    assert capsys.readouterr().out.splitlines()[-1] == "!! j did not finish in 0s"
