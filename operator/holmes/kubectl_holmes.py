"""`kubectl holmes`: the kubectl plugin (kubectl runs the executable ``kubectl-holmes`` found on
PATH, installed with the package). Against the current kubeconfig context, as kubectl itself:

- ``kubectl holmes plan -f JOB.yaml [holmes plan options]``: the layout Holmes would run on the
  cluster's nodes (``holmes plan --kubeconfig``'s code path);
- ``kubectl holmes status JOB [--svg FILE]``: phase, layout, progress with percentage and ETA,
  each stage's measured speed; ``--svg`` draws the layout from the job's layout ConfigMap;
  without JOB, one line per job of the namespace (``-A``: of every namespace);
- ``kubectl holmes why JOB``: what keeps it waiting or stalled, with the fix;
- ``kubectl holmes member-kubeconfig --member NAME [--duration 24h]``: run against a member
  cluster, prints a kubeconfig for the hub's operator with an expiring token of the
  ``holmes-member`` service account (holmes.operator.core.member_token), to store in the hub's Secret.

``-n/--namespace``, ``-A/--all-namespaces``, ``--context``, ``--kubeconfig`` and ``--as``/``--as-group``
(impersonation: the Impersonate-User/-Group headers on every API call) as kubectl's, and ``-o json|yaml``
on status and why (kubectl hands a plugin no flags of its own: they follow ``holmes``;
``KUBECONFIG`` in the environment works too). The I/O is here; the text
comes from holmes.view.job_text, the picture from holmes.view.svg."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from holmes.cli import CliError, impersonate, quiet_closed_pipe, write_svg, yaml_text
from holmes.cli import main as holmes_main
from holmes.contract.names import GROUP, PLURAL, VERSION
from holmes.operator.core import member_token
from holmes.operator.core.child_names import LABEL_ATTEMPT, LABEL_JOB


class PluginError(Exception):
    pass


def client(args: argparse.Namespace):
    try:
        from kubernetes import client as k8s
        from kubernetes import config
    except ImportError:
        raise PluginError("needs the kubernetes Python package (pip install kubernetes)") from None
    try:
        config.load_kube_config(config_file=args.kubeconfig, context=args.context)
        contexts, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
    except Exception as e:  # no kubeconfig, unknown context
        raise PluginError(f"kubeconfig: {e}") from None
    chosen = active if args.context is None else next(c for c in contexts if c.get("name") == args.context)
    if args.namespace is None:  # as kubectl: the context's namespace, else default
        args.namespace = (chosen.get("context") or {}).get("namespace") or "default"
    api = k8s.ApiClient()
    try:
        impersonate(api, args.as_user, args.as_group)
    except CliError as e:
        raise PluginError(str(e)) from None
    return k8s, api


def denied(e, what: str, args: argparse.Namespace) -> str:
    """An API error's words, with who asked when it was an impersonated user that was refused."""
    who = f" (as {args.as_user})" if args.as_user and e.status == 403 else ""
    return f"{what}: {e.status} {e.reason}{who}"


def dump(obj: Any, output: str) -> None:
    """-o json|yaml: the object as the API serves it, without metadata.managedFields (as kubectl
    prints it by default)."""
    for o in [obj, *(obj.get("items") or [])]:
        (o.get("metadata") or {}).pop("managedFields", None)
    if output == "json":
        print(json.dumps(obj, indent=2, sort_keys=True))
    else:
        print(yaml_text(obj), end="")


def get_job(k8s, api, ns: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    try:
        return k8s.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    except k8s.exceptions.ApiException as e:
        if e.status == 404:
            raise PluginError(
                f"no HolmesJob {name} in namespace {ns} (kubectl holmes status -A lists them)"
            ) from None
        raise PluginError(denied(e, f"reading HolmesJob {ns}/{name}", args)) from None
    except Exception as e:  # connection refused, TLS
        raise PluginError(f"reading HolmesJob {ns}/{name}: {e}") from None


def list_jobs(k8s, api, args: argparse.Namespace) -> dict[str, Any]:
    jobs = k8s.CustomObjectsApi(api)
    where = "every namespace" if args.all_namespaces else f"namespace {args.namespace}"
    try:
        if args.all_namespaces:
            return jobs.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        return jobs.list_namespaced_custom_object(GROUP, VERSION, args.namespace, PLURAL)
    except k8s.exceptions.ApiException as e:
        raise PluginError(denied(e, f"listing HolmesJobs in {where}", args)) from None
    except Exception as e:  # connection refused, TLS
        raise PluginError(f"listing HolmesJobs in {where}: {e}") from None


def one_job(args: argparse.Namespace) -> None:
    """A command about one job: -A names no namespace to find it in (kubectl's own refusal)."""
    if args.all_namespaces:
        raise PluginError(
            f"-A lists jobs (kubectl holmes status -A); {args.command} reads one: give -n NAMESPACE instead"
        )


def plan_command(args: argparse.Namespace, rest: list[str]) -> int:
    one_job(args)
    if args.output == "yaml":
        raise PluginError("plan prints its layout as JSON (-o json); -o yaml is for status and why")
    argv = ["plan", "--job", args.filename, "--kubeconfig", args.kubeconfig or ""]
    argv += ["--context", args.context] if args.context else []
    argv += ["--as", args.as_user] if args.as_user else []
    argv += [x for g in args.as_group or () for x in ("--as-group", g)]
    argv += ["--json"] if args.output == "json" else []
    return holmes_main(argv + rest)


def status_command(args: argparse.Namespace, rest: list[str]) -> int:
    from holmes.view import job_text

    if args.job is None:  # the namespace's jobs, or every namespace's
        if args.svg:
            raise PluginError("--svg draws one job: give its name (kubectl holmes status JOB --svg FILE)")
        k8s, api = client(args)
        found = list_jobs(k8s, api, args)
        if args.output:
            dump(found, args.output)
        else:
            items = sorted(
                found.get("items") or [],
                key=lambda j: (j["metadata"].get("namespace", ""), j["metadata"]["name"]),
            )
            print(
                "\n".join(job_text.list_lines(items, datetime.now(timezone.utc), bool(args.all_namespaces)))
            )
        return 0
    one_job(args)
    k8s, api = client(args)
    job = get_job(k8s, api, args.namespace, args.job, args)
    if args.output:
        dump(job, args.output)
    else:
        print("\n".join(job_text.status_lines(job, datetime.now(timezone.utc))))
    if args.svg:
        draw(k8s, api, job, args.svg)
    return 0


def draw(k8s, api, job: dict[str, Any], path: str) -> None:
    """The layout ConfigMap's full Layout (with the schedule), else what the status holds."""
    from holmes.contract.layout import Layout, LayoutError
    from holmes.view import picture

    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    cm_name = ((job.get("status") or {}).get("layout") or {}).get("configMap")
    pic = None
    if cm_name:
        try:
            cm = k8s.CoreV1Api(api).read_namespaced_config_map(cm_name, ns)
            pic = picture.from_layout(
                Layout.from_json((cm.data or {})["layout.json"]), f"HolmesJob {ns}/{name}"
            )
        except (k8s.exceptions.ApiException, KeyError, LayoutError) as e:
            print(f"(ConfigMap {cm_name}: {e}; drawing from the status)", file=sys.stderr)
    try:
        write_svg(path, pic or picture.from_status(job))
    except picture.PictureError as e:
        raise PluginError(str(e)) from None


def why_command(args: argparse.Namespace, rest: list[str]) -> int:
    from holmes.view import job_text

    one_job(args)
    k8s, api = client(args)
    job = get_job(k8s, api, args.namespace, args.job, args)
    core = k8s.CoreV1Api(api)
    selector = f"involvedObject.name={args.job},involvedObject.kind=HolmesJob"
    try:
        events = core.list_namespaced_event(args.namespace, field_selector=selector).items
        attempt = (job.get("status") or {}).get("attempt")
        labels = f"{LABEL_JOB}={args.job}" + (f",{LABEL_ATTEMPT}={attempt}" if attempt else "")
        pods = core.list_namespaced_pod(args.namespace, label_selector=labels).items
    except k8s.exceptions.ApiException as e:
        raise PluginError(
            denied(e, f"reading events and pods of {args.namespace}/{args.job}", args)
        ) from None
    plain = [api.sanitize_for_serialization(x) for x in (*events, *pods)]
    lines = job_text.why_lines(job, plain[: len(events)], plain[len(events) :], datetime.now(timezone.utc))
    if args.output:
        meta = job["metadata"]
        phase = (job.get("status") or {}).get("phase")
        dump(
            {"namespace": meta["namespace"], "name": meta["name"], "phase": phase, "why": lines}, args.output
        )
    else:
        print("\n".join(lines))
    return 0


def issue_member_token(k8s, api, namespace: str, service_account: str, expiration: int) -> str:
    """A token of ``service_account`` from the TokenRequest API, valid ``expiration`` seconds."""
    body = member_token.token_request(expiration)
    try:
        out = k8s.CoreV1Api(api).create_namespaced_service_account_token(service_account, namespace, body)
    except k8s.exceptions.ApiException as e:
        hint = ""
        if e.status == 404:
            hint = f": no service account {namespace}/{service_account} (`kubectl apply -k deploy/member/`)"
        raise PluginError(
            f"TokenRequest for {namespace}/{service_account}: {e.status} {e.reason}{hint}"
        ) from None
    except Exception as e:  # connection refused, TLS
        raise PluginError(f"TokenRequest for {namespace}/{service_account}: {e}") from None
    return str(out.status.token)


def member_kubeconfig_command(args: argparse.Namespace, rest: list[str]) -> int:
    one_job(args)
    namespace = args.namespace or "holmes-system"  # deploy/member/'s, not the context's
    k8s, api = client(args)
    try:
        expiration = member_token.seconds(args.duration)
        token = issue_member_token(k8s, api, namespace, args.service_account, expiration)
        expires = member_token.expires(token)
    except member_token.TokenError as e:
        raise PluginError(str(e)) from None
    cfg = api.configuration
    ca = None
    if cfg.ssl_ca_cert:
        with open(cfg.ssl_ca_cert, "rb") as f:
            ca = f.read()
    user = f"{args.service_account}@{args.member}"
    print(
        member_token.kubeconfig_text(member_token.kubeconfig(args.member, cfg.host, ca, token, user)), end=""
    )
    print(
        f"# token of {namespace}/{args.service_account} expires {expires:%Y-%m-%dT%H:%M:%SZ}: issue a new "
        "one and replace the hub's Secret before then (docs/multicluster.md#rotating-the-token)",
        file=sys.stderr,
    )
    return 0


def common(p: argparse.ArgumentParser, default: object) -> argparse.ArgumentParser:
    p.add_argument(
        "-n",
        "--namespace",
        default=default,
        help="the job's namespace (default: the context's, else default)",
    )
    p.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        default=default,
        help="status without JOB: the jobs of every namespace",
    )
    p.add_argument("--context", default=default, help="kubeconfig context (default: the current one)")
    p.add_argument(
        "--kubeconfig", default=default, help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)"
    )
    p.add_argument(
        "--as",
        dest="as_user",
        metavar="USER",
        default=default,
        help="impersonate USER on every API call (kubectl's --as: needs the impersonate verb)",
    )
    p.add_argument(
        "--as-group",
        action="append",
        metavar="GROUP",
        default=default,
        help="with --as: impersonate this group too",
    )
    return p


def output(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "-o", "--output", choices=("json", "yaml"), help="print the object(s) as JSON or YAML instead of text"
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl holmes", description="Holmes jobs on the current kubeconfig context's cluster"
    )
    common(p, None)
    sub = p.add_subparsers(dest="command", required=True)
    # before or after the command, as kubectl takes them
    after = common(argparse.ArgumentParser(add_help=False), argparse.SUPPRESS)
    pl = sub.add_parser(
        "plan",
        parents=[after],
        help="the layout Holmes would run for a job file on this cluster's nodes",
        description="Other options go to holmes plan (--json, --compare, --pods, --svg FILE, --config ...).",
    )
    pl.add_argument("-f", "--filename", required=True, help="the HolmesJob manifest")
    output(pl)
    pl.set_defaults(func=plan_command)
    st = sub.add_parser(
        "status", parents=[after], help="a job's layout, progress with ETA and per-stage measured speed"
    )
    st.add_argument("job", nargs="?", help="the HolmesJob's name (none: list the namespace's jobs)")
    output(st)
    st.add_argument("--svg", metavar="FILE", help="also draw its layout (from its layout ConfigMap)")
    st.set_defaults(func=status_command)
    wh = sub.add_parser(
        "why",
        parents=[after],
        help="why a job waits or stalled: its conditions, events and pods, with the fix",
    )
    wh.add_argument("job", help="the HolmesJob's name")
    output(wh)
    wh.set_defaults(func=why_command)
    mk = sub.add_parser(
        "member-kubeconfig",
        parents=[after],
        help="a kubeconfig for the hub's operator, with an expiring token (run against the member)",
        description="Issues a token of the member side's service account (deploy/member/) through the "
        "TokenRequest API and prints a kubeconfig with it; -n is its namespace (default holmes-system).",
    )
    mk.add_argument(
        "--member", required=True, help="the member's name (the kubeconfig's context and cluster)"
    )
    mk.add_argument(
        "--duration",
        default=member_token.DEFAULT_DURATION,
        help=f"how long the token is valid (default {member_token.DEFAULT_DURATION}; 10m to 7d)",
    )
    mk.add_argument("--service-account", default="holmes-member", help="default holmes-member")
    mk.set_defaults(func=member_kubeconfig_command, output=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "plan":
        parser.parse_args(argv)  # unknown options: argparse's own error and exit 2
    try:
        code = args.func(args, rest)
        sys.stdout.flush()
        return code
    except PluginError as e:
        print(f"kubectl holmes {args.command}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return quiet_closed_pipe()


if __name__ == "__main__":
    sys.exit(main())
