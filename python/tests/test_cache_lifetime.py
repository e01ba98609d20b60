"""kvtier.HierarchicalCache lifetime and threading (cpu backend, host-memory "device" pool):
match handles that cannot leak, handles of another cache refused, close() racing four threads,
the GIL released by blocking calls, and counts near the integer limits refused by name."""

import gc
import os
import sys
import threading
import time

import numpy as np
import pytest

import kvtier
from kvtier import ops
from kvtier.cache import _host_array

if not hasattr(kvtier, "HierarchicalCache"):
    pytest.skip("kvtier built without the cache manager", allow_module_level=True)

L, N, S, P = 2, 64, 32, 4


def make_cache(num_slots=N, slot_bytes=S, page_size=P, **kwargs):
    k = np.zeros((L, num_slots, slot_bytes), np.uint8)
    v = np.zeros((L, num_slots, slot_bytes), np.uint8)
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=slot_bytes,
                          page_size=page_size, k=k, v=v, name="device_pool")
    config = dict(write_policy="write_through", backup_threads=0, cpu_threads=1)
    config.update(kwargs)
    return kvtier.HierarchicalCache(region, **config)


def fill(cache, tokens):
    """Inserts `tokens` as a fresh prefill would."""
    slots = cache.allocate_device_slots(len(tokens))
    cache.insert(tokens, slots)
    return slots


# ---- match handles -------------------------------------------------------------------------

def test_forgotten_matches_release_themselves():
    cache = make_cache()
    tokens = list(range(100, 100 + N))
    fill(cache, tokens)
    for _ in range(1000):
        cache.match(tokens)  # dropped at once: collected, released
    assert cache.stats()["live_handles"] == 0
    # Nothing pins the prefix: the whole pool can be reclaimed for the engine.
    assert len(cache.allocate_device_slots(N)) == N
    cache.check_consistency()


def test_match_in_a_reference_cycle_is_released_by_the_collector():
    cache = make_cache()
    fill(cache, list(range(16)))
    m = cache.match(list(range(16)))
    m.cycle = m
    del m
    assert cache.stats()["live_handles"] == 1
    gc.collect()
    assert cache.stats()["live_handles"] == 0


def test_with_block_releases_even_on_error_and_release_is_idempotent():
    cache = make_cache()
    fill(cache, list(range(16)))
    with pytest.raises(RuntimeError, match="boom"):
        with cache.match(list(range(16))) as m:
            assert cache.stats()["live_handles"] == 1
            raise RuntimeError("boom")
    assert m.released and cache.stats()["live_handles"] == 0
    m.release()  # no-op
    with pytest.raises(ValueError, match="already released"):
        cache.release(m)


def test_matches_outliving_close_are_dropped_quietly():
    cache = make_cache()
    fill(cache, list(range(16)))
    m = cache.match(list(range(16)))
    cache.close()
    unraisable = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        del m
        gc.collect()
    finally:
        sys.unraisablehook = old_hook
    assert unraisable == []


def test_a_handle_of_another_cache_is_refused():
    c1, c2 = make_cache(), make_cache()
    fill(c1, list(range(16)))
    fill(c2, list(range(16)))
    m1, m2 = c1.match(list(range(16))), c2.match(list(range(16)))
    for call in (lambda: c2.release(m1), lambda: c2.load_back(m1),
                 lambda: c2.wait_layer(m1, 0), lambda: c2.query_storage(m1),
                 lambda: c2.prefetch(m1)):
        with pytest.raises(ValueError, match="another HierarchicalCache"):
            call()
    # By bare id too: the C++ cache issues ids unique per instance.
    with pytest.raises(ValueError):
        c2.release(m1.handle)
    assert c1.stats()["live_handles"] == 1 and c2.stats()["live_handles"] == 1
    m1.release()
    m2.release()
    assert c1.stats()["live_handles"] == 0 and c2.stats()["live_handles"] == 0


# ---- close() -------------------------------------------------------------------------------

def _hammer(cache, tokens, errors, started):
    """match / load_back / release / evict / insert until the cache is closed."""
    rng = np.random.default_rng(len(errors))
    started.release()
    try:
        while True:
            with cache.match(tokens) as m:
                if m.host_tokens:
                    try:
                        cache.load_back(m)
                    except MemoryError:
                        pass
            cache.evict_device(int(rng.integers(1, 3)) * P)
            cache.stats()
            cache.metrics()
    except kvtier.FailedPreconditionError as e:
        if "closed" not in str(e):
            errors.append(e)
    except Exception as e:  # anything else is a bug
        errors.append(e)


@pytest.mark.parametrize("run", range(5))
def test_close_while_four_threads_are_inside_the_cache(run):
    cache = make_cache(num_slots=256)
    prompts = [[1000 * p + i for i in range(32)] for p in range(4)]
    for tokens in prompts:
        fill(cache, tokens)
    errors = []
    started = threading.Semaphore(0)
    threads = [threading.Thread(target=_hammer, args=(cache, prompts[i], errors, started))
               for i in range(4)]
    for t in threads:
        t.start()
    for _ in threads:
        assert started.acquire(timeout=60), "a thread did not start (a hang)"
    time.sleep(0.005 * (run + 1))
    cache.close()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a thread hung after close()"
    assert errors == []
    assert cache.closed
    with pytest.raises(kvtier.FailedPreconditionError, match="closed"):
        cache.match(prompts[0])
    cache.close()  # twice is fine


def test_close_from_two_threads_at_once():
    cache = make_cache()
    fill(cache, list(range(16)))
    threads = [threading.Thread(target=cache.close) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "close() from two threads hung"
    assert cache.closed


# ---- the GIL -------------------------------------------------------------------------------

def _python_ran_during(call):
    """Whether another Python thread ran while `call` was inside C++: a ticker thread records
    timestamps. With the GIL held inside C++ the ticks leave a gap at least as long as the C++
    part; released, the ticker keeps running. Ticks alone prove nothing on a loaded machine (the
    calling thread may wait for the GIL, or for a core, before it enters C++), so the call counts
    as releasing only when no gap between ticks exceeds half of it. Returns (call seconds,
    released)."""
    stamps = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            stamps.append(time.perf_counter())

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        time.sleep(0.005)
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
    finally:
        stop.set()
        ticker.join()
        sys.setswitchinterval(old)
    points = [t0] + [s for s in stamps if t0 < s < t1] + [t1]
    largest_gap = max(b - a for a, b in zip(points, points[1:]))
    return t1 - t0, largest_gap < 0.5 * (t1 - t0)


def _measure_blocking_calls(num_slots):
    """{call name: (seconds, released)} for insert and load_back of a fresh cache."""
    # 2 layers x num_slots x 4 KiB for K and V: each full copy moves num_slots x 16 KiB on one
    # thread (32 MiB at 2,048 slots).
    slot_bytes = 4096
    cache = make_cache(num_slots=num_slots, slot_bytes=slot_bytes, page_size=16, cpu_threads=1)
    tokens = np.arange(num_slots, dtype=np.int32)
    slots = cache.allocate_device_slots(num_slots)
    measured = {}
    # The native calls are timed: the Python around them (argument and result conversion) lets
    # the ticker run whatever the C++ part does, and on a loaded machine it can take longer than
    # the copy.
    t_addr, t_count, t_keep = _host_array(tokens, "tokens", "i")
    s_addr, s_count, s_keep = _host_array(slots, "device_slots", "q")
    # insert backs up to host memory in the calling thread (write_through, backup_threads=0).
    measured["insert"] = _python_ran_during(
        lambda: cache._native.insert(t_addr, t_count, s_addr, s_count, "", 0, 0))
    del t_keep, s_keep
    assert cache.evict_device(num_slots) == num_slots
    m = cache.match(tokens)
    assert m.host_tokens == num_slots
    handle = m.handle
    measured["load_back"] = _python_ran_during(lambda: cache._native.load_back(handle, 0))
    m.release()
    # close is not timed here: what takes time in it is freeing the region's numpy arrays, which
    # needs the GIL. That close waits for other threads' calls without it is what
    # test_close_while_four_threads_are_inside_the_cache shows (those calls need the GIL to end).
    cache.close()
    return measured


def test_blocking_calls_release_the_gil():
    # A call that holds the GIL leaves a long gap in the ticks; one that releases it leaves none
    # unless the ticker thread was not scheduled (a loaded machine), so each call gets a few tries.
    # A fast machine copies 32 MiB in under 20 ms: the copies grow until the calls can be told.
    # insert and load_back must each have been long enough to tell at least once (a check that
    # stopped at the first long insert let a load_back that held the GIL pass).
    must = {"insert", "load_back"}
    long_calls, released = set(), set()
    for num_slots in (2048, 2048, 8192, 8192, 32768, 32768):
        for name, (seconds, ran) in _measure_blocking_calls(num_slots).items():
            if seconds >= 0.02:  # shorter calls are too fast to tell on this machine
                long_calls.add(name)
                if ran:
                    released.add(name)
        if must <= long_calls and long_calls <= released:
            break
    assert must <= long_calls, f"too fast to tell: {must - long_calls}"
    assert long_calls <= released, f"held the GIL in every try: {long_calls - released}"


# ---- argument limits -----------------------------------------------------------------------

def test_counts_near_int64_max_are_value_errors_naming_the_argument():
    cache = make_cache()
    fill(cache, list(range(16)))
    for n in (2**63 - 1, 2**63 - P + 1):
        with pytest.raises(ValueError, match="num_tokens"):
            cache.allocate_device_slots(n)
    with pytest.raises(ValueError, match="num_tokens = 9223372036854775808 does not fit"):
        cache.allocate_device_slots(2**63)
    with pytest.raises(ValueError, match="num_tokens = -9223372036854775809 does not fit"):
        cache.evict_device(-2**63 - 1)
    for evict in (cache.evict_device, cache.evict_host):
        try:
            evicted = evict(2**63 - 1)  # "evict everything you can" is a fine answer too
        except ValueError as e:
            assert "num_tokens" in str(e)
        else:
            assert 0 <= evicted <= 2 * N
    with pytest.raises(ValueError, match="priority"):
        cache.insert(list(range(4)), cache.allocate_device_slots(4), priority=2**31)
    with pytest.raises(ValueError, match="match = 18446744073709551616"):
        cache.release(2**64)
    with cache.match(list(range(16))) as m:
        with pytest.raises(ValueError, match="layer"):
            cache.wait_layer(m, 2**63 - 1)
    cache.check_consistency()


def _os_threads():
    return len(os.listdir("/proc/self/task"))


def test_thread_counts_are_bounded_and_answered_at_once():
    # "At once": refused before any thread starts (the process's thread count is unchanged), not
    # a wall-clock bound, which a loaded machine can miss.
    threads = _os_threads()
    start = time.monotonic()
    with pytest.raises(ValueError, match="cpu_threads = 100000"):
        make_cache(cpu_threads=100000)
    with pytest.raises(ValueError, match=r"cpu_threads = 4294967296 must be in \[0, 1024\]"):
        make_cache(cpu_threads=2**32)
    with pytest.raises(ValueError, match="backup_threads"):
        make_cache(backup_threads=100000)
    with pytest.raises(ValueError, match="storage_io_threads"):
        make_cache(storage_io_threads=-1)  # 0 is the machine's default
    assert _os_threads() <= threads
    assert time.monotonic() - start < 60  # a hang guard only
