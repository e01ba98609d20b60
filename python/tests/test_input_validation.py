"""Values Python callers could pass that were accepted although they cannot work: each is now a
ValueError naming the argument (issue 28 item 4).

  - kvtier.page_keys with floats (a pybind TypeError before), a set, a dict, bytes or a str;
  - token lists that are sets, dicts or bytes (bytes were reinterpreted as raw int32 values);
  - a storage URL with a NUL byte (the C++ side saw the path cut at the NUL);
  - storage_timeout_ms past 10 minutes (10**13 and 2**63-1 made every call time out at once).
"""

import mmap
import os
import tempfile

import numpy as np
import pytest

import kvtier
from kvtier import ops


@pytest.mark.parametrize("tokens", [[1.0] * 4, {1, 2, 3, 4}, {1: 0, 2: 0, 3: 0, 4: 0},
                                    b"\x01\x00\x00\x00" * 4, "abcd", [1, 2, 3, True], 7, None])
def test_page_keys_refuses_what_is_not_a_token_list(tokens):
    with pytest.raises(ValueError, match="tokens"):
        kvtier.page_keys(tokens, 4)


def test_page_keys_takes_every_ordered_integer_sequence():
    want = kvtier.page_keys([1, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(want) == 2
    assert kvtier.page_keys((1, 2, 3, 4, 5, 6, 7, 8), 4) == want
    assert kvtier.page_keys(range(1, 9), 4) == want
    assert kvtier.page_keys(np.arange(1, 9, dtype=np.int64), 4) == want
    assert kvtier.page_keys(np.arange(1, 9, dtype=np.uint32), 4) == want
    with pytest.raises(ValueError):
        kvtier.page_keys([-1, 2, 3, 4], 4)


if hasattr(kvtier, "HierarchicalCache"):
    L, N, S, P = 2, 64, 32, 4

    def make_cache(**kwargs):
        k = np.zeros((L, N, S), np.uint8)
        v = np.zeros((L, N, S), np.uint8)
        region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, page_size=P,
                              k=k, v=v, name="device_pool")
        return kvtier.HierarchicalCache(region, **kwargs)

    @pytest.mark.parametrize("tokens", [{1, 2, 3, 4}, {1: 2, 3: 4, 5: 6, 7: 8},
                                        b"\x01\x00\x00\x00" * 8, "abcdefgh", [1.5] * 4])
    def test_cache_refuses_unordered_or_raw_token_lists(tokens):
        cache = make_cache()
        with pytest.raises(ValueError, match="tokens"):
            cache.match(tokens)

    def test_storage_url_with_nul_byte_is_refused():
        with tempfile.TemporaryDirectory() as tmp:
            store = os.path.join(tmp, "store")
            with pytest.raises(ValueError, match="NUL"):
                make_cache(storage="file://" + store + "\0/../elsewhere",
                           storage_model_id="m")
            assert not os.path.exists(store)

    @pytest.mark.parametrize("ms", [10**13, 2**63 - 1, 600_001])
    def test_storage_timeout_is_bounded(ms):
        with pytest.raises(ValueError, match="timeout"):
            make_cache(storage="memory://", storage_model_id="m", storage_timeout_ms=ms)

    def test_storage_timeout_at_the_bound_works():
        cache = make_cache(storage="memory://", storage_model_id="m", storage_timeout_ms=600_000)
        assert cache.has_storage


if hasattr(kvtier, "HierarchicalCache"):
    @pytest.mark.parametrize("kind", ["bytes", "read-only mmap"])
    def test_a_read_only_device_region_is_refused(kind):
        # load_back writes into the region: read-only memory was accepted and the first
        # load-back crashed (issue 36 item 7.2).
        n = L * N * S
        if kind == "bytes":
            k = np.frombuffer(bytes(n), np.uint8).reshape(L, N, S)
        else:
            mm = mmap.mmap(-1, n, prot=mmap.PROT_READ)
            k = np.frombuffer(mm, np.uint8).reshape(L, N, S)
        v = np.zeros((L, N, S), np.uint8)
        region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, page_size=P,
                              k=k, v=v, name="device_pool")
        with pytest.raises(ValueError, match="read-only"):
            kvtier.HierarchicalCache(region)


def test_a_host_pointer_table_index_past_its_memory_is_refused():
    # Each entry of a pointer table into pageable host memory is bounded by the mappings that
    # hold it: an index far past them is a ValueError, not a crash (issue 36 item 7.4).
    from kvtier.compat import sgl_kernel as kv
    rows, item = 64, 64
    page = mmap.PAGESIZE
    guard = mmap.mmap(-1, 3 * page)  # the middle page alone stays readable and writable
    base = np.frombuffer(guard, np.uint8)
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    addr = base.ctypes.data
    assert libc.mprotect(addr, page, 0) == 0 and libc.mprotect(addr + 2 * page, page, 0) == 0
    src = np.zeros((rows, item), np.uint8)
    dst_table = np.array([addr + page], dtype=np.uint64)
    src_table = np.array([src.ctypes.data], dtype=np.uint64)
    si = np.array([0], dtype=np.int64)
    with pytest.raises(ValueError):
        kv.transfer_kv_all_layer_mla(src_table, dst_table, si, np.array([10**6], np.int64),
                                     item, 1)
    # Within the page: copied.
    src[3] = 7
    kv.transfer_kv_all_layer_mla(src_table, dst_table, np.array([3], np.int64),
                                 np.array([2], np.int64), item, 1)
    assert (base[page + 2 * item:page + 3 * item] == 7).all()
    assert libc.mprotect(addr, 3 * page, 3) == 0
