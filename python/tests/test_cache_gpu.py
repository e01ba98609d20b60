"""kvtier.HierarchicalCache on a GPU with PyTorch (kernel and dma backends) and a memory://
storage tier: KV evicted from device and host memory comes back through query_storage ->
prefetch -> load_back on a side stream, and a computation on the current stream that waits per
layer (wait_layer) reads the right bytes; close() from another thread while load_back runs.
Skipped without torch, a GPU, or a CUDA build of kvtier."""

import threading

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import kvtier  # noqa: E402
from kvtier import ops  # noqa: E402

if not kvtier.built_with_cuda() or not hasattr(kvtier, "HierarchicalCache"):
    pytest.skip("kvtier built without CUDA or the cache manager", allow_module_level=True)

L, N, S, P = 4, 1024, 512, 16
dev = torch.device("cuda")


def make_cache(backend, **kwargs):
    k = torch.zeros((L, N, S), dtype=torch.uint8, device=dev)
    v = torch.zeros((L, N, S), dtype=torch.uint8, device=dev)
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, page_size=P, k=k,
                          v=v, name="device_pool")
    config = dict(transfer_backend=backend, write_policy="write_through",
                  storage="memory://?capacity=64MiB", storage_model_id="gpu-test",
                  prefetch_threshold_tokens=0)
    config.update(kwargs)
    return kvtier.HierarchicalCache(region, **config), k, v


def prefill(cache, k, v, tokens):
    slots = cache.allocate_device_slots(len(tokens))
    want_k = torch.randint(0, 256, (L, len(tokens), S), dtype=torch.uint8, device=dev)
    want_v = torch.randint(0, 256, (L, len(tokens), S), dtype=torch.uint8, device=dev)
    k[:, slots.to(dev)], v[:, slots.to(dev)] = want_k, want_v
    cache.insert(tokens, slots)  # backups ordered after the writes on the current stream
    cache.wait_for_backups()
    return want_k, want_v


@pytest.mark.parametrize("backend", ["kernel", "dma"])
@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
def test_storage_prefetch_load_back_and_per_layer_waits(backend, policy):
    cache, k, v = make_cache(backend, prefetch_policy=policy)
    with cache:
        tokens = torch.randint(0, 32000, (256,), dtype=torch.int32)
        want_k, want_v = prefill(cache, k, v, tokens)
        assert cache.stats()["storage_backup_tokens"] == 256
        assert cache.evict_device(N) >= 256
        assert cache.evict_host(2 * N) >= 256
        k.fill_(0x5A)
        v.fill_(0xA5)
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with cache.match(tokens) as m:
            assert (m.device_tokens, m.host_tokens, m.storage_tokens) == (0, 0, 256)
            cache.query_storage(m)
            assert cache.prefetch(m).requested_tokens == 256
            if policy != "best_effort":
                assert cache.finish_prefetch(m).arrived_tokens == 256
            loaded = cache.load_back(m, stream=side)
            n = len(loaded.device_slots)
            assert n % P == 0 and (policy == "best_effort" or n == 256)
            idx = loaded.device_slots.to(dev)
            got = []
            for layer in range(L):
                cache.wait_layer(m, layer)  # the current stream waits for this layer
                got.append(k[layer, idx].clone() if n else None)
            torch.cuda.synchronize()
        for layer in range(L):
            if n:
                assert torch.equal(got[layer], want_k[layer, :n])
        assert torch.equal(v[:, idx], want_v[:, :n])
        cache.check_consistency()


@pytest.mark.parametrize("backend", ["kernel", "dma"])
def test_close_while_another_thread_loads_back(backend):
    cache, k, v = make_cache(backend, storage=None)
    tokens = torch.randint(0, 32000, (512,), dtype=torch.int32)
    prefill(cache, k, v, tokens)
    errors = []
    started = threading.Event()

    def loader():
        started.set()
        try:
            while True:
                with cache.match(tokens) as m:
                    if m.host_tokens:
                        cache.load_back(m)
                cache.evict_device(N)
        except kvtier.FailedPreconditionError as e:
            if "closed" not in str(e):
                errors.append(e)
        except Exception as e:
            errors.append(e)

    t = threading.Thread(target=loader)
    t.start()
    assert started.wait(10)
    cache.close()
    t.join(30)
    assert not t.is_alive() and errors == []
