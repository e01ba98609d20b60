"""kvtier.integrations.transformers on the cpu backend (a host-memory pool) and, where there is a
GPU, on CUDA device 0 (kernel backend): a KvtierCache's layers hold the cached prefix byte for byte
after the model's first update of each layer, for a device hit (one gather for every layer), a
host hit (layer by layer after wait_layer) and a host hit through a shared host segment written by
another pool; save() then caches what the model added. Needs torch and transformers (the GPU
machine has them; skipped elsewhere). The model itself runs in
examples/transformers_prefix_cache.py (python/run_gpu_tests.sh)."""

import os
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import kvtier  # noqa: E402
import kvtier.integrations.transformers as integration  # noqa: E402
from kvtier.integrations.transformers import KvtierPool  # noqa: E402

L, H, D, N = 3, 2, 8, 64
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and kvtier.built_with_cuda() and
                     kvtier.cuda_device_count() > 0 else [])


def config():
    return SimpleNamespace(num_hidden_layers=L, num_key_value_heads=H, num_attention_heads=H,
                           head_dim=D, hidden_size=H * D, _name_or_path="kvtier-test")


def fill(pool, tokens, seed):
    """The prompt's KV into the pool as a model's prefill would leave it; returns it."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn((L, 1, H, len(tokens), D), generator=g).to(pool.device, torch.bfloat16)
    v = torch.randn((L, 1, H, len(tokens), D), generator=g).to(pool.device, torch.bfloat16)
    slots = pool.cache.allocate_device_slots(len(tokens))
    from kvtier import ops
    ops.scatter_dense(pool.region, slots, k, v)
    pool.cache.insert(tokens, slots)
    return k, v


def first_updates(cache, k, v, n):
    """Each layer's first update (one new token), as the model's forward makes it; checks that
    the layer then holds the prefix's bytes ahead of the new token."""
    new = torch.full((1, H, 1, D), 7.0, dtype=torch.bfloat16, device=k.device)
    for i, layer in enumerate(cache.layers):
        keys, values = layer.update(new, new, None)
        assert keys.shape[-2] == n + 1
        assert torch.equal(keys[:, :, :n], k[i]) and torch.equal(values[:, :, :n], v[i]), i
        assert torch.equal(keys[:, :, n:], new)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("one_block", [True, False], ids=["one-block", "per-layer"])
def test_device_and_host_hits_hold_the_prefix(device, one_block, monkeypatch):
    # Long prefixes are gathered into a tensor per layer, short ones into one block: both here.
    monkeypatch.setattr(integration, "_ONE_BLOCK", 1 << 40 if one_block else 0)
    pool = KvtierPool(config(), device=device, num_tokens=4 * N, host_ratio=2.0)
    tokens = list(range(1000, 1000 + N))
    k, v = fill(pool, tokens, 1)
    prompt = torch.tensor([tokens + [5, 6, 7]], device=device)
    cache = pool.cache_for(prompt)
    assert cache.prefix_tokens == N and cache.sources == {"device": N, "host": 0, "storage": 0}
    first_updates(cache, k, v, N)
    assert cache.save(prompt) == N  # 3 more tokens: less than a page, nothing new
    if device == "cuda":
        torch.cuda.synchronize()  # the release waits for the stream's work (a CUDA event)
    pool.cache.wait_for_backups()  # (and carries out releases whose events completed)
    pool.cache.evict_device(1 << 30)
    cache = pool.cache_for(tokens + [5])
    assert cache.sources == {"device": 0, "host": N, "storage": 0}
    first_updates(cache, k, v, N)
    cache.release()
    with pytest.raises(ValueError, match="do not start with the prompt"):
        pool.cache_for(tokens + [5]).save([1, 2, 3])
    with pytest.raises(ValueError, match="batch size 2"):
        pool.cache_for(torch.zeros((2, 8), dtype=torch.int64))
    with pytest.raises(ValueError, match="outside int32"):
        pool.cache_for(torch.tensor([2**40, 1]))
    pool.close()


@pytest.mark.parametrize("device", DEVICES)
def test_save_caches_what_the_model_added(device):
    pool = KvtierPool(config(), device=device, num_tokens=4 * N, host_ratio=2.0)
    tokens = list(range(2000, 2000 + N))
    k, v = fill(pool, tokens[:32], 2)
    cache = pool.cache_for(tokens)
    assert cache.prefix_tokens == 32
    g = torch.Generator().manual_seed(3)
    more_k = torch.randn((L, 1, H, N - 32, D), generator=g).to(device, torch.bfloat16)
    more_v = torch.randn((L, 1, H, N - 32, D), generator=g).to(device, torch.bfloat16)
    for i, layer in enumerate(cache.layers):
        layer.update(more_k[i], more_v[i], None)
    assert cache.save(tokens) == N
    again = pool.cache_for(tokens + [1])
    assert again.prefix_tokens == N
    first_updates(again, torch.cat([k, more_k], dim=3), torch.cat([v, more_v], dim=3), N)
    again.release()
    pool.close()


@pytest.mark.parametrize("device", DEVICES)
def test_shared_host_hit_from_another_pool(device):
    name = "kvtier-pytest-tf-%d-%s" % (os.getpid(), device)
    KvtierPool.create_shared_host(name, config(), num_tokens=8 * N)
    try:
        writer = KvtierPool(config(), device=device, num_tokens=4 * N, shared_host=name,
                            host_ratio=2.0)
        reader = KvtierPool(config(), device=device, num_tokens=4 * N, shared_host=name,
                            host_ratio=2.0)
        tokens = list(range(3000, 3000 + N))
        k, v = fill(writer, tokens, 4)
        writer.cache.wait_for_backups()
        cache = reader.cache_for(tokens + [9])
        assert cache.sources == {"device": 0, "host": N, "storage": 0}
        first_updates(cache, k, v, N)
        cache.release()
        writer.close()
        reader.close()
    finally:
        KvtierPool.destroy_shared_host(name)
