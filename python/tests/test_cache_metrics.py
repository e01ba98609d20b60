"""kvtier.HierarchicalCache.metrics(): Prometheus text that Debian's python3-prometheus-client
parser reads, with SGLang HiCache's metric names (prefixed "kvtier:"), whose values follow real
cache operations (cpu backend, host-memory "device" pool) and whose counters never go down."""

import math

import numpy as np
import pytest

import kvtier
from kvtier import ops

if not hasattr(kvtier, "HierarchicalCache"):
    pytest.skip("kvtier built without the cache manager", allow_module_level=True)
parser = pytest.importorskip("prometheus_client.parser")  # Debian: python3-prometheus-client

L, N, S, P = 2, 64, 32, 4


def make_cache(**kwargs):
    k = np.zeros((L, N, S), np.uint8)
    v = np.zeros((L, N, S), np.uint8)
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, page_size=P, k=k, v=v,
                          name="device_pool")
    config = dict(write_policy="write_through", backup_threads=0)
    config.update(kwargs)
    return kvtier.HierarchicalCache(region, **config)


def scrape(cache):
    """({(sample name, sorted labels): value}, {family name: type}) parsed by prometheus_client."""
    samples, types = {}, {}
    for family in parser.text_string_to_metric_families(cache.metrics()):
        assert family.name not in types, f"family {family.name} twice"
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, f"sample {key} twice"
            samples[key] = s.value
    return samples, types


def value(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_parse_with_sglang_names_and_types():
    cache = make_cache()
    samples, types = scrape(cache)
    # The parser names counter families without "_total" (OpenMetrics); samples keep it.
    expected_types = {
        "kvtier:cached_tokens": "counter",
        "kvtier:hicache_host_used_tokens": "gauge",
        "kvtier:hicache_host_total_tokens": "gauge",
        "kvtier:prefetched_tokens": "counter",
        "kvtier:backuped_tokens": "counter",
        "kvtier:load_back_tokens": "counter",
        "kvtier:load_back_duration_seconds": "histogram",
        "kvtier:evicted_tokens": "counter",
        "kvtier:eviction_duration_seconds": "histogram",
        "kvtier:prefetch_bandwidth": "histogram",
        "kvtier:backup_bandwidth": "histogram",
        "kvtier:storage_errors": "counter",
        "kvtier:storage_corrupt_pages": "counter",
        "kvtier:storage_timeouts": "counter",
        "kvtier:storage_queue_drops": "counter",
    }
    for name, typ in expected_types.items():
        assert types.get(name) == typ, f"{name}: {types.get(name)}"
    for source in ("device", "host", "storage"):
        assert value(samples, "kvtier:cached_tokens_total", cache_source=source) == 0
    for tier in ("device", "host", "storage"):
        assert value(samples, "kvtier:evicted_tokens_total", tier=tier) == 0
    stats = cache.stats()
    for op in ("read", "write"):
        assert value(samples, "kvtier:storage_timeouts_total", op=op) == 0
        assert stats["storage_%s_timeouts" % op] == 0
    assert "storage_timeouts" not in stats
    assert value(samples, "kvtier:hicache_host_total_tokens") == 2 * N  # host_ratio 2
    assert value(samples, "kvtier:load_back_duration_seconds_bucket", le="+Inf") == 0
    # SGLang's buckets: GB/s for the bandwidths, seconds (finer below 1 ms) for evictions.
    for name in ("kvtier:prefetch_bandwidth", "kvtier:backup_bandwidth"):
        assert [float(le) for (n, labels) in samples if n == name + "_bucket"
                for (_, le) in labels] == [0.1, 0.5, 1, 5, 10, 50, 100, math.inf]
        assert value(samples, name + "_count") == 0
    eviction_bounds = [float(le) for (n, labels) in samples
                       if n == "kvtier:eviction_duration_seconds_bucket"
                       for (_, le) in labels if le != "+Inf"]
    assert eviction_bounds == sorted(eviction_bounds)
    assert eviction_bounds[0] <= 1e-5 and 0.001 in eviction_bounds and 1.0 in eviction_bounds
    assert all(math.isfinite(v) for v in samples.values())


def test_metrics_follow_cache_operations_and_counters_only_grow():
    cache = make_cache()
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 50000, size=32).astype(np.int32)
    history = [scrape(cache)[0]]

    def step():
        history.append(scrape(cache)[0])
        return history[-1]

    with cache.match(tokens) as m:  # a miss
        assert m.device_tokens == 0
    slots = cache.allocate_device_slots(32)
    cache.insert(tokens, slots)  # write_through: backed up to host memory
    cache.wait_for_backups()
    s = step()
    assert value(s, "kvtier:match_total") == 1
    assert value(s, "kvtier:match_query_tokens_total") == 32
    assert value(s, "kvtier:host_backup_tokens_total") == 32
    assert value(s, "kvtier:hicache_host_used_tokens") == 32
    assert value(s, "kvtier:device_cached_tokens") == 32

    with cache.match(tokens) as m:  # a device hit
        assert m.device_tokens == 32
    s = step()
    assert value(s, "kvtier:cached_tokens_total", cache_source="device") == 32

    assert cache.evict_device(N) == 32
    s = step()
    assert value(s, "kvtier:evicted_tokens_total", tier="device") == 32
    assert value(s, "kvtier:eviction_duration_seconds_count") == 1
    assert value(s, "kvtier:eviction_duration_seconds_bucket", le="+Inf") == 1
    assert 0 < value(s, "kvtier:eviction_duration_seconds_sum") < 1
    assert value(s, "kvtier:device_cached_tokens") == 0
    assert value(s, "kvtier:hicache_host_used_tokens") == 32  # kept in host memory

    with cache.match(tokens) as m:  # a host hit, loaded back
        assert m.host_tokens == 32
        cache.load_back(m)
    s = step()
    assert value(s, "kvtier:cached_tokens_total", cache_source="host") == 32
    assert value(s, "kvtier:load_back_tokens_total") == 32
    assert value(s, "kvtier:load_back_total") == 1
    assert value(s, "kvtier:load_back_duration_seconds_count") == 1
    assert value(s, "kvtier:load_back_duration_seconds_bucket", le="+Inf") == 1
    assert value(s, "kvtier:load_back_duration_seconds_sum") > 0

    assert cache.evict_device(N) == 32
    assert cache.evict_host(N) == 32
    s = step()
    assert value(s, "kvtier:evicted_tokens_total", tier="host") == 32
    assert value(s, "kvtier:hicache_host_used_tokens") == 0
    assert value(s, "kvtier:tree_nodes") == 0

    # Counters (and histogram buckets) never go down from one scrape to the next.
    _, types = scrape(cache)
    monotonic = [key for key in history[0]
                 if types.get(key[0][:-len("_total")] if key[0].endswith("_total") else None)
                 == "counter" or key[0].endswith(("_bucket", "_count"))]
    assert len(monotonic) > 30
    for before, after in zip(history, history[1:]):
        for key in monotonic:
            assert after[key] >= before[key], key
    cache.check_consistency()


def test_metrics_after_close_raise():
    cache = make_cache()
    cache.close()
    with pytest.raises(kvtier.FailedPreconditionError, match="closed"):
        cache.metrics()
