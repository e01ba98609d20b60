"""kvtier.HierarchicalCache settings come from the C++ HierarchicalCacheConfig: every field is
settable by name, defaults are the C++ struct's, and a value just outside each bound is refused
by Python (naming the field) and by the C++ Validate alike (so the table cannot drift from it)."""

import numpy as np
import pytest

import kvtier
from kvtier import _kvtier, ops

L, N, S, P = 2, 64, 16, 4
INT64_MAX = 2**63 - 1


def region():
    k = np.zeros((L, N, S), dtype=np.uint8)
    v = np.zeros((L, N, S), dtype=np.uint8)
    return ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, page_size=P, k=k, v=v)


FIELDS = kvtier.HierarchicalCache.config_fields()


def test_the_table_covers_the_settings_the_issue_names():
    names = {f["name"] for f in FIELDS}
    for name in ("max_backup_batch_pages", "max_prefetch_batch_pages", "storage_io_threads",
                 "storage_max_queued_batches", "storage_max_batch_pages", "dma_lanes",
                 "cpu_parallel_threshold_bytes", "write_through_threshold", "prefetch_policy"):
        assert name in names
    by_name = {f["name"]: f for f in FIELDS}
    assert by_name["write_through_threshold"]["min"] == 1  # C++ refuses 0
    assert by_name["max_backup_batch_pages"]["default"] == 256
    assert by_name["storage_timeout_ms"]["default"] == 2000
    assert by_name["write_policy"]["default"] == "write_through_selective"


@pytest.mark.parametrize("field", FIELDS, ids=[f["name"] for f in FIELDS])
def test_every_default_is_accepted(field):
    value = field["default"]
    if field["name"] == "storage" or field["name"] == "transfer_backend":
        value = {"storage": None, "transfer_backend": "cpu"}[field["name"]]
    with kvtier.HierarchicalCache(region(), **{field["name"]: value}) as cache:
        assert cache.page_size == P


def outside(field):
    lo, hi = field["min"], field["max"]
    values = []
    if field["kind"] == "int":
        values.append(lo - 1)
        if hi < INT64_MAX and hi < 2**31 - 1:
            values.append(hi + 1)
    else:
        values.append(lo if field["min_exclusive"] else lo - 0.5)
        values.append(hi * 1.5 + 1)
    return values


NUMERIC = [f for f in FIELDS if f["kind"] in ("int", "float")]


@pytest.mark.parametrize("field", NUMERIC, ids=[f["name"] for f in NUMERIC])
def test_values_outside_the_bounds_are_refused_by_python_and_by_cpp(field):
    name = field["name"]
    for value in outside(field):
        with pytest.raises(ValueError, match=name):
            kvtier.HierarchicalCache(region(), storage="memory://", **{name: value})
        # The C++ Validate, without the Python check: a storage tier so that its fields count.
        r = region()
        config = {"transfer_backend": "cpu", "storage": "memory://", name: value}
        with pytest.raises(ValueError):
            _kvtier._HierarchicalCache(r, r._native, config, "")


def test_unknown_settings_and_wrong_types_name_the_argument():
    with pytest.raises(ValueError, match="'max_backup_pages' is not a HierarchicalCache setting"):
        kvtier.HierarchicalCache(region(), max_backup_pages=3)
    with pytest.raises(ValueError, match="host_huge_pages = 1 must be True or False"):
        kvtier.HierarchicalCache(region(), host_huge_pages=1)
    with pytest.raises(ValueError, match="write_policy = 'sometimes' is not one of"):
        kvtier.HierarchicalCache(region(), write_policy="sometimes")
    r = region()
    with pytest.raises(ValueError, match=r"cpu_threads = 1099511627776 must be in \[0, 1024\]"):
        _kvtier._HierarchicalCache(r, r._native, {"cpu_threads": 2**40}, "")
    with pytest.raises(ValueError, match="'bogus' is not a HierarchicalCache setting"):
        _kvtier._HierarchicalCache(r, r._native, {"bogus": 1}, "")


@pytest.mark.parametrize("queue_pages,stored", [(4096, 4 * P), (0, 0)])
def test_settings_reach_the_cache(queue_pages, stored):
    with kvtier.HierarchicalCache(region(), storage="memory://", write_policy="write_through",
                                  max_backup_queue_pages=queue_pages) as cache:
        tokens = list(range(4 * P))
        slots = cache.allocate_device_slots(len(tokens))
        cache.insert(tokens, slots)
        cache.wait_for_backups()
        # A queue of 0 pages skips every storage backup (counted); the default stores them.
        assert cache.stats()["storage_backup_tokens"] == stored
        assert cache.stats()["storage_backup_dropped_tokens"] == 4 * P - stored


FLOATS = [f for f in FIELDS if f["kind"] == "float"]


@pytest.mark.parametrize("field", FLOATS, ids=[f["name"] for f in FLOATS])
def test_float_settings_refuse_text(field):
    # float("2") and float(b"1") parse text: a setting given as text is refused by name (issue 36).
    for value in ("2", b"1", "nan"):
        with pytest.raises(ValueError, match=field["name"]):
            kvtier.HierarchicalCache(region(), storage="memory://", **{field["name"]: value})
