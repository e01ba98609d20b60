"""kvtier as SGLang HiCache's storage backend, driven through SGLang's own classes.

SGLang's ``StorageBackendFactory`` loads ``kvtier.integrations.sglang.KvtierHiCacheStorage`` by
name from the launch line's extra_config (the "dynamic" backend) and registers SGLang's
MHA / MLA host pool with it, as its cache controller does; the tests then call the storage API
the controller calls. Every get lands in a poisoned host pool and every byte is compared with
what was written (read through SGLang's get_page_buffer_meta); bytes outside the pages a get
names must stay poison.

Needs SGLang's source (KVTIER_SGLANG_SRC; sglang_harness says what stands in for what): without
it these tests skip, saying so (CI cannot fetch SGLang). The redis:// cases need redis-server.
"""

import logging
import os
import time

import numpy as np
import pytest

import sglang_harness as harness
from redis_process import RedisUnavailable, local_redis

pytestmark = pytest.mark.skipif(harness.skip_reason() is not None,
                                reason=harness.skip_reason() or "")

POISON = 0xA5


@pytest.fixture(scope="module")
def sgl():
    return harness.load()


@pytest.fixture(scope="module")
def redis_url():
    try:
        with local_redis() as url:
            yield url
    except RedisUnavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{e} and CI=true")
        pytest.skip(str(e))


@pytest.fixture(params=["file", "memory", "redis"])
def url(request, tmp_path):
    if request.param == "file":
        return f"file://{tmp_path}/store?capacity=256MiB"
    if request.param == "memory":
        import hashlib

        name = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
        return f"memory://t{name}?capacity=256MiB"  # shared by the test's backends
    return request.getfixturevalue("redis_url")


def make_backend(sgl, url, mla, layout="page_first", page_size=16, tp=(0, 1), layer_num=4,
                 extra=None, pools=None, metrics=False, model_name="test/model"):
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    dev, host = pools or harness.make_pools(mla, layout, page_size, device_tokens=40 * page_size,
                                            layer_num=layer_num)
    cfg = harness.storage_config(host, mla, harness.kvtier_extra_config(url, **(extra or {})),
                                 tp_rank=tp[0], tp_size=tp[1], metrics=metrics,
                                 model_name=model_name)
    backend = StorageBackendFactory.create_backend("dynamic", cfg, host)
    backend.register_mem_pool_host(host)  # what the cache controller does next
    return backend, host


def keys_for(n, tag):
    import hashlib

    return [hashlib.sha256(f"{tag}/{i}".encode()).hexdigest() for i in range(n)]


def host_indices(host, pages):
    """Token indices of whole host pages (page numbers `pages`), as SGLang hands them."""
    import torch

    p = host.page_size
    return torch.cat([torch.arange(q * p, (q + 1) * p, dtype=torch.int64) for q in pages])


def fill_random(host, seed):
    harness.host_bytes(host)[:] = np.random.default_rng(seed).integers(
        0, 256, harness.host_bytes(host).shape[0], dtype=np.uint8)


def snapshot(host, pages):
    return [harness.page_bytes(host, q * host.page_size) for q in pages]


def poison(host):
    harness.host_bytes(host)[:] = POISON


def assert_pages(host, pages, expected):
    for q, want in zip(pages, expected):
        got = harness.page_bytes(host, q * host.page_size)
        assert got.shape == want.shape
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"page {q}: {bad.size} wrong bytes, first at {bad[0]}"


def assert_only_pages_written(host, pages):
    """Every byte outside `pages` is still poison (no byte landed elsewhere)."""
    mask = np.ones(harness.host_bytes(host).shape[0], dtype=bool)
    base = host.kv_buffer.data_ptr()
    for q in pages:
        import torch

        ptrs, sizes = host.get_page_buffer_meta(
            torch.arange(q * host.page_size, (q + 1) * host.page_size, dtype=torch.int64))
        for p, s in zip(ptrs, sizes):
            mask[int(p) - base:int(p) - base + int(s)] = False
    outside = harness.host_bytes(host)[mask]
    assert (outside == POISON).all(), f"{int((outside != POISON).sum())} bytes written outside"


# ---- loading -------------------------------------------------------------------------------


def test_sglang_factory_loads_kvtier_dynamically(sgl, tmp_path):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

    from kvtier.integrations.sglang import KvtierHiCacheStorage

    backend, host = make_backend(sgl, f"file://{tmp_path}/s", mla=False)
    assert type(backend) is KvtierHiCacheStorage and isinstance(backend, HiCacheStorage)
    assert backend.mem_pool_host is host
    assert backend.store.page_bytes == harness.page_bytes(host, 0).size
    assert backend.store.num_buffers == 2
    backend.close()


def test_bad_extra_config_names_the_field(sgl, tmp_path):
    url = f"file://{tmp_path}/s"
    with pytest.raises(ValueError, match="io_thread"):
        make_backend(sgl, url, mla=False, extra={"io_thread": 4})  # a typo of io_threads
    with pytest.raises(ValueError, match="'url' is required"):
        make_backend(sgl, None, mla=False)
    with pytest.raises(ValueError, match="url"):
        make_backend(sgl, 42, mla=False)
    with pytest.raises(ValueError, match="io_threads"):  # the storage schema's bound
        make_backend(sgl, url, mla=False, extra={"io_threads": 1000})
    with pytest.raises(ValueError, match="model_id"):
        make_backend(sgl, url, mla=False, model_name=None)


# ---- the zero-copy interface ----------------------------------------------------------------

LAYOUTS = [(False, "layer_first"), (False, "page_first"), (False, "page_first_direct"),
           (False, "page_head"), (True, "layer_first"), (True, "page_first"),
           (True, "page_first_direct")]


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("mla,layout", LAYOUTS)
def test_v1_round_trip_every_byte(sgl, url, mla, layout, page_size):
    backend, host = make_backend(sgl, url, mla, layout, page_size)
    n = 12
    keys = keys_for(n, f"{mla}{layout}{page_size}")
    src_pages = list(range(1, 1 + n))
    dst_pages = list(range(3 * n, 3 * n - 2 * n, -2))  # elsewhere, in another order
    fill_random(host, seed=page_size)
    written = snapshot(host, src_pages)
    assert backend.batch_set_v1(keys, host_indices(host, src_pages)) == [True] * n
    assert backend.batch_exists(keys) == n
    assert backend.batch_exists(keys + keys_for(3, "absent")) == n
    for _ in range(2):  # twice: a second get of the same pages is as exact
        poison(host)
        assert backend.batch_get_v1(keys, host_indices(host, dst_pages)) == [True] * n
        assert_pages(host, dst_pages, written)
        assert_only_pages_written(host, dst_pages)
    backend.close()


def test_set_passes_parents_so_the_store_evicts_a_prefix_tail_first(sgl):
    """batch_set_v1 gets consecutive pages of one prefix: each page's parent is the key before it
    (the first one's: the last of extra_info.prefix_keys). A small memory:// store then evicts the
    chain's tail first, and refuses (False) a page whose parent it evicted."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo

    backend, host = make_backend(sgl, "memory://parents?capacity=160KiB", mla=False)  # 4 pages
    fill_random(host, seed=3)
    chain = keys_for(3, "chain")
    assert backend.batch_set_v1(chain, host_indices(host, [0, 1, 2])) == [True] * 3
    for i in range(16):  # unrelated pages (parents unknown) until the store evicts one
        assert backend.batch_set_v1(keys_for(1, f"filler{i}"), host_indices(host, [3])) == [True]
        if backend.kvtier_stats()["evicted_pages"] > 0:
            break
    assert backend.kvtier_stats()["evicted_pages"] == 1
    assert backend.batch_exists(chain) == 2 and not backend.exists(chain[2])  # the tail (LRU: the head)
    after_tail, after_head = keys_for(2, "next")
    assert backend.batch_set_v1([after_tail], host_indices(host, [4]),
                                HiCacheStorageExtraInfo(prefix_keys=list(chain))) == [False]
    assert backend.batch_set_v1([after_head], host_indices(host, [4]),
                                HiCacheStorageExtraInfo(prefix_keys=chain[:2])) == [True]
    backend.close()


def test_missing_pages_are_false_and_exists_stops_at_the_first(sgl, url):
    backend, host = make_backend(sgl, url, mla=False)
    stored = keys_for(6, "stored")
    fill_random(host, seed=7)
    written = snapshot(host, range(6))
    assert all(backend.batch_set_v1(stored, host_indices(host, range(6))))
    absent = keys_for(2, "never")
    keys = [stored[0], stored[1], absent[0], stored[2], absent[1], stored[3]]
    poison(host)
    got = backend.batch_get_v1(keys, host_indices(host, range(10, 16)))
    assert got == [True, True, False, True, False, True]
    assert_pages(host, [10, 11, 13, 15], [written[0], written[1], written[2], written[3]])
    assert backend.batch_exists(keys) == 2
    assert backend.batch_exists(absent) == 0
    assert backend.exists(stored[5]) and not backend.exists(absent[0])


@pytest.mark.parametrize("case", ["unaligned", "past_end", "short", "scattered"])
def test_bad_host_indices_are_false_and_move_nothing(sgl, tmp_path, caplog, case):
    import torch

    backend, host = make_backend(sgl, f"file://{tmp_path}/s", mla=False)
    keys = keys_for(2, "bad")
    fill_random(host, seed=3)
    assert all(backend.batch_set_v1(keys, host_indices(host, [0, 1])))
    p = host.page_size
    idx = {
        "unaligned": torch.arange(1, 1 + 2 * p, dtype=torch.int64),
        "past_end": torch.arange(host.size - p, host.size + p, dtype=torch.int64),
        "short": torch.arange(0, 2 * p - 1, dtype=torch.int64),
        "scattered": torch.cat([torch.arange(0, p), torch.arange(5 * p, 6 * p)])[
            torch.randperm(2 * p, generator=torch.Generator().manual_seed(1))],
    }[case]
    poison(host)
    with caplog.at_level(logging.ERROR):
        assert backend.batch_get_v1(keys, idx) == [False, False]
        assert backend.batch_set_v1(keys, idx) == [False, False]
    assert "host_indices" in caplog.text
    assert (harness.host_bytes(host) == POISON).all()


# ---- the copying interface (SGLang's generic path) ------------------------------------------


def test_copying_interface_reads_what_zero_copy_wrote_and_back(sgl, url):
    backend, host = make_backend(sgl, url, mla=False, layout="page_first")
    p = host.page_size
    keys = keys_for(4, "copying")
    fill_random(host, seed=11)
    written = snapshot(host, range(4))
    assert all(backend.batch_set_v1(keys[:2], host_indices(host, [0, 1])))
    # SGLang's _generic_page_set: flat pages from the host pool
    assert backend.batch_set(keys[2:], [host.get_data_page(q * p) for q in (2, 3)])
    poison(host)
    pages = backend.batch_get(keys, [host.get_dummy_flat_data_page() for _ in keys])
    for q, page in enumerate(pages):  # SGLang's _generic_page_get
        host.set_from_flat_data_page(q * p + 8 * p, page)
    assert_pages(host, [8, 9, 10, 11], written)
    assert backend.get(keys_for(1, "none")[0], host.get_dummy_flat_data_page()) is None
    poison(host)
    assert backend.batch_get_v1(keys, host_indices(host, [4, 5, 6, 7])) == [True] * 4
    assert_pages(host, [4, 5, 6, 7], written)


def test_copying_interface_wrong_tensor_is_a_logged_miss(sgl, tmp_path, caplog):
    import torch

    backend, host = make_backend(sgl, f"file://{tmp_path}/s", mla=True)
    with caplog.at_level(logging.ERROR):
        assert backend.get("a" * 64, torch.zeros(3, dtype=torch.uint8)) is None
        assert backend.set("a" * 64, torch.zeros(3, dtype=torch.uint8)) is False
    assert "page tensor 0" in caplog.text


# ---- tensor parallelism ---------------------------------------------------------------------


def test_mha_ranks_have_their_own_pages(sgl, tmp_path):
    url = f"file://{tmp_path}/tp"
    keys = keys_for(3, "tp")
    w, host = make_backend(sgl, url, mla=False, tp=(0, 2))
    fill_random(host, seed=5)
    written = snapshot(host, range(3))
    assert all(w.batch_set_v1(keys, host_indices(host, range(3))))
    same, h2 = make_backend(sgl, url, mla=False, tp=(0, 2))
    poison(h2)
    assert same.batch_get_v1(keys, host_indices(h2, range(3))) == [True] * 3
    assert_pages(h2, range(3), written)
    for tp in [(1, 2), (0, 1), (0, 4)]:  # another rank's heads, another TP size: clean misses
        other, h3 = make_backend(sgl, url, mla=False, tp=tp)
        assert other.batch_exists(keys) == 0
        assert other.batch_get_v1(keys, host_indices(h3, range(3))) == [False] * 3


def test_mla_one_writer_read_at_any_tp_size(sgl, tmp_path):
    url = f"file://{tmp_path}/mla"
    keys = keys_for(3, "mla")
    other_keys = keys_for(3, "mla-rank1")
    r1, h1 = make_backend(sgl, url, mla=True, tp=(1, 2))
    fill_random(h1, seed=6)
    assert r1.batch_set_v1(other_keys, host_indices(h1, range(3))) == [True] * 3  # not its job
    r0, h0 = make_backend(sgl, url, mla=True, tp=(0, 2))
    fill_random(h0, seed=8)
    written = snapshot(h0, range(3))
    assert all(r0.batch_set_v1(keys, host_indices(h0, range(3))))
    assert r0.batch_exists(other_keys) == 0  # rank 1 wrote nothing
    for tp in [(1, 2), (3, 4), (0, 1)]:
        reader, h = make_backend(sgl, url, mla=True, tp=tp)
        poison(h)
        assert reader.batch_get_v1(keys, host_indices(h, [5, 6, 7])) == [True] * 3
        assert_pages(h, [5, 6, 7], written)


# ---- faults ---------------------------------------------------------------------------------


def test_store_going_down_gives_misses_within_the_timeout(sgl):
    try:
        cm = local_redis()
        url = cm.__enter__()
    except RedisUnavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{e} and CI=true")
        pytest.skip(str(e))
    try:
        backend, host = make_backend(sgl, url, mla=False, extra={"timeout_ms": 2000})
        keys = keys_for(4, "down")
        fill_random(host, seed=9)
        assert all(backend.batch_set_v1(keys, host_indices(host, range(4))))
    finally:
        cm.__exit__(None, None, None)  # the server is gone
    start = time.monotonic()
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, host_indices(host, range(4, 8))) == [False] * 4
    assert backend.batch_set_v1(keys, host_indices(host, range(4))) == [False] * 4
    assert time.monotonic() - start < 60  # three calls, each bounded by timeout_ms and connects


# ---- housekeeping ---------------------------------------------------------------------------


def test_stats_and_clear(sgl, tmp_path):
    url = f"file://{tmp_path}/s"
    backend, host = make_backend(sgl, url, mla=False)
    assert backend.get_stats() is None  # storage metrics off: SGLang's default
    keys = keys_for(2, "stats")
    assert all(backend.batch_set_v1(keys, host_indices(host, [0, 1])))
    assert isinstance(backend.kvtier_stats(), dict)
    # Another writer of the same namespace (another process's pages in the same directory) and
    # another deployment (another model id) sharing the store.
    same, _ = make_backend(sgl, url, mla=False, pools=(None, host))
    theirs = keys_for(2, "same namespace")
    assert all(same.batch_set_v1(theirs, host_indices(host, [2, 3])))
    other, _ = make_backend(sgl, url, mla=False, pools=(None, host), model_name="other/model")
    assert all(other.batch_set_v1(keys, host_indices(host, [0, 1])))
    assert backend.clear() is True
    assert backend.batch_exists(keys) == 0 and backend.batch_exists(theirs) == 0
    assert other.batch_exists(keys) == 2  # another namespace keeps its pages
    assert all(backend.batch_set_v1(keys, host_indices(host, [0, 1])))  # usable after clear
    assert backend.batch_exists(keys) == 2


def test_clear_on_redis_deletes_nothing(sgl, redis_url, caplog):
    backend, host = make_backend(sgl, redis_url, mla=False)
    keys = keys_for(2, "redis clear")
    assert all(backend.batch_set_v1(keys, host_indices(host, [0, 1])))
    with caplog.at_level(logging.WARNING):
        assert backend.clear() is False
    assert "deleted nothing" in caplog.text
    assert backend.batch_exists(keys) == 2


def test_storage_metrics_in_sglang_form(sgl, tmp_path):
    try:
        from sglang.srt.observability.metrics_collector import StorageMetrics
    except Exception as e:  # its import closure needs SGLang's server modules
        pytest.skip(f"sglang.srt.observability.metrics_collector does not import here: {e}")
    backend, host = make_backend(sgl, f"file://{tmp_path}/s", mla=False, metrics=True)
    keys = keys_for(3, "metrics")
    assert all(backend.batch_set_v1(keys, host_indices(host, range(3))))
    assert all(backend.batch_get_v1(keys, host_indices(host, range(3, 6))))
    m = backend.get_stats()
    assert isinstance(m, StorageMetrics)
    assert m.backup_pgs == [3] and m.prefetch_pgs == [3]
    assert len(m.backup_bandwidth) == 1 and m.prefetch_bandwidth[0] > 0
    assert backend.get_stats().prefetch_pgs == []  # since the last call
