"""kvtier as SGLang HiCache's storage tier: ``kvtier.integrations.sglang.KvtierHiCacheStorage``.

SGLang loads it by name (docs/sglang.md has the launch flags and every extra_config field)::

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
    '{"backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
      "class_name": "KvtierHiCacheStorage", "interface_v1": 1, "url": "file:///mnt/kv"}'

The parts: ``config`` (extra_config's fields, checked; no SGLang import), ``pages`` (a host
pool's page addresses; no SGLang import) and ``storage`` (the ``HiCacheStorage`` subclass,
which imports SGLang). ``KvtierHiCacheStorage`` is imported on first use, so the SGLang-free parts
work where SGLang is not installed.
"""

__all__ = ["KvtierHiCacheStorage"]


def __getattr__(name):
    if name == "KvtierHiCacheStorage":
        from .storage import KvtierHiCacheStorage

        return KvtierHiCacheStorage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
