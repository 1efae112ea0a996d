"""Helpers that tests/, bench/ and hack/'s demos share: free ports, HolmesJob manifests, forked
gloo ranks and following a job to its end. One copy of each, so a change to the spec or to how
ranks start is made once.

Importable as ``holmes_dev`` with hack/ on ``sys.path``: pytest puts it there (pyproject.toml,
``pythonpath``), bench scripts and the demos add it themselves, as they do for ``localkube``.
Not part of the holmes package: nothing under operator/, trainer/ or contract/ imports it.
Only ``gloo`` needs torch; the other modules need the standard library alone.
"""
