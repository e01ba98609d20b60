"""kvtier.compat.sgl_kernel on host memory (numpy, cpu backend): the exact SGLang signatures, every
function against a numpy advanced-indexing reference, and the argument checks."""

import inspect
import re

import numpy as np
import pytest

from kvtier.compat import sgl_kernel as kv
from kv_reference import random_indices

# The SGLang sgl_kernel.kvcacheio signatures (issue 5): name -> (arguments, defaults).
KERNEL_DEFAULTS = {"block_quota": 2, "num_warps_per_block": 32}
SIGNATURES = {
    "transfer_kv_per_layer": "src_k dst_k src_v dst_v src_indices dst_indices item_size",
    "transfer_kv_per_layer_pf_lf":
        "src_k dst_k src_v dst_v src_indices dst_indices layer_id item_size src_layout_dim",
    "transfer_kv_per_layer_ph_lf": "src_k dst_k src_v dst_v src_indices dst_indices layer_id "
                                   "item_size src_layout_dim page_size head_num",
    "transfer_kv_all_layer": "src_k_layers dst_k_layers src_v_layers dst_v_layers src_indices "
                             "dst_indices item_size num_layers",
    "transfer_kv_all_layer_lf_pf": "src_k_layers dst_k src_v_layers dst_v src_indices dst_indices "
                                   "item_size dst_layout_dim num_layers",
    "transfer_kv_all_layer_lf_ph": "src_k_layers dst_k src_v_layers dst_v src_indices dst_indices "
                                   "item_size dst_layout_dim num_layers page_size head_num",
    "transfer_kv_per_layer_mla": "src dst src_indices dst_indices item_size",
    "transfer_kv_per_layer_mla_pf_lf":
        "src dst src_indices dst_indices layer_id item_size src_layout_dim",
    "transfer_kv_all_layer_mla": "src_layers dst_layers src_indices dst_indices item_size num_layers",
    "transfer_kv_all_layer_mla_lf_pf":
        "src_layers dst src_indices dst_indices item_size dst_layout_dim num_layers",
    "transfer_kv_direct": "src_layers dst_layers src_indices dst_indices page_size",
    "transfer_kv_per_layer_direct_pf_lf":
        "src_ptrs dst_ptrs src_indices dst_indices layer_id page_size",
    "transfer_kv_all_layer_direct_lf_pf": "src_ptrs dst_ptrs src_indices dst_indices page_size",
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_matches_sglang(name):
    params = list(inspect.signature(getattr(kv, name)).parameters.values())
    required = SIGNATURES[name].split()
    extra = {} if "direct" in name else KERNEL_DEFAULTS
    assert [p.name for p in params] == required + list(extra)
    for p in params[:len(required)]:
        assert p.default is inspect.Parameter.empty, p.name
    for p in params[len(required):]:
        assert p.default == extra[p.name], p.name
    assert set(kv.__all__) == set(SIGNATURES)


# ---- geometry shared by the reference checks ----------------------------------------------------
L, N, H, D, P = 3, 64, 2, 8, 4
DT = np.float16
ITEM = H * D * 2  # bytes of one token of one layer (K), as SGLang's token_stride_size
MLA_DIM = 36
MLA_ITEM = MLA_DIM * 2
rng = np.random.default_rng(1234)


def rand(*shape):
    return rng.standard_normal(shape).astype(DT)


def idx(count=10, page_size=1):
    return random_indices(rng, count, N, page_size), random_indices(rng, count, N, page_size)


def table(layers):
    return np.array([a.ctypes.data for a in layers], dtype=np.uint64)


def test_per_layer():
    sk, sv, dk, dv = rand(N, H, D), rand(N, H, D), rand(N, H, D), rand(N, H, D)
    rk, rv = dk.copy(), dv.copy()
    si, di = idx()
    kv.transfer_kv_per_layer(sk, dk, sv, dv, si, di, ITEM)
    rk[di], rv[di] = sk[si], sv[si]
    np.testing.assert_array_equal(dk, rk)
    np.testing.assert_array_equal(dv, rv)


def test_per_layer_pf_lf():
    sk, sv = rand(N, L, H, D), rand(N, L, H, D)
    dk, dv = rand(N, H, D), rand(N, H, D)
    rk, rv = dk.copy(), dv.copy()
    si, di = idx()
    kv.transfer_kv_per_layer_pf_lf(sk, dk, sv, dv, si, di, 2, ITEM, L * ITEM)
    rk[di], rv[di] = sk[si, 2], sv[si, 2]
    np.testing.assert_array_equal(dk, rk)
    np.testing.assert_array_equal(dv, rv)


def test_per_layer_ph_lf():
    sk, sv = rand(N // P, H, P, L, D), rand(N // P, H, P, L, D)
    dk, dv = rand(N, H, D), rand(N, H, D)
    rk, rv = dk.copy(), dv.copy()
    si, di = idx(2 * P, P)
    kv.transfer_kv_per_layer_ph_lf(sk, dk, sv, dv, si, di, 1, ITEM, L * ITEM, P, H)
    for h in range(H):
        rk[di, h] = sk[si // P, h, si % P, 1]
        rv[di, h] = sv[si // P, h, si % P, 1]
    np.testing.assert_array_equal(dk, rk)
    np.testing.assert_array_equal(dv, rv)


def test_all_layer():
    sk = [rand(N, H, D) for _ in range(L)]
    sv = [rand(N, H, D) for _ in range(L)]
    dk = [rand(N, H, D) for _ in range(L)]
    dv = [rand(N, H, D) for _ in range(L)]
    rk, rv = [a.copy() for a in dk], [a.copy() for a in dv]
    si, di = idx()
    kv.transfer_kv_all_layer(table(sk), table(dk), table(sv), table(dv), si, di, ITEM, L)
    for l in range(L):
        rk[l][di], rv[l][di] = sk[l][si], sv[l][si]
        np.testing.assert_array_equal(dk[l], rk[l])
        np.testing.assert_array_equal(dv[l], rv[l])


def test_all_layer_lf_pf():
    sk = [rand(N, H, D) for _ in range(L)]
    sv = [rand(N, H, D) for _ in range(L)]
    dk, dv = rand(N, L, H, D), rand(N, L, H, D)
    rk, rv = dk.copy(), dv.copy()
    si, di = idx()
    kv.transfer_kv_all_layer_lf_pf(table(sk), dk, table(sv), dv, si, di, ITEM, L * ITEM, L)
    for l in range(L):
        rk[di, l], rv[di, l] = sk[l][si], sv[l][si]
    np.testing.assert_array_equal(dk, rk)
    np.testing.assert_array_equal(dv, rv)


def test_all_layer_lf_ph():
    sk = [rand(N, H, D) for _ in range(L)]
    sv = [rand(N, H, D) for _ in range(L)]
    dk, dv = rand(N // P, H, P, L, D), rand(N // P, H, P, L, D)
    rk, rv = dk.copy(), dv.copy()
    si, di = idx(3 * P, P)
    kv.transfer_kv_all_layer_lf_ph(table(sk), dk, table(sv), dv, si, di, ITEM, L * ITEM, L, P, H)
    for l in range(L):
        for h in range(H):
            rk[di // P, h, di % P, l] = sk[l][si, h]
            rv[di // P, h, di % P, l] = sv[l][si, h]
    np.testing.assert_array_equal(dk, rk)
    np.testing.assert_array_equal(dv, rv)


def test_per_layer_mla():
    s, d = rand(N, 1, MLA_DIM), rand(N, 1, MLA_DIM)
    r = d.copy()
    si, di = idx()
    kv.transfer_kv_per_layer_mla(s, d, si, di, MLA_ITEM)
    r[di] = s[si]
    np.testing.assert_array_equal(d, r)


def test_per_layer_mla_pf_lf():
    s, d = rand(N, L, 1, MLA_DIM), rand(N, 1, MLA_DIM)
    r = d.copy()
    si, di = idx()
    kv.transfer_kv_per_layer_mla_pf_lf(s, d, si, di, L - 1, MLA_ITEM, L * MLA_ITEM)
    r[di] = s[si, L - 1]
    np.testing.assert_array_equal(d, r)


def test_all_layer_mla():
    s = [rand(N, 1, MLA_DIM) for _ in range(L)]
    d = [rand(N, 1, MLA_DIM) for _ in range(L)]
    r = [a.copy() for a in d]
    si, di = idx()
    kv.transfer_kv_all_layer_mla(table(s), table(d), si, di, MLA_ITEM, L)
    for l in range(L):
        r[l][di] = s[l][si]
        np.testing.assert_array_equal(d[l], r[l])


def test_all_layer_mla_lf_pf():
    s = [rand(N, 1, MLA_DIM) for _ in range(L)]
    d = rand(N, L, 1, MLA_DIM)
    r = d.copy()
    si, di = idx()
    kv.transfer_kv_all_layer_mla_lf_pf(table(s), d, si, di, MLA_ITEM, L * MLA_ITEM, L)
    for l in range(L):
        r[di, l] = s[l][si]
    np.testing.assert_array_equal(d, r)


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_direct(mla):
    n = L if mla else 2 * L  # K layers then V layers
    src = [rand(N, H, D) for _ in range(n)]
    dst = [rand(N, H, D) for _ in range(n)]
    ref = [a.copy() for a in dst]
    si, di = idx(2 * P, P)
    kv.transfer_kv_direct(src, dst, si, di, P)
    for j in range(n):
        ref[j][di] = src[j][si]
        np.testing.assert_array_equal(dst[j], ref[j])


def test_direct_mixed_row_sizes():
    src = [rand(N, H, D), rand(N, 1, MLA_DIM)]
    dst = [rand(N, H, D), rand(N, 1, MLA_DIM)]
    ref = [a.copy() for a in dst]
    si, di = idx(P, P)
    kv.transfer_kv_direct(src, dst, si, di, P)
    for j in range(2):
        ref[j][di] = src[j][si]
        np.testing.assert_array_equal(dst[j], ref[j])


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_per_layer_direct_pf_lf(mla):
    pool = [rand(N // P, L, P, H, D) for _ in range(1 if mla else 2)]
    layers = 1
    dst = [rand(N, H, D) for _ in range(len(pool) * layers)]
    ref = [a.copy() for a in dst]
    si, di = idx(2 * P, P)
    kv.transfer_kv_per_layer_direct_pf_lf(pool, dst, si, di, 2, P)
    for b in range(len(pool)):
        ref[b][di] = pool[b][si // P, 2, si % P]
        np.testing.assert_array_equal(dst[b], ref[b])


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_all_layer_direct_lf_pf(mla):
    nb = 1 if mla else 2
    src = [rand(N, H, D) for _ in range(nb * L)]  # L K layers, then L V layers
    pool = [rand(N // P, L, P, H, D) for _ in range(nb)]
    ref = [a.copy() for a in pool]
    si, di = idx(3 * P, P)
    kv.transfer_kv_all_layer_direct_lf_pf(src, pool, si, di, P)
    for b in range(nb):
        for l in range(L):
            ref[b][di // P, l, di % P] = src[b * L + l][si]
        np.testing.assert_array_equal(pool[b], ref[b])


# ---- argument checks ----------------------------------------------------------------------------

def test_bad_arguments_name_the_argument():
    a, b = rand(N, H, D), rand(N, H, D)
    pf = rand(N, L, H, D)
    si, di = idx()
    t = table([rand(N, H, D) for _ in range(L)])
    cases = [
        (lambda: kv.transfer_kv_per_layer(a, b, a, b, si, di, 6), "item_size = 6"),
        (lambda: kv.transfer_kv_per_layer(a, b, a, b, si, di, 0), "item_size = 0"),
        (lambda: kv.transfer_kv_per_layer(a, b, a, b, si, di[:3], ITEM),
         "src_indices and dst_indices differ in length"),
        (lambda: kv.transfer_kv_per_layer(a, b, a, b, si + N, di, ITEM), "src_indices[0]"),
        (lambda: kv.transfer_kv_per_layer(a, "b", a, b, si, di, ITEM), "dst_k of type str"),
        (lambda: kv.transfer_kv_per_layer(a, b, a, b[:1], si, di, ITEM), "dst_indices["),
        (lambda: kv.transfer_kv_per_layer(a, b, a, b, si, di, 4 * N * ITEM), "src_k holds"),
        (lambda: kv.transfer_kv_per_layer_pf_lf(pf, b, pf, b, si, di, 0, ITEM, ITEM + 4),
         "src_layout_dim = 36"),
        (lambda: kv.transfer_kv_per_layer_pf_lf(pf, b, pf, b, si, di, L, ITEM, L * ITEM),
         "src_layer = 3"),
        (lambda: kv.transfer_kv_per_layer_pf_lf(pf, b, pf, b, si, di, -1, ITEM, L * ITEM),
         "layer_id = -1"),
        (lambda: kv.transfer_kv_all_layer(t, t[:2], t, t, si, di, ITEM, L),
         "dst_k_layers must be a 1-D uint64 array of 3 addresses"),
        (lambda: kv.transfer_kv_all_layer(t.astype(np.float64), t, t, t, si, di, ITEM, L),
         "src_k_layers must be a 1-D uint64 array"),
        (lambda: kv.transfer_kv_all_layer(np.zeros(L, np.uint64), t, t, t, si, di, ITEM, L),
         "src_k_layers[0] is a null address"),
        (lambda: kv.transfer_kv_all_layer_lf_pf(t, pf, t, pf, si, di, ITEM, L * ITEM, L + 1),
         "num_layers = 4 exceeds"),
        (lambda: kv.transfer_kv_direct([a], [b, b], si, di, 1), "src_layers has 1 tensors"),
        (lambda: kv.transfer_kv_direct(a, [b], si, di, 1), "src_layers must be a list"),
        (lambda: kv.transfer_kv_direct([a], [rand(N, 1, D)], si, di, 1), "dst_layers[0] has"),
        (lambda: kv.transfer_kv_direct([a], [b], si[:3], di[:3], 2),
         "not a multiple of page_size = 2"),
        (lambda: kv.transfer_kv_per_layer_direct_pf_lf([rand(N // P, L, P, H, D)] * 2, [b, b],
                                                       si[:8], di[:8], 0, 2 * P),
         "page_size = 8 does not match src_ptrs[0].shape[2] = 4"),
        (lambda: kv.transfer_kv_per_layer_direct_pf_lf([a, a, a], [b], si, di, 0, P),
         "src_ptrs has 3 tensors"),
        (lambda: kv.transfer_kv_all_layer_direct_lf_pf([a, a, a], [rand(N // P, L, P, H, D)] * 2,
                                                       si[:8], di[:8], P),
         "src_ptrs has 3 tensors; an MHA pool passes K layers then V layers"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()


def test_same_buffers_with_another_geometry():
    # The compat layer caches regions by geometry and addresses: the same arrays seen with another
    # item_size must not reuse the first geometry.
    src, dst = rand(N, H, D), rand(N, H, D)
    si, di = idx()
    want = dst.copy()
    kv.transfer_kv_per_layer_mla(src, dst, si, di, ITEM)
    want[di] = src[si]
    np.testing.assert_array_equal(dst, want)
    half = ITEM // 2  # now each array holds 2N half-size items
    s2, d2 = random_indices(rng, 10, 2 * N), random_indices(rng, 10, 2 * N)
    kv.transfer_kv_per_layer_mla(src, dst, s2, d2, half)
    flat_src, flat_want = src.reshape(2 * N, -1), want.reshape(2 * N, -1)
    flat_want[d2] = flat_src[s2]
    np.testing.assert_array_equal(dst, want)


def test_read_only_destination():
    src, dst = rand(N, 1, MLA_DIM), rand(N, 1, MLA_DIM)
    dst.flags.writeable = False
    before = dst.copy()
    with pytest.raises(ValueError, match="dst buffer dst is read-only"):
        kv.transfer_kv_per_layer_mla(src, dst, [0], [1], MLA_ITEM)
    np.testing.assert_array_equal(dst, before)


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_all_layer_direct_from_views_of_one_pool(mla):
    # Per-layer tensors that are views of one [L, N, ...] pool are described by base pointers
    # (one strided copy per run across all layers on the dma backend): same bytes.
    nb = 1 if mla else 2
    pools = [rand(L, N, H, D) for _ in range(nb)]
    src = [pools[b][l] for b in range(nb) for l in range(L)]
    pfd = [rand(N // P, L, P, H, D) for _ in range(nb)]
    ref = [a.copy() for a in pfd]
    si, di = idx(3 * P, P)
    kv.transfer_kv_all_layer_direct_lf_pf(src, pfd, si, di, P)
    for b in range(nb):
        for l in range(L):
            ref[b][di // P, l, di % P] = pools[b][l][si]
        np.testing.assert_array_equal(pfd[b], ref[b])


def test_views_with_gaps_are_bounded_by_their_rows():
    # Views of the first half of each layer: the layers are N rows apart but hold N/2 rows, so an
    # index in the second half is out of range although it lies inside the pool.
    pool = rand(L, N, H, D)
    half = [pool[l, :N // 2] for l in range(L)]
    pfd = [rand(N // P, L, P, H, D)]
    before = pfd[0].copy()
    si = np.arange(N // 2, N // 2 + P)
    with pytest.raises(ValueError, match=re.escape(f"src_indices[0] = {N // 2} is out of range")):
        kv.transfer_kv_all_layer_direct_lf_pf(half, pfd, si, np.arange(P), P)
    np.testing.assert_array_equal(pfd[0], before)
    kv.transfer_kv_all_layer_direct_lf_pf(half, pfd, si - N // 2, np.arange(P), P)
    for l in range(L):
        np.testing.assert_array_equal(pfd[0][0, l], pool[l, :P])
