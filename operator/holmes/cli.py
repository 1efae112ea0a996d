"""`holmes` command line. `holmes plan --nodes NODES.yaml --job JOB.yaml [--json] [--compare]
[--config COSTMODEL.yaml]` prints the layout Holmes would run (with `--pods`, the ConfigMap,
Service and pods the operator would create, as a v1 List), without any cluster (or with
--kubeconfig, reading the nodes of a live cluster); `holmes plan --print-config` prints the cost
model's numbers as YAML to start a --config file from. `holmes dryrun --job JOB.yaml (--layout
LAYOUT.json... | --nodes NODES.yaml) [...]` runs the trainer's dry run (python -m
holmes.trainer.dryrun, in a process of its own: the CLI itself never imports torch) on the
given Layout(s) or on what the operator would plan for those nodes (one Layout per replica for
a job that trains as replicas across islands). `holmes plan --svg FILE` also draws the layout
(holmes.view); with `--layout LAYOUT.json` or `--from-status JOB.yaml` it draws one without planning."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any


class CliError(Exception):
    pass


def load_nodes(path: str) -> list[dict]:
    """A v1 List of Nodes (kubectl get nodes -o yaml|json), a NodeList, a plain list, or Node
    documents; JSON and libyaml-parsed YAML are fast (holmes.contract.documents). ResourceSlices
    among them (``kubectl get nodes,resourceslices -o json``) are joined onto their nodes
    (holmes.plan.dra)."""
    from holmes.contract.documents import DocumentError, load_documents
    from holmes.plan import dra

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
    slices = [n for n in nodes if dra.is_slice(n)]
    bad = [
        i
        for i, n in enumerate(nodes)
        if not isinstance(n, dict) or (n.get("kind", "Node") != "Node" and not dra.is_slice(n))
    ]
    if bad:
        raise CliError(
            f"nodes file {path}: item {bad[0]} is neither a v1 Node nor a {dra.API_VERSION} ResourceSlice"
        )
    nodes = [n for n in nodes if not dra.is_slice(n)]
    if not nodes:
        raise CliError(f"nodes file {path} holds no nodes")
    return dra.join(nodes, slices) if slices else nodes


def load_job(path: str):
    from holmes.contract import SpecError, load_job

    try:
        return load_job(path)
    except SpecError as e:
        raise CliError(str(e)) from None


def impersonate(api, user: str | None, groups: Sequence[str] | None) -> None:
    """kubectl's --as/--as-group on a kubernetes ApiClient: the Impersonate-* headers on every
    call (the API server then authorizes as that user; the caller needs the impersonate verb)."""
    if groups and not user:
        raise CliError("--as-group needs --as USER (the API server impersonates groups of a user only)")
    if groups and len(groups) > 1:
        raise CliError(
            "one --as-group at a time: the Python client sends one Impersonate-Group header "
            "(impersonate a user that is a member of the others, or use kubectl itself)"
        )
    if user:
        api.set_default_header("Impersonate-User", user)
    for group in groups or ():
        api.set_default_header("Impersonate-Group", group)


def nodes_from_cluster(
    kubeconfig: str | None,
    context: str | None,
    as_user: str | None = None,
    as_group: Sequence[str] | None = None,
) -> list[dict]:
    try:
        from kubernetes import client, config  # only this path needs the Kubernetes client
    except ImportError:
        raise CliError("--kubeconfig needs the kubernetes Python package (pip install kubernetes)") from None
    from holmes.plan import dra

    try:
        config.load_kube_config(config_file=kubeconfig, context=context)
        api = client.ApiClient()
        impersonate(api, as_user, as_group)
        items = client.CoreV1Api(api).list_node().items
    except CliError:
        raise
    except Exception as e:  # config errors, connection refused, 403...
        raise CliError(f"cannot list nodes from the cluster: {e}") from None
    nodes = [api.sanitize_for_serialization(n) for n in items]
    group, version = dra.API_VERSION.split("/")
    try:  # DRA's devices, where the API server serves them
        custom = client.CustomObjectsApi(api)
        slices = custom.list_cluster_custom_object(group, version, "resourceslices")["items"]
    except client.ApiException as e:
        if e.status != 404:
            raise CliError(f"cannot list {dra.API_VERSION} resourceslices from the cluster: {e}") from None
        slices = []
    return dra.join(nodes, slices)


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
    if args.from_status or args.layout:
        return svg_only_command(args)
    if args.job is None:
        raise CliError("give --job JOB.yaml (a HolmesJob manifest)")
    if args.kubeconfig is None and args.nodes is None:
        raise CliError("give --nodes NODES.yaml or --kubeconfig PATH")
    nodes = (
        load_nodes(args.nodes)
        if args.nodes
        else nodes_from_cluster(args.kubeconfig or None, args.context, args.as_user, args.as_group)
    )
    if args.pods:
        return pods_command(args, nodes, config)
    job = load_job(args.job)
    warn_raw_priority(args, job)
    if args.measured:
        return measured_command(nodes, job, config, args.measured, args.json)
    try:
        if args.compare:
            holmes, base, ratio = compare(nodes, job, config)
        else:
            holmes = plan(nodes, job, config)
    except PlanError as e:
        raise CliError(f"no layout: {e}") from None
    if args.svg:
        from holmes.view import picture

        write_svg(args.svg, picture.from_layout(holmes, f"Holmes layout of {args.job}"))
    single = single_type(nodes, job, config, holmes)
    if args.json:
        doc: dict = holmes.to_dict()
        if args.compare:
            doc = {"holmes": doc, "megatronDefault": base.to_dict(), "speedup": round(ratio, 4)}
        if single is not None:
            doc = doc if args.compare else {"holmes": doc}
            doc["singleType"] = {"layout": single[0].to_dict(), "speedup": round(single[1], 4)}
        print(json.dumps(doc, indent=2))
        return 0
    print("Holmes layout")
    print(explain(holmes))
    if job.training.across_islands.mode != "pipeline":
        print_across(nodes, job, config)
    if single is not None:
        print_single_type(holmes, *single)
    if args.compare:
        print()
        print("Megatron default (nodes in name order, equal layers, same degrees)")
        print(explain(base))
        print_estimates(holmes.estimate, base.estimate, "Holmes", "Megatron")
        print(f"Holmes is {ratio:.3f}x the Megatron-default speed (estimated)")
    return 0


def raw_priority_namespaces(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(n.strip() for n in (args.raw_priority_namespaces or "").split(",") if n.strip())


def job_namespace(args: argparse.Namespace) -> str:
    """The namespace the job would run in: --namespace, else its manifest's, else default."""
    if args.namespace:
        return str(args.namespace)
    from holmes.contract.documents import DocumentError, load_documents

    try:
        docs = [d for d in load_documents(args.job, "job file") if isinstance(d, dict)]
    except (DocumentError, ValueError):
        return "default"
    return str(((docs[0] if docs else {}).get("metadata") or {}).get("namespace") or "default")


def warn_raw_priority(args: argparse.Namespace, job) -> None:
    """A raw runPolicy.priority does not change the plan, but the operator refuses it where its
    policy does not allow one: say so rather than accept it silently."""
    from holmes.operator.core.admitting import raw_priority_problem

    problem = raw_priority_problem(job, job_namespace(args), raw_priority_namespaces(args))
    if problem:
        print(f"warning: the operator would stall this job (PolicyViolation): {problem}", file=sys.stderr)


def yaml_text(obj: Any) -> str:
    """An API object as YAML (`kubectl holmes -o yaml`), keys sorted as kubectl prints them."""
    import yaml

    return str(yaml.safe_dump(obj, sort_keys=True))


def write_svg(path: str, pic) -> None:
    from holmes.view.svg import render

    try:
        with open(path, "w") as f:
            f.write(render(pic))
    except OSError as e:
        raise CliError(f"--svg {path}: {e.strerror}") from None
    print(f"wrote {path}", file=sys.stderr)


def svg_only_command(args: argparse.Namespace) -> int:
    """--svg with --layout (a Layout JSON: holmes plan --json, or a job's <name>-layout ConfigMap's
    layout.json) or --from-status (a HolmesJob as kubectl get -o yaml prints it): draw, no plan."""
    from holmes.contract.documents import DocumentError, load_documents
    from holmes.contract.layout import Layout, LayoutError
    from holmes.view import picture

    if not args.svg:
        raise CliError("--layout and --from-status draw a layout: give --svg FILE")
    if args.layout and args.from_status:
        raise CliError("give --layout or --from-status, not both")
    path = args.layout or args.from_status
    try:
        (doc,) = [d for d in load_documents(path, "layout file" if args.layout else "job file")][:1]
        if args.layout:
            if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":  # kubectl get cm <job>-layout
                doc = json.loads((doc.get("data") or {}).get("layout.json") or "null")
            doc = doc.get("holmes", doc) if isinstance(doc, dict) else doc  # holmes plan --json --compare
            pic = picture.from_layout(Layout.from_dict(doc), f"Holmes layout {path}")
        else:
            pic = picture.from_status(doc if isinstance(doc, dict) else {})
    except (DocumentError, LayoutError, picture.PictureError, ValueError) as e:
        raise CliError(f"{path}: {e}") from None
    write_svg(args.svg, pic)
    return 0


def pods_command(args: argparse.Namespace, nodes: list[dict], config) -> int:
    """The ConfigMap, Service and pods the operator would create, as a v1 List."""
    from holmes.contract.documents import DocumentError, load_documents
    from holmes.operator.core.render import RenderSettings
    from holmes.operator.placement_facts import with_nic_flags
    from holmes.operator.preview import PreviewError, as_list, children
    from holmes.plan.costmodel_file import CostModelFile

    load_job(args.job)  # the spec's own problems first, with the file's name
    try:
        (job,) = [d for d in load_documents(args.job, "job file") if isinstance(d, dict)][:1]
    except (DocumentError, ValueError) as e:
        raise CliError(str(e)) from None
    kinds = dict(k.split("=", 1) for k in args.cluster_rdma_kind or [])
    cost_model = CostModelFile(base=with_nic_flags(config, kinds))
    settings = RenderSettings(
        image=args.trainer_image,
        pod_security=args.pod_security,
        raw_priority_namespaces=raw_priority_namespaces(args),
    )
    if args.namespace:
        job.setdefault("metadata", {})["namespace"] = args.namespace
    try:
        doc = as_list(children(job, nodes, settings, cost_model))
    except PreviewError as e:
        raise CliError(str(e)) from None
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        import yaml

        print(yaml.safe_dump(doc, sort_keys=False), end="")
    # The pod template (its schema, Pod Security) is the API server's to check, as the operator
    # has it checked before a launch: on the cluster of --kubeconfig, by a dry run; offline, not.
    if args.kubeconfig is None:
        print(
            "holmes plan --pods: spec.template is not checked offline (the API server checks it on "
            "a dry run when the operator launches the job); with --kubeconfig this command asks it, "
            "or pipe these pods to: kubectl create --dry-run=server -f -",
            file=sys.stderr,
        )
        return 0
    refused = dry_run_pods(args, job["metadata"].get("namespace") or "default", doc["items"])
    for line in refused:
        print(line, file=sys.stderr)
    return 2 if refused else 0


def dry_run_pods(args: argparse.Namespace, ns: str, objects: list[dict]) -> list[str]:
    """A server-side dry run (strict field validation) of one pod of each shape on the cluster of
    --kubeconfig, as the operator makes before a launch: the API server's refusals, the fields
    named as the job's."""
    from kubernetes import client, config

    from holmes.operator.core import dry_run
    from holmes.operator.core.state import ChildRefusal

    config.load_kube_config(config_file=args.kubeconfig or None, context=args.context)
    api = client.ApiClient()
    impersonate(api, args.as_user, args.as_group)
    core = client.CoreV1Api(api)
    out = []
    samples = dry_run.samples(o for o in objects if o.get("kind") == "Pod")
    for pod in samples:
        try:
            core.create_namespaced_pod(
                ns, pod, dry_run="All", field_validation="Strict", _preload_content=False
            )
        except client.ApiException as e:
            no = ChildRefusal.from_status("Pod", pod["metadata"]["name"], e.status, e.reason, e.body)
            if dry_run.about_template(no):
                out.append(dry_run.message(no))
            else:  # a full quota, a busy server: not the template's
                print(f"dry run not conclusive: {no.describe()}", file=sys.stderr)
    if not out:
        print(
            f"the API server accepted a dry run of the pods ({len(samples)} shape(s)) in namespace {ns}",
            file=sys.stderr,
        )
    return out


def single_type(nodes, job, config, holmes):
    """On nodes of several GPU types: (the plan made as if every GPU were ``gpuPeakTflops``,
    re-estimated on the real GPUs; how much faster the GPU-aware plan is), else None."""
    from holmes.plan import PlanError, plan
    from holmes.plan.estimate import gpu_types, reestimate, without_gpu_types

    if len(gpu_types(holmes)) < 2:
        return None
    try:
        blind = plan(without_gpu_types(nodes), job, config)
        real = reestimate(nodes, job, blind, config)
    except PlanError as e:  # e.g. the blind plan does not fit the smaller GPUs' memory
        print(f"(single-type plan not comparable: {e})", file=sys.stderr)
        return None
    return real, real.estimate["iterationSeconds"] / holmes.estimate["iterationSeconds"]


def print_across(nodes, job, config) -> None:
    """spec.training.acrossIslands.mode replicas or auto: the pipeline against replicas."""
    from holmes.plan import PlanError
    from holmes.plan.across_plan import compare_across

    print()
    print(f"Across islands (spec.training.acrossIslands.mode: {job.training.across_islands.mode})")
    try:
        found = compare_across(nodes, job, config)
    except PlanError as e:
        print(f"  replicas: not possible here: {e}")
        return
    if found is None:
        print("  all nodes are in one cluster: there is no link to cross, the layout above runs")
        return
    for line in found.lines:
        print(f"  {line}")


def print_estimates(a: dict, b: dict, a_name: str, b_name: str) -> None:
    """Two layouts' estimates side by side, with a's over b's."""
    print()
    print(f"{'':24}{a_name:>12}{b_name:>12}{'ratio':>8}")
    for key, label in (
        ("iterationSeconds", "iteration seconds"),
        ("tokensPerSecond", "tokens/s"),
        ("tflopsPerGpu", "TFLOPS/GPU"),
    ):
        print(f"{label:24}{a[key]:>12.4g}{b[key]:>12.4g}{a[key] / b[key]:>8.3f}")


def print_single_type(holmes, single, ratio: float) -> None:
    from holmes.plan import explain

    print()
    print("Single-type plan (every GPU priced as gpuPeakTflops), estimated on the real GPUs")
    print(explain(single))
    print_estimates(holmes.estimate, single.estimate, "GPU-aware", "single-type")
    print(f"the GPU-aware plan is {ratio:.3f}x the single-type plan's speed (estimated)")


def measured_command(nodes, job, config, path: str, as_json: bool) -> int:
    """--measured: calibrate the cost model from a run's metrics file, print the calibrated
    plan and the change a re-plan would make (holmes.plan.calibrate)."""
    from holmes.plan import PlanError, explain, plan
    from holmes.plan.calibrate import CalibrationError, assess, read_metrics, with_rates

    try:
        measured = read_metrics(path)
        cal, now_s = assess(nodes, job, measured.run, measured, config)
        best = plan(with_rates(nodes, cal.node_tflops), job, config)
    except (CalibrationError, PlanError) as e:
        raise CliError(f"--measured {path}: {e}") from None
    best_s = best.estimate["iterationSeconds"]
    gain = now_s / best_s - 1
    ran = "/".join(map(str, measured.run.layers))
    new = "/".join(str(s.num_layers) for s in best.stages)
    same = list(best.nodes) == list(measured.run.nodes) and ran == new
    threshold = job.parallelism.replan.threshold
    would = job.parallelism.replan.enabled and not same and gain > threshold
    if as_json:
        doc = {
            "measured": {
                "samples": measured.samples,
                "iterationSeconds": measured.iteration_seconds,
                "layers": list(measured.run.layers),
                "nodes": list(measured.run.nodes),
                "estimatedSeconds": round(now_s, 6),
            },
            "stages": [
                {
                    "stage": r.stage,
                    "island": r.island,
                    "gpu": r.gpu,
                    "plannedComputeSeconds": round(r.planned_compute, 6),
                    "measuredComputeSeconds": round(r.measured_compute, 6),
                    "tflopsPerGpu": round(r.tflops, 6),
                }
                for r in cal.stages
            ],
            "nodeTflops": {k: round(v, 6) for k, v in sorted(cal.node_tflops.items())},
            "calibrated": best.to_dict(),
            "gain": round(gain, 6),
            "wouldReplan": would,
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(f"Measured run ({measured.samples} iterations after warm-up): layers {ran}")
    rows = [("stage", "island", "gpu", "planned", "measured", "ratio", "TFLOP/s/GPU")] + [
        (
            str(r.stage),
            r.island,
            r.gpu,
            f"{r.planned_compute:.3g}s",
            f"{r.measured_compute:.3g}s",
            f"{r.ratio:.3g}",
            f"{r.tflops:.4g}",
        )
        for r in cal.stages
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    print()
    print("Calibrated plan (every node priced at the TFLOP/s its stage achieved)")
    print(explain(best))
    print()
    measured_s = f", measured {measured.iteration_seconds:.4g} s" if measured.iteration_seconds else ""
    print(f"running layout {ran}: calibrated estimate {now_s:.4g} s/iteration{measured_s}")
    print(f"calibrated plan {new}: {best_s:.4g} s/iteration ({gain:+.1%} faster)")
    if same:
        print("change: none (the running layout is the calibrated plan)")
    else:
        verdict = "would re-plan" if would else "would not re-plan"
        print(
            f"change: layers {ran} -> {new}; a running job with parallelism.replan threshold "
            f"{threshold:g} {verdict}"
        )
    return 0


def dryrun_command(args: argparse.Namespace, rest: list[str]) -> int:
    """Plan when asked (--nodes), then run the dry run as its own process: it needs the trainer
    extra (torch) and sets up its fake CUDA device before torch is imported."""
    import importlib.util
    import subprocess
    import tempfile

    if importlib.util.find_spec("holmes.trainer") is None or importlib.util.find_spec("torch") is None:
        raise CliError("the dry run needs the trainer: pip install holmes-train-trainer (or ./trainer)")
    if (args.layout is None) == (args.nodes is None):
        raise CliError(
            "give --layout LAYOUT.json (from holmes plan --json) or --nodes NODES.yaml to plan one"
        )
    with tempfile.TemporaryDirectory() as tmp:
        layouts = args.layout
        if layouts is None:
            layouts = []
            for r, planned in enumerate(planned_layouts(args)):
                layouts.append(f"{tmp}/layout-{r}.json")
                with open(layouts[-1], "w") as f:
                    f.write(planned.to_json())
        cmd = [sys.executable, "-m", "holmes.trainer.dryrun", "--job", args.job, "--layout", *layouts, *rest]
        return subprocess.run(cmd).returncode


def planned_layouts(args: argparse.Namespace) -> list[Any]:
    """What the operator would run for the job on --nodes: one Layout, or one per replica when
    the job trains as replicas across islands (acrossIslands.mode replicas, or auto picking them)."""
    from holmes.operator.core.replicas import REPLICAS, choose, plan_replicas
    from holmes.plan import PlanError, plan

    nodes, job, config = load_nodes(args.nodes), load_job(args.job), load_config(args.config)
    try:
        if choose(job, nodes, config) == REPLICAS:
            return list(plan_replicas(job, nodes, config).layouts)
        return [plan(nodes, job, config)]
    except PlanError as e:
        raise CliError(f"no layout: {e}") from None


def topology_command(args: argparse.Namespace) -> int:
    """``holmes topology``: the nodes classified as the operator classifies them, their islands
    rendered for Kueue's TAS, KAI and Volcano (core/island_topology.py)."""
    import yaml

    from holmes.operator.core import island_topology as it
    from holmes.plan import NicMapping, classify_nodes
    from holmes.plan.topology import switch_levels

    if args.kubeconfig is None and args.nodes is None:
        raise CliError("give --nodes NODES.yaml or --kubeconfig PATH")
    nodes = (
        load_nodes(args.nodes) if args.nodes else nodes_from_cluster(args.kubeconfig or None, args.context)
    )
    kinds = tuple(sorted(dict(k.split("=", 1) for k in args.cluster_rdma_kind or []).items()))
    nics = classify_nodes(nodes, NicMapping(cluster_rdma_kinds=kinds))
    labelled = [it.with_labels(n, nic) for n, nic in zip(nodes, nics) if not nic.problems]
    for nic in nics:
        if nic.problems:
            print(f"# node {nic.name}: no island ({'; '.join(nic.problems)})")
    switches = switch_levels(n.labels for n in nics if not n.problems)
    items = [
        it.kueue_topology(args.name, switches=switches),
        it.kai_topology(args.name, switches=switches),
        *it.volcano_hypernodes(labelled),
    ]
    print(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}, sort_keys=False), end="")
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
    pl.add_argument(
        "--kubeconfig",
        nargs="?",
        const="",
        metavar="PATH",
        help="read the nodes from this cluster instead of --nodes (without PATH: $KUBECONFIG or "
        "~/.kube/config, as kubectl)",
    )
    pl.add_argument("--context", help="kubeconfig context (with --kubeconfig)")
    pl.add_argument("--as", dest="as_user", metavar="USER", help="with --kubeconfig: impersonate USER")
    pl.add_argument(
        "--as-group", action="append", metavar="GROUP", help="with --as: impersonate this group too"
    )
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
        "--pod-security",
        choices=("privileged", "baseline", "restricted"),
        default="privileged",
        help="with --pods: the Pod Security level the job's namespace enforces "
        "(pod-security.kubernetes.io/enforce), which picks the defaults Holmes fills in",
    )
    pl.add_argument(
        "--raw-priority-namespaces",
        default="",
        metavar="NS,NS",
        help="the operator's --raw-priority-namespaces: where spec.runPolicy.priority may be set "
        "(elsewhere plan warns and --pods refuses, as the operator does)",
    )
    pl.add_argument(
        "--measured",
        metavar="METRICS",
        help="the trainer's metrics JSON-lines file (--metrics-file) of a run of this job: calibrate "
        "the cost model from its stage times, print the calibrated plan and the change it would make",
    )
    pl.add_argument(
        "--svg",
        metavar="FILE",
        help="also draw the layout as SVG: islands, nodes, stages, groups by network, slow links and "
        "the estimated 1F1B schedule per stage",
    )
    pl.add_argument(
        "--layout",
        metavar="LAYOUT.json",
        help="with --svg: draw this Layout (holmes plan --json, or a job's <name>-layout ConfigMap, "
        "kubectl get cm -o yaml) instead of planning",
    )
    pl.add_argument(
        "--from-status",
        metavar="JOB.yaml",
        help="with --svg: draw a running job's layout from its status (kubectl get hj NAME -o yaml)",
    )
    pl.set_defaults(func=plan_command)
    tp = sub.add_parser(
        "topology",
        help="print Holmes' islands as a Kueue Topology, a KAI Topology and Volcano HyperNodes",
        description="The levels the operator publishes as node labels (topology.holmes.dev/cluster, "
        "topology.holmes.dev/island, kubernetes.io/hostname), as each scheduler's objects: a v1 List "
        "(YAML) to review and apply.",
    )
    tp.add_argument("--nodes", help="YAML or JSON: the nodes (as holmes plan --nodes)")
    tp.add_argument(
        "--kubeconfig", nargs="?", const="", metavar="PATH", help="read the nodes from this cluster"
    )
    tp.add_argument("--context", help="kubeconfig context (with --kubeconfig)")
    tp.add_argument("--name", default="holmes-islands", help="the Kueue and KAI Topology's name")
    tp.add_argument(
        "--cluster-rdma-kind",
        action="append",
        metavar="CLUSTER=KIND",
        help="the operator's flag (repeatable)",
    )
    tp.set_defaults(func=topology_command)
    dr = sub.add_parser(
        "dryrun",
        help="run the trainer for a Layout on fake CUDA and a fake process group, and check it",
        description="Other options go to python -m holmes.trainer.dryrun (--ranks, --micro-batches, --jobs).",
    )
    dr.add_argument("--job", required=True, help="YAML or JSON: a HolmesJob manifest")
    dr.add_argument(
        "--layout", nargs="+", help="the Layout JSON to run (holmes plan --json); several: one per replica"
    )
    dr.add_argument("--nodes", help="plan for these nodes first (as holmes plan --nodes)")
    dr.add_argument("--config", metavar="COSTMODEL.yaml", help="cost-model file for planning (with --nodes)")
    dr.set_defaults(func=dryrun_command)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args, rest = build_parser().parse_known_args(argv)
    try:
        if args.command != "dryrun" and rest:
            build_parser().parse_args(argv)  # unknown options: argparse's own error and exit 2
        code = args.func(args, rest) if args.command == "dryrun" else args.func(args)
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
