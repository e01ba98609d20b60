"""kvtier.integrations.transformers says which transformers it supports: where transformers (or
torch) is missing, importing it raises ImportError naming the versions it needs. (The integration
itself runs in examples/transformers_prefix_cache.py, from python/run_gpu_tests.sh.)"""

import importlib.util

import pytest


@pytest.mark.skipif(importlib.util.find_spec("transformers") is not None
                    and importlib.util.find_spec("torch") is not None,
                    reason="transformers is installed: the example exercises the integration")
def test_import_without_transformers_names_the_supported_versions():
    with pytest.raises(ImportError, match=r"transformers >= 4\.56 .*tested with 5\.x"):
        import kvtier.integrations.transformers  # noqa: F401
