"""No input crashes anything: seeded mutations of the example HolmesJobs through the contract's
``load_job``, ``holmes plan --job`` (the CLI's own entry, in process) and the operator's first
decision on an empty namespace (``holmes.operator.preview.children``). Every case is accepted
or refused with a message naming the field; a TypeError, AttributeError or traceback fails.

The mutations are what a hand-edited manifest gets wrong: a value of another type or out of
range, a field removed, an unknown field, a value moved from elsewhere in the manifest. The
seed is fixed, so a failure names the case that reproduces it (``mutate(seed_doc, rng)``)."""

from __future__ import annotations

import dataclasses
import io
import math
import random
import re
import signal
import time
import traceback
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from holmes.cli import main as cli_main
from holmes.contract import SpecError, load_job
from holmes.contract.documents import load_documents
from holmes.operator.preview import PreviewError, children
from tests.helpers.contract.spec_mutations import ROOT, mutate, seeds

NODES = ROOT / "examples/nodes/paper.yaml"
CASES = 4000
# The CLI and the operator plan every job they accept (milliseconds each): to stay within
# seconds, they see every OPERATOR_EVERY-th / CLI_EVERY-th case the contract accepted, and every
# REFUSED_EVERY-th refused one (refused cases must be refused there too, by name).
OPERATOR_EVERY, CLI_EVERY, REFUSED_EVERY = 2, 4, 20
CASE_SECONDS = 5  # one case through all three entries; far more than any example job needs

# A problem line starts with the field it is about (spec.x.y, apiVersion, kind, the manifest).
NAMES_A_FIELD = re.compile(r"^(spec\b|apiVersion\b|kind\b|HolmesJob manifest\b)")


def integers(value: Any) -> Iterator[int]:
    """The integers a read spec holds in its declared fields (the pod template, a mapping kept
    as given, is not read field by field)."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            yield from integers(getattr(value, f.name))
    elif isinstance(value, tuple):
        for v in value:
            yield from integers(v)
    elif isinstance(value, int) and not isinstance(value, bool):
        yield value


def check_load(doc: dict) -> bool:
    """True when accepted; a refusal must be a SpecError whose every line names a field. An
    accepted spec holds only integers the API server holds (int64)."""
    try:
        job = load_job(doc)
    except SpecError as e:
        assert e.problems, "a SpecError with no problem line"
        unnamed = [p for p in e.problems if not NAMES_A_FIELD.match(p)]
        assert not unnamed, f"problem lines that name no field: {unnamed}"
        return False
    beyond = [i for i in integers(job) if not -(2**63) <= i < 2**63]
    assert not beyond, f"accepted integers beyond int64: {beyond}"
    return True


def check_cli(doc: dict, tmp: Path) -> None:
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli_main(["plan", "--nodes", str(NODES), "--job", str(job), "--json"])
    assert code in (0, 2), f"holmes plan exited {code}: {err.getvalue()[-2000:]}"
    assert "Traceback" not in err.getvalue()
    if code == 2:
        assert err.getvalue().startswith("holmes plan: "), err.getvalue()


def check_operator(doc: dict, nodes: list[dict]) -> None:
    try:
        children(doc, nodes)
    except PreviewError as e:
        assert str(e), "an empty refusal"


class Stalled(Exception):
    pass


def _stalled(signum: int, frame: Any) -> None:
    raise Stalled(f"more than {CASE_SECONDS} s")


def test_mutated_jobs_are_accepted_or_refused_by_name(tmp_path: Path) -> None:
    rng = random.Random(39)
    base = seeds()
    nodes = load_documents(str(NODES))[0]["items"]
    crashes: list[str] = []
    accepted = 0
    previous = signal.signal(signal.SIGALRM, _stalled)
    started = time.perf_counter()
    try:
        for case in range(CASES):
            doc = mutate(rng.choice(base), rng)
            signal.alarm(CASE_SECONDS)  # a spec that stalls the planner is a failure too
            try:
                ok = check_load(doc)
                accepted += ok
                every = (OPERATOR_EVERY, CLI_EVERY) if ok else (REFUSED_EVERY, REFUSED_EVERY)
                if case % every[0] == 0:
                    check_operator(doc, nodes)
                if case % every[1] == 0:
                    check_cli(doc, tmp_path)
            except Exception as e:  # collect them all: one run shows every kind of crash
                where = traceback.extract_tb(e.__traceback__)[-1]
                at = f"{Path(where.filename).name}:{where.lineno}"
                crashes.append(f"case {case}: {type(e).__name__} at {at}: {str(e)[:300]}")
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    print(
        f"{CASES} cases, {accepted} accepted, {len(crashes)} crashed, {time.perf_counter() - started:.1f} s"
    )
    assert not crashes, f"{len(crashes)} of {CASES} cases crashed:\n" + "\n".join(crashes[:80])
    # the mutations must leave some jobs valid, or the CLI and operator paths go unexercised
    assert accepted > CASES // 20, accepted


def megatron(**container: Any) -> dict:
    doc = next(d for d in seeds() if (d.get("spec") or {}).get("framework") == "megatron")
    c = doc["spec"]["template"]["spec"]["containers"][0]
    c.update(container)
    return doc


@pytest.mark.parametrize(
    "doc, field",
    [  # what the fuzz found crashing load_job (framework checks) and the planner (socket threads)
        (megatron(args=5), "spec.template.spec.containers[0].args: must be a list of strings"),
        (megatron(command="python x.py"), "spec.template.spec.containers[0].command: must be a list"),
        (megatron(env=[{"name": "NCCL_SOCKET_NTHREADS", "value": 4}]), "containers[0].env[0].value"),
        (megatron(env={"A": "1"}), "spec.template.spec.containers[0].env: must be a list"),
        (megatron(resources={"requests": {"cpu": math.inf}}), "containers[0].resources.requests.cpu"),
    ],
)
def test_templates_of_the_wrong_shape_are_refused_by_name(doc: dict, field: str) -> None:
    with pytest.raises(SpecError) as e:
        load_job(doc)
    assert any(field in p for p in e.value.problems), e.value.problems
