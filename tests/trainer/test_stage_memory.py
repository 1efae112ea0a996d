"""Building a stage costs about its own parameters in host memory (meta-device construction,
per-parameter init), measured in a fresh process like bench/stage_memory.py."""

from stage_memory import measure


def test_building_a_stage_adds_at_most_1_25x_its_fp32_parameter_bytes():
    # the first stage of a small GPT: embedding (the largest parameter) + 4 of 8 layers, ~80M params
    r = measure(layers=8, hidden=1024, heads=16, seq=512, vocab=32000, stage_layers=4, first=True)
    assert r["params"] > 50_000_000
    assert r["ratio"] <= 1.25, r
