"""The launcher in a pod: its environment, torchrun's arguments and the device checks, in-process (a
real torchrun of a copied launcher: tests/integration/frameworks/test_launcher.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from holmes_dev.ports import free_port

from holmes.launch import __main__ as launcher
from holmes.launch import hook
from holmes.launch.install import install
from tests.helpers.frameworks.layouts import THREE
from tests.helpers.trainer.fakepod import pod_root


def test_worker_env_drops_nccl_net_and_puts_the_launcher_first():
    env, notes = launcher.worker_env({"NCCL_NET": "IB", "PYTHONPATH": "/app"}, Path("/holmes-launch"))
    assert "NCCL_NET" not in env and "NCCL_NET=IB" in notes[0]
    assert env["PYTHONPATH"] == "/holmes-launch:/app"
    env, notes = launcher.worker_env({"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "eth0"}, Path("/x"))
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and not notes  # socket names: podnet's (test_podnet.py)


@pytest.mark.parametrize(
    "argv, program",
    [
        (["python", "-u", "pretrain_gpt.py", "--x", "1"], ["pretrain_gpt.py", "--x", "1"]),
        (["/usr/bin/python3.12", "-m", "torchtitan.train", "--a"], ["-m", "torchtitan.train", "--a"]),
        (["./train.sh", "a"], ["--no-python", "./train.sh", "a"]),
    ],
)
def test_program_args(argv, program):
    assert launcher.program_args(argv) == program


def test_torchrun_gets_the_layouts_static_node_rank():
    env = {"NNODES": "6", "NPROC_PER_NODE": "2", "NODE_RANK": "4", "MASTER_ADDR": "m", "MASTER_PORT": "1"}
    argv = launcher.torchrun_argv(env, ["x.py"])
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert "--node-rank=4" in argv and "--rdzv-backend=static" in argv and argv[-1] == "x.py"
    with pytest.raises(launcher.LaunchError, match="NODE_RANK not set"):
        launcher.torchrun_argv({k: v for k, v in env.items() if k != "NODE_RANK"}, ["x.py"])


def layout_file(tmp_path):
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(THREE))
    return str(path)


def test_device_checks_on_an_ib_node(tmp_path):
    base = {"HOLMES_LAYOUT": layout_file(tmp_path), "HOLMES_NIC": "infiniband", "NODE_RANK": "0"}
    good = pod_root(tmp_path / "good")
    found = launcher.device_check({**base, "HOLMES_FABRIC_ROOT": str(good), "NCCL_IB_HCA": "mlx5_0"})
    assert found == {"devices": "checked", "problems": []}
    bad = pod_root(tmp_path / "bad", uverbs=False)
    found = launcher.device_check({**base, "HOLMES_FABRIC_ROOT": str(bad)})
    assert any("uverbs" in p for p in found["problems"])
    with pytest.raises(launcher.LaunchError, match="fabric check failed on node rank 0.*uverbs") as e:
        launcher.device_check({**base, "HOLMES_FABRIC_ROOT": str(bad), "HOLMES_FABRIC_CHECK": "fail"})
    assert e.value.code == 3
    # an Ethernet node, a node of the mixed stage, or fabricCheck: off: nothing to check
    assert launcher.device_check({**base, "HOLMES_NIC": "ethernet", "HOLMES_FABRIC_ROOT": str(bad)}) is None
    assert launcher.device_check({**base, "NODE_RANK": "5", "HOLMES_FABRIC_ROOT": str(bad)}) is None
    assert (
        launcher.device_check({**base, "HOLMES_FABRIC_CHECK": "off", "HOLMES_FABRIC_ROOT": str(bad)}) is None
    )


def test_a_host_interface_name_in_the_template_stops_the_pod_before_any_worker(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "NNODES": "2",
        "NPROC_PER_NODE": "1",
        "NODE_RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "HOLMES_NET_HOOK": "off",
        "GLOO_SOCKET_IFNAME": "eno12399np0",  # the host's name, as the operator used to copy it
    }
    # a process of its own: a launcher that let it through would exec torchrun and wait for rank 0
    r = subprocess.run(
        [sys.executable, "-m", "holmes.launch", "--", "python", "train.py"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert (
        "holmes.launch: GLOO_SOCKET_IFNAME=eno12399np0 (set in the pod template) names eno12399np0"
        in r.stderr
    )


def test_an_unsupported_torch_stops_the_pod_before_any_worker(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "__version__", "2.12.0+cu126")
    with pytest.raises(launcher.LaunchError, match="torch 2.12.0\\+cu126 is not supported") as e:
        launcher.check_hook({})
    assert e.value.code == 2
    launcher.check_hook({"HOLMES_NET_HOOK": "off"})  # the documented way to run without it


def test_nccl_net_in_nccl_conf_or_torchcomms_stop_the_pod_before_any_worker(tmp_path, monkeypatch):
    etc = tmp_path / "nccl.conf"
    etc.write_text("NCCL_NET=IB\n")
    with pytest.raises(launcher.LaunchError, match=f"NCCL_NET=IB in {etc} would override") as e:
        launcher.check_hook({}, home=tmp_path, etc=etc)
    assert e.value.code == 2
    etc.write_text("NCCL_SOCKET_NTHREADS=4\n")
    env = {"HOLMES_LAYOUT": layout_file(tmp_path)}
    assert launcher.check_hook(env, home=tmp_path, etc=etc) is None
    monkeypatch.setattr(hook, "torchcomms_enabled", lambda: True)
    with pytest.raises(launcher.LaunchError, match="TorchComms is on") as e:
        launcher.check_hook(env, home=tmp_path, etc=etc)
    assert e.value.code == 2


def test_the_images_own_sitecustomize_still_runs(tmp_path):
    dest = tmp_path / "holmes-launch"
    install(dest)
    image = tmp_path / "image-site"
    image.mkdir()
    (image / "sitecustomize.py").write_text("print('image sitecustomize ran')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "PYTHONPATH")}
    env["PYTHONPATH"] = f"{dest}{os.pathsep}{image}"
    show = "import sitecustomize; print(sitecustomize.__file__)"
    r = subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "image sitecustomize ran",
        str(dest / "sitecustomize.py"),
    ]  # ours, then theirs
