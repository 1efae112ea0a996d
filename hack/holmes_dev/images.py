"""What goes into the project's container images: their names, the files the Dockerfile's build
context sends (.dockerignore applied), the Debian packages its RUN steps install, the Python
requirements, and one digest over all of it that hack/build-images.sh keys its cache on.

Standard library only: build-images.sh runs it with the host's python3, before any venv exists.

    python -m holmes_dev.images digest          # sha256 of Dockerfile, .dockerignore, context
    python -m holmes_dev.images apt-packages    # what the Dockerfile's `apt-get install`s name
    python -m holmes_dev.images requirements    # the distributions' dependencies
    python -m holmes_dev.images ref operator    # localhost/holmes-operator:<version>
    python -m holmes_dev.images names           # BASE_REF=... and the label keys, for the shell
    python -m holmes_dev.images test-ref frameworks          # localhost/holmes-test-frameworks:<version>
    python -m holmes_dev.images framework-requirements       # the test extra's framework pins

Test images (``TEST_IMAGES``) are fixtures of the tests, not the product's: each a Containerfile
under tests/images/ on top of a project image, built by its own make target (never by ``make
images`` or ``make test``). Real nodes (hack/localkube/realnode.py) get the project's images and
whichever test images the local containers storage holds.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import sys
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
TARGETS = ("operator", "trainer")
BASE_REF = "localhost/holmes-base:bookworm"
# Image labels holding the cache keys, read back to decide whether a build is needed.
INPUTS_LABEL = "dev.holmes.inputs"
RECIPE_LABEL = "dev.holmes.base-recipe"


# The tests' own images: name -> the Containerfile that builds it.
TEST_IMAGES = {"frameworks": "tests/images/frameworks.Containerfile"}
# What the frameworks image adds to the trainer image: the external frameworks the launcher's
# tests run (spec.framework), at the pins of the root pyproject's test extra.
FRAMEWORKS = ("megatron-core", "torchtitan", "deepspeed")


def version(repo: Path = REPO) -> str:
    return tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"]


def image_ref(target: str, repo: Path = REPO) -> str:
    """The local name of one Dockerfile target; the chart's default repository names with the
    chart's appVersion (the package version), under the local containers storage's localhost/."""
    if target not in TARGETS:
        raise ValueError(f"target {target!r}: the Dockerfile's image targets are {', '.join(TARGETS)}")
    return f"localhost/holmes-{target}:{version(repo)}"


def test_image_ref(name: str, repo: Path = REPO) -> str:
    """The local name of one of the tests' images (``TEST_IMAGES``)."""
    if name not in TEST_IMAGES:
        raise ValueError(f"test image {name!r}: the tests' images are {', '.join(TEST_IMAGES)}")
    return f"localhost/holmes-test-{name}:{version(repo)}"


def framework_requirements(repo: Path = REPO) -> list[str]:
    """The root pyproject's test-extra requirements of ``FRAMEWORKS``, as written there (the pins
    the unit tier runs them at), so the image runs what the venv does."""
    extra = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    found = {re.split(r"[\s<>=!~;\[(@]", r, maxsplit=1)[0].lower(): r for r in extra}
    missing = [f for f in FRAMEWORKS if f not in found]
    if missing:
        raise ValueError(
            f"pyproject.toml's test extra names no {', '.join(missing)}: the frameworks image needs each"
        )
    return [found[f] for f in FRAMEWORKS]


# ---- .dockerignore ------------------------------------------------------------------------------
Rule = tuple["re.Pattern[str]", bool, str]  # (regex, negated, pattern as written)


def dockerignore_rules(text: str) -> list[Rule]:
    rules: list[Rule] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        pat = line[1:] if neg else line
        rx = ""
        i = 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx += "(?:.*/)?"
                i += 3
            elif pat.startswith("**", i):
                rx += ".*"
                i += 2
            elif pat[i] == "*":
                rx += "[^/]*"
                i += 1
            elif pat[i] == "?":
                rx += "[^/]"
                i += 1
            else:
                rx += re.escape(pat[i])
                i += 1
        rules.append((re.compile(rx.rstrip("/") + "(?:/.*)?$"), neg, pat))
    return rules


def excluded(rel: str, rules: list[Rule]) -> bool:
    """Docker's .dockerignore semantics: the last matching rule wins, '!' re-includes, a pattern
    matching a parent directory matches everything below it."""
    out = False
    for rx, neg, _ in rules:
        if rx.match(rel):
            out = not neg
    return out


def _may_reinclude_below(rel_dir: str, rules: list[Rule]) -> bool:
    """Whether a '!' rule could match something under an excluded directory (then it is walked)."""
    for _, neg, pat in rules:
        if not neg:
            continue
        literal = re.split(r"[*?\[]", pat, maxsplit=1)[0]
        if literal.startswith(rel_dir + "/") or (rel_dir + "/").startswith(literal):
            return True
    return False


def context_files(repo: Path = REPO) -> list[str]:
    """Paths (relative, sorted) of the files `docker build .` sends, as .dockerignore decides."""
    rules = dockerignore_rules((repo / ".dockerignore").read_text())
    out: list[str] = []
    for root, dirs, files in os.walk(repo):
        rel_root = os.path.relpath(root, repo)
        rel_root = "" if rel_root == "." else rel_root + "/"
        dirs[:] = [
            d
            for d in dirs
            if not (excluded(rel_root + d, rules) and not _may_reinclude_below(rel_root + d, rules))
        ]
        out += [rel_root + f for f in files if not excluded(rel_root + f, rules)]
    return sorted(out)


def digest(repo: Path = REPO) -> str:
    """sha256 over the Dockerfile, .dockerignore and every file of the build context: path,
    executable bit and content (other mode bits vary with a clone's umask; COPY keeps them but
    nothing here reads them)."""
    h = hashlib.sha256()
    for rel in ["Dockerfile", ".dockerignore", *context_files(repo)]:
        p = repo / rel
        h.update(rel.encode() + b"\0")
        h.update(b"x" if os.access(p, os.X_OK) else b"-")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


# ---- what the Dockerfile installs ---------------------------------------------------------------
def apt_packages(dockerfile: str) -> list[str]:
    """Package names of every `apt-get install` in the Dockerfile's RUN instructions, in order,
    once each (options such as -y and --no-install-recommends left out)."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    out: list[str] = []
    for line in joined.splitlines():
        if not line.lstrip().upper().startswith("RUN "):
            continue
        for command in re.split(r"&&|\|\||;", line.strip()[4:]):
            words = shlex.split(command)
            if words[:2] != ["apt-get", "install"]:
                continue
            out += [w for w in words[2:] if not w.startswith("-") and w not in out]
    return out


def distributions(repo: Path = REPO) -> dict[str, dict]:
    """The product's distributions: folder -> its pyproject's [project] table, for every folder
    with a pyproject.toml of its own (as `make venv` finds them)."""
    return {
        p.parent.name: tomllib.loads(p.read_text())["project"] for p in sorted(repo.glob("*/pyproject.toml"))
    }


def requirements(repo: Path = REPO) -> list[str]:
    """What the images' venvs install from the wheelhouse: every distribution's dependencies,
    once each, less the distributions themselves (the Dockerfile builds their wheels)."""
    dists = distributions(repo)
    ours = {d["name"].lower() for d in dists.values()}
    out: list[str] = []
    for project in dists.values():
        for req in project.get("dependencies", []):
            name = re.split(r"[\s<>=!~;\[(@]", req, maxsplit=1)[0].lower().replace("_", "-")
            if name not in ours and req not in out:
                out.append(req)
    return out


def main(argv: list[str]) -> int:
    usage = (
        "usage: python -m holmes_dev.images digest | apt-packages | requirements | ref TARGET | names"
        " | test-ref NAME | framework-requirements"
    )
    if argv == ["names"]:
        print(f"BASE_REF={BASE_REF}\nRECIPE_LABEL={RECIPE_LABEL}\nINPUTS_LABEL={INPUTS_LABEL}")
    elif argv == ["digest"]:
        print(digest())
    elif argv == ["apt-packages"]:
        print("\n".join(apt_packages((REPO / "Dockerfile").read_text())))
    elif argv == ["requirements"]:
        print("\n".join(requirements()))
    elif len(argv) == 2 and argv[0] in ("ref", "test-ref"):
        try:
            print(image_ref(argv[1]) if argv[0] == "ref" else test_image_ref(argv[1]))
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
    elif argv == ["framework-requirements"]:
        print("\n".join(framework_requirements()))
    else:
        print(usage, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
