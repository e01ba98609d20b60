"""The torch-facing API on CPU tensors (Debian's python3-torch, no GPU): kvtier.ops regions and
transfers over torch tensors, scatter_dense / gather_dense of [batch, heads, seq, head_dim]
tensors (non-contiguous views included), compat.sgl_kernel over torch tensors and torch index
tensors against torch's own advanced indexing, its argument checks, and torch.ops.kvtier. Every
destination starts poisoned, so a copy that writes nothing or the wrong rows fails. A required
test under CI=true (conftest.py: torch is in REQUIRED_MODULES); the GPU variants are
test_gpu_*.py."""

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kvtier  # noqa: E402
from kvtier import ops  # noqa: E402
from kvtier.compat import sgl_kernel as kv  # noqa: E402

L, N, H, D, P = 3, 64, 2, 8, 4
ITEM = H * D * 2  # bytes of one token of one layer at fp16/bf16
POISON = -7.0

gen = torch.Generator().manual_seed(2024)


def rand(*shape, dtype=torch.float16):
    return torch.randn(*shape, generator=gen).to(dtype)


def poisoned(*shape, dtype=torch.float16):
    return torch.full(shape, POISON, dtype=dtype)


def indices(count, dtype=torch.int64):
    perm_s = torch.randperm(N, generator=gen)[:count]
    perm_d = torch.randperm(N, generator=gen)[:count]
    return perm_s.to(dtype), perm_d.to(dtype)


def same_bytes(a, b):
    """Bitwise equality (NaN payloads and -0.0 included), whatever the dtype."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# ---- kvtier.ops over torch tensors ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_ops_transfer_between_torch_regions(dtype):
    slot_bytes = H * D * torch.tensor([], dtype=dtype).element_size()
    src_k, src_v = rand(L, N, H, D, dtype=dtype), rand(L, N, H, D, dtype=dtype)
    dst_k, dst_v = poisoned(L, N, H, D, dtype=dtype), poisoned(L, N, H, D, dtype=dtype)
    src = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=slot_bytes, k=src_k, v=src_v,
                       name="src")
    dst = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=slot_bytes, k=dst_k, v=dst_v,
                       name="dst")
    assert not src.on_device
    si, di = indices(13)
    ops.transfer_layer(src, dst, si, di, layer=1)
    want_k, want_v = poisoned(L, N, H, D, dtype=dtype), poisoned(L, N, H, D, dtype=dtype)
    want_k[1, di], want_v[1, di] = src_k[1, si], src_v[1, si]
    assert same_bytes(dst_k, want_k) and same_bytes(dst_v, want_v)
    si, di = indices(2 * P, dtype=torch.int32)  # int32 index tensors too
    ops.transfer_all_layers(src, dst, si, di)
    want_k[:, di.long()], want_v[:, di.long()] = src_k[:, si.long()], src_v[:, si.long()]
    assert same_bytes(dst_k, want_k) and same_bytes(dst_v, want_v)


def test_ops_refuse_bad_torch_arguments():
    k = rand(L, N, H, D)
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=ITEM, k=k, v=rand(L, N, H, D))
    si, di = indices(4)
    with pytest.raises(ValueError, match="src_indices"):
        ops.transfer_all_layers(region, region, si.to(torch.float32), di)
    with pytest.raises(ValueError, match=r"src_indices\[0\]"):
        ops.transfer_all_layers(region, region, si + N, di)
    with pytest.raises((ValueError, kvtier.InvalidArgumentError), match="slot_bytes"):
        ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=ITEM + 2, k=k, v=k)


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_scatter_and_gather_dense_torch(mla):
    batch, seq = 2, 5
    pool_k = poisoned(L, N, H, D)
    pool_v = None if mla else poisoned(L, N, H, D)
    pool = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=ITEM, k=pool_k, v=pool_v,
                        mla=mla, name="pool")
    # [batch, heads, seq, head_dim], the second a non-contiguous view (a transpose).
    k = [rand(batch, H, seq, D) for _ in range(L)]
    v = None if mla else [rand(batch, seq, H, D).transpose(1, 2) for _ in range(L)]
    assert mla or not v[0].is_contiguous()
    slots = torch.randperm(N, generator=gen)[:batch * seq]
    ops.scatter_dense(pool, slots, k, v)
    for layer in range(L):
        # token (b, t) -> slots[b * seq + t]: pool row = k[b, :, t, :]
        want = k[layer].permute(0, 2, 1, 3).reshape(batch * seq, H, D)
        assert same_bytes(pool_k[layer, slots], want)
        if not mla:
            want_v = v[layer].permute(0, 2, 1, 3).reshape(batch * seq, H, D)
            assert same_bytes(pool_v[layer, slots], want_v)
    others = torch.ones(N, dtype=torch.bool)
    others[slots] = False
    assert bool((pool_k[:, others] == POISON).all()), "a slot outside the list was written"
    back_k = [poisoned(batch, H, seq, D) for _ in range(L)]
    back_v = None if mla else [poisoned(batch, H, seq, D) for _ in range(L)]
    ops.gather_dense(pool, slots.view(batch, seq), back_k, back_v)
    for layer in range(L):
        assert same_bytes(back_k[layer], k[layer])
        if not mla:
            assert same_bytes(back_v[layer], v[layer])
    with pytest.raises(ValueError, match="slot"):
        ops.scatter_dense(pool, slots + N, k, v)


# ---- compat.sgl_kernel over torch tensors -----------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sgl_kernel_per_layer_and_all_layer_on_torch(dtype):
    sk, sv = rand(N, H, D, dtype=dtype), rand(N, H, D, dtype=dtype)
    dk, dv = poisoned(N, H, D, dtype=dtype), poisoned(N, H, D, dtype=dtype)
    rk, rv = dk.clone(), dv.clone()
    si, di = indices(10)
    kv.transfer_kv_per_layer(sk, dk, sv, dv, si, di, ITEM)
    rk[di], rv[di] = sk[si], sv[si]
    assert same_bytes(dk, rk) and same_bytes(dv, rv)

    # page_first host pool -> per-layer device-side buffers, layer 2
    pf_k, pf_v = rand(N, L, H, D, dtype=dtype), rand(N, L, H, D, dtype=dtype)
    dk, dv = poisoned(N, H, D, dtype=dtype), poisoned(N, H, D, dtype=dtype)
    rk, rv = dk.clone(), dv.clone()
    si, di = indices(10)
    kv.transfer_kv_per_layer_pf_lf(pf_k, dk, pf_v, dv, si, di, 2, ITEM, L * ITEM)
    rk[di], rv[di] = pf_k[si, 2], pf_v[si, 2]
    assert same_bytes(dk, rk) and same_bytes(dv, rv)

    # all layers: per-layer tensors addressed through uint64 pointer tables (torch tensors)
    src_k = [rand(N, H, D, dtype=dtype) for _ in range(L)]
    src_v = [rand(N, H, D, dtype=dtype) for _ in range(L)]
    dst_k = [poisoned(N, H, D, dtype=dtype) for _ in range(L)]
    dst_v = [poisoned(N, H, D, dtype=dtype) for _ in range(L)]

    def table(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64) \
            if hasattr(torch, "uint64") else np.array([t.data_ptr() for t in ts], np.uint64)

    si, di = indices(12)
    want_k = [t.clone() for t in dst_k]
    want_v = [t.clone() for t in dst_v]
    kv.transfer_kv_all_layer(table(src_k), table(dst_k), table(src_v), table(dst_v), si, di, ITEM,
                             L)
    for layer in range(L):
        want_k[layer][di], want_v[layer][di] = src_k[layer][si], src_v[layer][si]
        assert same_bytes(dst_k[layer], want_k[layer])
        assert same_bytes(dst_v[layer], want_v[layer])


def test_sgl_kernel_direct_on_torch():
    src = [rand(N, H, D) for _ in range(2 * L)]
    dst = [poisoned(N, H, D) for _ in range(2 * L)]
    want = [t.clone() for t in dst]
    si, di = indices(2 * P)
    kv.transfer_kv_direct(src, dst, si, di, 1)
    for s, d, w in zip(src, dst, want):
        w[di] = s[si]
        assert same_bytes(d, w)


def test_sgl_kernel_argument_checks_on_torch():
    a, b = rand(N, H, D), rand(N, H, D)
    pf = rand(N, L, H, D)
    si, di = indices(10)
    cases = [
        (lambda: kv.transfer_kv_per_layer(a, b, a, b, si, di, 6), "item_size = 6"),
        (lambda: kv.transfer_kv_per_layer(a, b, a, b, si, di[:3], ITEM),
         "src_indices and dst_indices differ in length"),
        (lambda: kv.transfer_kv_per_layer(a, b, a, b, si + N, di, ITEM), "src_indices[0]"),
        (lambda: kv.transfer_kv_per_layer(a, b, a, b, si.to(torch.float32), di, ITEM),
         "src_indices"),
        (lambda: kv.transfer_kv_per_layer(a, b, a, b, si, di, 4 * N * ITEM), "src_k holds"),
        (lambda: kv.transfer_kv_per_layer_pf_lf(pf, b, pf, b, si, di, L, ITEM, L * ITEM),
         "src_layer = 3"),
        (lambda: kv.transfer_kv_direct([a], [b, b], si, di, 1), "src_layers has 1 tensors"),
        (lambda: kv.transfer_kv_direct([a], [rand(N, 1, D)], si, di, 1), "dst_layers[0] has"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()


def test_torch_ops_are_registered_once_torch_is_imported():
    import kvtier.compat.torch_ops  # noqa: F401  (imported by sgl_kernel when torch is loaded)
    assert hasattr(torch.ops.kvtier, "transfer_kv_per_layer")
    sk, sv = rand(N, H, D), rand(N, H, D)
    dk, dv = poisoned(N, H, D), poisoned(N, H, D)
    rk, rv = dk.clone(), dv.clone()
    si, di = indices(10)
    torch.ops.kvtier.transfer_kv_per_layer(sk, dk, sv, dv, si, di, ITEM)
    rk[di], rv[di] = sk[si], sv[si]
    assert same_bytes(dk, rk) and same_bytes(dv, rv)
