"""The operator's pure core: what to do, decided from data. Nothing here talks to the API server,
a trainer or a clock: the I/O modules beside this package read the world into an
``reconcile.Observed``, call ``reconcile.decide`` and write the ``Decision`` back.
``tests/unit/repo/test_import_directions.py`` keeps it so (no kopf, kubernetes, urllib, sockets, ...)."""
