"""Pods for the local cluster's own tests: a one-container pod running a Python snippet."""

from __future__ import annotations

import textwrap

import yaml


def apply(cluster, namespace, *docs):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))


def pod(name, script, node=None, restart="Never", **spec):
    """A one-container pod running a Python snippet (images map to the local environment)."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {"name": "main", "image": "holmes:dev", "command": ["python", "-c", textwrap.dedent(script)]}
            ],
            **spec,
        },
    }
    if node:
        body["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            }
        }
    return body
