"""The project's release version: the one version the three distributions (their
pyproject.toml), the chart (version, appVersion), the images' labels and the CRD carry
(tests/unit/repo/test_release_version.py checks they agree; CHANGELOG.md says what each
release changed). Kept here so that code can name it (the CRD's label, the operator's
holmes_build_info) without reading package metadata, which an editable install leaves stale."""

from __future__ import annotations

RELEASE = "0.1.0"
