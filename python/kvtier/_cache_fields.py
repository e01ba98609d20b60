"""The HierarchicalCache's settings, read from the C++ HierarchicalCacheConfig schema.

One table for every Python class that takes the cache's settings: kvtier.HierarchicalCache (the
leader of a TP group included) and kvtier.TpFollower (every rank passes the same settings). Its
own module so that cache.py and tp.py both read it without importing each other the wrong way
(cache.py uses tp.py's TpGroup; tp.py needs nothing of cache.py but this table).
"""

from __future__ import annotations

from . import _kvtier

# [{name, kind, default, min, max, min_exclusive, choices, help}], as cache_config_fields().
CONFIG_FIELDS = tuple(_kvtier.cache_config_fields())
FIELDS_BY_NAME = {f["name"]: f for f in CONFIG_FIELDS}
