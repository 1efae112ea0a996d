"""Nodes reach the operator through Holmes' own informer (watches.py), not kopf: at 2,000 hollow
nodes (bench/operator_scale.py) kopf's per-event handlers held the event loop for about 30 s
while listing them, before any job was reconciled, and jobs were then taken last-created first.
A node event wakes every job only when what planning reads of the node changed."""

from __future__ import annotations

import asyncio
import copy

from holmes.operator import __main__ as main
from holmes.operator.kube import Caches
from holmes.operator.watches import Watches, slim_node
from tests.helpers.operator.opfixtures import default_nodes


def test_no_kopf_handler_watches_nodes(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: c, cluster: {server: "
        "'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    registry, _ = main.build(main.parse_args([f"--kubeconfig={kubeconfig}"]))
    handlers = [*registry._watching.get_all_handlers(), *registry._indexing.get_all_handlers()]  # noqa: SLF001
    selectors = " ".join(repr(h.selector) for h in handlers)
    assert "holmesjobs" in selectors and "nodes" not in selectors, selectors


def test_a_node_event_wakes_every_job_only_when_planning_facts_change():
    woken = []
    loop = asyncio.new_event_loop()
    try:
        w = Watches(
            None, Caches(), (), "", lambda k: None, lambda: woken.append(1), lambda: None, lambda v: None
        )  # type: ignore[arg-type]
        w.loop = loop
        node = slim_node(default_nodes()[0])
        w.node_event("LISTED", node)  # the first list: no job acts before it
        beat = copy.deepcopy(node)
        beat["status"]["conditions"][0]["lastHeartbeatTime"] = "later"
        w.node_event("MODIFIED", beat)  # a heartbeat
        loop.run_until_complete(asyncio.sleep(0))
        assert woken == []
        cordoned = copy.deepcopy(node)
        cordoned["spec"]["unschedulable"] = True
        w.node_event("MODIFIED", cordoned)
        w.node_event("DELETED", cordoned)
        loop.run_until_complete(asyncio.sleep(0))
        assert len(woken) == 2
    finally:
        loop.close()
