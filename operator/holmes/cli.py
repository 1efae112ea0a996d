"""`holmes` command line. `holmes plan --nodes NODES.yaml --job JOB.yaml [--json] [--compare]
[--config COSTMODEL.yaml]` prints the layout Holmes would run (with `--pods`, the ConfigMap,
Service and pods the operator would create, as a v1 List), without any cluster (or with
--kubeconfig, reading the nodes of a live cluster); `holmes plan --print-config` prints the cost
model's numbers as YAML to start a --config file from."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


class CliError(Exception):
    pass


def load_nodes(path: str) -> list[dict]:
    """A v1 List of Nodes (kubectl get nodes -o yaml|json), a NodeList, a plain list, or Node
    documents; JSON and libyaml-parsed YAML are fast (holmes.contract.documents)."""
    from holmes.contract.documents import DocumentError, load_documents

    try:
        docs = load_documents(path, "nodes file")
    except DocumentError as e:
        raise CliError(str(e)) from None
    nodes: list = []
    for d in docs:
        if isinstance(d, dict) and isinstance(d.get("items"), list):
            nodes.extend(d["items"])
        elif isinstance(d, list):
            nodes.extend(d)
        else:
            nodes.append(d)
    bad = [i for i, n in enumerate(nodes) if not isinstance(n, dict) or n.get("kind", "Node") != "Node"]
    if bad:
        raise CliError(f"nodes file {path}: item {bad[0]} is not a v1 Node object")
    if not nodes:
        raise CliError(f"nodes file {path} holds no nodes")
    return nodes


def load_job(path: str):
    from holmes.contract import SpecError, load_job

    try:
        return load_job(path)
    except SpecError as e:
        raise CliError(str(e)) from None


def nodes_from_cluster(kubeconfig: str | None, context: str | None) -> list[dict]:
    try:
        from kubernetes import client, config  # only this path needs the Kubernetes client
    except ImportError:
        raise CliError("--kubeconfig needs the kubernetes Python package (pip install kubernetes)") from None
    try:
        config.load_kube_config(config_file=kubeconfig, context=context)
        api = client.ApiClient()
        items = client.CoreV1Api(api).list_node().items
    except Exception as e:  # config errors, connection refused, 403...
        raise CliError(f"cannot list nodes from the cluster: {e}") from None
    return [api.sanitize_for_serialization(n) for n in items]


def load_config(path: str | None):
    """The cost model: CostModelConfig defaults overridden by a --config YAML file."""
    from holmes.plan import CostModelConfig
    from holmes.plan.costmodel_file import CostModelError, load_file

    if path is None:
        return CostModelConfig()
    try:
        return load_file(path)
    except CostModelError as e:
        raise CliError(str(e)) from None


def plan_command(args: argparse.Namespace) -> int:
    from holmes.plan import PlanError, compare, explain, plan

    config = load_config(args.config)
    if args.print_config:
        from holmes.plan.costmodel_file import dump_yaml

        print(dump_yaml(config), end="")
        return 0
    if args.job is None:
        raise CliError("give --job JOB.yaml (a HolmesJob manifest)")
    if args.kubeconfig is None and args.nodes is None:
        raise CliError("give --nodes NODES.yaml or --kubeconfig PATH")
    nodes = load_nodes(args.nodes) if args.nodes else nodes_from_cluster(args.kubeconfig, args.context)
    if args.pods:
        return pods_command(args, nodes, config)
    job = load_job(args.job)
    try:
        if args.compare:
            holmes, base, ratio = compare(nodes, job, config)
        else:
            holmes = plan(nodes, job, config)
    except PlanError as e:
        raise CliError(f"no layout: {e}") from None
    if args.json:
        doc: dict = holmes.to_dict()
        if args.compare:
            doc = {"holmes": doc, "megatronDefault": base.to_dict(), "speedup": round(ratio, 4)}
        print(json.dumps(doc, indent=2))
        return 0
    print("Holmes layout")
    print(explain(holmes))
    if args.compare:
        print()
        print("Megatron default (nodes in name order, equal layers, same degrees)")
        print(explain(base))
        he, be = holmes.estimate, base.estimate
        print()
        print(f"{'':24}{'Holmes':>12}{'Megatron':>12}{'ratio':>8}")
        for key, label in (
            ("iterationSeconds", "iteration seconds"),
            ("tokensPerSecond", "tokens/s"),
            ("tflopsPerGpu", "TFLOPS/GPU"),
        ):
            r = he[key] / be[key]
            print(f"{label:24}{he[key]:>12.4g}{be[key]:>12.4g}{r:>8.3f}")
        print(f"Holmes is {ratio:.3f}x the Megatron-default speed (estimated)")
    return 0


def pods_command(args: argparse.Namespace, nodes: list[dict], config) -> int:
    """The ConfigMap, Service and pods the operator would create, as a v1 List."""
    from holmes.contract.documents import DocumentError, load_documents
    from holmes.operator.core.render import RenderSettings
    from holmes.operator.planning import ClusterPlanner, with_nic_flags
    from holmes.operator.preview import PreviewError, as_list, children
    from holmes.plan.costmodel_file import CostModelFile

    load_job(args.job)  # the spec's own problems first, with the file's name
    try:
        (job,) = [d for d in load_documents(args.job, "job file") if isinstance(d, dict)][:1]
    except (DocumentError, ValueError) as e:
        raise CliError(str(e)) from None
    kinds = dict(k.split("=", 1) for k in args.cluster_rdma_kind or [])
    planner = ClusterPlanner(CostModelFile(base=with_nic_flags(config, kinds)))
    from holmes.operator.core.template import TemplatePolicy

    policy = TemplatePolicy(allow_host_namespaces=args.allow_host_namespaces)
    settings = RenderSettings(image=args.trainer_image, policy=policy)
    if args.namespace:
        job.setdefault("metadata", {})["namespace"] = args.namespace
    try:
        doc = as_list(children(job, nodes, settings, planner))
    except PreviewError as e:
        raise CliError(str(e)) from None
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        import yaml

        print(yaml.safe_dump(doc, sort_keys=False), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="holmes", description="Holmes: LLM training across clusters with heterogeneous NICs"
    )
    sub = p.add_subparsers(dest="command", required=True)
    pl = sub.add_parser("plan", help="print the layout Holmes would run for a job on some nodes")
    pl.add_argument(
        "--nodes",
        help="YAML or JSON: a v1 List of Nodes (kubectl get nodes -o json loads fastest) or Node objects",
    )
    pl.add_argument("--kubeconfig", help="read the nodes from this cluster instead of --nodes")
    pl.add_argument("--context", help="kubeconfig context (with --kubeconfig)")
    pl.add_argument("--job", help="YAML or JSON: a HolmesJob manifest (required unless --print-config)")
    pl.add_argument(
        "--config",
        metavar="COSTMODEL.yaml",
        help="YAML: cost-model numbers (CostModelConfig fields, camelCase) overriding the defaults",
    )
    pl.add_argument(
        "--print-config",
        action="store_true",
        help="print the cost model (defaults, or with --config the merged result) as YAML and exit",
    )
    pl.add_argument("--json", action="store_true", help="print the Layout JSON instead of the table")
    pl.add_argument(
        "--compare", action="store_true", help="also plan the Megatron default and print the ratio"
    )
    pl.add_argument(
        "--pods",
        action="store_true",
        help="print the ConfigMap, Service and pods the operator would create, as a v1 List (YAML; "
        "--json for JSON), for review before applying",
    )
    pl.add_argument("--namespace", help="with --pods: the job's namespace (default: its own, else default)")
    pl.add_argument(
        "--trainer-image", default="holmes-trainer:latest", help="with --pods: the operator's --trainer-image"
    )
    pl.add_argument(
        "--cluster-rdma-kind",
        action="append",
        metavar="CLUSTER=KIND",
        help="with --pods: the operator's --cluster-rdma-kind (repeatable)",
    )
    pl.add_argument(
        "--allow-host-namespaces",
        action="store_true",
        help="with --pods: the operator's --allow-host-namespaces (spec.network: hostNetwork)",
    )
    pl.set_defaults(func=plan_command)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()
        return code
    except CliError as e:
        print(f"holmes {args.command}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return quiet_closed_pipe()


def quiet_closed_pipe() -> int:
    """The reader went away (``holmes plan ... | head``): as any Unix filter, stop without a
    traceback. stdout is pointed at /dev/null so the interpreter's final flush cannot fail again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141  # 128 + SIGPIPE, what a shell reports


if __name__ == "__main__":
    sys.exit(main())
