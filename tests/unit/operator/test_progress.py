"""Reading the trainer's progress (pure parsing of what the rank-0 pod exposes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from holmes.operator import progress
from holmes.operator.core import child_names


def exposition(**values):
    reg = CollectorRegistry()
    for k, v in values.items():
        Gauge(k, k, registry=reg).set(v)
    return generate_latest(reg).decode()


@contextlib.contextmanager
def serving(body: bytes):
    """An HTTP server on loopback answering every GET with ``body``; yields its port."""

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_port
    finally:
        srv.shutdown()
        srv.server_close()


class Reader:
    """A ProgressReader and the reads it finished (its ``on_read`` calls), to wait on them."""

    def __init__(self, interval: float, port: int = 1, workers: int = progress.READ_WORKERS):
        self.finished = threading.Semaphore(0)
        self.reader = progress.ProgressReader(
            port, interval, on_read=lambda key: self.finished.release(), workers=workers
        )

    def settled(self, job, pods, log_tail=lambda *a, **k: ""):
        """What a reconcile gets once the read it started has finished (None: none started)."""
        first = self.reader.read(job, pods, log_tail)
        if first is not None or not self.finished.acquire(timeout=10):
            return first
        return self.reader.read(job, pods, log_tail)


def test_prometheus_text_to_status_progress():
    text = exposition(
        holmes_trainer_iteration=12,
        holmes_trainer_loss=3.25,
        holmes_trainer_tokens_per_second=1234.5,
        holmes_trainer_tflops_per_gpu=0.5,
        holmes_trainer_iteration_seconds=0.2,
        other_metric=7,
    )
    assert progress.from_prometheus(text) == {
        "iteration": 12,
        "loss": 3.25,
        "tokensPerSecond": 1234.5,
        "tflopsPerGpu": 0.5,
        "iterationSeconds": 0.2,
    }


def test_nothing_before_the_first_iteration():
    assert progress.from_prometheus(exposition(holmes_trainer_iteration=0, holmes_trainer_loss=0)) == {}


def test_nan_is_dropped():
    assert progress.from_prometheus(
        exposition(holmes_trainer_loss=float("nan"), holmes_trainer_iteration=1)
    ) == {"iteration": 1}


def test_termination_message_last_json_line_wins():
    msg = "\n".join(
        [
            "garbage",
            json.dumps({"holmes": "iteration", "iteration": 4, "loss": 2.0}),
            json.dumps({"holmes": "done", "iteration": 5, "loss": 1.5, "tflopsPerGpu": 0.1}),
            "",
        ]
    )
    assert progress.from_json_lines(msg) == {"iteration": 5, "loss": 1.5, "tflopsPerGpu": 0.1}
    assert progress.from_json_lines(None) == {}


def test_from_pod_scrapes_a_running_rank0_and_reads_a_terminated_one():
    with serving(exposition(holmes_trainer_iteration=7).encode()) as port:
        running = {"status": {"phase": "Running", "podIP": "127.0.0.1"}}
        assert progress.from_pod(running, port) == {"iteration": 7}
    done = {
        "status": {
            "phase": "Succeeded",
            "podIP": "127.0.0.1",
            "containerStatuses": [
                {
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "message": json.dumps({"holmes": "done", "iteration": 9}),
                        }
                    }
                }
            ],
        }
    }
    assert progress.from_pod(done, 1) == {"iteration": 9}
    assert progress.from_pod({"status": {"phase": "Pending"}}, 1) == {}


def test_fabric_warnings_from_the_trainers_endpoint_and_its_last_line():
    from holmes.trainer.reporting import MetricsSink

    msgs = ["rank 1 on node b: dp group (2 ranks) expects IB, found NCCL using Socket", 'a "quoted" one']
    sink = MetricsSink(enabled=True, port=0, addr="127.0.0.1", stream=open("/dev/null", "w"))
    try:
        sink.fabric_problems({"devices": 2})
        sink.emit("iteration", iteration=2, loss=3.0)
        text = urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/metrics").read().decode()
        found = progress.scrape(f"http://127.0.0.1:{sink.port}/metrics")
    finally:
        sink.close()
    # counts per kind, from a closed set of label values: no message text on the metrics port
    assert 'holmes_trainer_fabric_problems{kind="devices"} 2.0' in text
    assert 'holmes_trainer_fabric_problems{kind="socketFallback"} 0.0' in text and "Socket" not in text
    assert found["iteration"] == 2 and found["fabricWarnings"] == [progress.fabric_warning("devices", 2)]
    assert found["fabricWarnings"][0].startswith("fabricCheck warn: 2 ranks of IB groups")
    done = json.dumps({"holmes": "done", "iteration": 5, "fabricWarnings": msgs})
    assert progress.from_json_lines(done)["fabricWarnings"] == msgs
    assert "fabricWarnings" not in progress.from_json_lines(json.dumps({"holmes": "done", "iteration": 5}))


def test_a_scrape_larger_than_the_limit_is_ignored():
    text = exposition(holmes_trainer_iteration=3, holmes_trainer_loss=1.5)
    with serving((text + "# " + "x" * 4096 + "\n").encode()) as port:
        url = f"http://127.0.0.1:{port}/metrics"
        assert progress.scrape(url)["iteration"] == 3
        assert progress.scrape(url, limit=1024) == {}


def test_a_preempted_trainers_last_line_is_its_progress():
    msg = "\n".join(
        [
            json.dumps({"holmes": "iteration", "iteration": 40, "loss": 2.0}),
            json.dumps({"holmes": "preempted", "iteration": 41, "loss": 1.9, "saved": True, "seconds": 0.2}),
        ]
    )
    assert progress.from_json_lines(msg) == {"iteration": 41, "loss": 1.9}


def test_each_replicas_rank0_is_read_with_its_own_iteration_and_outer_step():
    """acrossIslands replicas: replica 0's numbers are the job's progress; every replica's first
    pod (its rank 0, on its own metrics port) gives status.replicas its row."""
    from holmes.operator.core import child_names

    job = {
        "metadata": {"namespace": "ns", "name": "j", "uid": "u"},
        "status": {"launched": True, "attempt": 1},
    }

    def pod(rank, replica, port):
        labels = {
            child_names.LABEL_ATTEMPT: "1",
            child_names.LABEL_NODE_RANK: str(rank),
            child_names.LABEL_REPLICA: str(replica),
        }
        return {
            "metadata": {
                "name": f"j-1-{rank}",
                "uid": f"p{rank}",
                "labels": labels,
                "ownerReferences": [{"uid": "u"}],
            },
            "spec": {
                "containers": [{"name": "trainer", "ports": [{"name": "metrics", "containerPort": port}]}]
            },
            "status": {"phase": "Running", "podIP": "127.0.0.1"},
        }

    first = exposition(holmes_trainer_iteration=12, holmes_trainer_outer_step=2).encode()
    second = exposition(holmes_trainer_iteration=11, holmes_trainer_outer_step=2).encode()
    with serving(first) as p0, serving(second) as p1:
        pods = [pod(0, 0, p0), pod(1, 0, 1), pod(2, 1, p1), pod(3, 1, 1)]
        found = Reader(0.0).settled(job, pods)
    assert found["iteration"] == 12 and found["outerStep"] == 2
    assert found["replicas"] == {0: {"iteration": 12, "outerStep": 2}, 1: {"iteration": 11, "outerStep": 2}}


def test_a_replica_ending_after_replica_0_has_its_last_line_read_too():
    """Replica 0's rank 0 ended and was read; replica 1's ends later: its last line is read then
    (status.replicas would otherwise keep its last scrape), and nothing more once all ended."""
    from holmes.operator.core import child_names

    job = {
        "metadata": {"namespace": "ns", "name": "j", "uid": "u"},
        "status": {"launched": True, "attempt": 1},
    }

    def pod(rank, replica, line=None):
        labels = {
            child_names.LABEL_ATTEMPT: "1",
            child_names.LABEL_NODE_RANK: str(rank),
            child_names.LABEL_REPLICA: str(replica),
        }
        status = {"phase": "Running", "podIP": "127.0.0.1"}
        if line is not None:
            term = {"exitCode": 0, "message": json.dumps({"holmes": "done", **line})}
            status = {"phase": "Succeeded", "containerStatuses": [{"state": {"terminated": term}}]}
        meta = {"name": f"j-1-{rank}", "uid": f"p{rank}", "labels": labels, "ownerReferences": [{"uid": "u"}]}
        return {"metadata": meta, "spec": {"containers": [{"name": "trainer"}]}, "status": status}

    reader = Reader(3600.0)  # no second read of a running pod within the test
    zero_done = pod(0, 0, {"iteration": 32, "outerStep": 8})
    first = reader.settled(job, [zero_done, pod(1, 1)])
    assert first["replicas"][0] == {"iteration": 32, "outerStep": 8} and first["replicas"][1] == {}
    both = [zero_done, pod(1, 1, {"iteration": 32, "outerStep": 8})]
    assert reader.settled(job, both)["replicas"][1] == {"iteration": 32, "outerStep": 8}
    assert reader.reader.read(job, both, lambda *a, **k: "") is None  # all ended and read:
    assert not reader.finished.acquire(timeout=0.5)  # no read is started again


@contextlib.contextmanager
def hanging():
    """A port on loopback that accepts connections (the kernel's backlog) and never answers, as
    a trainer stuck in a long step or a pod behind a black-holed route; yields its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    try:
        yield srv.getsockname()[1]
    finally:
        srv.close()


def running_job(i: int, port: int):
    job = {
        "metadata": {"namespace": "ns", "name": f"j{i}", "uid": f"u{i}"},
        "status": {"launched": True, "attempt": 1},
    }
    labels = {child_names.LABEL_ATTEMPT: "1", child_names.LABEL_NODE_RANK: "0"}
    pod = {
        "metadata": {
            "name": f"j{i}-1-0",
            "uid": f"p{i}",
            "labels": labels,
            "ownerReferences": [{"uid": f"u{i}"}],
        },
        "spec": {"containers": [{"name": "trainer", "ports": [{"name": "metrics", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    }
    return job, [pod]


def test_reconciles_go_on_while_every_trainer_hangs():
    """Reconciles run on asyncio's default executor (handlers.job_loop), a few threads shared
    by every job: trainers that never answer must not hold them, nor slow another job's
    reconcile, however many there are; the reader's own threads stay bounded."""
    jobs = min(32, (os.cpu_count() or 1) + 4) + 2  # more than the default executor's threads
    reader = Reader(0.0, workers=2)

    async def reconciles(port: int) -> tuple[float, float, list]:
        started = time.perf_counter()
        reads = asyncio.gather(
            *(
                asyncio.to_thread(reader.reader.read, *running_job(i, port), lambda *a, **k: "")
                for i in range(jobs)
            )
        )
        await asyncio.sleep(0.05)  # the hung jobs' reconciles are under way
        other = time.perf_counter()
        await asyncio.to_thread(lambda: None)  # another job's reconcile
        other = time.perf_counter() - other
        found = await reads
        return time.perf_counter() - started, other, found

    with hanging() as port:
        took, other, found = asyncio.run(reconciles(port))
        scrapers = [t for t in threading.enumerate() if t.name.startswith("holmes-progress")]
        assert took < 0.5 and other < 0.25, (took, other)  # a hung scrape takes its 1 s timeout
        assert found == [None] * jobs  # nothing read yet: the reads are under way
        assert len(scrapers) <= 2
        assert reader.finished.acquire(timeout=10)  # each hung scrape times out on its own thread
    reader.reader.close()


def test_the_reconcile_that_sees_every_reporter_ended_gets_their_last_lines():
    """The reconcile that sees the pods ended writes the final status: it must carry their last
    lines, not leave them to a read that lands after the job has finished (CI saw a replicas job
    end Succeeded at iteration 31 of 32)."""
    job = {
        "metadata": {"namespace": "ns", "name": "j", "uid": "u"},
        "status": {"launched": True, "attempt": 1},
    }
    labels = {child_names.LABEL_ATTEMPT: "1", child_names.LABEL_NODE_RANK: "0"}
    term = {"exitCode": 0, "message": json.dumps({"holmes": "done", "iteration": 32})}
    ended = {
        "metadata": {"name": "j-1-0", "uid": "p0", "labels": labels, "ownerReferences": [{"uid": "u"}]},
        "spec": {"containers": [{"name": "trainer"}]},
        "status": {"phase": "Succeeded", "containerStatuses": [{"state": {"terminated": term}}]},
    }
    reader = Reader(3600.0)
    assert reader.reader.read(job, [ended], lambda *a, **k: "")["iteration"] == 32
    assert reader.reader.read(job, [ended], lambda *a, **k: "") is None  # read once
    assert not reader.finished.acquire(timeout=0.3)  # and not again on the reader's threads
