"""kvtier.ops.scatter_dense / gather_dense on a GPU: byte-for-byte against torch indexing over
random strided CUDA views (bf16, fp16, fp32, fp8), layer_first and page_first pools, MHA and MLA,
device and host slot lists of both index types, poisoned destinations; out-of-range device slots
are skipped and counted. And the engine-facing cache handles: device slot lists on the pool's
GPU, release / free_device_slots parked behind an engine stream. Skipped without torch, a GPU or
a CUDA build of kvtier."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import kvtier  # noqa: E402
from kvtier import ops  # noqa: E402

if not kvtier.built_with_cuda():
    pytest.skip("kvtier built without CUDA", allow_module_level=True)

dev = torch.device("cuda")
DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]


def random_of(shape, dtype, gen):
    raw = torch.randint(0, 256, (*shape, torch.tensor([], dtype=dtype).element_size()),
                        dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape).to(dev)


def strided(shape, dtype, gen):
    """A random non-contiguous CUDA view of `shape` (permuted, padded, head_dim maybe strided)."""
    nd = len(shape)
    order = torch.randperm(nd, generator=gen).tolist()
    step = int(torch.randint(1, 3, (1,), generator=gen))
    base_shape = [shape[a] + 1 for a in order]
    base_shape[order.index(nd - 1)] = shape[-1] * step + 1
    base = random_of(base_shape, dtype, gen)
    inverse = [order.index(a) for a in range(nd)]
    view = base.permute(*inverse)
    index = tuple(slice(0, n) if a < nd - 1 else slice(0, n * step, step)
                  for a, n in enumerate(shape))
    return view[index]


def as_bytes(t):
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_scatter_gather_match_torch_indexing(dtype, layout, mla):
    gen = torch.Generator().manual_seed(hash((str(dtype), layout, mla)) % 2**31)
    for trial in range(4):
        L = int(torch.randint(1, 5, (1,), generator=gen))
        H = 1 if mla else int(torch.randint(1, 5, (1,), generator=gen))
        D = int(torch.randint(1, 5, (1,), generator=gen)) * 16
        B, T, P = int(torch.randint(1, 3, (1,), generator=gen)), 37 + trial, 4
        N = P * ((B * T) // P + 4)
        isz = torch.tensor([], dtype=dtype).element_size()
        S = H * D * isz
        # The pool in bytes, canonical [L, N, S] view for the reference.
        if layout == "layer_first":
            bufs = [torch.full((L, N, S), 0xA5, dtype=torch.uint8, device=dev) for _ in range(2)]
            canon = [b for b in bufs]
        else:
            bufs = [torch.full((N, L, S), 0xA5, dtype=torch.uint8, device=dev) for _ in range(2)]
            canon = [b.permute(1, 0, 2) for b in bufs]
        region = ops.KvRegion(layout=layout, num_layers=L, slot_bytes=S, page_size=P, k=bufs[0],
                              v=None if mla else bufs[1], mla=mla)
        slots = torch.randperm(N, generator=gen)[:B * T]
        slots = slots.to(torch.int32 if trial % 2 else torch.int64)
        if trial < 2:
            slots = slots.to(dev)
        dk = strided((L, B, H, T, D), dtype, gen)
        dv = None if mla else [strided((B, H, T, D), dtype, gen) for _ in range(L)]
        ops.scatter_dense(region, slots, dk, dv)
        torch.cuda.synchronize()
        idx = slots.to(dev).long()
        for i, dense in enumerate([[dk[l] for l in range(L)]] + ([] if mla else [dv])):
            want = torch.full_like(canon[i], 0xA5)
            for l in range(L):
                rows = as_bytes(dense[l].permute(0, 2, 1, 3)).reshape(B * T, S)
                want[l, idx] = rows
            assert torch.equal(canon[i], want), f"pool buffer {i} differs (trial {trial})"
        gk = [strided((B, H, T, D), dtype, gen) for _ in range(L)]
        gv = None if mla else strided((L, B, H, T, D), dtype, gen)
        for g in gk + ([] if mla else [gv]):
            g.copy_(random_of(tuple(g.shape), dtype, gen))  # poison
        ops.gather_dense(region, slots, gk, gv)
        torch.cuda.synchronize()
        for l in range(L):
            assert torch.equal(as_bytes(gk[l]), as_bytes(dk[l]))
            if not mla:
                assert torch.equal(as_bytes(gv[l]), as_bytes(dv[l]))
    assert ops.dense_paged_errors(0) == 0


def test_out_of_range_device_slots_are_skipped_and_counted():
    L, N, H, D = 2, 64, 2, 64
    k = torch.zeros((L, N, H, D), dtype=torch.bfloat16, device=dev)
    v = torch.zeros_like(k)
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=H * D * 2, k=k, v=v)
    dense = torch.ones((L, 1, H, 3, D), dtype=torch.bfloat16, device=dev)
    ops.dense_paged_errors(0)
    ops.scatter_dense(region, torch.tensor([5, 1000, 7], device=dev), dense, dense)
    assert ops.dense_paged_errors(0) == 1
    assert ops.dense_paged_errors(0) == 0
    assert k[:, 5].eq(1).all() and k[:, 7].eq(1).all()
    assert int(k.ne(0).sum()) == 2 * L * H * D


def make_cache(**kwargs):
    L, N, S, P = 2, 256, 256, 16
    k = torch.zeros((L, N, S), dtype=torch.uint8, device=dev)
    v = torch.zeros_like(k)
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, page_size=P, k=k, v=v)
    return kvtier.HierarchicalCache(region, write_policy="write_through", **kwargs), P


def test_slot_lists_live_on_the_pools_device_unless_asked_otherwise():
    cache, P = make_cache()
    slots = cache.allocate_device_slots(2 * P)
    assert slots.device.type == "cuda"
    cache.insert(list(range(2 * P)), slots)
    with cache.match(list(range(2 * P))) as m:
        assert m.device_slots.device.type == "cuda" and m.host_slots.device.type == "cpu"
        assert torch.equal(m.device_slots.cpu(), slots.cpu())
    cache.close()
    cache, P = make_cache(slots_on_device=False)
    assert cache.allocate_device_slots(P).device.type == "cpu"
    cache.close()


def test_release_and_free_wait_for_the_engine_stream():
    cache, P = make_cache()
    tokens = list(range(2 * P))
    cache.insert(tokens, cache.allocate_device_slots(2 * P))
    engine = torch.cuda.Stream()
    m = cache.match(tokens)
    held = cache.allocate_device_slots(P)
    with torch.cuda.stream(engine):
        torch.cuda._sleep(200_000_000)  # the engine still reads the slots on its stream
    cache.release(m, stream=engine)
    cache.free_device_slots(held, stream=engine)
    stats = cache.stats()
    assert stats["live_handles"] == 1, "released before the engine's stream was done"
    assert stats["device_engine_tokens"] == P, "freed before the engine's stream was done"
    engine.synchronize()
    stats = cache.stats()
    assert stats["live_handles"] == 0 and stats["device_engine_tokens"] == 0
    # load_back ordered after another stream: runs, and the bytes are the cache's.
    cache.wait_for_backups()
    cache.evict_device(1 << 30)
    with cache.match(tokens) as m2:
        loaded = cache.load_back(m2, after=[engine])
        assert loaded.loaded_tokens == 2 * P and loaded.device_slots.device.type == "cuda"
    cache.close()
