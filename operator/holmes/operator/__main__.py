"""python -m holmes.operator [--namespace NS ... | --all-namespaces] [--kubeconfig PATH] ...

Runs the HolmesJob operator (kopf) with a liveness endpoint and Prometheus metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import sys
import time
from typing import Any

import kopf
from kubernetes import client, config

from holmes.contract.names import GROUP, PLURAL, RDMA_KINDS, VERSION
from holmes.contract.release import RELEASE
from holmes.plan.costmodel_file import CostModelError, CostModelFile

from . import api_count, kopf_namespaces, liveness, metrics
from .core.reconcile import RestartBackoff
from .core.render import RenderSettings
from .core.template import POLICY_OPTIONS, TemplatePolicy
from .handlers import Runtime, register
from .leader import LeaderElector, LeaseConfig, default_identity
from .placement_facts import export_state, with_nic_flags
from .watches import until_answered

log = logging.getLogger("holmes.operator")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m holmes.operator", description=__doc__.splitlines()[0])
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="serve only this namespace (repeatable; glob patterns allowed)",
    )
    scope.add_argument(
        "--all-namespaces",
        "-A",
        action="store_true",
        help="serve every namespace (the default when no --namespace is given)",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: $KUBECONFIG, else in-cluster, else ~/.kube/config)",
    )
    p.add_argument(
        "--liveness",
        default="http://127.0.0.1:8080/healthz",
        metavar="URL",
        help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz ('' disables)",
    )
    p.add_argument(
        "--reconcile-bound",
        type=float,
        default=liveness.DEFAULT_BOUND,
        metavar="S",
        help="the liveness probe fails (and a leader stops renewing its Lease) once a reconcile has "
        "run S seconds, or reconciles have waited S seconds for a worker while none finished",
    )
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0 disables)")
    p.add_argument("--metrics-addr", default="127.0.0.1", help="address the metrics server binds")
    p.add_argument(
        "--metrics-secure",
        action="store_true",
        help="serve metrics over HTTPS to bearer tokens the API server authenticates (TokenReview) "
        "and authorizes for get on /metrics (SubjectAccessReview), as controller-runtime does",
    )
    p.add_argument(
        "--metrics-cert-dir",
        default="",
        help="with --metrics-secure: a folder holding tls.crt and tls.key (default: a self-signed "
        "certificate made at start)",
    )
    p.add_argument(
        "--trainer-image",
        default=os.environ.get("HOLMES_TRAINER_IMAGE", RenderSettings.image),
        help="image of pods whose template names none (default: $HOLMES_TRAINER_IMAGE)",
    )
    p.add_argument(
        "--master-port",
        type=int,
        default=RenderSettings.master_port,
        help="torch rendezvous port on the rank-0 pod",
    )
    p.add_argument(
        "--port-range",
        metavar="LO-HI",
        help="give each attempt its own rendezvous and metrics ports from this range, for pods "
        "that share a network namespace (hostNetwork: true; the local node agent)",
    )
    p.add_argument(
        "--trainer-metrics-port",
        type=int,
        default=RenderSettings.metrics_port,
        help="port of the rank-0 trainer's Prometheus endpoint, read for status.progress",
    )
    p.add_argument(
        "--cluster-rdma-kind",
        action="append",
        default=[],
        metavar="CLUSTER=KIND",
        help="NIC kind (infiniband|roce) of RDMA nodes in CLUSTER whose labels do not say which "
        "(e.g. Node Feature Discovery only); repeatable",
    )
    p.add_argument(
        "--rdma-default-kind",
        choices=RDMA_KINDS,
        help="NIC kind of such nodes in any other cluster (default: report them as unusable)",
    )
    p.add_argument(
        "--cost-model",
        metavar="COSTMODEL.yaml",
        help="plan with this cost model (the YAML `holmes plan --config` reads; re-read before "
        "each plan when it changes, a bad edit keeps the last good one); default: built-in",
    )
    p.add_argument(
        "--restart-backoff-seconds",
        type=float,
        default=RestartBackoff.base,
        metavar="S",
        help="wait S seconds before the attempt after the first gang restart, doubling with each "
        "further restart (like Kubernetes Jobs; 0 disables)",
    )
    p.add_argument(
        "--restart-backoff-max-seconds",
        type=float,
        default=RestartBackoff.cap,
        metavar="S",
        help="the longest restart back-off",
    )
    pol = p.add_argument_group(
        "job policy",
        "what a HolmesJob's spec.template may set beyond what Pod Security Admission checks in the "
        "job's namespace (docs/api.md#job-policy)",
    )
    for o in POLICY_OPTIONS:
        if o.is_list:
            pol.add_argument(f"--{o.flag}", dest=o.field, default="", metavar="A,B", help=o.help)
        else:
            pol.add_argument(f"--{o.flag}", dest=o.field, action="store_true", help=o.help)
    p.add_argument(
        "--raw-priority-namespaces",
        default="",
        metavar="NS,NS",
        help="namespaces whose HolmesJobs may set spec.runPolicy.priority, a raw number that wins "
        "over PriorityClasses in Holmes' queue and is Kueue's Workload priority; a job elsewhere "
        "that sets it is Stalled (PolicyViolation). Default: none, priority comes from "
        "PriorityClasses and Kueue's WorkloadPriorityClasses, which admins own",
    )
    p.add_argument(
        "--members-namespace",
        default="",
        metavar="NS",
        help="member clusters: read their registrations (Secrets labelled holmes.dev/member-cluster "
        "holding a kubeconfig) in this namespace of this (hub) cluster, usually the operator's own; "
        "while any is registered, jobs span the members' nodes (docs/multicluster.md). Default: off",
    )
    p.add_argument(
        "--member-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="read only this registration Secret in --members-namespace (repeat for each member), "
        "each watched by name, so that RBAC can grant exactly these (resourceNames). "
        "Default: every Secret there labelled holmes.dev/member-cluster",
    )
    p.add_argument(
        "--progress-interval",
        type=float,
        default=RenderSettings.progress_interval,
        metavar="S",
        help="read a running trainer's metrics (and patch status.progress) at most every S seconds",
    )
    ha = p.add_argument_group(
        "high availability", "run several replicas; one leads through a coordination.k8s.io Lease"
    )
    ha.add_argument("--leader-elect", action="store_true", help="act only while holding the Lease")
    ha.add_argument(
        "--leader-elect-namespace",
        default=os.environ.get("POD_NAMESPACE") or _incluster_namespace() or "default",
        metavar="NS",
        help="namespace of the Lease (default: $POD_NAMESPACE, the pod's own, else default)",
    )
    ha.add_argument("--leader-elect-name", default="holmes-operator", metavar="NAME", help="the Lease's name")
    ha.add_argument(
        "--leader-elect-identity", default=default_identity(), metavar="ID", help="default: $POD_NAME"
    )
    ha.add_argument("--leader-elect-lease-duration", type=float, default=LeaseConfig.duration, metavar="S")
    ha.add_argument(
        "--leader-elect-renew-deadline", type=float, default=LeaseConfig.renew_deadline, metavar="S"
    )
    ha.add_argument("--leader-elect-retry-period", type=float, default=LeaseConfig.retry, metavar="S")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--log-format",
        default="json",
        choices=["json", "plain"],
        help="json: one structured record per line (default); plain: human-readable",
    )
    args = p.parse_args(argv)
    kinds = {}
    for item in args.cluster_rdma_kind:
        cluster, _, kind = item.partition("=")
        if not cluster or kind not in RDMA_KINDS:
            p.error(f"--cluster-rdma-kind {item!r}: expected CLUSTER=infiniband or CLUSTER=roce")
        kinds[cluster] = kind
    args.cluster_rdma_kinds = kinds
    try:
        args.restart_backoff = RestartBackoff(args.restart_backoff_seconds, args.restart_backoff_max_seconds)
    except ValueError as e:
        p.error(f"--restart-backoff-seconds/--restart-backoff-max-seconds: {e}")

    def names_in(v: str) -> tuple[str, ...]:
        return tuple(x.strip() for x in v.split(",") if x.strip())

    policy: dict[str, Any] = {  # each option's parsed value (argparse's namespace is untyped)
        o.field: names_in(getattr(args, o.field)) if o.is_list else getattr(args, o.field)
        for o in POLICY_OPTIONS
    }
    args.policy = TemplatePolicy(**policy)
    args.raw_priority_namespaces = names_in(args.raw_priority_namespaces)
    if not args.reconcile_bound >= 10:
        p.error(f"--reconcile-bound {args.reconcile_bound:g}: expected at least 10 seconds")
    if args.progress_interval < 1:
        p.error(f"--progress-interval {args.progress_interval:g}: expected at least 1 second")
    args.lease = None
    if args.leader_elect:
        try:
            args.lease = LeaseConfig(
                namespace=args.leader_elect_namespace,
                name=args.leader_elect_name,
                identity=args.leader_elect_identity,
                duration=args.leader_elect_lease_duration,
                renew_deadline=args.leader_elect_renew_deadline,
                retry=args.leader_elect_retry_period,
            )
        except ValueError as e:
            p.error(f"--leader-elect-*: {e}")
    args.port_range_tuple = None
    if args.port_range:
        lo, _, hi = args.port_range.partition("-")
        if not (lo.isdigit() and hi.isdigit() and 1024 <= int(lo) < int(hi) <= 65535):
            p.error(f"--port-range {args.port_range!r}: expected LO-HI with 1024 <= LO < HI <= 65535")
        args.port_range_tuple = (int(lo), int(hi))
    if args.member_secret and not args.members_namespace:
        p.error("--member-secret names a Secret in --members-namespace: set --members-namespace too")
    if args.metrics_cert_dir and not args.metrics_secure:
        p.error("--metrics-cert-dir is the HTTPS certificate of --metrics-secure: add --metrics-secure")
    if args.metrics_cert_dir:
        missing = [
            f for f in ("tls.crt", "tls.key") if not os.path.isfile(os.path.join(args.metrics_cert_dir, f))
        ]
        if missing:
            p.error(f"--metrics-cert-dir {args.metrics_cert_dir}: no {' or '.join(missing)} there")
    return args


def _incluster_namespace() -> str | None:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def api_client(kubeconfig: str | None) -> client.ApiClient:
    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = 32  # pods of a large job are created in parallel
    return client.ApiClient(cfg)


def connection_info(cfg: client.Configuration, settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """kopf's credentials from the same client configuration the reconciler uses (so
    --kubeconfig, in-cluster tokens and client certificates all work alike)."""
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (
        (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    )
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        trust_env=settings.networking.trust_env,
    )


def cost_model(args: argparse.Namespace) -> CostModelFile:
    """The --cost-model file (or the defaults) with the NIC flags on top; CostModelError if bad."""
    return CostModelFile(
        args.cost_model,
        on_state=export_state,
        adjust=lambda c: with_nic_flags(c, args.cluster_rdma_kinds, args.rdma_default_kind),
    )


def build(
    args: argparse.Namespace, model: CostModelFile | None = None
) -> tuple[kopf.OperatorRegistry, Runtime]:
    registry = kopf.OperatorRegistry()
    settings = RenderSettings(
        image=args.trainer_image,
        master_port=args.master_port,
        metrics_port=args.trainer_metrics_port,
        port_range=args.port_range_tuple,
        policy=args.policy,
        raw_priority_namespaces=args.raw_priority_namespaces,
        progress_interval=args.progress_interval,
    )
    rt = Runtime(
        api=api_client(args.kubeconfig),
        cost_model=model or cost_model(args),
        settings=settings,
        backoff=args.restart_backoff,
        namespaces=tuple(args.namespace),
        members_namespace=args.members_namespace,
        member_secrets=tuple(args.member_secret),
        reconciles=liveness.Progress(args.reconcile_bound),
    )
    register(rt, registry)

    @kopf.on.login(registry=registry, id="login")
    def login(settings: kopf.OperatorSettings, **_):
        return connection_info(rt.api.configuration, settings)

    @kopf.on.startup(registry=registry, id="configure")
    def configure(settings: kopf.OperatorSettings, **_):
        # Events: transitions are posted explicitly (kopf.event); kopf's own warnings and
        # errors about an object (e.g. a crashed handler) are posted from its log calls too.
        settings.posting.enabled = True
        settings.posting.loggers = True
        settings.posting.level = logging.WARNING
        # Keep any kopf bookkeeping under our own domain and out of status (the schema owns it).
        # No finalizer is needed: no handler runs on deletion, ownerReferences clean up.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="holmes.dev")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="holmes.dev")
        settings.watching.server_timeout = 270
        settings.watching.client_timeout = 300
        settings.watching.connect_timeout = 10

    return registry, rt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        model = cost_model(args)  # a bad file stops here, before anything is served
    except CostModelError as e:
        print(f"python -m holmes.operator: error: --cost-model: {e}", file=sys.stderr)
        return 2
    kopf.configure(
        verbose=args.log_level == "debug",
        quiet=args.log_level in ("warning", "error"),
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL,
    )
    logging.getLogger().setLevel(args.log_level.upper())
    if args.log_level != "debug":  # kopf logs every watch-event handler call at INFO: keep its warnings
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    api_count.install()
    metrics.BUILD_INFO.labels(RELEASE).set(1)
    registry, rt = build(args, model)
    if args.metrics_port and args.metrics_secure:
        from .metrics_auth import MetricsAuthorizer
        from .metrics_server import api_reviews, serve_secure

        serve_secure(
            args.metrics_addr,
            args.metrics_port,
            MetricsAuthorizer(*api_reviews(rt.api)),
            args.metrics_cert_dir or None,
        )
    elif args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_addr)
    namespaces = args.namespace
    log.info(
        "starting",
        extra={
            "namespaces": namespaces or "*",
            "metrics_port": args.metrics_port,
            "metrics_secure": args.metrics_secure,
            "liveness": args.liveness,
            "cost_model": args.cost_model or "built-in",
        },
    )
    # a replica whose reconciles are stuck stops renewing: the standby leads within the lease
    elector = LeaderElector(rt.api, args.lease, stuck=rt.reconciles.verdict) if args.lease else None
    asyncio.run(serve(registry, rt, elector, namespaces, args.liveness or None))
    return 0


async def serve(
    registry: kopf.OperatorRegistry,
    rt: Runtime,
    elector: LeaderElector | None,
    namespaces: list[str],
    liveness: str | None,
) -> None:
    """kopf (watches, caches, handlers) and, with --leader-elect, the Lease; the job loops act once
    both the caches are filled and this replica leads. A clean exit hands the Lease over."""
    # kopf resolves the HolmesJob resource once, at start-up: an API server still starting (its
    # CRDs not served yet) left an operator that led and served no HolmesJob at all
    await asyncio.to_thread(until_answered, functools.partial(crd_served, rt.api), time.sleep)
    electing = asyncio.create_task(elector.run()) if elector else None
    if electing is not None and elector is not None:
        electing.add_done_callback(functools.partial(_election_ended, elector))
    rt.leading = elector.leading if elector else None
    metrics.LEADER.set(0 if elector else 1)  # without --leader-elect this one replica acts
    kopf_namespaces.apply()  # namespaces created while kopf starts are served too
    try:
        await kopf.operator(
            registry=registry,
            standalone=True,  # one replica acts: the Lease decides which (kopf's peering is not used)
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness,
        )
    finally:
        if electing is not None and elector is not None:
            electing.cancel()
            await asyncio.gather(electing, return_exceptions=True)
            await asyncio.to_thread(elector.release)


def crd_served(api: client.ApiClient) -> bool:
    """True once the API server serves HolmesJobs (API discovery); raises while it does not, so
    ``until_answered`` asks again (the CRD is installed before the operator: a missing one is
    waited for too, saying so)."""
    try:
        resources = client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION).resources or []
    except client.ApiException as e:
        if e.status != 404:
            raise
        resources = []
    if not any(r.name == PLURAL for r in resources):
        raise OSError(
            f"the API server does not serve {PLURAL}.{GROUP}/{VERSION} (yet): is its CRD installed?"
        )
    return True


def _election_ended(elector: LeaderElector, task: asyncio.Task) -> None:
    """An election that ended by an error would leave a replica that never leads (or leads
    unrenewed): exit, so that Kubernetes restarts it as a follower."""
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger("holmes.operator.leader").critical(
            "leader election failed: %r; exiting so that a restart elects again", task.exception()
        )
        elector.on_lost()


if __name__ == "__main__":
    sys.exit(main())
