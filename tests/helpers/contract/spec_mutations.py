"""Seeded mutations of the example HolmesJobs, as a hand-edited manifest gets them wrong: a value
of another type or out of range, a field removed, an unknown field, a value moved from elsewhere
in the manifest (the fuzz test's cases, tests/unit/contract/test_spec_fuzz.py, and the CRD rules'
tests/unit/contract/test_crd_rules.py)."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

from holmes.contract.documents import load_documents

ROOT = Path(__file__).resolve().parents[3]
SEEDS = sorted([*ROOT.glob("examples/holmesjob-*.yaml"), *ROOT.glob("examples/jobs/*.yaml")])

ODD: list[Any] = [
    None,
    0,
    -1,
    1,
    5,
    2**31,
    2**63,
    10**30,
    0.5,
    -2.5,
    math.nan,
    math.inf,
    True,
    False,
    "",
    "x",
    "5",
    "auto",
    "off",
    [],
    [5],
    ["x"],
    [None],
    [{"name": 5}],
    [[1]],
    {},
    {"name": 5},
    {"x": {"y": 1}},
]


def paths(doc: Any, at: tuple = ()) -> list[tuple]:
    """Every path into the manifest (keys and list indices), the root's spec first."""
    out = [at]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += paths(v, (*at, i))
    return out


def get(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def mutate(doc: dict, rng: random.Random) -> dict:
    """One to three mutations of a copy of ``doc``."""
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        all_paths = [p for p in paths(doc) if p and p[0] == "spec"]  # apiVersion/kind: a few only
        if not all_paths:  # the spec itself was removed
            break
        path = rng.choice(all_paths) if rng.random() < 0.97 else (rng.choice(["apiVersion", "kind"]),)
        parent, key = get(doc, path[:-1]), path[-1]
        op = rng.random()
        if op < 0.55:
            parent[key] = copy.deepcopy(rng.choice(ODD))
        elif op < 0.7 and isinstance(parent, dict):
            del parent[key]
        elif op < 0.8:
            parent[key] = copy.deepcopy(get(doc, rng.choice(all_paths)))  # a value from elsewhere
        elif op < 0.9 and isinstance(parent[key], dict):
            parent[key][rng.choice(["extra", "Layers", "count"])] = copy.deepcopy(rng.choice(ODD))
        elif isinstance(parent[key], list):
            parent[key].append(copy.deepcopy(rng.choice(ODD)))
        elif isinstance(parent[key], int) and not isinstance(parent[key], bool):
            parent[key] = rng.choice([parent[key] * 10**6, -parent[key], parent[key] + 1])
        else:
            parent[key] = str(parent[key])
    return doc


def seeds() -> list[dict]:
    out = []
    for path in SEEDS:
        (doc,) = [
            d for d in load_documents(str(path)) if isinstance(d, dict) and d.get("kind") == "HolmesJob"
        ]
        out.append(doc)
    return out
