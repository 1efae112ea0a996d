"""`kubectl holmes` takes kubectl's -n/--context/--kubeconfig before or after its command."""

from __future__ import annotations

import pytest

from holmes.kubectl_holmes import build_parser


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
