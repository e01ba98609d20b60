"""kvtier.HierarchicalCache.pin / unpin (cpu backend, host-memory "device" pool): a pinned prefix
survives eviction pressure in the tiers it names, budgets refuse a pin beyond them with
ValueError, unpin ends it, bad arguments are refused by name, and the pinned tokens show in
stats() and metrics()."""

import numpy as np
import pytest

import kvtier
from kvtier import ops

if not hasattr(kvtier, "HierarchicalCache"):
    pytest.skip("kvtier built without the cache manager", allow_module_level=True)

L, N, S, P = 2, 32, 16, 4  # 8 device pages of 4 tokens


def make_cache(**kwargs):
    k = np.zeros((L, N, S), np.uint8)
    v = np.zeros((L, N, S), np.uint8)
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, page_size=P, k=k, v=v,
                          name="device_pool")
    config = dict(write_policy="write_through", backup_threads=0, cpu_threads=1, host_ratio=0,
                  pin_device_budget_tokens=4 * P)
    config.update(kwargs)
    return kvtier.HierarchicalCache(region, **config)


def fill(cache, tokens):
    with cache.match(tokens) as m:
        assert m.device_tokens == 0
        slots = cache.allocate_device_slots(len(tokens))
        cache.insert(tokens, slots)


def pressure(cache, rounds=10):
    for r in range(rounds):
        fill(cache, list(range(10_000 + 1000 * r, 10_000 + 1000 * r + 3 * P)))


def device_tokens(cache, tokens):
    with cache.match(tokens) as m:
        return m.device_tokens


def test_a_pinned_prompt_survives_pressure_until_unpinned():
    cache = make_cache()
    prompt = list(range(1, 1 + 2 * P))
    fill(cache, prompt)
    pin = cache.pin(prompt, tiers=("device",))
    assert isinstance(pin, kvtier.cache.Pin)
    assert pin.id != 0 and pin.pinned_tokens == 2 * P and not pin.store_pinned
    assert cache.stats()["pinned_device_tokens"] == 2 * P
    pressure(cache)
    assert cache.stats()["device_evicted_tokens"] > N, "no pressure"
    assert device_tokens(cache, prompt) == 2 * P
    cache.unpin(pin)
    with pytest.raises(ValueError, match="not live"):
        cache.unpin(pin)
    pressure(cache)
    assert device_tokens(cache, prompt) == 0
    cache.check_consistency()


def test_budget_refuses_with_value_error_and_changes_nothing():
    cache = make_cache(pin_device_budget_tokens=3 * P)
    a, b = list(range(1, 1 + 2 * P)), list(range(500, 500 + 2 * P))
    fill(cache, a)
    fill(cache, b)
    cache.pin(a, "device", ttl=60)
    with pytest.raises(ValueError, match="pin_device_budget_tokens = 12"):
        cache.pin(b, "device")
    assert isinstance(kvtier.InvalidArgumentError("x"), ValueError)
    stats = cache.stats()
    assert stats["pinned_device_tokens"] == 2 * P and stats["pins_refused"] == 1
    assert stats["live_pins"] == 1
    text = cache.metrics()
    assert f'kvtier:pinned_tokens{{tier="device"}} {2 * P}' in text
    assert "kvtier:pins_refused_total 1" in text


def test_nothing_cached_pins_nothing():
    cache = make_cache()
    pin = cache.pin(list(range(1, 9)))
    assert pin.id == 0 and pin.pinned_tokens == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(tiers=("gpu",)), "not one of device, host, storage"),
    (dict(tiers=()), "tiers is empty"),
    (dict(tiers=None), "tiers = None"),  # ValueError, not list(None)'s TypeError (issue 36)
    (dict(tiers=3), "tiers = 3"),
    (dict(tiers=("device", "device")), "each once"),
    (dict(tiers=("host",)), "no host tier"),
    (dict(tiers=("storage",)), "no storage tier"),
    (dict(ttl=0), "positive"),
    (dict(ttl=-1.5), "positive"),
    (dict(ttl=float("nan")), "positive"),
    (dict(ttl=float("inf")), "positive"),
    (dict(ttl="1h"), "number of seconds"),
])
def test_bad_arguments_are_refused_by_name(kwargs, message):
    cache = make_cache()
    prompt = list(range(1, 1 + 2 * P))
    fill(cache, prompt)
    with pytest.raises(ValueError, match=message):
        cache.pin(prompt, **kwargs)
    assert cache.stats()["live_pins"] == 0


def test_unpin_refuses_what_is_not_a_live_pin():
    cache = make_cache()
    for bad in (12345, -1, 2**70, "pin"):
        with pytest.raises(ValueError):
            cache.unpin(bad)


def test_budgets_are_settings_with_bounds():
    names = {f["name"]: f for f in kvtier.HierarchicalCache.config_fields()}
    for tier in ("device", "host", "storage"):
        f = names[f"pin_{tier}_budget_tokens"]
        assert f["default"] == 0 and f["min"] == 0
    with pytest.raises(ValueError, match="pin_host_budget_tokens"):
        make_cache(pin_host_budget_tokens=-1)
    with pytest.raises(ValueError, match="pin_device_budget_tokens"):
        make_cache(pin_device_budget_tokens=N)  # the whole device pool


def test_host_pin_keeps_the_host_copy():
    cache = make_cache(host_ratio=2.0, pin_device_budget_tokens=0, pin_host_budget_tokens=4 * P)
    prompt = list(range(1, 1 + 2 * P))
    fill(cache, prompt)
    cache.wait_for_backups()
    cache.pin(prompt, ("host",), ttl=3600)
    pressure(cache, rounds=20)
    assert cache.stats()["host_evicted_tokens"] > 0, "no host pressure"
    with cache.match(prompt) as m:
        assert m.device_tokens == 0 and m.host_tokens == 2 * P
    cache.check_consistency()
