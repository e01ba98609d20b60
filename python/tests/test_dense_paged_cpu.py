"""kvtier.ops.scatter_dense / gather_dense on host memory: byte-for-byte against a numpy reference
over random shapes, random non-contiguous views (any strides, strided head_dim included), every
pool layout, MHA and MLA, element sizes 1/2/4/8, int32/int64 and 2-D slot lists, with poisoned
destinations; and the argument checks (ValueError naming the argument)."""

import numpy as np
import pytest

from kvtier import ops
from kv_reference import LAYOUTS, buffer_shape, to_canonical

POISON = 0xA5


def strided_view(rng, shape, dtype):
    """A random non-contiguous view of `shape` ([..., B, H, T, D]) over a larger buffer: axes
    permuted in memory, padded, and sometimes head_dim strided."""
    nd = len(shape)
    order = rng.permutation(nd)  # memory order of the axes
    pad = [int(rng.integers(0, 3)) for _ in range(nd)]
    step_d = int(rng.integers(1, 3))  # head_dim stride 1 or 2 elements
    base_shape = [shape[a] + pad[a] for a in order]
    base_shape[list(order).index(nd - 1)] = shape[-1] * step_d + pad[nd - 1]
    base = rng.integers(0, 256, size=int(np.prod(base_shape)) * np.dtype(dtype).itemsize,
                        dtype=np.uint8).view(dtype).reshape(base_shape)
    view = base.transpose(np.argsort(order))
    index = tuple(slice(0, n) if a < nd - 1 else slice(0, n * step_d, step_d)
                  for a, n in enumerate(shape))
    return view[index]


def pool_bytes(buf, layout, L, N, S, P, H):
    return to_canonical(buf, layout, L, N, S, P, H)  # [L, N, S] bytes in head order


def make_pool(layout, mla, L, N, S, P, H):
    shape = buffer_shape(layout, L, N, S, P, H)
    bufs = [np.full(shape, POISON, dtype=np.uint8) for _ in range(1 if mla else 2)]
    region = ops.KvRegion(layout=layout, num_layers=L, slot_bytes=S, page_size=P, head_num=H,
                          k=bufs[0], v=None if mla else bufs[1], mla=mla, name="pool")
    return region, bufs


def token_bytes(dense, b, t):
    """Bytes of token (b, t) of a [B, H, T, D] array, heads in order."""
    return np.ascontiguousarray(dense[b, :, t, :]).view(np.uint8).reshape(-1)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.int64])
def test_scatter_then_gather_byte_for_byte(layout, mla, dtype):
    rng = np.random.default_rng(abs(hash((layout, mla, np.dtype(dtype).name))) % 2**32)
    for trial in range(3):
        itemsize = np.dtype(dtype).itemsize
        heads = 1 if mla else int(rng.integers(1, 4))
        head_dim = int(rng.integers(1, 5)) * (8 // itemsize if itemsize < 8 else 1)
        S = heads * head_dim * itemsize
        if S % 4:
            head_dim *= 4
            S = heads * head_dim * itemsize
        P = int(rng.choice([1, 2, 4]))
        H = heads if layout == "page_head" else int(rng.choice([1, heads]))
        L = int(rng.integers(1, 5))
        batch, seq = int(rng.integers(1, 3)), int(rng.integers(0, 7))
        N = P * (batch * seq // P + 3)
        first = int(rng.integers(0, L))
        n_layers = int(rng.integers(1, L - first + 1))
        pool, bufs = make_pool(layout, mla, L, N, S, P, H)
        slots = rng.permutation(N)[:batch * seq].astype(rng.choice([np.int32, np.int64]))
        shape = (batch, heads, seq, head_dim)
        dense_k = [strided_view(rng, shape, dtype) for _ in range(n_layers)]
        dense_v = None if mla else [strided_view(rng, shape, dtype) for _ in range(n_layers)]
        slot_arg = slots.reshape(batch, seq) if trial == 1 else slots
        ops.scatter_dense(pool, slot_arg, dense_k, dense_v, first_layer=first)

        for buf, dense in zip(bufs, [dense_k] + ([] if mla else [dense_v])):
            got = pool_bytes(buf, layout, L, N, S, P, H)
            want = np.full_like(got, POISON)
            for i, layer in enumerate(dense):
                for b in range(batch):
                    for t in range(seq):
                        want[first + i, slots[b * seq + t]] = token_bytes(layer, b, t)
            np.testing.assert_array_equal(got, want)  # written slots right, the rest untouched

        # Gather back into poisoned strided outputs (a single 5-D view for k this time).
        poison = np.frombuffer(bytes([POISON]) * np.dtype(dtype).itemsize, dtype=dtype)[0]
        out_k = strided_view(rng, (n_layers,) + shape, dtype)
        out_k[...] = poison
        out_v = None if mla else [strided_view(rng, shape, dtype) for _ in range(n_layers)]
        for o in ([] if mla else out_v):
            o[...] = poison
        ops.gather_dense(pool, slots, out_k, out_v, first_layer=first)
        as_bytes = lambda a: np.ascontiguousarray(a).view(np.uint8)  # noqa: E731
        for i in range(n_layers):
            np.testing.assert_array_equal(as_bytes(out_k[i]), as_bytes(dense_k[i]))
            if not mla:
                np.testing.assert_array_equal(as_bytes(out_v[i]), as_bytes(dense_v[i]))


def test_padding_outside_the_view_is_not_written():
    rng = np.random.default_rng(7)
    pool, _ = make_pool("layer_first", False, 2, 16, 16, 4, 1)
    # [L=2, B=1, H=2, T=4, D=4] uint16 (2 x 4 x 2 = 16 = slot_bytes) inside a padded buffer.
    base = np.full((2, 1, 2, 6, 8), POISON * 257, dtype=np.uint16)
    view = base[:, :, :, 1:5, 0:4]
    slots = rng.permutation(16)[:4].astype(np.int64)
    ops.scatter_dense(pool, slots, view, view)  # pool <- poison bytes
    before = base.copy()
    k = np.zeros((2, 1, 2, 4, 4), dtype=np.uint16)
    ops.scatter_dense(pool, slots, k, k)
    ops.gather_dense(pool, slots, view, view)
    assert (base[:, :, :, 1:5, 0:4] == 0).all()
    mask = np.ones(base.shape, dtype=bool)
    mask[:, :, :, 1:5, 0:4] = False
    np.testing.assert_array_equal(base[mask], before[mask])


def test_bad_arguments_name_the_argument():
    pool, _ = make_pool("layer_first", False, 2, 16, 16, 4, 1)
    mla_pool, _ = make_pool("layer_first", True, 2, 16, 16, 4, 1)
    k = np.zeros((2, 1, 2, 4, 4), dtype=np.uint16)  # 2 heads x 4 x 2 bytes = 16 = slot_bytes
    slots = np.arange(4, dtype=np.int64)
    cases = [
        (lambda: ops.scatter_dense(pool, slots, k, None), r"\bv is None"),
        (lambda: ops.scatter_dense(mla_pool, slots, k, k), r"\bv must be None"),
        (lambda: ops.scatter_dense(pool, slots, k[:, :, :, :, :2], k[:, :, :, :, :2]),
         r"heads x head_dim x elem_bytes"),
        (lambda: ops.scatter_dense(pool, slots[:3], k, k), r"slots has 3 entries"),
        (lambda: ops.scatter_dense(pool, np.array([0, 1, 2, 99]), k, k), r"slots\[3\] = 99"),
        (lambda: ops.scatter_dense(pool, slots, k, k, first_layer=1), r"first_layer = 1"),
        (lambda: ops.scatter_dense(pool, slots, k, k[:1]), r"v has 1 layers"),
        (lambda: ops.scatter_dense(pool, slots, k[0], k[0]), r"\bk has shape"),
        (lambda: ops.scatter_dense(pool, slots, [k[0, 0]], [k[0, 0]]), r"k\[0\] has shape"),
        (lambda: ops.scatter_dense(pool, slots, k[:, :, :, ::-1], k), r"k\[0\] has negative"),
        (lambda: ops.scatter_dense(pool, slots.reshape(2, 2), k, k), r"slots has shape"),
        (lambda: ops.scatter_dense(pool, slots, [k[0], k[1].astype(np.uint32)], k),
         r"k\[1\] has 4-byte"),
        (lambda: ops.scatter_dense(pool, slots, "k", k), r"\bk of type str"),
        (lambda: ops.scatter_dense("pool", slots, k, k), r"pool must be"),
    ]
    for call, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            call()
    ro = np.zeros_like(k)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"k\[0\] is read-only"):
        ops.gather_dense(pool, slots, ro, np.zeros_like(k))
    ops.scatter_dense(pool, slots, ro, ro)  # reading a read-only array is fine


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_plan_gathers_and_scatters_any_layer_range_byte_for_byte(mla):
    """DensePagedPlan (arguments read once, then one native call per range of layers) copies
    exactly what gather_dense / scatter_dense copy, for single layers and ranges."""
    rng = np.random.default_rng(7 + mla)
    L, N, P, H, D = 4, 64, 4, 1 if mla else 2, 8
    S = H * D * 2
    pool, bufs = make_pool("layer_first", mla, L, N, S, P, H)
    for b in bufs:
        b[...] = rng.integers(0, 256, size=b.shape, dtype=np.uint8)
    slots = rng.permutation(N)[:24].astype(np.int64)
    k = np.zeros((L, 1, H, 24, D), dtype=np.uint16)
    v = None if mla else np.zeros_like(k)
    want_k = np.zeros_like(k)
    want_v = None if mla else np.zeros_like(k)
    ops.gather_dense(pool, slots, want_k, want_v)
    plan = ops.DensePagedPlan(pool, slots, k, v)
    assert plan.num_layers == L
    plan.gather(2)  # layers 2 and 3
    assert np.array_equal(k[2:], want_k[2:]) and not k[:2].any()
    plan.gather(0, 1)
    plan.gather(1, num_layers=1)
    assert np.array_equal(k, want_k)
    if not mla:
        assert np.array_equal(v, want_v)
    # Per-layer tensors and an offset first_layer: the plan's layer 0 is pool layer 1.
    ks = [np.zeros((1, H, 24, D), dtype=np.uint16) for _ in range(2)]
    vs = None if mla else [np.zeros((1, H, 24, D), dtype=np.uint16) for _ in range(2)]
    sub = ops.DensePagedPlan(pool, slots, ks, vs, first_layer=1)
    sub.gather(1, 1)
    assert np.array_equal(ks[1], want_k[2]) and not ks[0].any()
    # Scatter: new bytes into the pool through the plan, read back with gather_dense.
    k[...] = rng.integers(0, 2**16, size=k.shape, dtype=np.uint16)
    if not mla:
        v[...] = rng.integers(0, 2**16, size=v.shape, dtype=np.uint16)
    plan.scatter()
    got_k = np.zeros_like(k)
    got_v = None if mla else np.zeros_like(k)
    ops.gather_dense(pool, slots, got_k, got_v)
    assert np.array_equal(got_k, k)
    if not mla:
        assert np.array_equal(got_v, v)


def test_plan_bad_arguments_name_the_argument():
    pool, _ = make_pool("layer_first", False, 2, 16, 16, 4, 1)
    k = np.zeros((2, 1, 2, 4, 4), dtype=np.uint16)
    slots = np.arange(4, dtype=np.int64)
    plan = ops.DensePagedPlan(pool, slots, k, k.copy())
    for call, pattern in [
        (lambda: plan.gather(2), r"layer = 2 is outside the plan's 2 layers"),
        (lambda: plan.gather(-1), r"layer = -1"),
        (lambda: plan.gather(1, 2), r"num_layers = 2 must be in \[1, 1\]"),
        (lambda: plan.gather(0, 0), r"num_layers = 0"),
        (lambda: plan.gather("0"), r"layer"),
        (lambda: ops.DensePagedPlan(pool, slots, k, None), r"\bv is None"),
        (lambda: ops.DensePagedPlan(pool, slots, k, k[:1].copy()), r"v has 1 layers"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            call()
    # What the pool refuses (shapes, slots) is found by the copy: at the plan's first run.
    bad = ops.DensePagedPlan(pool, np.array([0, 1, 2, 99]), k, k.copy())
    with pytest.raises(ValueError, match=r"slots\[3\] = 99"):
        bad.gather()
    narrow = k[:, :, :, :, :2].copy()
    bad = ops.DensePagedPlan(pool, slots, narrow, narrow.copy())
    with pytest.raises(ValueError, match=r"heads x head_dim x elem_bytes"):
        bad.gather()
    read_only = k.copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ops.DensePagedPlan(pool, slots, read_only, k.copy())
