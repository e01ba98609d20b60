"""kvtier.HierarchicalCache over a host-memory "device" pool (cpu backend): a request's life
(match, allocate, insert with backup, device eviction, host hit, load back) with the KV bytes
checked, and the argument checks. Skipped when kvtier was built without the cache manager."""

import numpy as np
import pytest

import kvtier
from kvtier import ops

if not hasattr(kvtier, "HierarchicalCache"):
    pytest.skip("kvtier built without the cache manager", allow_module_level=True)

L, N, S, P = 2, 64, 32, 4


def make_cache(**kwargs):
    k = np.zeros((L, N, S), np.uint8)
    v = np.zeros((L, N, S), np.uint8)
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, page_size=P, k=k, v=v,
                          name="device_pool")
    config = dict(write_policy="write_through", backup_threads=0)
    config.update(kwargs)
    return kvtier.HierarchicalCache(region, **config), k, v


@pytest.mark.parametrize("host_layout", ["page_first", "page_first_direct", "layer_first"])
def test_request_life_with_host_hit(host_layout):
    cache, k, v = make_cache(host_layout=host_layout)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50000, size=32).astype(np.int32)
    with cache.match(tokens) as m:
        assert m.device_tokens == 0 and m.host_tokens == 0
    # Slot lists are torch tensors when torch is imported (the GPU test modules import it), else
    # numpy arrays; np.asarray serves both.
    slots = np.asarray(cache.allocate_device_slots(len(tokens)))
    assert len(slots) == 32
    kv_k = rng.integers(0, 256, size=(L, 32, S), dtype=np.uint8)
    kv_v = rng.integers(0, 256, size=(L, 32, S), dtype=np.uint8)
    k[:, slots], v[:, slots] = kv_k, kv_v  # the "prefill"
    result = cache.insert(tokens, slots)
    assert result["new_tokens"] == 32
    cache.wait_for_backups()
    assert cache.stats()["backup_tokens"] == 32

    with cache.match(tokens.tolist()) as m:  # a device hit
        assert m.device_tokens == 32
        np.testing.assert_array_equal(np.sort(np.asarray(m.device_slots)), np.sort(slots))
    assert cache.evict_device(N) >= 32
    k[:], v[:] = 0, 0  # the evicted slots get reused by others

    with cache.match(tokens) as m:  # now a host hit
        assert m.device_tokens == 0 and m.host_tokens == 32
        loaded = cache.load_back(m)
        assert loaded.loaded_tokens == 32 and len(loaded.device_slots) == 32
        new_slots = np.asarray(loaded.device_slots)
        for layer in range(L):
            cache.wait_layer(m, layer)  # cpu: returns at once
        np.testing.assert_array_equal(k[:, new_slots], kv_k)
        np.testing.assert_array_equal(v[:, new_slots], kv_v)
    stats = cache.stats()
    assert stats["live_handles"] == 0 and stats["load_back_tokens"] == 32
    assert stats["host_hit_tokens"] == 32
    cache.check_consistency()
    cache.close()
    with pytest.raises(kvtier.FailedPreconditionError, match="closed"):
        cache.stats()


def test_namespaces_are_isolated_and_partial_prefixes_match():
    cache, k, v = make_cache()
    tokens = list(range(1000, 1016))
    slots = cache.allocate_device_slots(16)
    cache.insert(tokens, slots, namespace="tenant-a")
    with cache.match(tokens, namespace="tenant-b") as m:
        assert m.device_tokens == 0
    with cache.match(tokens[:10] + [7, 7, 7, 7, 7, 7], namespace="tenant-a") as m:
        assert m.device_tokens == 8  # whole pages only
    cache.check_consistency()


def test_bad_arguments_name_the_argument():
    cache, _, _ = make_cache()
    cases = [
        (lambda: cache.match([1.5, 2.0]), "tokens"),
        (lambda: cache.match(np.zeros((2, 2), np.int32)), "tokens must be 1-D"),
        (lambda: cache.match(np.array([2**40])), "tokens has values outside int32"),
        (lambda: cache.match(None), "tokens is None"),
        (lambda: cache.allocate_device_slots(-1), "num_tokens"),
        (lambda: cache.insert(list(range(8)), list(range(4))), "device_slots"),
        (lambda: cache.release(12345), "handle"),
        (lambda: cache.wait_layer(0, -1), "layer = -1"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    with pytest.raises(ValueError, match="device_region must be a kvtier.ops.KvRegion"):
        kvtier.HierarchicalCache("pool")
    with pytest.raises(ValueError, match="write_policy|write policy"):
        make_cache(write_policy="sometimes")
    with pytest.raises(ValueError, match="max_sms_to_host"):
        make_cache(max_sms_to_host=-1)
    make_cache(max_sms_to_host=0)  # 0 = max_sms
    with pytest.raises(ValueError, match="max_sms_beside_backup"):
        make_cache(max_sms_beside_backup=-1)
    make_cache(max_sms_beside_backup=0)  # 0 = off
    m = cache.match([1, 2, 3, 4])
    cache.release(m)
    with pytest.raises(ValueError):
        cache.release(m.handle)  # already released
    m.release()  # a no-op after cache.release(m)


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_no_host_tier(write_policy):
    """host_capacity_bytes = 0 and host_ratio = 0: device evictions forget, nothing is backed up,
    the host gauges read 0; a storage tier without a host tier is refused naming both."""
    cache, k, v = make_cache(host_ratio=0, write_policy=write_policy)
    assert cache.host_geometry["num_slots"] == 0
    tokens = list(range(2000, 2032))
    slots = np.asarray(cache.allocate_device_slots(32))
    kv_k = np.random.default_rng(1).integers(0, 256, size=(L, 32, S), dtype=np.uint8)
    k[:, slots] = kv_k
    cache.insert(tokens, slots)
    cache.wait_for_backups()
    with cache.match(tokens) as m:
        assert m.device_tokens == 32 and m.host_tokens == 0
        np.testing.assert_array_equal(k[:, np.asarray(m.device_slots)], kv_k)
    assert cache.evict_device(N) == 32
    assert cache.evict_host(N) == 0
    with cache.match(tokens) as m:
        assert m.device_tokens == 0 and m.host_tokens == 0 and m.storage_tokens == 0
        assert cache.load_back(m).loaded_tokens == 0
    stats = cache.stats()
    assert stats["host_total_tokens"] == 0 and stats["host_used_tokens"] == 0
    assert stats["backup_tokens"] == 0 and stats["dropped_tokens"] == 32
    assert "kvtier:hicache_host_total_tokens 0\n" in cache.metrics()
    cache.check_consistency()
    cache.close()
    with pytest.raises(ValueError, match="storage.*host tier.*host_ratio"):
        make_cache(host_ratio=0, storage="memory://")
    with pytest.raises(ValueError, match="host_ratio"):
        make_cache(host_ratio=-1.0)


def test_out_of_memory_is_a_memory_error():
    cache, _, _ = make_cache()
    held = cache.allocate_device_slots(N)  # the engine holds every page: nothing to evict
    assert len(held) == N
    with pytest.raises(MemoryError):
        cache.allocate_device_slots(P)
    cache.free_device_slots(held)
    assert len(cache.allocate_device_slots(P)) == P
