"""The container runner's pure rules (localkube.ociconfig): which argv runs, as whom, with which
capabilities, env and OCI config, each as Kubernetes (kubelet + containerd) decides it."""

from __future__ import annotations

import pytest

from localkube.ociconfig import (
    DEFAULT_CAPS,
    DEFAULT_PATH,
    ImageConfig,
    Mount,
    User,
    capabilities,
    home_dir,
    merged_env,
    process_args,
    resolve_user,
    runtime_config,
)
from localkube.podspec import Unsupported, container_command

IMAGE = ImageConfig(id="abc", entrypoint=("python", "-m", "holmes.operator"), cmd=("--all-namespaces",))


@pytest.mark.parametrize(
    "command, args, expected",
    [
        # neither: ENTRYPOINT + CMD
        (None, None, ["python", "-m", "holmes.operator", "--all-namespaces"]),
        ([], [], ["python", "-m", "holmes.operator", "--all-namespaces"]),
        # args only: ENTRYPOINT + args (the image's CMD is replaced)
        (None, ["--help"], ["python", "-m", "holmes.operator", "--help"]),
        # command only: the image's ENTRYPOINT and CMD are both ignored
        (["sh", "-c", "id"], None, ["sh", "-c", "id"]),
        # both: command + args
        (["python"], ["-c", "print(1)"], ["python", "-c", "print(1)"]),
    ],
)
def test_command_and_args_merge_with_the_image_as_kubernetes_does(command, args, expected):
    assert process_args(IMAGE, command, args) == expected


def test_cmd_only_image_and_nothing_to_run():
    trainer = ImageConfig(id="t", cmd=("python", "-m", "holmes.trainer", "--help"))
    assert process_args(trainer, None, None) == ["python", "-m", "holmes.trainer", "--help"]
    assert process_args(trainer, None, ["torchrun"]) == ["torchrun"]
    with pytest.raises(Unsupported, match="no ENTRYPOINT or CMD"):
        process_args(ImageConfig(id="empty"), None, None)


PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\n"
    "holmes:x:65532:65532::/home/holmes:/usr/sbin/nologin\n"
    "web:x:33:33::/:/bin/sh\n"
)
GROUP = "root:x:0:\nholmes:x:65532:\nrdma:x:990:holmes,web\nweb:x:33:\n"


def test_home_is_the_users_passwd_entry_else_root_dir():
    assert home_dir(65532, PASSWD) == "/home/holmes"
    assert home_dir(0, PASSWD) == "/root"
    assert home_dir(1234, PASSWD) == "/"  # a runAsUser without a passwd entry


def test_image_user_numeric_pair_and_its_groups():
    assert resolve_user("65532:65532", None, PASSWD, GROUP, None) == User(65532, 65532, (990,))


def test_image_user_by_name_and_group_name():
    assert resolve_user("web", None, PASSWD, GROUP, None) == User(33, 33, (990,))
    assert resolve_user("web:holmes", None, PASSWD, GROUP, None) == User(33, 65532, (990,))
    with pytest.raises(Unsupported, match="'nobody' is not in its /etc/passwd"):
        resolve_user("nobody", None, PASSWD, GROUP, None)


def test_run_as_user_overrides_image_user_and_takes_the_passwd_group():
    # containerd: runAsUser without runAsGroup looks the uid up; an unknown uid gets gid 0.
    assert resolve_user("65532:65532", {"runAsUser": 33}, PASSWD, GROUP, None).gid == 33
    assert resolve_user("65532:65532", {"runAsUser": 1234}, PASSWD, GROUP, None) == User(1234, 0)
    assert resolve_user("", {"runAsUser": 1234, "runAsGroup": 7}, PASSWD, GROUP, None) == User(1234, 7)


def test_container_security_context_over_the_pods():
    pod = {"runAsUser": 1000, "runAsGroup": 1000, "supplementalGroups": [5], "fsGroup": 2000}
    assert resolve_user("", None, PASSWD, GROUP, pod) == User(1000, 1000, (5, 2000))
    assert resolve_user("", {"runAsUser": 33}, PASSWD, GROUP, pod) == User(33, 1000, (5, 990, 2000))


def test_run_as_non_root_refuses_root_and_unverifiable_users():
    with pytest.raises(Unsupported, match="uid 0"):
        resolve_user("", {"runAsNonRoot": True}, PASSWD, GROUP, None)
    with pytest.raises(Unsupported, match="not numeric"):
        resolve_user("web", None, PASSWD, GROUP, {"runAsNonRoot": True})
    assert resolve_user("web", {"runAsUser": 33}, PASSWD, GROUP, {"runAsNonRoot": True}).uid == 33
    assert resolve_user("65532", {"runAsNonRoot": True}, PASSWD, GROUP, None).uid == 65532


def test_capabilities_drop_then_add():
    assert capabilities(None) == list(DEFAULT_CAPS)
    assert capabilities({"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}) == [
        "CAP_NET_BIND_SERVICE"
    ]
    caps = capabilities({"capabilities": {"drop": ["NET_RAW"], "add": ["IPC_LOCK", "CAP_KILL"]}})
    assert "CAP_NET_RAW" not in caps and caps.count("CAP_KILL") == 1 and caps[-1] == "CAP_IPC_LOCK"


def test_env_image_then_container_wins():
    env = merged_env(("PATH=/opt/holmes/bin:/usr/bin", "LANG=C.UTF-8"), {"LANG": "en", "A": "1"}, "pod-0")
    assert env == ["PATH=/opt/holmes/bin:/usr/bin", "LANG=en", "HOSTNAME=pod-0", "A=1"]
    assert merged_env((), {}, "h")[0] == f"PATH={DEFAULT_PATH}"


def config(**kw):
    args = dict(
        rootfs="/b/rootfs",
        argv=["true"],
        env=[],
        user=User(65532, 65532),
        cwd="",
        hostname="pod-0",
        mounts=[Mount("/v/data", "/data", ro=True), Mount("/v/tmp", "/tmp")],
        netns="/run/netns/pod-0",
    )
    return runtime_config(**{**args, **kw})


def test_runtime_config_root_user_mounts_and_network():
    c = config(security_context={"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False})
    assert c["root"] == {"path": "/b/rootfs", "readonly": True}
    assert c["process"]["user"] == {"uid": 65532, "gid": 65532, "additionalGids": []}
    assert c["process"]["cwd"] == "/" and c["process"]["noNewPrivileges"] is True
    binds = {m["destination"]: m for m in c["mounts"] if m["type"] == "bind"}
    assert binds["/data"]["source"] == "/v/data" and "ro" in binds["/data"]["options"]
    assert "rw" in binds["/tmp"]["options"]
    ns = {n["type"]: n.get("path") for n in c["linux"]["namespaces"]}
    assert ns == {"pid": None, "ipc": None, "uts": None, "mount": None, "network": "/run/netns/pod-0"}

    host = config(netns=None)
    assert "network" not in {n["type"] for n in host["linux"]["namespaces"]}
    assert host["root"]["readonly"] is False and host["process"]["noNewPrivileges"] is False
    sys_mount = next(m for m in host["mounts"] if m["destination"] == "/sys")
    assert sys_mount["type"] == "bind", "with the host's network, /sys must be the host's"


def test_privileged_is_refused():
    with pytest.raises(Unsupported, match="privileged"):
        config(security_context={"privileged": True})


def test_command_and_args_are_expanded_separately_and_left_to_the_image_when_absent():
    env = {"PORT": "29500"}
    c = {"name": "t", "command": ["torchrun", "--port=$(PORT)"], "args": ["$(MISSING)", "$$(PORT)"]}
    assert container_command(c, env) == (["torchrun", "--port=29500"], ["$(MISSING)", "$(PORT)"])
    assert container_command({"name": "t", "args": ["--help"]}, env) == (None, ["--help"])
    assert container_command({"name": "t"}, env) == (None, None)


def test_the_runtime_gives_unlimited_memlock_within_its_own_hard_limit():
    """Issue 50, item 5: the memlock limit RDMA needs is the runtime's (no IPC_LOCK); the node
    agent, as a runtime, gives unlimited, or its own hard limit where it may not raise it."""
    from localkube.ociconfig import RLIM_INFINITY, memlock_rlimit

    assert memlock_rlimit(None) == {"type": "RLIMIT_MEMLOCK", "hard": RLIM_INFINITY, "soft": RLIM_INFINITY}
    assert memlock_rlimit(-1)["hard"] == RLIM_INFINITY  # Python's RLIM_INFINITY
    assert memlock_rlimit(8 << 20) == {"type": "RLIMIT_MEMLOCK", "hard": 8 << 20, "soft": 8 << 20}
    assert config()["process"]["rlimits"] == [memlock_rlimit(None)]
    assert config(memlock_hard=8 << 20)["process"]["rlimits"] == [memlock_rlimit(8 << 20)]
