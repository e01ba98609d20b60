"""kvtier.compat.sgl_kernel on a GPU with PyTorch: every function against a PyTorch advanced-indexing
reference, bf16 and fp16, MHA and MLA, page sizes {1, 16, 64, 128} x item counts
{1, 128, 1024, 8192}, on a side stream and on the legacy default stream. Destinations are poisoned
with random data first and compared byte for byte (as int16), untouched slots included.

Skipped without torch, without a GPU, or when kvtier was built without CUDA."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import kvtier  # noqa: E402
from kvtier import ops  # noqa: E402
from kvtier.compat import sgl_kernel as kv  # noqa: E402
from kv_reference import random_indices  # noqa: E402

if not kvtier.built_with_cuda():
    pytest.skip("kvtier built without CUDA", allow_module_level=True)

L, N, H, D = 4, 16384, 2, 64  # MHA: item_size = H*D*2 = 256 bytes
MLA_DIM = 576                 # kv_lora_rank 512 + rope 64: item_size = 1152 bytes
PAGE_SIZES = (1, 16, 64, 128)
ITEM_COUNTS = (1, 128, 1024, 8192)
DTYPES = [torch.bfloat16, torch.float16]
STREAMS = ["default", "side"]
dev = torch.device("cuda")


def rand(shape, dtype, where):
    t = torch.randn(shape, dtype=dtype, device=dev if where == "gpu" else "cpu")
    return t.pin_memory() if where == "pinned" else t


def pinned(shape, dtype):
    """A pinned host tensor, allocated once per test; `refill` gives it new bytes per case."""
    return torch.empty(shape, dtype=dtype, pin_memory=True)


def refill(*hosts):
    """New random bytes (drawn on the GPU) in each pinned host tensor; returns GPU copies of them,
    which the reference indexes. The copy to the host is synchronous."""
    mirrors = []
    for h in hosts:
        g = torch.randn(h.shape, dtype=h.dtype, device=dev)
        h.copy_(g)
        mirrors.append(g)
    return mirrors


def bits(t):
    return t.view(torch.int16)


def assert_same(got, want):
    """Byte-for-byte equality (as int16), compared on the GPU."""
    g = bits(got if got.is_cuda else got.to(dev))
    w = bits(want if want.is_cuda else want.to(dev))
    if not torch.equal(g, w):
        bad = (g != w).nonzero()
        raise AssertionError(f"{bad.shape[0]} elements differ, first at {bad[0].tolist()}")


def cases(direct=False):
    """(page_size, src_idx, dst_idx) for every page size x item count, as int64 tensors on the GPU
    (SGLang passes device indices). Direct functions need whole pages: counts round up."""
    rng = np.random.default_rng(2024)
    for p in PAGE_SIZES:
        for n in ITEM_COUNTS:
            count = -(-n // p) * p if direct else n
            si = random_indices(rng, count, N, p)
            di = random_indices(rng, count, N, p)
            yield p, torch.from_numpy(si).to(dev), torch.from_numpy(di).to(dev)


def run_on(stream_kind, fn):
    """Runs `fn` on the legacy default stream or on a side stream, then waits for the device."""
    if stream_kind == "default":
        assert torch.cuda.current_stream().cuda_stream == 0  # the legacy default stream
        fn()
    else:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            assert torch.cuda.current_stream().cuda_stream != 0
            fn()
        torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def ptr_table(tensors):
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=dev).view(
        torch.uint64 if hasattr(torch, "uint64") else torch.int64)


def page_head_shape(p):
    return (N // p, H, p, L, D)


# ---- per-layer loads: host pool -> one device layer --------------------------------------------

@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("host_layout", ["lf", "pf", "ph"])
def test_per_layer_mha(host_layout, dtype, stream):
    item = H * D * dtype.itemsize
    layer = 2
    dk, dv = rand((N, H, D), dtype, "gpu"), rand((N, H, D), dtype, "gpu")
    flat_k, flat_v = pinned((L * N * H * D,), dtype), pinned((L * N * H * D,), dtype)
    for p, si, di in cases():
        if host_layout == "lf":
            hk, hv = flat_k.view(L, N, H, D), flat_v.view(L, N, H, D)
            call = lambda: kv.transfer_kv_per_layer(hk[layer], dk, hv[layer], dv, si, di, item)
            ref = lambda h, s: h[layer][s]
        elif host_layout == "pf":
            hk, hv = flat_k.view(N, L, H, D), flat_v.view(N, L, H, D)
            call = lambda: kv.transfer_kv_per_layer_pf_lf(hk, dk, hv, dv, si, di, layer, item,
                                                          L * item)
            ref = lambda h, s: h[s, layer]
        else:
            hk, hv = flat_k.view(page_head_shape(p)), flat_v.view(page_head_shape(p))
            call = lambda: kv.transfer_kv_per_layer_ph_lf(hk, dk, hv, dv, si, di, layer, item,
                                                          L * item, p, H)
            ref = lambda h, s: h[s // p, :, s % p, layer]
        gk, gv = refill(hk, hv)
        wk, wv = dk.clone(), dv.clone()
        run_on(stream, call)
        wk[di], wv[di] = ref(gk, si), ref(gv, si)
        assert_same(dk, wk)
        assert_same(dv, wv)


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("host_layout", ["lf", "pf"])
def test_per_layer_mla(host_layout, dtype, stream):
    item = MLA_DIM * dtype.itemsize
    layer = L - 1
    d = rand((N, 1, MLA_DIM), dtype, "gpu")
    h = pinned((L, N, 1, MLA_DIM) if host_layout == "lf" else (N, L, 1, MLA_DIM), dtype)
    for p, si, di in cases():
        (g,) = refill(h)
        if host_layout == "lf":
            call = lambda: kv.transfer_kv_per_layer_mla(h[layer], d, si, di, item)
            want = g[layer][si]
        else:
            call = lambda: kv.transfer_kv_per_layer_mla_pf_lf(h, d, si, di, layer, item, L * item)
            want = g[si, layer]
        w = d.clone()
        run_on(stream, call)
        w[di] = want
        assert_same(d, w)


# ---- all-layer backups: device per-layer tables -> host pool -----------------------------------

@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("host_layout", ["lf", "pf", "ph"])
def test_all_layer_mha(host_layout, dtype, stream):
    item = H * D * dtype.itemsize
    dk = [rand((N, H, D), dtype, "gpu") for _ in range(L)]
    dv = [rand((N, H, D), dtype, "gpu") for _ in range(L)]
    tk, tv = ptr_table(dk), ptr_table(dv)
    if host_layout == "lf":
        hk = [pinned((N, H, D), dtype) for _ in range(L)]
        hv = [pinned((N, H, D), dtype) for _ in range(L)]
        hk_table, hv_table = ptr_table(hk), ptr_table(hv)
        for p, si, di in cases():
            wk, wv = refill(*hk), refill(*hv)
            run_on(stream, lambda: kv.transfer_kv_all_layer(tk, hk_table, tv, hv_table, si, di,
                                                            item, L))
            for l in range(L):
                wk[l][di], wv[l][di] = dk[l][si], dv[l][si]
                assert_same(hk[l], wk[l])
                assert_same(hv[l], wv[l])
        return
    flat_k, flat_v = pinned((L * N * H * D,), dtype), pinned((L * N * H * D,), dtype)
    for p, si, di in cases():
        shape = (N, L, H, D) if host_layout == "pf" else page_head_shape(p)
        hk, hv = flat_k.view(shape), flat_v.view(shape)
        if host_layout == "pf":
            call = lambda: kv.transfer_kv_all_layer_lf_pf(tk, hk, tv, hv, si, di, item, L * item, L)
        else:
            call = lambda: kv.transfer_kv_all_layer_lf_ph(tk, hk, tv, hv, si, di, item, L * item,
                                                          L, p, H)
        wk, wv = refill(hk, hv)
        run_on(stream, call)
        for l in range(L):
            for w, src in ((wk, dk[l]), (wv, dv[l])):
                if host_layout == "pf":
                    w[di, l] = src[si]
                else:
                    w[di // p, :, di % p, l] = src[si]
        assert_same(hk, wk)
        assert_same(hv, wv)


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("host_layout", ["lf", "pf"])
def test_all_layer_mla(host_layout, dtype, stream):
    item = MLA_DIM * dtype.itemsize
    d = [rand((N, 1, MLA_DIM), dtype, "gpu") for _ in range(L)]
    t = ptr_table(d)
    if host_layout == "lf":
        h = [pinned((N, 1, MLA_DIM), dtype) for _ in range(L)]
        h_table = ptr_table(h)
        for p, si, di in cases():
            w = refill(*h)
            run_on(stream, lambda: kv.transfer_kv_all_layer_mla(t, h_table, si, di, item, L))
            for l in range(L):
                w[l][di] = d[l][si]
                assert_same(h[l], w[l])
        return
    h = pinned((N, L, 1, MLA_DIM), dtype)
    for p, si, di in cases():
        (w,) = refill(h)
        run_on(stream, lambda: kv.transfer_kv_all_layer_mla_lf_pf(t, h, si, di, item, L * item, L))
        for l in range(L):
            w[di, l] = d[l][si]
        assert_same(h, w)


# ---- direct functions (copy engines) -----------------------------------------------------------

@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_direct(mla, dtype, stream):
    n = L if mla else 2 * L
    shape = (N, 1, MLA_DIM) if mla else (N, H, D)
    gpu = [rand(shape, dtype, "gpu") for _ in range(n)]
    host = [pinned(shape, dtype) for _ in range(n)]
    for p, si, di in cases(direct=True):
        # device -> host (backup), then host -> device (load); device indices for the backup,
        # host indices for the load (the direct functions take indices on any device)
        wh = refill(*host)
        run_on(stream, lambda: kv.transfer_kv_direct(gpu, host, si, di, p))
        for j in range(n):
            wh[j][di] = gpu[j][si]
            assert_same(host[j], wh[j])
        wg = [x.clone() for x in gpu]
        run_on(stream, lambda: kv.transfer_kv_direct(host, gpu, di.cpu(), si.cpu(), p))
        for j in range(n):
            wg[j][si] = wh[j][di]
            assert_same(gpu[j], wg[j])


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_page_first_direct(mla, dtype, stream):
    nb = 1 if mla else 2
    tail = (1, MLA_DIM) if mla else (H, D)
    per_slot = MLA_DIM if mla else H * D
    flat = [pinned((N * L * per_slot,), dtype) for _ in range(nb)]
    gpu = [rand((N,) + tail, dtype, "gpu") for _ in range(nb * L)]  # L K layers, L V layers
    targets = [rand((N,) + tail, dtype, "gpu") for _ in range(nb)]
    layer = 1
    for p, si, di in cases(direct=True):
        pool = [f.view((N // p, L, p) + tail) for f in flat]
        # backup: every device layer -> host page_first_direct pool
        wp = refill(*pool)
        run_on(stream, lambda: kv.transfer_kv_all_layer_direct_lf_pf(gpu, pool, si, di, p))
        for b in range(nb):
            for l in range(L):
                wp[b][di // p, l, di % p] = gpu[b * L + l][si]
            assert_same(pool[b], wp[b])
        # load: layer 1 of the host pool -> one device layer ([K_1, V_1] or [KV_1])
        wt = [x.clone() for x in targets]
        run_on(stream, lambda: kv.transfer_kv_per_layer_direct_pf_lf(pool, targets, di, si, layer,
                                                                     p))
        for b in range(nb):
            wt[b][si] = wp[b][di // p, layer, di % p]
            assert_same(targets[b], wt[b])


# dma engine settings of the batch split (TransferEngineConfig::dma_batch_split,
# dma_first_batch_piece), as python/bench/sglang_kernels.py's variants set them.
BATCH_SPLITS = {
    "default": {},
    "first-piece-64": {"dma_first_batch_piece": 64},
    "whole-batch": {"dma_batch_split": "whole"},
    "whole-when-busy": {"dma_batch_split": "whole_when_busy"},
}


@pytest.mark.parametrize("held", [False, True], ids=["idle", "held"])
@pytest.mark.parametrize("split", list(BATCH_SPLITS))
@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_page_first_direct_load_goes_out_in_the_configured_batch_calls(mla, split, held):
    """A per-layer load of 128 random pages of 64 (SGLang's page-64 row): the dma engine's single
    copies go out in cudaMemcpyBatchAsync calls of 16, 32, 32, ... (BatchPieces, dma_plan.h; from
    64 with dma_first_batch_piece=64), or in one call (dma_batch_split=whole, and
    whole_when_busy where the stream is held by a sleep kernel as the call is made), every byte
    right; without the batch API (driver < 12.8) one cudaMemcpyAsync each."""
    from kvtier import _kvtier

    p, nb, layer = 64, 1 if mla else 2, 2
    tail = (1, MLA_DIM) if mla else (H, D)
    pool = [pinned((N // p, L, p) + tail, torch.bfloat16) for _ in range(nb)]
    want = refill(*pool)
    targets = [rand((N,) + tail, torch.bfloat16, "gpu") for _ in range(nb)]
    rng = np.random.default_rng(37)
    si = torch.from_numpy(random_indices(rng, 8192, N, p))
    di = torch.from_numpy(random_indices(rng, 8192, N, p))
    wt = [x.clone() for x in targets]
    old = ops.engine_config()
    ops.configure(**BATCH_SPLITS[split])
    busy_after_call = False
    try:
        torch.cuda.synchronize()  # the side stream starts empty: nothing for it to wait on
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            if held:
                torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time ahead of the copies
            kv.transfer_kv_per_layer_direct_pf_lf(pool, targets, si, di, layer, p)
            busy_after_call = not side.query()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        stats = _kvtier.sgl_direct_last_stats(torch.cuda.current_device())
    finally:
        torch.cuda.synchronize()
        ops.configure(**old)
    for b in range(nb):
        wt[b][di.to(dev)] = want[b][si.to(dev) // p, layer, si.to(dev) % p]
        assert_same(targets[b], wt[b])
    singles = stats["copy_ops"] - stats["copies_2d"]
    assert stats["lanes"] == 1 and 0 < stats["copy_ops"] <= 128 * nb
    if stats["batch_calls"] == 0:  # no batch API: one cudaMemcpyAsync each
        return
    settings = dict(ops.engine_config(), **BATCH_SPLITS[split])
    whole = settings["dma_batch_split"] == "whole"
    if settings["dma_batch_split"] == "whole_when_busy":
        # Held: a stream still busy after the call (the sleep kernel ahead of the copies) was
        # busy when the engine asked. Idle: the stream was empty (CPU indices: the call enqueues
        # nothing before its copies).
        whole = held
        if held and not busy_after_call:
            whole = stats["whole_batch"]  # the sleep ended first (not seen): either is right
    assert stats["whole_batch"] == whole, stats
    first = settings["dma_first_batch_piece"]
    pieces, piece, left = 0, first, singles if singles >= 2 else 0  # BatchPieces' rule
    while left > 0:
        left -= left if whole or 2 * left <= 3 * piece else piece
        piece, pieces = min(max(2 * first, singles // 16), 2 * piece), pieces + 1
    # + 1: the strided copies' cudaMemcpy3DBatchAsync, when the plan grouped two or more.
    allowed = {pieces, pieces + 1} if stats["copies_2d"] >= 2 else {pieces}
    assert stats["batch_calls"] in allowed, (stats, pieces)


# ---- stream semantics, errors -------------------------------------------------------------------

def test_copy_is_ordered_on_the_current_side_stream():
    """A copy enqueued under `with torch.cuda.stream(side)` waits behind earlier work on `side`."""
    dtype = torch.bfloat16
    item = H * D * 2
    dk = [rand((N, H, D), dtype, "gpu") for _ in range(L)]
    dv = [rand((N, H, D), dtype, "gpu") for _ in range(L)]
    hk, hv = rand((N, L, H, D), dtype, "pinned"), rand((N, L, H, D), dtype, "pinned")
    before = hk.clone()
    si = torch.arange(0, 4096, device=dev)
    di = torch.arange(4096, 8192, device=dev)
    tk, tv = ptr_table(dk), ptr_table(dv)
    # Warm-up on the default stream: the first call reads the pointer tables back to the host
    # (a blocking read on the current stream); later calls use the cached copy.
    kv.transfer_kv_all_layer_lf_pf(tk, hk, tv, hv, si, di, item, L * item, L)
    torch.cuda.synchronize()
    hk.copy_(before)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time on `side`
        kv.transfer_kv_all_layer_lf_pf(tk, hk, tv, hv, si, di, item, L * item, L)
    assert torch.equal(bits(hk), bits(before)), "the copy did not wait for the side stream"
    side.synchronize()
    assert_same(hk[4096:8192], torch.stack([t[:4096] for t in dk], dim=1).cpu())


def test_out_of_range_device_index_is_reported():
    dtype = torch.float16
    item = H * D * 2
    src, dst = rand((N, H, D), dtype, "gpu"), rand((N, H, D), dtype, "gpu")
    before = dst.clone()
    si = torch.tensor([0, 1], device=dev)
    di = torch.tensor([5, N + 7], device=dev)  # the second is out of range
    kv.transfer_kv_per_layer(src, dst, src, dst, si, di, item)
    with pytest.raises(ValueError, match="out-of-range device indices"):
        ops.synchronize("kernel")
    torch.cuda.synchronize()
    assert_same(dst[6:], before[6:])  # nothing written past the valid slot


def test_pageable_host_memory_is_refused_by_the_kernel_backend():
    item = H * D * 2
    host = torch.randn((N, H, D), dtype=torch.float16)  # not pinned
    gpu = rand((N, H, D), torch.float16, "gpu")
    idx = torch.arange(8, device=dev)
    with pytest.raises(ValueError, match="pinned"):
        kv.transfer_kv_per_layer(host, gpu, host, gpu, idx, idx, item)


def test_too_small_device_buffer_is_refused():
    item = H * D * 2
    host = rand((L, N, H, D), torch.float16, "pinned")
    small = rand((16, H, D), torch.float16, "gpu")
    idx = torch.arange(8, device=dev)
    far = torch.tensor([0, 1, 2, 3, 4, 5, 6, 100])
    with pytest.raises(ValueError, match="dst_indices"):
        kv.transfer_kv_per_layer(host[0], small, host[1], small, idx.cpu(), far, item)


@pytest.mark.parametrize("memory", ["pinned", "registered"])
@pytest.mark.parametrize("table_on", ["host", "gpu"])
def test_pointer_table_into_host_memory_is_bounded(memory, table_on):
    """A pointer table whose entries point into pinned (cudaHostAlloc) or registered
    (cudaHostRegister) host memory: an index past the allocation is a ValueError before anything
    moves, as for device memory (a registered numpy array was written past its end before)."""
    dtype = torch.float16
    item = H * D * 2
    dk = [rand((N, H, D), dtype, "gpu") for _ in range(L)]
    dv = [rand((N, H, D), dtype, "gpu") for _ in range(L)]
    cudart = torch.cuda.cudart()
    arrays = []
    if memory == "pinned":
        hk = [pinned((N, H, D), dtype) for _ in range(L)]
        hv = [pinned((N, H, D), dtype) for _ in range(L)]
    else:
        arrays = [np.zeros((N, H, D), np.float16) for _ in range(2 * L)]
        for a in arrays:
            assert int(cudart.cudaHostRegister(a.ctypes.data, a.nbytes, 0)) == 0
        hk = [torch.from_numpy(a) for a in arrays[:L]]
        hv = [torch.from_numpy(a) for a in arrays[L:]]
    try:
        def table(tensors):
            t = ptr_table(tensors)
            return t.cpu().numpy() if table_on == "host" else t

        before = [t.clone() for t in hk]
        si = torch.tensor([0, 1])
        for far in (N, N + 1, 10**9):
            di = torch.tensor([2, far])
            with pytest.raises(ValueError, match="dst_indices"):
                kv.transfer_kv_all_layer(table(dk), table(hk), table(dv), table(hv), si, di, item,
                                         L)
        torch.cuda.synchronize()
        for t, b in zip(hk, before):
            assert_same(t, b)  # nothing moved
        # The last valid slot still works.
        di = torch.tensor([2, N - 1])
        kv.transfer_kv_all_layer(table(dk), table(hk), table(dv), table(hv), si, di, item, L)
        torch.cuda.synchronize()
        for l in range(L):
            assert_same(hk[l][N - 1], dk[l][1].cpu())
    finally:
        for a in arrays:
            cudart.cudaHostUnregister(a.ctypes.data)
