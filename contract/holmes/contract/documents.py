"""Reading YAML and JSON documents fast: manifests, node lists (a 15,000-node
``kubectl get nodes -o json`` dump is ~100 MB) and cost-model files.

JSON is parsed by the standard library's C parser; YAML by libyaml's C loader when PyYAML was
built with it (``yaml.CSafeLoader``), else by PyYAML's pure-Python safe loader (same result,
~30x slower). A file whose first non-blank character opens a JSON object or array is tried as
JSON first; YAML is a superset, so a JSON file that fails to parse as JSON gets YAML's error.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DocumentError(ValueError):
    """A file or text that is not readable YAML/JSON; the message names the source and why."""


def parse_documents(text: str, source: str) -> list[Any]:
    """The non-empty documents of a YAML stream (or the one value of a JSON text)."""
    head = text.lstrip()[:1]
    if head in ("{", "["):
        try:
            return [json.loads(text)]
        except ValueError:
            pass  # YAML flow style, or broken: YAML says why
    try:
        return [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as e:
        raise DocumentError(f"{source} is not valid YAML: {e}") from None


def read_text(path: str, source: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise DocumentError(f"cannot read {source} {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise DocumentError(f"{source} {path} is not UTF-8 text: {e}") from None


def load_documents(path: str, source: str = "file") -> list[Any]:
    """The documents of the YAML or JSON file at ``path``; DocumentError if there are none."""
    docs = parse_documents(read_text(path, source), f"{source} {path}")
    if not docs:
        raise DocumentError(f"{source} {path} is empty")
    return docs
