"""bench/operator_apply.py's client: the connection pool its floor's parallel requests need."""

from __future__ import annotations

import operator_apply  # bench/ is on pytest's pythonpath
import yaml


def test_the_bench_client_has_the_pool_it_asks_for(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    api = operator_apply.api_client(str(kubeconfig))
    # what urllib3 sizes each host's pool by, read when the client was made
    assert api.rest_client.pool_manager.connection_pool_kw["maxsize"] == operator_apply.POOL_SIZE == 32
