"""Bad input found by trying kvtier as a new user would (issue 14, §5), on host memory (numpy, cpu
backend): each is a ValueError naming the argument, and the destination stays untouched."""

import re

import numpy as np
import pytest

from kvtier import ops
from kvtier.compat import sgl_kernel as kv

L, N, ITEM = 3, 64, 32
rng = np.random.default_rng(77)


def rand(*shape):
    return rng.integers(0, 255, size=shape, dtype=np.uint8)


def per_layer_pair():
    return rand(N, ITEM), rand(N, ITEM)


@pytest.mark.parametrize("bad", [[0.9, 1.7], [True, False], ["a", "b"], [1, None],
                                 np.array([0.9, 1.7]), np.array([True, False])],
                         ids=["floats", "bools", "strings", "none", "float_array", "bool_array"])
def test_index_lists_of_non_integers_are_refused(bad):
    src, dst = per_layer_pair()
    before = dst.copy()
    with pytest.raises(ValueError, match="src_indices"):
        kv.transfer_kv_per_layer_mla(src, dst, bad, [2, 3], ITEM)
    np.testing.assert_array_equal(dst, before)
    s = ops.KvRegion(layout="layer_first", num_layers=1, slot_bytes=ITEM, k=src, mla=True,
                     name="src")
    d = ops.KvRegion(layout="layer_first", num_layers=1, slot_bytes=ITEM, k=dst, mla=True,
                     name="dst")
    with pytest.raises(ValueError, match="dst_indices"):
        ops.transfer_layer(s, d, [2, 3], bad, 0)
    np.testing.assert_array_equal(dst, before)


def test_integers_beyond_int64_name_the_argument():
    huge = 1 << 70
    src, dst = per_layer_pair()
    pf = rand(N, L, ITEM)
    ph = rand(N // 4, 2, 4, L, ITEM // 2)
    s = ops.KvRegion(layout="layer_first", num_layers=1, slot_bytes=ITEM, k=src, mla=True,
                     name="src")
    d = ops.KvRegion(layout="layer_first", num_layers=1, slot_bytes=ITEM, k=dst, mla=True,
                     name="dst")
    cases = [
        (lambda: ops.transfer_layer(s, d, [0], [1], huge), "layer = "),
        (lambda: ops.transfer(s, d, [0], [1], max_sms=huge), "max_sms = "),
        (lambda: ops.transfer(s, d, [0], [1], src_layer=-huge), "src_layer = "),
        (lambda: ops.transfer(s, d, [huge], [1]), "src_indices[0] = "),
        (lambda: kv.transfer_kv_per_layer_mla_pf_lf(pf, dst, [0], [1], huge, ITEM, L * ITEM),
         "layer_id = "),
        (lambda: kv.transfer_kv_per_layer_mla_pf_lf(pf, dst, [0], [1], 0, huge, L * ITEM),
         "item_size = "),
        (lambda: kv.transfer_kv_per_layer_ph_lf(ph, dst, ph, dst, [0], [1], 0, ITEM, L * ITEM, 4,
                                                huge), "head_num = "),
        (lambda: kv.transfer_kv_per_layer_ph_lf(ph, dst, ph, dst, [0], [1], 0, ITEM, L * ITEM,
                                                huge, 2), "page_size = "),
        (lambda: ops.KvRegion(layout="page_head", num_layers=1, slot_bytes=ITEM, k=src, mla=True,
                              head_num=huge), "region.head_num = "),
        (lambda: ops.configure(max_sms=huge), "max_sms = "),
    ]
    before = dst.copy()
    for call, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
    np.testing.assert_array_equal(dst, before)


def test_overlapping_slots_in_one_buffer_are_refused():
    # 64,536 slots copied within one buffer, source and destination overlapping: before, the cpu
    # backend's threads produced a mix of old and new bytes.
    n = 64_536 + 1_000
    pool = rand(n, 16)
    before = pool.copy()
    src = np.arange(0, 64_536)
    dst = np.arange(1_000, 65_536)
    with pytest.raises(ValueError, match=r"dst_indices\[\d+\] = \d+ is also read"):
        kv.transfer_kv_per_layer_mla(pool, pool, src, dst, 16)
    np.testing.assert_array_equal(pool, before)
    # Disjoint slots of one buffer are copied.
    kv.transfer_kv_per_layer_mla(pool, pool, np.arange(0, 100), np.arange(500, 600), 16)
    before[500:600] = before[0:100]
    np.testing.assert_array_equal(pool, before)


def test_transfer_kv_direct_checks_every_group_before_copying():
    # Two groups (different row sizes); the second group's destination index is out of range.
    src = [rand(N, ITEM), rand(N, 2 * ITEM)]
    dst = [rand(N, ITEM), rand(N // 2, 2 * ITEM)]
    before = [d.copy() for d in dst]
    with pytest.raises(ValueError, match=r"dst_indices\[1\] = 40 is out of range"):
        kv.transfer_kv_direct(src, dst, [0, 1], [3, 40], 1)
    for d, b in zip(dst, before):
        np.testing.assert_array_equal(d, b)


def test_destination_made_read_only_after_the_region_is_refused():
    src, dst = per_layer_pair()
    s = ops.KvRegion(layout="layer_first", num_layers=1, slot_bytes=ITEM, k=src, mla=True,
                     name="src")
    d = ops.KvRegion(layout="layer_first", num_layers=1, slot_bytes=ITEM, k=dst, mla=True,
                     name="dst")
    ops.transfer_layer(s, d, [0], [1], 0)
    dst.flags.writeable = False
    before = dst.copy()
    with pytest.raises(ValueError, match=r"dst buffer dst\.k is read-only"):
        ops.transfer_layer(s, d, [2], [3], 0)
    np.testing.assert_array_equal(dst, before)
    dst.flags.writeable = True
    ops.transfer_layer(s, d, [2], [3], 0)
    assert (dst[3] == src[2]).all()


def test_read_only_direct_destination():
    pool = [rand(N // 4, L, 4, ITEM)]
    layers = [rand(N, ITEM) for _ in range(L)]
    pool[0].flags.writeable = False
    with pytest.raises(ValueError, match=r"dst buffer dst_ptrs\[0\] is read-only"):
        kv.transfer_kv_all_layer_direct_lf_pf(layers, pool, [0, 1, 2, 3], [4, 5, 6, 7], 4)
