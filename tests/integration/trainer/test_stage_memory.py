"""Building a stage costs about its own parameters in host memory (meta-device construction,
per-parameter init), measured in a fresh process like bench/stage_memory.py."""

from stage_memory import measure


def test_building_a_stage_adds_at_most_1_3x_its_fp32_parameter_bytes():
    # the first stage of a small GPT: embedding (the largest parameter) + 4 of 8 layers, ~80M params.
    # Peak RSS moves by about 1% between runs of the same code (1.23-1.25x measured on 2026-11-24,
    # once 1.252x in a full suite run): the bound is above that noise and far below a second copy
    # of the stage (2x), which is what this test is for.
    # Less what building a tiny stage adds (torch's own lazily allocated state: ~75 MB with the CPU
    # wheel, about twice that with a CUDA build of torch, whose ratio read 1.47 without this).
    shape = dict(layers=8, hidden=1024, heads=16, seq=512, vocab=32000, stage_layers=4, first=True)
    fixed = measure(**{**shape, "hidden": 64, "vocab": 320})["added_bytes"]
    r = measure(**shape)
    assert r["params"] > 50_000_000
    assert (r["added_bytes"] - fixed) / r["param_bytes"] <= 1.3, (fixed, r)


def test_tensor_parallelism_2_halves_a_ranks_parameter_memory():
    # measured (the peak RSS each build added, fresh processes), not computed from the shapes;
    # less what building a tiny stage adds (torch's own lazily allocated state, ~75 MB)
    shape = dict(layers=8, hidden=1024, heads=16, seq=512, vocab=32000, stage_layers=4, first=True)
    fixed = measure(**{**shape, "hidden": 64, "vocab": 320})["added_bytes"]
    whole, half = measure(**shape), measure(**shape, tensor=2)
    ratio = (half["added_bytes"] - fixed) / (whole["added_bytes"] - fixed)
    assert 0.45 <= ratio <= 0.65, (fixed, whole, half)
