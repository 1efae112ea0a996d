"""The chart's optional labeller DaemonSet, rendered without a cluster."""

from __future__ import annotations

import json

import pytest
import yaml

from holmes.labeller.__main__ import parse_args  # noqa: E402
from tests.helpers.packaging.packaging_helpers import CHART, by_kind, helm, one, render  # noqa: E402

ON = {"labeller.enabled": "true"}


def labeller_docs(values=None, **kw):
    return [
        d
        for d in render({**ON, **(values or {})}, **kw)
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "nic-labeller"
    ]


def test_off_by_default_and_lint_clean_when_on():
    assert not by_kind(render(), "DaemonSet")
    assert not labeller_docs({"labeller.enabled": "false"})
    helm("lint", "--strict", str(CHART), "--set", "labeller.enabled=true")


def test_objects_and_least_privilege_rbac():
    docs = labeller_docs()
    assert sorted(d["kind"] for d in docs) == sorted(
        [
            "Namespace",  # its own (labeller.namespace), Pod Security privileged for the hostPath
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "DaemonSet",
            # what RBAC cannot say (its own Node, holmes.dev/ keys): templates/labeller-admission.yaml
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    )
    assert one(docs, "ClusterRole")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}
    ]
    role = one(docs, "Role")
    assert role["metadata"]["namespace"] == "default"  # where the API wants Events about Nodes
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    assert sa == "holmes-labeller"
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        assert one(docs, kind)["subjects"] == [
            {"kind": "ServiceAccount", "name": sa, "namespace": "holmes-labeller"}
        ]
    assert one(docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == sa
    # The operator's own objects are unchanged by enabling it.
    off, on = render(), render(ON)
    assert [d for d in on if d not in docs] == off


def test_daemonset_pod():
    ds = one(labeller_docs(), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert (
        ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    (c,) = pod["containers"]
    operator = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == operator["image"] and c["command"] == ["python", "-m", "holmes.labeller"]
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]} == {
        "NODE_NAME": "spec.nodeName"
    }
    assert c["volumeMounts"] == [
        {"name": "sys", "mountPath": "/host/sys", "readOnly": True},
        {"name": "route", "mountPath": "/host/route", "readOnly": True},
    ]
    # sysfs, and the host's route table (PID 1's network namespace: the pod has its own)
    assert pod["volumes"] == [
        {"name": "sys", "hostPath": {"path": "/sys", "type": "Directory"}},
        {"name": "route", "hostPath": {"path": "/proc/1/net/route", "type": "File"}},
    ]
    # The args are what the labeller's own parser accepts, with the values given.
    args = parse_args([a.replace("$(NODE_NAME)", "gpu-1") for a in c["args"]])
    assert (
        args.node_name,
        args.sysfs_root,
        args.interval,
        args.socket_ifname,
        args.rails,
        args.route_table,
    ) == (
        "gpu-1",
        "/host/sys",
        300,
        True,
        "",
        "/host/route",
    )
    # Everything but the hostPath is Pod Security "restricted"; reading sysfs needs no privilege.
    psc, sc = pod["securityContext"], c["securityContext"]
    assert (
        psc["runAsNonRoot"] is True
        and psc["runAsUser"] != 0
        and psc["seccompProfile"]["type"] == "RuntimeDefault"
    )
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged")
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    # GPU nodes' usual taint only, not every taint (labeller.tolerations widens it)
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "nodeSelector" not in pod


def test_values_flow_into_the_daemonset(tmp_path):
    vals = tmp_path / "v.yaml"
    vals.write_text(
        yaml.safe_dump(
            {
                "labeller": {
                    "enabled": True,
                    "intervalSeconds": 60,
                    "socketIfname": False,
                    "rails": "mlx5_[0-7], mlx5_1?",
                    "defaultRoute": {"hostPath": ""},
                    "logLevel": "debug",
                    "sysfs": {"hostPath": "/var/lib/fake-sys", "root": "/host/sys/$(NODE_NAME)"},
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "tolerations": [],
                    "extraArgs": ["--no-socket-ifname"],
                    "serviceAccount": {"create": False, "name": "mine"},
                    "priorityClassName": "system-node-critical",
                }
            }
        )
    )
    docs = [
        d
        for d in render(extra=["-f", str(vals)])
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "nic-labeller"
    ]
    assert not by_kind(docs, "ServiceAccount")
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    args = parse_args([a.replace("$(NODE_NAME)", "n") for a in c["args"]])
    assert (
        args.sysfs_root,
        args.interval,
        args.socket_ifname,
        args.log_level,
        args.rails,
        args.route_table,
    ) == (
        "/host/sys/n",
        60,
        False,
        "debug",
        "mlx5_[0-7], mlx5_1?",
        "",
    )
    assert [v["name"] for v in pod["volumes"]] == ["sys"], "no route table mounted"
    assert c["args"].count("--no-socket-ifname") == 2  # from socketIfname: false and from extraArgs
    assert pod["volumes"][0]["hostPath"]["path"] == "/var/lib/fake-sys"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and "tolerations" not in pod
    assert pod["serviceAccountName"] == "mine" and pod["priorityClassName"] == "system-node-critical"
    assert one(docs, "ClusterRoleBinding")["subjects"][0]["name"] == "mine"


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--set", "labeller.intervalSeconds=0"],
            "at '/labeller/intervalSeconds': minimum: got 0, want 1",
        ),
        (
            ["--set", "labeller.sysfs.hostPath=sys"],
            "at '/labeller/sysfs/hostPath': 'sys' does not match pattern",
        ),
        (
            ["--set", "labeller.defaultRoute.hostPath=proc/1/net/route"],
            "at '/labeller/defaultRoute/hostPath': 'proc/1/net/route' does not match pattern",
        ),
        (["--set", "labeller.enable=true"], "at '/labeller': additional properties 'enable' not allowed"),
        (
            ["--set", "labeller.enabled=true", "--set", "labeller.serviceAccount.create=false"],
            "labeller.serviceAccount.name is required",
        ),
    ],
)
def test_wrong_values_fail_clearly(args, message):
    proc = helm("template", "r", str(CHART), *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_values_yaml_documents_every_labeller_key():
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["labeller"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())["labeller"]
    assert set(values) == set(schema["properties"])
    assert set(values["sysfs"]) == set(schema["properties"]["sysfs"]["properties"])
    assert set(values["defaultRoute"]) == set(schema["properties"]["defaultRoute"]["properties"])
