"""kvtier.HierarchicalCache.create_shared_host / destroy_shared_host: a segment made from Python
(no kvtier CLI) serves two caches — the second gets host hits for what the first computed and
loads them back byte-exact; creating it twice, removing it twice and bad arguments are clear
errors. Also the token lists the cache reads in C++ (int32 range, no floats)."""

import os

import numpy as np
import pytest

import kvtier
from kvtier import ops

if not hasattr(kvtier, "HierarchicalCache"):
    pytest.skip("kvtier built without the cache manager", allow_module_level=True)

HC = kvtier.HierarchicalCache
L, N, S, P = 2, 64, 32, 4


@pytest.fixture
def segment():
    name = "kvtier-pytest-api-%d" % os.getpid()
    info = HC.create_shared_host(name, num_layers=L, slot_bytes=S, page_size=P, pages=32)
    yield name, info
    try:
        HC.destroy_shared_host(name)
    except kvtier.NotFoundError:
        pass


def make_cache(segment_name):
    k = np.zeros((L, N, S), np.uint8)
    v = np.zeros((L, N, S), np.uint8)
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, page_size=P, k=k, v=v)
    cache = HC(region, shared_host=segment_name, write_policy="write_through", backup_threads=0,
               host_capacity_bytes=16 * P * L * S * 2)
    return cache, k, v


def test_segment_made_from_python_serves_a_second_cache(segment):
    name, info = segment
    assert info["num_pages"] == 32 and info["page_bytes"] == P * L * S * 2
    assert os.path.exists(info["path"])
    first, k1, v1 = make_cache(name)
    second, k2, v2 = make_cache(name)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 50000, size=16).tolist()
    slots = np.asarray(first.allocate_device_slots(16))
    k1[:, slots] = rng.integers(0, 256, size=(L, 16, S), dtype=np.uint8)
    v1[:, slots] = rng.integers(0, 256, size=(L, 16, S), dtype=np.uint8)
    first.insert(tokens, slots)
    first.wait_for_backups()
    with second.match(tokens) as m:
        assert m.device_tokens == 0 and m.host_tokens == 16
        got = np.asarray(second.load_back(m).device_slots)
        assert np.array_equal(k2[:, got], k1[:, slots]) and np.array_equal(v2[:, got], v1[:, slots])
    first.close()
    second.close()


def test_segment_errors(segment):
    name, _ = segment
    with pytest.raises(kvtier.FailedPreconditionError):
        HC.create_shared_host(name, num_layers=L, slot_bytes=S, page_size=P, pages=8)
    HC.destroy_shared_host(name)
    with pytest.raises(kvtier.NotFoundError):
        HC.destroy_shared_host(name)
    for kwargs, pattern in [(dict(pages=0), "pages"), (dict(page_size=3), "page_size"),
                            (dict(num_layers=0), "num_layers"), (dict(layout="rows"), "layout")]:
        args = dict(num_layers=L, slot_bytes=S, page_size=P, pages=8)
        args.update(kwargs)
        with pytest.raises(ValueError, match=pattern):
            HC.create_shared_host(name, **args)
    with pytest.raises(ValueError, match="name"):
        HC.create_shared_host("", num_layers=L, slot_bytes=S, page_size=P, pages=8)


def test_token_lists_are_read_in_one_pass_and_checked():
    k = np.zeros((L, N, S), np.uint8)
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, page_size=P, k=k,
                          v=k.copy())
    cache = HC(region)
    tokens = list(range(100, 108))
    slots = cache.allocate_device_slots(8)
    cache.insert(tokens, slots)
    for same in (tokens, tuple(tokens), np.array(tokens, dtype=np.int32), range(100, 108)):
        with cache.match(same) as m:
            assert m.device_tokens == 8
    for bad, pattern in [([1, 2, 2**31, 4], r"tokens\[2\] is outside the int32 range"),
                         ([1, 2, -2**31 - 1, 4], r"tokens\[2\] is outside the int32 range"),
                         ([1, 2, 3.0, 4], r"tokens\[2\] is a float"),
                         ([1, True, 3, 4], r"tokens\[1\] is a bool")]:
        with pytest.raises(ValueError, match=pattern):
            cache.match(bad)
    assert cache.match([2**31 - 1, -2**31, 0, 1]).device_tokens == 0
    cache.close()
