"""DeepSpeed patched by the launcher's hook when a worker process of its own imports it (the mesh
and the partition in-process: tests/unit/frameworks/test_real_frameworks.py)."""

import os
import subprocess
import sys

import pytest

from holmes.contract import Layout
from holmes.launch import stages
from tests.helpers.frameworks.framework_helpers import job, launched


@pytest.fixture(scope="module")
def layout() -> Layout:
    """The planner's three-stage layout on the default topology (6 nodes x 2 GPUs, tensor 2)."""
    _, d = launched(job("torchtitan", ["python", "-m", "torchtitan.train"]))
    out = Layout.from_json(d.configmap["data"]["layout.json"])
    assert out.pipeline == 3 and len({s.num_layers for s in out.stages}) > 1  # uneven stages
    return out


def test_deepspeed_is_patched_when_the_worker_imports_it(tmp_path, layout):
    path = tmp_path / "layout.json"
    path.write_text(layout.to_json())
    code = (
        "from holmes.launch import stages; import sys\n"
        "assert stages.install_from_env()\n"
        "import deepspeed.runtime.pipe.module as m\n"
        "print(getattr(m.PipelineModule._partition_layers, '__holmes_hook__', False))\n"
    )
    env = {**os.environ, "HOLMES_FRAMEWORK": "deepspeed", "HOLMES_LAYOUT": str(path)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("True"), r.stderr[-2000:]
    assert not stages.install_from_env({"HOLMES_FRAMEWORK": "megatron", "HOLMES_LAYOUT": str(path)})
