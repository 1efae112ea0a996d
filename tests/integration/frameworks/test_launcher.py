"""A real torchrun of a copied launcher (as the init container writes it) whose workers get the hook
(the launcher's pieces in-process: tests/unit/frameworks/test_launcher.py)."""

import json
import os
import subprocess
import sys

from holmes_dev.ports import free_port

from holmes.launch.install import install
from tests.helpers.frameworks.layouts import THREE
from tests.helpers.trainer.fakepod import pod_root

PROGRAM = """
import json, os
import torch.distributed as dist
dist.init_process_group("gloo")
dist.new_group([0, 1])
# one write per line: the two workers share the pod's stdout (print writes text and newline apart)
os.write(1, (json.dumps({"rank": dist.get_rank(), "nccl_net": os.environ.get("NCCL_NET"),
                         "gloo_if": os.environ.get("GLOO_SOCKET_IFNAME")}) + "\\n").encode())
dist.destroy_process_group()
"""


def test_a_copied_launcher_runs_torchrun_with_the_hook_in_every_worker(tmp_path):
    dest = tmp_path / "holmes-launch"
    written = {p.relative_to(dest).as_posix() for p in install(dest)}
    assert {"launch.py", "sitecustomize.py", "fabric.py", "holmes/launch/hook.py"} <= written
    assert not (dest / "holmes" / "__init__.py").exists()  # a namespace: the image's holmes, if any, stays
    (tmp_path / "prog.py").write_text(PROGRAM)
    one_node = dict(THREE, pipeline=1, data=1, stages=[THREE["stages"][0]], nodes=["ib-0"])
    (tmp_path / "layout.json").write_text(json.dumps(one_node))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HOLMES_", "PET_", "RANK"))},
        "NNODES": "1",
        "NPROC_PER_NODE": "2",
        "NODE_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "HOLMES_LAYOUT": str(tmp_path / "layout.json"),
        "NCCL_NET": "Socket",
        # an RDMA node whose sys/ and dev/ are a fake pod's: the resolver and the copied fabric.py read them
        "HOLMES_NIC": "infiniband",
        "HOLMES_FABRIC_ROOT": str(pod_root(tmp_path / "pod")),
    }
    r = subprocess.run(
        [sys.executable, str(dest / "launch.py"), "--", "python", str(tmp_path / "prog.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "removed NCCL_NET=Socket" in r.stderr
    workers = [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"rank"')]
    assert sorted(w["rank"] for w in workers) == [0, 1]
    # gloo's interface resolved in the pod: the one the route to MASTER_ADDR=127.0.0.1 starts from
    assert all(w["nccl_net"] is None and w["gloo_if"] == "lo" for w in workers)
    (net,) = [json.loads(line)["holmesNet"] for line in r.stderr.splitlines() if '"holmesNet"' in line]
    assert net["set"] == {"NCCL_SOCKET_IFNAME": "=lo", "GLOO_SOCKET_IFNAME": "lo", "NCCL_IB_HCA": "=mlx5_0:1"}
    (fab,) = [json.loads(line)["holmesFabric"] for line in r.stderr.splitlines() if '"holmesFabric"' in line]
    assert fab == {"devices": "checked", "problems": []}
    groups = [json.loads(line)["holmesGroup"] for line in r.stderr.splitlines() if '"holmesGroup"' in line]
    assert [(g["ranks"], g["net"], g["backend"]) for g in groups] == [
        ([0, 1], None, "gloo"),  # one node: left to NCCL (NVLink, shared memory)
        ([0, 1], None, "gloo"),
    ]
