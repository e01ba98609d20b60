"""kvtier.ops on the cpu backend over numpy arrays: every layout pair, MHA and MLA, per-layer and
all-layer copies, per-layer buffer lists, index types, and the argument checks."""

import itertools
import re
import subprocess
import sys

import numpy as np
import pytest

import kvtier
from kvtier import ops
from kv_reference import (LAYOUTS, buffer_shape, expected_copy, random_bytes,
                          random_indices, to_canonical)

L, N, S, P, H = 3, 64, 32, 4, 4


def make_region(rng, layout, mla, name, L=L, N=N, S=S, P=P, H=H, per_layer=False):
    """(region, [buffers]) with random contents."""
    if per_layer:
        bufs = [[random_bytes(rng, (N, S)) for _ in range(L)] for _ in range(1 if mla else 2)]
        k, v = bufs[0], (None if mla else bufs[1])
    else:
        shape = buffer_shape(layout, L, N, S, P, H)
        bufs = [random_bytes(rng, shape) for _ in range(1 if mla else 2)]
        k, v = bufs[0], (None if mla else bufs[1])
    region = ops.KvRegion(layout=layout, num_layers=L, slot_bytes=S, page_size=P, head_num=H,
                          k=k, v=v, mla=mla, name=name)
    return region, bufs


def canon(buf, layout, L=L, N=N, S=S, P=P, H=H):
    if isinstance(buf, list):  # per-layer buffers
        return np.stack([np.asarray(b).view(np.uint8).reshape(N, S) for b in buf])
    return to_canonical(buf, layout, L, N, S, P, H)


@pytest.mark.parametrize("src_layout,dst_layout", list(itertools.product(LAYOUTS, LAYOUTS)))
@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_every_layout_pair(src_layout, dst_layout, mla):
    rng = np.random.default_rng(hash((src_layout, dst_layout, mla)) % 2**32)
    src, sbufs = make_region(rng, src_layout, mla, "src")
    dst, dbufs = make_region(rng, dst_layout, mla, "dst")
    si = random_indices(rng, 13, N)  # arbitrary slots, not page-aligned runs
    di = random_indices(rng, 13, N)
    before = [canon(b, dst_layout) for b in dbufs]
    # one layer, then all layers
    ops.transfer_layer(src, dst, si, di, layer=1)
    for sb, db, b0 in zip(sbufs, dbufs, before):
        want = expected_copy(canon(sb, src_layout), b0, si, di, 1, 1, 1)
        np.testing.assert_array_equal(canon(db, dst_layout), want)
    si2 = random_indices(rng, 2 * P, N, page_size=P)
    di2 = random_indices(rng, 2 * P, N, page_size=P)
    before = [canon(b, dst_layout) for b in dbufs]
    ops.transfer_all_layers(src, dst, si2, di2)
    for sb, db, b0 in zip(sbufs, dbufs, before):
        want = expected_copy(canon(sb, src_layout), b0, si2, di2, 0, 0, L)
        np.testing.assert_array_equal(canon(db, dst_layout), want)


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
@pytest.mark.parametrize("direction", ["lists_to_pool", "pool_to_lists"])
def test_per_layer_buffer_lists(mla, direction):
    rng = np.random.default_rng(7)
    lists, lbufs = make_region(rng, "layer_first", mla, "lists", per_layer=True)
    pool, pbufs = make_region(rng, "page_head", mla, "pool")
    si = random_indices(rng, 9, N)
    di = random_indices(rng, 9, N)
    if direction == "lists_to_pool":
        src, sb, sl, dst, db, dl = lists, lbufs, "layer_first", pool, pbufs, "page_head"
    else:
        src, sb, sl, dst, db, dl = pool, pbufs, "page_head", lists, lbufs, "layer_first"
    before = [canon(b, dl) for b in db]
    ops.transfer(src, dst, si, di, src_layer=0, dst_layer=1, num_layers=2)
    for s, d, b0 in zip(sb, db, before):
        np.testing.assert_array_equal(canon(d, dl), expected_copy(canon(s, sl), b0, si, di, 0, 1, 2))


@pytest.mark.parametrize("index_kind", ["int64", "int32", "list", "strided"])
def test_index_types(index_kind):
    rng = np.random.default_rng(11)
    src, sbufs = make_region(rng, "page_first", False, "src")
    dst, dbufs = make_region(rng, "layer_first", False, "dst")
    si = random_indices(rng, 10, N)
    di = random_indices(rng, 10, N)
    before = [canon(b, "layer_first") for b in dbufs]
    if index_kind == "int32":
        a, b = si.astype(np.int32), di.astype(np.int32)
    elif index_kind == "list":
        a, b = si.tolist(), di.tolist()
    elif index_kind == "strided":
        a, b = np.repeat(si, 2)[::2], np.repeat(di, 2)[::2]
        assert not a.flags.c_contiguous
    else:
        a, b = si, di
    ops.transfer_all_layers(src, dst, a, b)
    for s, d, b0 in zip(sbufs, dbufs, before):
        np.testing.assert_array_equal(canon(d, "layer_first"),
                                      expected_copy(canon(s, "page_first"), b0, si, di, 0, 0, L))


def test_typed_buffers_and_inferred_num_slots():
    # float16 buffers with a natural [L, N, H, D] shape; slot_bytes = H * D * 2.
    rng = np.random.default_rng(3)
    k = rng.standard_normal((2, 40, 4, 8)).astype(np.float16)
    v = rng.standard_normal((2, 40, 4, 8)).astype(np.float16)
    hk = np.zeros((40, 2, 4, 8), np.float16)
    hv = np.zeros((40, 2, 4, 8), np.float16)
    dev = ops.KvRegion(layout="layer_first", num_layers=2, slot_bytes=64, k=k, v=v)
    host = ops.KvRegion(layout="page_first", num_layers=2, slot_bytes=64, k=hk, v=hv)
    assert dev.num_slots == 40 and host.num_slots == 40
    idx = np.array([0, 39, 17])
    ops.transfer_all_layers(dev, host, idx, idx, backend="cpu")
    np.testing.assert_array_equal(hk[idx], k[:, idx].transpose(1, 0, 2, 3))
    np.testing.assert_array_equal(hv[idx], v[:, idx].transpose(1, 0, 2, 3))
    untouched = np.setdiff1d(np.arange(40), idx)
    assert not hk[untouched].any() and not hv[untouched].any()


def test_different_layer_counts_and_offsets():
    rng = np.random.default_rng(5)
    big, bb = make_region(rng, "page_first_direct", True, "src", L=6)
    one, ob = make_region(rng, "layer_first", True, "dst", L=1)
    si, di = random_indices(rng, 8, N, P), random_indices(rng, 8, N)
    before = canon(ob[0], "layer_first", L=1)
    ops.transfer(big, one, si, di, src_layer=5, dst_layer=0, num_layers=1)
    want = expected_copy(canon(bb[0], "page_first_direct", L=6), before, si, di, 5, 0, 1)
    np.testing.assert_array_equal(canon(ob[0], "layer_first", L=1), want)


def test_max_sms_reaches_the_engine():
    """max_sms is passed through to the native call (the cpu backend ignores it)."""
    rng = np.random.default_rng(3)
    src, sbufs = make_region(rng, "page_first", False, "src")
    dst, dbufs = make_region(rng, "layer_first", False, "dst")
    si, di = random_indices(rng, 9, N), random_indices(rng, 9, N)
    before = [canon(b, "layer_first") for b in dbufs]
    ops.transfer_all_layers(src, dst, si, di, backend="cpu", max_sms=3)
    for sb, db, b0 in zip(sbufs, dbufs, before):
        want = expected_copy(canon(sb, "page_first"), b0, si, di, 0, 0, L)
        np.testing.assert_array_equal(canon(db, "layer_first"), want)


def test_empty_index_list_is_a_no_op():
    rng = np.random.default_rng(1)
    src, _ = make_region(rng, "layer_first", False, "src")
    dst, dbufs = make_region(rng, "page_head", False, "dst")
    before = [b.copy() for b in dbufs]
    ops.transfer_all_layers(src, dst, np.array([], np.int64), np.array([], np.int64))
    for b, b0 in zip(dbufs, before):
        np.testing.assert_array_equal(b, b0)


def test_large_copy_uses_the_thread_pool_path():
    # 4 layers x 4096 slots x 512 bytes = 8 MiB per buffer: above the parallel threshold.
    rng = np.random.default_rng(2)
    Lb, Nb, Sb = 4, 4096, 512
    src, sb = make_region(rng, "page_first", False, "src", L=Lb, N=Nb, S=Sb, P=16, H=8)
    dst, db = make_region(rng, "page_head", False, "dst", L=Lb, N=Nb, S=Sb, P=16, H=8)
    si = rng.permutation(Nb)[:3000]
    di = rng.permutation(Nb)[:3000]
    ops.transfer_all_layers(src, dst, si, di)
    for s, d in zip(sb, db):
        got = to_canonical(d, "page_head", Lb, Nb, Sb, 16, 8)
        np.testing.assert_array_equal(got[:, di], to_canonical(s, "page_first", Lb, Nb, Sb, 16, 8)[:, si])


def test_configure_round_trip():
    old = ops.engine_config()
    try:
        ops.configure(cpu_threads=2, cpu_parallel_threshold_bytes=1)
        assert ops.engine_config()["cpu_threads"] == 2
        test_large_copy_uses_the_thread_pool_path()
    finally:
        ops.configure(**old)
    with pytest.raises(ValueError, match="max_sms"):
        ops.configure(max_sms=0)
    assert old["max_sms_to_host"] == 3
    try:
        ops.configure(max_sms_to_host=0)
        assert ops.engine_config()["max_sms_to_host"] == 0
    finally:
        ops.configure(**old)
    with pytest.raises(ValueError, match="max_sms_to_host"):
        ops.configure(max_sms_to_host=-1)
    assert old["max_sms_beside_backup"] == 8
    try:
        ops.configure(max_sms_beside_backup=0)
        assert ops.engine_config()["max_sms_beside_backup"] == 0
    finally:
        ops.configure(**old)
    with pytest.raises(ValueError, match="max_sms_beside_backup"):
        ops.configure(max_sms_beside_backup=-1)


# ---- argument checks --------------------------------------------------------------------------

def regions(rng=None):
    rng = rng or np.random.default_rng(0)
    src, _ = make_region(rng, "layer_first", False, "src")
    dst, _ = make_region(rng, "page_first", False, "dst")
    return src, dst


def test_bad_region_arguments_name_the_argument():
    buf = np.zeros(buffer_shape("layer_first", L, N, S), np.uint8)
    kw = dict(layout="layer_first", num_layers=L, slot_bytes=S, k=buf, v=buf.copy(), name="src")
    cases = [
        (dict(layout="row_major"), "src.layout"),
        (dict(num_layers=0), "src.num_layers"),
        (dict(slot_bytes=-4), "src.slot_bytes"),
        (dict(slot_bytes=30), "slot_bytes = 30 is not a multiple of 4"),
        (dict(page_size=0), "src.page_size"),
        (dict(num_layers=1.5), "src.num_layers"),
        (dict(num_slots=N + 1), "src.k holds"),
        (dict(v=None), "src.v is required"),
        (dict(mla=True), "src.v must be None"),
        (dict(k="not a buffer"), "src.k of type str"),
        (dict(k=None), "src.k is None"),
        (dict(k=np.zeros((L, N, 2 * S), np.uint8)[:, :, ::2]), "src.k must be C-contiguous"),
        (dict(k=np.zeros(8, np.uint8), v=np.zeros(8, np.uint8)), "less than one page"),
        (dict(layout="page_head", head_num=3), "head_num = 3"),
        (dict(layout="page_first_direct", page_size=5, num_slots=12),
         "src.page_size = 5 does not divide num_slots = 12"),
        (dict(k=[buf[0]] * L), "must both be buffers or both be lists"),
        (dict(layout="page_first", k=list(buf), v=list(buf)), "needs layout='layer_first'"),
        (dict(k=list(buf)[:2], v=list(buf)[:2]), "src.k has 2 per-layer buffers"),
    ]
    for override, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            ops.KvRegion(**{**kw, **override})


def test_bad_transfer_arguments_name_the_argument():
    src, dst = regions()
    si = np.arange(4)
    cases = [
        (dict(src_indices=np.array([0, 1, 2, N])), r"src_indices\[3\] = 64 is out of range"),
        (dict(dst_indices=np.array([-1, 1, 2, 3])), r"dst_indices\[0\] = -1 is out of range"),
        (dict(dst_indices=np.arange(3)), "src_indices and dst_indices differ in length"),
        (dict(src_indices=np.arange(4.0)), "src_indices has element type"),
        (dict(src_indices=np.arange(4).reshape(2, 2)), "src_indices must be 1-D"),
        (dict(src_indices=["a"]), "src_indices must hold integers"),
        (dict(dst_indices=None), "dst_indices is None"),
        (dict(src_layer=L), "src_layer = 3"),
        (dict(dst_layer=-1), "dst_layer = -1"),
        (dict(num_layers=0), "num_layers = 0"),
        (dict(num_layers=L + 1), "num_layers"),
        (dict(backend="gpu"), "backend = 'gpu' is not one of"),
        (dict(src="src"), "src must be a kvtier.ops.KvRegion"),
        (dict(dst=np.zeros(4)), "dst must be a kvtier.ops.KvRegion"),
        (dict(src_layer="0"), "src_layer = '0' must be an integer"),
        (dict(max_sms=-1), "max_sms = -1 must be >= 0"),
        (dict(max_sms=2.5), "max_sms = 2.5 must be an integer"),
    ]
    base = dict(src=src, dst=dst, src_indices=si, dst_indices=si)
    for override, message in cases:
        args = {**base, **override}
        with pytest.raises(ValueError, match=message):
            ops.transfer(args.pop("src"), args.pop("dst"), args.pop("src_indices"),
                         args.pop("dst_indices"), **args)


def test_mismatched_regions():
    rng = np.random.default_rng(0)
    src, _ = make_region(rng, "layer_first", False, "src")
    mla_dst, _ = make_region(rng, "layer_first", True, "dst")
    with pytest.raises(ValueError, match="src is MHA but dst is MLA"):
        ops.transfer_all_layers(src, mla_dst, [0], [0])
    wide, _ = make_region(rng, "layer_first", False, "dst", S=2 * S)
    with pytest.raises(ValueError, match="slot_bytes differ"):
        ops.transfer_all_layers(src, wide, [0], [0])


def test_read_only_destination():
    rng = np.random.default_rng(0)
    src, _ = make_region(rng, "layer_first", True, "src")
    buf = np.zeros(buffer_shape("layer_first", L, N, S), np.uint8)
    buf.flags.writeable = False
    dst = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, k=buf, mla=True,
                       name="dst")
    with pytest.raises(ValueError, match=r"dst buffer dst\.k is read-only"):
        ops.transfer_all_layers(src, dst, [0], [0])
    assert not buf.any()


def test_failed_check_leaves_destination_untouched():
    rng = np.random.default_rng(9)
    src, _ = make_region(rng, "page_first", False, "src")
    dst, dbufs = make_region(rng, "page_head", False, "dst")
    before = [b.copy() for b in dbufs]
    with pytest.raises(ValueError):
        ops.transfer_all_layers(src, dst, np.arange(8), np.array([0, 1, 2, 3, 4, 5, 6, 999]))
    for b, b0 in zip(dbufs, before):
        np.testing.assert_array_equal(b, b0)


@pytest.mark.skipif(kvtier.built_with_cuda(), reason="checks the message of a build without CUDA")
@pytest.mark.parametrize("backend", ["kernel", "dma"])
def test_gpu_backend_without_cuda_says_so(backend):
    src, dst = regions()
    with pytest.raises(kvtier.UnavailableError, match="needs CUDA"):
        ops.transfer_all_layers(src, dst, [0], [0], backend=backend)
    with pytest.raises(kvtier.UnavailableError, match="without CUDA"):
        kvtier.LayerEvents(4)


def test_bad_stream_argument():
    src, dst = regions()
    for stream, message in ((-1, "stream = -1"), (object(), "stream of type object")):
        with pytest.raises(ValueError, match=message):
            ops.transfer_all_layers(src, dst, [0], [0], backend="kernel", stream=stream)


def test_exception_hierarchy():
    assert issubclass(kvtier.InvalidArgumentError, ValueError)
    assert issubclass(kvtier.InvalidArgumentError, kvtier.KvtierError)
    assert issubclass(kvtier.OutOfMemoryError, MemoryError)
    assert issubclass(kvtier.KvtierError, RuntimeError)
    for cls in (kvtier.NotFoundError, kvtier.KvtierIOError, kvtier.CorruptionError,
                kvtier.CudaError, kvtier.UnavailableError, kvtier.FailedPreconditionError,
                kvtier.InternalError):
        assert issubclass(cls, kvtier.KvtierError)
    # A C++ Status message arrives unchanged.
    with pytest.raises(kvtier.InvalidArgumentError, match="^src.slot_bytes = 6 is not a multiple of 4$"):
        kvtier._kvtier.Region(layout="layer_first", num_layers=1, num_slots=1, slot_bytes=6, k=64,
                              v=64, name="src")


def test_import_needs_neither_torch_nor_a_gpu():
    code = ("import sys, kvtier, kvtier.ops, kvtier.compat.sgl_kernel; "
            "assert 'torch' not in sys.modules, 'kvtier imported torch'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
