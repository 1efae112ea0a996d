"""The Holmes NIC labeller: reads this node's sysfs and writes Holmes' NIC labels on its Node.

    python -m holmes.labeller --node-name $NODE_NAME [--sysfs-root /host/sys] [--interval 300]
        [--once] [--kubeconfig PATH] [--no-socket-ifname] [--rails mlx5_0,mlx5_[1-7]]
        [--route-table /host/route]

Each pass: read sysfs (:mod:`.sysfs`) and the host's default route (:mod:`.route_table`), read the
Node (its ``holmes.dev/nic-rails`` annotation, an admin's rail selector, beats ``--rails``),
decide the keys (:func:`.labels.desired_labels`) and patch only the Holmes keys the labeller owns
(:func:`.labels.plan_patch`; a 409 from a concurrent edit is retried on a fresh read). A node
problem (the compute rails disagree on the link layer, or the selector names no port) also
becomes a Warning Event on the Node when it first appears (in namespace ``default``: the API
accepts Events about cluster-scoped objects only there, as the kubelet's own node Events).
``--once`` does one pass and exits 0, or 1 with the reason (API refused, node missing, sysfs not
mounted); without it, errors are logged and retried at the next interval.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import signal
import sys
import threading

from .labels import Desired, Keys, desired_labels, plan_patch, rail_selector
from .route_table import read_default_route
from .sysfs import SysfsError, read_sysfs

log = logging.getLogger("holmes.labeller")
CONFLICT_RETRIES = 5


class LabellerError(RuntimeError):
    """A pass that could not finish; the message says what to fix."""


def _api_error(e, node: str, what: str) -> LabellerError:
    status = getattr(e, "status", None)
    if status == 404:
        return LabellerError(
            f"{what} node {node!r}: not found (404): --node-name must be this node's "
            f"name (spec.nodeName via the downward API)"
        )
    if status in (401, 403):
        return LabellerError(
            f"{what} node {node!r}: {'forbidden' if status == 403 else 'unauthorized'} "
            f"({status}): the service account needs nodes get and patch "
            f"(the chart's labeller ClusterRole) — {getattr(e, 'reason', '')}"
        )
    return LabellerError(f"{what} node {node!r} failed: {status} {getattr(e, 'reason', e)}")


def _core(kubeconfig: str | None):
    from kubernetes import client, config

    if kubeconfig:
        return client.CoreV1Api(config.new_client_from_config(kubeconfig))
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except Exception as e:  # noqa: BLE001 - any failure here means "no credentials"
            raise LabellerError(
                f"no Kubernetes credentials: not in a pod and no kubeconfig ({e}); pass --kubeconfig"
            ) from None
    return client.CoreV1Api()


def run_once(
    core,
    node: str,
    sysfs_root: str,
    keys: Keys,
    *,
    socket_ifname: bool = True,
    rails: str | None = None,
    route_table: str | None = None,
) -> Desired:
    """One pass; raises LabellerError with the reason. ``rails``: the --rails selector."""
    import json

    from kubernetes.client.rest import ApiException

    try:
        facts = read_sysfs(sysfs_root)
    except SysfsError as e:
        raise LabellerError(str(e)) from None
    for msg in facts.errors:
        log.debug("sysfs: %s", msg)
    default_route, route_note = read_default_route(route_table)

    logged: tuple | None = None
    desired: Desired | None = None
    for attempt in range(CONFLICT_RETRIES):
        try:
            obj = json.loads(core.read_node(node, _preload_content=False).data)
        except ApiException as e:
            raise _api_error(e, node, "reading") from None
        selector = rail_selector((obj.get("metadata") or {}).get("annotations") or {}, rails, keys)
        desired = desired_labels(
            facts,
            keys,
            socket_ifname=socket_ifname,
            selector=selector,
            default_route=default_route,
            route_note=route_note,
        )
        if logged != (desired, selector):  # once per pass, again only if a re-read changed it
            logged = (desired, selector)
            _log_decision(node, facts, desired)
        plan = plan_patch(obj.get("metadata") or {}, desired, keys)
        for msg in plan.notes:
            log.warning("%s: %s", node, msg)
        for key, value in sorted(plan.kept.items()):
            log.info("%s: %s=%r set by someone else: left alone", node, key, value)
        if plan.patch is None:
            log.info("%s: labels up to date", node)
            break
        try:
            core.patch_node(node, plan.patch)
        except ApiException as e:
            if e.status == 409 and attempt + 1 < CONFLICT_RETRIES:
                log.info("%s: node changed while patching; reading it again", node)
                continue
            raise _api_error(e, node, "patching") from None
        log.info(
            "%s: patched %s",
            node,
            ", ".join(f"{k}={'(removed)' if v is None else v}" for k, v in sorted(plan.changes.items()))
            or "the record",
        )
        problem = plan.changes.get(keys.problem)
        if problem:
            _post_event(core, obj, problem)
        break
    else:
        raise LabellerError(f"node {node!r} kept changing: {CONFLICT_RETRIES} patches refused with 409")
    assert desired is not None  # the loop ran at least once
    return desired


def _log_decision(node: str, facts, desired: Desired) -> None:
    log.info(
        "%s: %s (ports: %s; netdevs up: %s)",
        node,
        desired.summary,
        ", ".join(f"{p.name}={p.link_layer}/{p.state}/{p.rate_gbps}" for p in facts.ports) or "none",
        ", ".join(f"{n.name}:{n.speed_mbps or '?'}Mb/s" for n in facts.netdevs if n.up and n.physical)
        or "none",
    )
    for msg in desired.notes:
        log.info("%s: %s", node, msg)
    for msg in desired.problems:
        log.warning("%s: problem: %s", node, msg)


EVENT_NAMESPACE = "default"  # the only namespace the API accepts for Events about a Node


def _post_event(core, node_obj: dict, message: str) -> None:
    """A Warning Event on the Node (``kubectl describe node`` shows it); best effort."""
    from kubernetes.client.rest import ApiException

    meta = node_obj.get("metadata") or {}
    ns = EVENT_NAMESPACE
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "metadata": {"generateName": f"{meta.get('name')}.", "namespace": ns},
        "involvedObject": {
            "kind": "Node",
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "apiVersion": "v1",
        },
        "reason": "NicProblem",
        "message": message[:1024],
        "type": "Warning",
        "source": {"component": "holmes-labeller", "host": meta.get("name")},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        core.create_namespaced_event(ns, body)
    except ApiException as e:
        log.warning(
            "could not post the NicProblem Event in namespace %s (%s %s); the problem is in "
            "the node's annotation",
            ns,
            e.status,
            e.reason,
        )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m holmes.labeller",
        description="Label this node with its NIC kind, speed, HCAs and socket interface, read from sysfs.",
    )
    p.add_argument(
        "--node-name", default=os.environ.get("NODE_NAME"), help="this node's name (default: $NODE_NAME)"
    )
    p.add_argument(
        "--sysfs-root",
        default="/sys",
        help="where the host's /sys is (default /sys; the chart mounts it at /host/sys)",
    )
    p.add_argument("--interval", type=float, default=300.0, help="seconds between passes (default 300)")
    p.add_argument("--once", action="store_true", help="one pass, then exit (non-zero on failure)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, else ~/.kube/config)")
    p.add_argument(
        "--no-socket-ifname",
        dest="socket_ifname",
        action="store_false",
        help=f"do not write {Keys.from_mapping().socket_ifname}",
    )
    p.add_argument(
        "--rails",
        default="",
        help="the compute rails' HCAs, comma-separated names or globs (e.g. 'mlx5_[0-7]'); "
        f"default: chosen from sysfs. A node's {Keys.from_mapping().rails} annotation wins over this",
    )
    p.add_argument(
        "--route-table",
        default="/proc/net/route",
        help="the host's IPv4 routes in /proc/net/route format, to find the default route's "
        "interface (default /proc/net/route: right on the host's network; the chart mounts "
        "the host's /proc/1/net/route); '' to not read one",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    a = p.parse_args(argv)
    if not a.node_name:
        p.error("--node-name (or $NODE_NAME) is required: the node whose labels to write")
    if not a.interval > 0:
        p.error(f"--interval must be > 0 seconds, got {a.interval:g}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    logging.basicConfig(
        level=a.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    keys = Keys.from_mapping()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        core = _core(a.kubeconfig)
    except LabellerError as e:
        log.error("%s", e)
        return 1
    while True:
        try:
            run_once(
                core,
                a.node_name,
                a.sysfs_root,
                keys,
                socket_ifname=a.socket_ifname,
                rails=a.rails,
                route_table=a.route_table,
            )
        except LabellerError as e:
            log.error("%s", e)
            if a.once:
                return 1
        except Exception as e:  # noqa: BLE001 - a daemon keeps going; --once reports it
            log.exception("pass failed: %s", e)
            if a.once:
                return 1
        if a.once or stop.wait(a.interval):
            return 0


if __name__ == "__main__":
    sys.exit(main())
