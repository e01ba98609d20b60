"""The C++ argument path of kvtier.compat.sgl_kernel and kvtier.ops with torch tensors on a GPU:
every bad argument raises ValueError naming it, with the destination untouched; uint64 pointer
tables are bounded by the CUDA allocations they point into.

Skipped without torch, without a GPU, or when kvtier was built without CUDA."""

import re

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import kvtier  # noqa: E402
from kvtier import ops  # noqa: E402
from kvtier.compat import sgl_kernel as kv  # noqa: E402

if not kvtier.built_with_cuda():
    pytest.skip("kvtier built without CUDA", allow_module_level=True)

L, N, H, D = 4, 1024, 2, 64
ITEM = H * D * 2
dev = torch.device("cuda")


def layers(where="gpu"):
    out = [torch.randn(N, H, D, dtype=torch.bfloat16, device=dev) for _ in range(L)]
    return out if where == "gpu" else [t.cpu().pin_memory() for t in out]


def table(ts, device=dev):
    return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64, device=device)


def idx(*values, device=dev):
    return torch.tensor(values, dtype=torch.int64, device=device)


def test_bad_arguments_name_the_argument():
    k, v = layers(), layers()
    hk, hv = layers("pinned"), layers("pinned")
    pf = torch.randn(N, L, H, D, dtype=torch.bfloat16).pin_memory()
    si, di = idx(0, 1, 2), idx(3, 4, 5)
    tk, tv = table(k), table(v)
    cases = [
        (lambda: kv.transfer_kv_per_layer(hk[0], k[0], hv[0], v[0], si, di, ITEM + 2),
         "item_size = 258"),
        (lambda: kv.transfer_kv_per_layer(hk[0], k[0], hv[0], v[0], si.float(), di, ITEM),
         "src_indices has dtype torch.float32"),
        (lambda: kv.transfer_kv_per_layer(hk[0], k[0], hv[0], v[0], si, di.view(1, 3), ITEM),
         "dst_indices must be 1-D"),
        (lambda: kv.transfer_kv_per_layer(hk[0], k[0], hv[0], v[0], si, di[:2], ITEM),
         "src_indices and dst_indices differ in length"),
        (lambda: kv.transfer_kv_per_layer(hk[0], k[0].transpose(0, 1), hv[0], v[0], si, di, ITEM),
         "dst_k must be contiguous"),
        (lambda: kv.transfer_kv_per_layer(hk[0], k[0][:2], hv[0], v[0], si, di, 4 * ITEM),
         "dst_k holds"),
        (lambda: kv.transfer_kv_per_layer(hk[0], k[0], hv[0], v[0], [0.9, 1.7, 2.0], di, ITEM),
         "src_indices must hold integers"),
        (lambda: kv.transfer_kv_per_layer(hk[0], k[0], hv[0], v[0], [True, False, True], di,
                                          ITEM), "src_indices must hold integers"),
        (lambda: kv.transfer_kv_per_layer_pf_lf(pf, k[0], pf, v[0], si, di, 1 << 70, ITEM,
                                                L * ITEM), "layer_id = "),
        (lambda: kv.transfer_kv_per_layer_pf_lf(pf, k[0], pf, v[0], si, di, L, ITEM, L * ITEM),
         "src_layer = 4"),
        (lambda: kv.transfer_kv_all_layer(tk.float(), table(hk), tv, table(hv), si, di, ITEM, L),
         "src_k_layers has dtype torch.float32"),
        (lambda: kv.transfer_kv_all_layer(tk[:2], table(hk), tv, table(hv), si, di, ITEM, L),
         "src_k_layers has shape (2,)"),
        (lambda: kv.transfer_kv_all_layer(tk, table(hk), tv, table(hv), si, di, ITEM, 1 << 64),
         "num_layers = "),
        (lambda: kv.transfer_kv_all_layer_lf_pf(tk, pf, tv, pf, si, idx(N), ITEM, L * ITEM, L),
         "dst_indices"),
    ]
    before = [t.clone() for t in k]
    for call, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
    torch.cuda.synchronize()
    for t, b in zip(k, before):
        assert torch.equal(t, b)


@pytest.mark.parametrize("index_place", ["host", "device"])
def test_pointer_tables_are_bounded_by_their_allocations(index_place):
    # A backup through per-layer pointer tables (on the GPU, as SGLang keeps them) into another
    # set of per-layer tables whose layers are separate pinned allocations: a destination index
    # of 10^9, or a source index past the pool, is an error instead of a crash.
    k, v = layers(), layers()
    hk, hv = layers("pinned"), layers("pinned")
    before = [t.clone() for t in hk]
    tk, tv, hk_t, hv_t = table(k), table(v), table(hk), table(hv)
    where = "cpu" if index_place == "host" else dev
    for si, di, name in ((idx(0, 1, device=where), idx(2, 10**9, device=where), "dst_indices"),
                         # past the pool and past the allocator's segment that holds it
                         (idx(0, 10**8, device=where), idx(2, 3, device=where), "src_indices")):
        if index_place == "host":
            with pytest.raises(ValueError, match=re.escape(name) + r"\[1\] = \d+ is out of range"):
                kv.transfer_kv_all_layer(tk, hk_t, tv, hv_t, si, di, ITEM, L)
        else:
            kv.transfer_kv_all_layer(tk, hk_t, tv, hv_t, si, di, ITEM, L)
            with pytest.raises(ValueError, match="out-of-range device indices were skipped"):
                ops.synchronize("kernel")
    torch.cuda.synchronize()
    for h, b in zip(hk, before):  # the bad pair was skipped; the good one (0 -> 2) may be copied
        assert torch.equal(h[3:], b[3:]) and torch.equal(h[:2], b[:2])


def test_gpu_table_rewritten_in_place_is_read_again():
    k, hk = layers(), layers("pinned")
    k2 = layers()
    v, hv = layers(), layers("pinned")
    tk, tv, hk_t, hv_t = table(k), table(v), table(hk), table(hv)
    kv.transfer_kv_all_layer(tk, hk_t, tv, hv_t, idx(0), idx(1), ITEM, L)
    tk.copy_(table(k2))  # torch bumps the version counter: the cached host copy is stale
    kv.transfer_kv_all_layer(tk, hk_t, tv, hv_t, idx(0), idx(1), ITEM, L)
    torch.cuda.synchronize()
    for layer in range(L):
        assert torch.equal(hk[layer][1], k2[layer][0].cpu())


def test_torch_ops_are_registered_and_copy():
    import kvtier.compat.torch_ops  # noqa: F401  (sgl_kernel registered it already: torch was in)
    hk, k = layers("pinned"), layers()
    hv, v = layers("pinned"), layers()
    si, di = idx(0, 5, 9), idx(1, 2, 3)
    torch.ops.kvtier.transfer_kv_per_layer(hk[0], k[0], hv[0], v[0], si, di, ITEM, 2, 32)
    torch.cuda.synchronize()
    assert torch.equal(k[0][di].cpu(), hk[0][si.cpu()])
    assert torch.equal(v[0][di].cpu(), hv[0][si.cpu()])


def test_torch_compile_traces_through_an_op():
    import kvtier.compat.torch_ops  # noqa: F401

    src = torch.randn(N, 1, 576, dtype=torch.bfloat16).pin_memory()
    dst = torch.zeros(N, 1, 576, dtype=torch.bfloat16, device=dev)
    si, di = idx(3, 4), idx(7, 8)

    def load_then_sum(s, d, a, b):
        torch.ops.kvtier.transfer_kv_per_layer_mla(s, d, a, b, 1152, 2, 32)
        return d.float().sum()

    compiled = torch.compile(load_then_sum, backend="aot_eager", fullgraph=True)
    got = compiled(src, dst, si, di)
    torch.cuda.synchronize()
    assert torch.equal(dst[di].cpu(), src[si.cpu()])
    assert torch.isclose(got.cpu(), src[si.cpu()].float().sum())
