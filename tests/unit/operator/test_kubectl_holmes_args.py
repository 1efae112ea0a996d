"""`kubectl holmes` takes kubectl's -n/--context/--kubeconfig before or after its command."""

from __future__ import annotations

import pytest

from holmes.cli import impersonate
from holmes.kubectl_holmes import build_parser, main


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "j", "-n", "lab", "--context", "east"],
        ["why", "j", "-n", "lab", "--context", "east"],
        ["-n", "lab", "--context", "east", "why", "j"],
        ["plan", "-f", "job.yaml", "-n", "lab", "--context", "east"],
    ],
)
def test_namespace_and_context_before_or_after_the_command(argv):
    args = build_parser().parse_args(argv)
    assert (args.namespace, args.context, args.kubeconfig) == ("lab", "east", None)


def test_without_flags_the_current_context_decides():
    args = build_parser().parse_args(["why", "j"])
    assert (args.namespace, args.context, args.kubeconfig) == (None, None, None)


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "-A", "-o", "json", "--as", "alice", "--as-group", "team"],
        ["-A", "--as", "alice", "--as-group", "team", "status", "-o", "json"],
        ["status", "--all-namespaces", "--output", "json", "--as=alice", "--as-group=team"],
    ],
)
def test_all_namespaces_output_and_impersonation_before_or_after_the_command(argv):
    args = build_parser().parse_args(argv)
    assert (args.job, args.all_namespaces, args.output) == (None, True, "json")
    assert (args.as_user, args.as_group) == ("alice", ["team"])


def test_output_is_json_or_yaml_only(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["status", "j", "-o", "wide"])
    assert "invalid choice: 'wide'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["why", "j", "-A"], "-A lists jobs (kubectl holmes status -A); why reads one: give -n NAMESPACE"),
        (["status", "j", "-A"], "status reads one: give -n NAMESPACE"),
        (["status", "-A", "--svg", "x.svg"], "--svg draws one job: give its name"),
        (["plan", "-f", "job.yaml", "-o", "yaml"], "plan prints its layout as JSON (-o json)"),
    ],
)
def test_flags_that_do_not_go_together_are_refused_before_any_api_call(argv, words, capsys):
    assert main(argv) == 1
    assert words in capsys.readouterr().err


def test_a_group_without_a_user_is_refused_with_the_fix(tmp_path, capsys):
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: k, cluster: {server: "
        "'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: "
        "{cluster: k, user: u}}]\n"
    )
    assert main(["status", "j", "--kubeconfig", str(cfg), "--as-group", "team"]) == 1
    assert "--as-group needs --as USER" in capsys.readouterr().err
    assert (
        main(["status", "j", "--kubeconfig", str(cfg), "--as", "a", "--as-group", "x", "--as-group", "y"])
        == 1
    )
    assert "one --as-group at a time" in capsys.readouterr().err


def test_impersonation_sets_the_headers_the_api_server_reads():
    from kubernetes import client

    api = client.ApiClient()
    impersonate(api, "alice", ["team"])
    assert api.default_headers["Impersonate-User"] == "alice"
    assert api.default_headers["Impersonate-Group"] == "team"
