"""Publishes Holmes' topology labels on the nodes (core/island_topology.py: cluster, island) from the
operator's own classification of each node, so Kueue's TAS, Volcano's HyperNodes and any other
workload see the islands Holmes plans with.

The operator writes them, not an admin or the NIC labeller: only the operator classifies every
node with everything that says its NIC kind (Holmes' labels, NFD, DRA slices, device plugins,
its --cluster-rdma-kind flags), and it sees a node change as it happens (its node informer).
Patches run in one thread of their own, off the informer's; a node whose labels already say it
is not written. Without the RBAC to patch nodes (the chart grants it) the first refusal is
logged once, naming the rule, and nothing more is tried. ``HOLMES_TOPOLOGY_LABELS=off`` (the
environment) turns it off: an admin who labels the nodes another way, or none.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Mapping

from kubernetes import client
from kubernetes.client.rest import ApiException

from holmes.plan import NicMapping, classify_nodes

from .core import island_topology as topology

log = logging.getLogger("holmes.operator.topology")
ENV = "HOLMES_TOPOLOGY_LABELS"  # "off": publish none


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether to publish (ENV): on unless "off"; any other value is refused by name."""
    raw = (os.environ if environ is None else environ).get(ENV, "on").strip().lower()
    if raw not in ("on", "off"):
        raise ValueError(f"{ENV}={raw!r}: give on (the default) or off")
    return raw == "on"


def wanted(node: Mapping, mapping: NicMapping) -> dict[str, str] | None:
    """The label patch a node needs (None: none, or a node the planner cannot classify)."""
    nic = classify_nodes([node], mapping)[0]
    if nic.problems:
        return None
    labels = (node.get("metadata") or {}).get("labels") or {}
    return topology.label_patch(labels, topology.node_labels(nic))


class TopologyLabels:
    """``offer(kind, node)`` from the node informer; patches from a thread of its own."""

    def __init__(self, api: client.ApiClient, mapping: Callable[[], NicMapping]):
        self.core = client.CoreV1Api(api)
        self.mapping = mapping
        self.forbidden = False
        self._queue: queue.Queue[Mapping | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="topology-labels", daemon=True)

    def start(self) -> TopologyLabels:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._queue.put(None)

    def offer(self, kind: str, node: Mapping) -> None:
        if kind != "DELETED" and not self.forbidden:
            self._queue.put(node)

    def _run(self) -> None:
        while True:
            node = self._queue.get()
            if node is None:
                return
            if self.forbidden:
                continue
            try:
                patch = wanted(node, self.mapping())
                if patch:
                    name = node["metadata"]["name"]
                    self.core.patch_node(name, {"metadata": {"labels": patch}})
                    log.info("node %s: topology labels %s", name, patch)
            except ApiException as e:
                if e.status == 403:
                    self.forbidden = True
                    log.warning(
                        "cannot publish Holmes' topology labels (%s): the operator needs RBAC "
                        "nodes patch (the chart's ClusterRole grants it); not trying again",
                        e.reason,
                    )
                elif e.status != 404:
                    log.warning("node topology labels: %s", e)
            except Exception as e:  # a node the classifier trips on: the next change tries again
                log.warning("node topology labels: %s", e)
