"""One declaration per field (holmes.contract.schema): the reader and the CRD's schema both follow
it, so a field added to the spec needs nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import pytest
import yaml
from crdgen.render import crd, render

from holmes.contract.jobspec import JobSpec, SpecError
from holmes.contract.schema import INVALID, Field, Reader, object_schema


@dataclass(frozen=True)
class Route:
    subnet: Annotated[str, Field("Destination subnet.")]


@dataclass(frozen=True)
class Toy:
    """What a new section of the spec looks like: each field written once."""

    gid_index: Annotated[int, Field("RoCE GID index.", minimum=0, maximum=255)]
    traffic_class: Annotated[int | None, Field("IB traffic class.", minimum=0, nullable=True)] = None
    mode: Annotated[str, Field("How routes are chosen.", enum=("auto", "static"))] = "auto"
    weight: Annotated[float, Field("Share.", minimum=0, exclusive_minimum=True, server_default=False)] = 1.0
    routes: Annotated[tuple[Route, ...], Field("Static routes.", min_items=1)] = ()
    extra: Annotated[Route, Field("A nested object.")] = field(default_factory=lambda: Route("x"))


def read(v):
    r = Reader()
    return r.object(Toy, v, "spec.toy"), r.problems


def test_the_reader_follows_the_declaration():
    toy, problems = read({"gidIndex": 3, "routes": [{"subnet": "10.0.0.0/8"}]})
    assert not problems and toy == Toy(gid_index=3, routes=(Route("10.0.0.0/8"),))
    assert toy.mode == "auto" and toy.weight == 1.0  # the dataclass defaults
    toy, problems = read(
        {"gidIndex": 256, "mode": "dynamic", "weight": 0, "routes": [], "trafficClass": "5", "typo": 1}
    )
    assert toy is INVALID
    assert problems == [
        "spec.toy: unknown field typo (known: gidIndex, trafficClass, mode, weight, routes, extra); "
        "remove or fix the spelling",
        "spec.toy.gidIndex: must be an integer from 0 to 255, got 256",
        "spec.toy.trafficClass: must be an integer >= 0, got '5' (a string: remove the quotes)",
        "spec.toy.mode: must be one of auto, static, got 'dynamic'",
        "spec.toy.weight: must be a positive number, got 0",
        "spec.toy.routes: must be a non-empty list of {subnet}, got a list",
    ]
    _, problems = read({"routes": [{"subnet": ""}]})
    assert problems == [
        "spec.toy.gidIndex: required field is missing",
        "spec.toy.routes[0].subnet: must be a non-empty string, got ''",
    ]


def test_the_crd_schema_follows_the_declaration():
    s = object_schema(Toy)
    assert s["required"] == ["gidIndex"]
    p = s["properties"]
    assert p["gidIndex"] == {
        "type": "integer",
        "minimum": 0,
        "maximum": 255,
        "description": "RoCE GID index.",
    }
    assert p["trafficClass"]["nullable"] is True and "default" not in p["trafficClass"]
    assert p["mode"] == {
        "type": "string",
        "enum": ["auto", "static"],
        "default": "auto",
        "description": "How routes are chosen.",
    }
    assert p["weight"] == {"type": "number", "exclusiveMinimum": True, "minimum": 0, "description": "Share."}
    assert p["routes"]["minItems"] == 1 and p["routes"]["items"]["required"] == ["subnet"]
    assert p["routes"]["items"]["properties"]["subnet"]["minLength"] == 1  # the reader refuses ""
    assert p["extra"]["default"] == {} and p["extra"]["type"] == "object"


def test_the_rendered_crd_reads_back_as_the_declarations():
    text = render()
    assert yaml.safe_load(text) == crd()
    assert max(len(line) for line in text.splitlines()) <= 100


def test_a_data_path_of_null_is_refused():
    """It used to parse as neither synthetic nor a file (path None), which the trainer cannot read."""
    spec = {
        "model": {"layers": 2, "hiddenSize": 8, "attentionHeads": 2, "seqLength": 4, "vocabSize": 16},
        "training": {"globalBatchSize": 4, "microBatchSize": 1, "iterations": 1, "learningRate": 0.1},
        "nodes": {"count": 1, "gpusPerNode": 1},
    }
    JobSpec.from_spec(spec)
    spec["training"]["data"] = {"path": None}
    with pytest.raises(SpecError, match=r"spec.training.data.path: must be a non-empty string, got null"):
        JobSpec.from_spec(spec)
