"""bench/gpu.py's code path on CPU (a tiny model, no MFU) and its refusal without CUDA."""

import json

import pytest
import torch

from tests.helpers.bench.bench_run import run_bench


def test_smoke_run_on_cpu_reports_every_variant(tmp_path):
    out = tmp_path / "gpu.json"
    args = ["--device", "cpu", "--models", "tiny", "--iters", "2", "--warmup", "1"]
    args += ["--variants", "engine,plain", "--out", str(out)]
    p = run_bench("gpu", *args)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert [r["variant"] for r in res["results"]] == ["engine", "plain"]
    assert all(r["tokensPerSecond"] > 0 and r["mfu"] is None for r in res["results"])  # no peak on CPU
    assert "tokens/s" in p.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the bench would run")
def test_without_cuda_it_says_so():
    p = run_bench("gpu", timeout=120)
    assert p.returncode == 2 and "needs a CUDA GPU" in p.stderr and "--device cpu" in p.stderr
