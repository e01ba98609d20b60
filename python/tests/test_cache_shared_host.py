"""kvtier.HierarchicalCache(shared_host=NAME): two caches on one shared host segment (made with
`kvtier shm create`); the second gets host hits for what the first computed, loads them back
byte-exact and copies nothing again; argument errors. Needs the kvtier CLI (KVTIER_CLI, set by
ctest); skipped without it."""

import os
import subprocess

import numpy as np
import pytest

import kvtier
from kvtier import ops

if not hasattr(kvtier, "HierarchicalCache"):
    pytest.skip("kvtier built without the cache manager", allow_module_level=True)
CLI = os.environ.get("KVTIER_CLI", "")
if not CLI or not os.path.exists(CLI):
    pytest.skip("KVTIER_CLI (the kvtier binary, to create a segment) is not set",
                allow_module_level=True)

L, N, S, P = 2, 64, 32, 4


@pytest.fixture
def segment():
    name = "kvtier-pytest-%d" % os.getpid()
    subprocess.run([CLI, "shm", "create", name, "--layers", str(L), "--slot-bytes", str(S),
                    "--page-size", str(P), "--pages", "64"], check=True, stdout=subprocess.DEVNULL)
    yield name
    subprocess.run([CLI, "shm", "destroy", name], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def make_cache(**kwargs):
    k = np.zeros((L, N, S), np.uint8)
    v = np.zeros((L, N, S), np.uint8)
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, page_size=P, k=k, v=v,
                          name="device_pool")
    config = dict(write_policy="write_through", backup_threads=0,
                  host_capacity_bytes=32 * P * L * S * 2)
    config.update(kwargs)
    return kvtier.HierarchicalCache(region, **config), k, v


def test_second_cache_gets_host_hits_from_the_segment(segment):
    first, k1, v1 = make_cache(shared_host=segment)
    second, k2, v2 = make_cache(shared_host=segment)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 50000, size=24).astype(np.int32)
    slots = np.asarray(first.allocate_device_slots(len(tokens)))
    kv_k = rng.integers(0, 256, size=(L, 24, S), dtype=np.uint8)
    kv_v = rng.integers(0, 256, size=(L, 24, S), dtype=np.uint8)
    k1[:, slots], v1[:, slots] = kv_k, kv_v  # the first cache's prefill
    first.insert(tokens, slots)
    first.wait_for_backups()
    assert first.stats()["backup_tokens"] == 24

    with second.match(tokens) as m:
        assert m.device_tokens == 0 and m.host_tokens == 24
        loaded = second.load_back(m)
        assert loaded.loaded_tokens == 24
        new_slots = np.asarray(loaded.device_slots)
        np.testing.assert_array_equal(k2[:, new_slots], kv_k)
        np.testing.assert_array_equal(v2[:, new_slots], kv_v)
        second.insert(tokens, new_slots)
    second.wait_for_backups()
    stats = second.stats()
    assert stats["shared_host_hit_tokens"] == 24
    assert stats["backup_tokens"] == 0  # nothing copied again


def test_shared_host_arguments(segment):
    with pytest.raises(ValueError, match="shared_host"):
        make_cache(shared_host=7)
    with pytest.raises(ValueError, match="shared_host"):
        make_cache(shared_host="")
    with pytest.raises(ValueError, match="shared_host and storage"):
        make_cache(shared_host=segment, storage="memory://")
    with pytest.raises(LookupError):
        make_cache(shared_host=segment + "-missing")
    with pytest.raises(ValueError, match="slot_bytes"):  # the segment's pages do not fit
        k = np.zeros((L, N, 2 * S), np.uint8)
        region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=2 * S, page_size=P,
                              k=k, v=k.copy(), name="device_pool")
        kvtier.HierarchicalCache(region, shared_host=segment)
