"""A new job's placement never queues behind the running jobs' reconciles (issue 46's full-size
runs: six workers, each held by a running job's reconcile waiting on the API server, kept the
ramp's new jobs waiting): jobs not launched yet reconcile in a pool of their own."""

from __future__ import annotations

import asyncio
import threading

from kubernetes import client

from holmes.operator import handlers, placement_facts
from tests.helpers.operator.pipeline_world import waiting_job


def test_a_new_jobs_reconcile_runs_while_every_tracking_worker_is_busy(monkeypatch):
    rt = handlers.Runtime(client.ApiClient(), placement_facts.builtin_cost_model())
    running = [waiting_job(f"run-{i}", i) for i in range(handlers.RECONCILE_WORKERS + 2)]
    for j in running:
        j["status"] = {"launched": True, "phase": "Running"}
        rt.caches.jobs.put(j)
    rt.caches.jobs.put(waiting_job("new", 100))
    release = threading.Event()
    ran = []

    def reconcile(ns, name, nodes, refused=None):
        ran.append(name)
        if name.startswith("run-"):
            release.wait(30)  # an API server that does not answer yet
        return None

    monkeypatch.setattr(rt, "reconcile", reconcile)
    assert rt.pool_of("ns", "new") == "launching" and rt.pool_of("ns", "run-0") == "tracking"

    async def scenario() -> None:
        busy = [
            asyncio.ensure_future(rt.reconcile_in_worker("ns", j["metadata"]["name"], [])) for j in running
        ]
        await asyncio.sleep(0.2)  # every tracking worker taken, two more reconciles queued
        await asyncio.wait_for(rt.reconcile_in_worker("ns", "new", []), 5)
        assert "new" in ran and not all(b.done() for b in busy)
        release.set()
        await asyncio.gather(*busy)

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        for pool in rt.workers.values():
            pool.shutdown(wait=False, cancel_futures=True)
