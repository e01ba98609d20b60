"""kvtier.ops on a GPU with PyTorch: every layout pair host<->device on the kernel, dma and auto
backends, MHA and MLA, per-layer events, numpy host buffers pinned with PinnedRegistration, and
the example program. Skipped without torch, a GPU, or a CUDA build of kvtier."""

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import kvtier  # noqa: E402
from kvtier import ops  # noqa: E402
from kv_reference import LAYOUTS, buffer_shape, random_indices, to_canonical  # noqa: E402

if not kvtier.built_with_cuda():
    pytest.skip("kvtier built without CUDA", allow_module_level=True)

L, N, S, P, H = 3, 512, 256, 16, 4
dev = torch.device("cuda")
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch_offload.py")


def buffers(layout, mla, where, rng):
    shape = buffer_shape(layout, L, N, S, P, H)
    out = []
    for _ in range(1 if mla else 2):
        t = torch.from_numpy(rng.integers(0, 256, size=shape, dtype=np.uint8))
        out.append(t.pin_memory() if where == "host" else t.to(dev))
    return out


def region(layout, mla, bufs, name):
    return ops.KvRegion(layout=layout, num_layers=L, slot_bytes=S, page_size=P, head_num=H,
                        k=bufs[0], v=None if mla else bufs[1], mla=mla, name=name)


def canon(t, layout):
    return to_canonical(t.cpu().numpy(), layout, L, N, S, P, H)


@pytest.mark.parametrize("backend", ["kernel", "dma", "auto"])
@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_every_layout_pair(direction, mla, backend):
    rng = np.random.default_rng(17)
    for src_layout, dst_layout in itertools.product(LAYOUTS, LAYOUTS):
        src_where, dst_where = ("host", "gpu") if direction == "h2d" else ("gpu", "host")
        sb = buffers(src_layout, mla, src_where, rng)
        db = buffers(dst_layout, mla, dst_where, rng)
        src, dst = region(src_layout, mla, sb, "src"), region(dst_layout, mla, db, "dst")
        si = random_indices(rng, 5 * P, N, P)
        di = random_indices(rng, 5 * P, N, P)
        before = [canon(b, dst_layout) for b in db]
        ops.transfer_all_layers(src, dst, torch.from_numpy(si).to(dev), torch.from_numpy(di))
        ops.transfer_all_layers(src, dst, si, di, backend=backend)  # host indices as well
        ops.synchronize(backend)
        torch.cuda.synchronize()
        for s, d, b0 in zip(sb, db, before):
            want = b0.copy()
            want[:, di] = canon(s, src_layout)[:, si]
            np.testing.assert_array_equal(canon(d, dst_layout), want,
                                          err_msg=f"{src_layout} -> {dst_layout}")


@pytest.mark.parametrize("max_sms", [1, 2, 7])
def test_max_sms_per_call(max_sms):
    """max_sms bounds the kernel backend's SMs for one call; the bytes are the same."""
    rng = np.random.default_rng(23)
    sb = buffers("page_head", False, "host", rng)
    db = buffers("layer_first", False, "gpu", rng)
    src, dst = region("page_head", False, sb, "src"), region("layer_first", False, db, "dst")
    si = random_indices(rng, 8 * P, N, P)
    di = random_indices(rng, 8 * P, N, P)
    before = [canon(b, "layer_first") for b in db]
    ops.transfer_all_layers(src, dst, torch.from_numpy(si).to(dev), torch.from_numpy(di).to(dev),
                            backend="kernel", max_sms=max_sms)
    ops.synchronize("kernel")
    torch.cuda.synchronize()
    for b, bb in zip(range(2), before):
        want = bb.copy()
        want[:, di] = canon(sb[b], "page_head")[:, si]
        np.testing.assert_array_equal(canon(db[b], "layer_first"), want)


def test_layer_events_per_layer_wait():
    rng = np.random.default_rng(3)
    host = buffers("page_first", False, "host", rng)
    gpu = buffers("layer_first", False, "gpu", rng)
    src, dst = region("page_first", False, host, "src"), region("layer_first", False, gpu, "dst")
    idx = torch.arange(0, N, 2, device=dev)
    events = kvtier.LayerEvents(L)
    assert len(events) == L and events.device == 0
    copy = torch.cuda.Stream()
    copy.wait_stream(torch.cuda.current_stream())
    ops.transfer(src, dst, idx.cpu(), idx, num_layers=L, backend="kernel", stream=copy,
                 layer_events=events)
    sums = []
    for layer in range(L):
        events.wait(layer)
        sums.append(gpu[0].view(L, N, S)[layer, idx].to(torch.int64).sum())
    torch.cuda.synchronize()
    for layer in range(L):
        assert events.query(layer)
        want = torch.from_numpy(canon(host[0], "page_first")[layer, idx.cpu().numpy()]).to(
            torch.int64).sum()
        assert sums[layer].item() == want.item()
    with pytest.raises(ValueError, match="layer"):
        events.wait(L)
    with pytest.raises(ValueError, match="layer_events must be a kvtier.LayerEvents"):
        ops.transfer(src, dst, idx, idx, backend="kernel", layer_events="events")


def test_numpy_host_buffer_with_pinned_registration():
    rng = np.random.default_rng(5)
    host = rng.integers(0, 256, size=(N, L, S), dtype=np.uint8)
    gpu = torch.zeros((L, N, S), dtype=torch.uint8, device=dev)
    src = ops.KvRegion(layout="page_first", num_layers=L, slot_bytes=S, k=host, mla=True)
    dst = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, k=gpu, mla=True)
    idx = np.arange(0, N, 3)
    with pytest.raises(ValueError, match="pinned"):
        ops.transfer_all_layers(src, dst, idx, idx, backend="kernel")
    with kvtier.PinnedRegistration(host) as pin:
        assert pin.nbytes == host.nbytes
        ops.transfer_all_layers(src, dst, idx, idx, backend="kernel")
        torch.cuda.synchronize()
    np.testing.assert_array_equal(gpu.cpu().numpy()[:, idx], host[idx].transpose(1, 0, 2))


def test_cpu_backend_refuses_device_buffers():
    gpu = torch.zeros((L, N, S), dtype=torch.uint8, device=dev)
    host = torch.zeros((L, N, S), dtype=torch.uint8)
    a = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, k=gpu, mla=True, name="src")
    b = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, k=host, mla=True, name="dst")
    with pytest.raises(ValueError, match="backend='cpu' copies host memory only, but src"):
        ops.transfer_all_layers(a, b, [0], [0], backend="cpu")


@pytest.mark.parametrize("backend", ["kernel", "dma"])
def test_example_runs_clean(backend):
    env = dict(os.environ)
    out = subprocess.run([sys.executable, EXAMPLE, "--backend", backend, "--layers", "8",
                          "--tokens", "2048"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "torch_offload: OK" in out.stdout


@pytest.mark.skipif(not hasattr(kvtier, "HierarchicalCache"), reason="no cache manager")
@pytest.mark.parametrize("backend", ["kernel", "dma"])
def test_hierarchical_cache_load_back_with_per_layer_waits(backend):
    Lc, Nc, Sc, Pc = 4, 1024, 512, 16
    k = torch.zeros((Lc, Nc, Sc), dtype=torch.uint8, device=dev)
    v = torch.zeros((Lc, Nc, Sc), dtype=torch.uint8, device=dev)
    region = ops.KvRegion(layout="layer_first", num_layers=Lc, slot_bytes=Sc, page_size=Pc, k=k,
                          v=v, name="device_pool")
    with kvtier.HierarchicalCache(region, transfer_backend=backend,
                                  write_policy="write_through") as cache:
        tokens = torch.randint(0, 32000, (256,), dtype=torch.int32)
        slots = cache.allocate_device_slots(256)
        assert isinstance(slots, torch.Tensor) and slots.dtype == torch.int64
        want_k = torch.randint(0, 256, (Lc, 256, Sc), dtype=torch.uint8, device=dev)
        want_v = torch.randint(0, 256, (Lc, 256, Sc), dtype=torch.uint8, device=dev)
        k[:, slots.to(dev)], v[:, slots.to(dev)] = want_k, want_v
        torch.cuda.synchronize()
        cache.insert(tokens, slots)
        cache.wait_for_backups()
        assert cache.evict_device(Nc) >= 256
        k.zero_()
        v.zero_()
        torch.cuda.synchronize()
        copy = torch.cuda.Stream()
        with cache.match(tokens) as m:
            assert m.host_tokens == 256
            loaded = cache.load_back(m, stream=copy)
            got = []
            for layer in range(Lc):
                cache.wait_layer(m, layer)  # the current stream waits for this layer
                got.append(k[layer, loaded.device_slots.to(dev)].clone())
            torch.cuda.synchronize()
        for layer in range(Lc):
            assert torch.equal(got[layer], want_k[layer])
        assert torch.equal(v[:, loaded.device_slots.to(dev)], want_v)
        cache.check_consistency()


class CudaArray:
    """Exposes only __cuda_array_interface__ (as CuPy or Numba arrays do)."""

    def __init__(self, tensor):
        self._tensor = tensor
        self.__cuda_array_interface__ = tensor.__cuda_array_interface__


def test_cuda_array_interface_buffers_and_indices():
    rng = np.random.default_rng(8)
    host = torch.from_numpy(rng.integers(0, 256, size=(N, L, S), dtype=np.uint8)).pin_memory()
    gpu = torch.zeros((L, N, S), dtype=torch.uint8, device=dev)
    src = ops.KvRegion(layout="page_first", num_layers=L, slot_bytes=S, k=host, mla=True)
    dst = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, k=CudaArray(gpu),
                       mla=True)
    assert dst.device == 0
    idx = torch.arange(0, N, 5, device=dev)
    ops.transfer_all_layers(src, dst, CudaArray(idx), CudaArray(idx), backend="kernel")
    torch.cuda.synchronize()
    i = idx.cpu()
    assert torch.equal(gpu[:, idx].cpu(), host[i].transpose(0, 1))
    untouched = torch.ones(N, dtype=torch.bool)
    untouched[i] = False
    assert not gpu[:, untouched.to(dev)].any()
