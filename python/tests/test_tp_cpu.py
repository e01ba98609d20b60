"""A TP=2 group from Python on the cpu device, two processes, no torch (kvtier.tp, docs/tp.md).

Rank 0 (this process) runs the group's HierarchicalCache; rank 1 (a spawned process) is a
TpFollower with its own "device" pool (numpy, its half of the KV heads), host pages and view of a
file store. A shared prefix is reused through the device, host and storage tiers; every rank
checks the bytes it holds for every hit against its heads' pattern, and the store the TP=2 group
filled then serves a TP=1 cache whole pages. A follower killed mid-run makes the leader's next
wait raise UnavailableError within the group's timeout."""

import multiprocessing
import os
import signal
import time
import uuid

import numpy as np
import pytest

import kvtier
from kvtier import ops

if not hasattr(kvtier, "TpFollower"):
    pytest.skip("kvtier built without the cache manager", allow_module_level=True)

L, H, HEAD_BYTES, P, N = 2, 4, 8, 4, 64  # layers, KV heads, bytes of a head, page, device slots
TP = 2
WRITE, VERIFY = 1, 2
SETTINGS = dict(host_layout="page_head", write_policy="write_through", backup_threads=0,
                storage_model_id="tp-python-test", prefetch_threshold_tokens=0,
                prefetch_policy="wait_complete")


def pattern(tokens, rank, tp):
    """KV bytes (k, v), each [L, len(tokens), S/tp], of rank `rank`'s heads at TP=`tp`: slice
    [rank * S/tp, (rank + 1) * S/tp) of each slot's full-model bytes, which depend on the token,
    its position, the layer and the byte — so a rank holding another rank's bytes is caught."""
    s = H * HEAD_BYTES // tp
    t = np.asarray(tokens, np.int64)[None, :, None]
    pos = np.arange(len(tokens), dtype=np.int64)[None, :, None]
    layer = np.arange(L, dtype=np.int64)[:, None, None]
    byte = (rank * s + np.arange(s, dtype=np.int64))[None, None, :]
    k = (t * 7 + pos * 13 + layer * 29 + byte * 3) % 251
    return k.astype(np.uint8), ((k + 101) % 256).astype(np.uint8)


def make_region(tp, rank):
    s = H * HEAD_BYTES // tp
    k, v = np.zeros((L, N, s), np.uint8), np.zeros((L, N, s), np.uint8)
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=s, page_size=P,
                          head_num=H // tp, k=k, v=v, name=f"rank{rank}")
    return region, k, v


def encode(kind, tokens, slots):
    tokens, slots = np.asarray(tokens, np.int64), np.asarray(slots, np.int64)
    assert len(tokens) == len(slots)
    return np.array([kind, len(tokens)], np.int64).tobytes() + tokens.tobytes() + slots.tobytes()


def apply_step(message, k, v, rank, tp):
    """Writes (WRITE) or checks (VERIFY) the step's slots; the bytes checked. AssertionError
    naming the first wrong slot."""
    kind, n = np.frombuffer(message[:16], np.int64)
    tokens = np.frombuffer(message[16:16 + 8 * n], np.int64)
    slots = np.frombuffer(message[16 + 8 * n:], np.int64)
    want_k, want_v = pattern(tokens, rank, tp)
    if kind == WRITE:
        k[:, slots], v[:, slots] = want_k, want_v
        return 0
    for have, want, name in ((k[:, slots], want_k, "k"), (v[:, slots], want_v, "v")):
        bad = np.nonzero((have != want).any(axis=(0, 2)))[0]
        if len(bad):
            raise AssertionError(f"rank {rank}: {name} of token {bad[0]} (slot {slots[bad[0]]}) "
                                 f"is wrong ({len(bad)} tokens)")
    return int(want_k.nbytes + want_v.nbytes)


def follower_main(name, storage, ack_timeout_s, out):
    try:
        region, k, v = make_region(TP, 1)
        group = kvtier.TpGroup(name, TP, 1, ack_timeout_s=ack_timeout_s, attach_timeout_s=30)
        checked = []

        def on_message(message):
            n = apply_step(message, k, v, 1, TP)
            checked.append(n)
            return n

        with kvtier.TpFollower(region, group, storage=storage, **SETTINGS) as f:
            assert f.shape == {"device_slots": N, "host_slots": 2 * N, "num_layers": L,
                               "page_size": P, "mla": False}, f.shape
            f.serve_until_closed(on_message)
            out.put(("ok", f.stats(), sum(checked)))
    except Exception as e:  # reported to the test, which fails naming it
        out.put(("error", repr(e), 0))


class Leader:
    """Rank 0: the cache and rank 0's own share of each step."""

    def __init__(self, cache, k, v):
        self.cache, self.k, self.v = cache, k, v
        self.checked = [0, 0]  # bytes each rank checked

    def step(self, kind, tokens, slots):
        msg = encode(kind, tokens, slots)
        seq = self.cache.tp_publish(msg)
        self.checked[0] += apply_step(msg, self.k, self.v, 0, TP)
        self.cache.tp_wait_applied(seq)
        self.checked[1] += self.cache.tp_result(1, seq)

    def serve(self, tokens):
        """One request: hits are checked on every rank, the rest written on every rank."""
        with self.cache.match(tokens) as m:
            self.cache.query_storage(m)
            self.cache.prefetch(m)
            loaded = self.cache.load_back(m)
            hit = np.asarray(loaded.device_slots)
            if len(hit):
                self.step(VERIFY, tokens[:len(hit)], hit)
            new = np.asarray(self.cache.allocate_device_slots(len(tokens) - len(hit)))
            self.step(WRITE, tokens[len(hit):], new)
            self.cache.insert(tokens, np.concatenate([hit, new]))
        self.cache.wait_for_backups()
        return m, loaded


# The ranks' time-outs are hang guards: a rank (a spawned Python process) on a loaded box may go
# seconds without a core, and an ack timeout that expired then failed a right test. A killed rank
# is still seen at once (the leader checks its pid while it waits).
ACK_TIMEOUT_S = 60.0


def start_follower(name, storage, ack_timeout_s=ACK_TIMEOUT_S):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=follower_main, args=(name, storage, ack_timeout_s, out))
    proc.start()
    return proc, out


def test_a_shared_prefix_reused_through_every_tier_on_both_ranks(tmp_path):
    name = f"kvtier-pytest-tp-{uuid.uuid4().hex[:12]}"
    storage = f"file://{tmp_path}"
    proc, out = start_follower(name, storage)
    try:
        region, k, v = make_region(TP, 0)
        group = kvtier.TpGroup(name, TP, 0, ack_timeout_s=ACK_TIMEOUT_S, attach_timeout_s=30)
        cache = kvtier.HierarchicalCache(region, tp_group=group, storage=storage, **SETTINGS)
        leader = Leader(cache, k, v)
        rng = np.random.default_rng(7)
        prefix = rng.integers(0, 50000, 32).tolist()
        requests = [prefix + rng.integers(0, 50000, 8).tolist() for _ in range(4)]

        m, _ = leader.serve(requests[0])  # cold
        assert m.device_tokens == 0
        m, _ = leader.serve(requests[1])  # the prefix on the device
        assert m.device_tokens == 32
        assert cache.evict_device(N) > 0  # now in host memory only
        m, loaded = leader.serve(requests[2])
        assert (m.device_tokens, m.host_tokens, loaded.loaded_tokens) == (0, 32, 32)
        assert cache.evict_device(N) > 0 and cache.evict_host(4 * N) > 0  # storage only
        m, loaded = leader.serve(requests[3])
        assert m.storage_tokens == 32 and loaded.prefetch.arrived_tokens == 32
        assert loaded.loaded_tokens == 32

        hits = 32 * 3
        per_rank = hits * L * 2 * (H // TP) * HEAD_BYTES
        assert leader.checked == [per_rank, per_rank]
        cache.tp_fence()  # every decision so far applied on the follower
        stats = cache.tp_stats()
        assert stats["size"] == 2 and stats["records"] > 0 and stats["health"] == "OK", stats
        cache.check_consistency()
        cache.close()  # closes the ring: the follower's serve() returns "closed"
        status, fstats, checked = out.get(timeout=30)
        assert status == "ok", fstats
        assert checked == per_rank and fstats["records"] == stats["records"], fstats
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()

    # The store the TP=2 group filled serves a TP=1 cache (a group of one: its store is the
    # per-head one too) every head of the prefix.
    region, k, v = make_region(1, 0)
    alone = kvtier.TpGroup(name + "-tp1", 1, 0)
    with kvtier.HierarchicalCache(region, tp_group=alone, storage=storage, **SETTINGS) as one:
        tokens = prefix + [1, 2, 3, 4]
        with one.match(tokens) as m:
            assert one.query_storage(m).storage_tokens == 32
            one.prefetch(m)
            slots = np.asarray(one.load_back(m).device_slots)
        assert len(slots) == 32
        want_k, want_v = pattern(prefix, 0, 1)
        np.testing.assert_array_equal(k[:, slots], want_k)
        np.testing.assert_array_equal(v[:, slots], want_v)


def test_a_killed_follower_fails_the_leader_within_the_timeout():
    name = f"kvtier-pytest-tp-{uuid.uuid4().hex[:12]}"
    proc, _ = start_follower(name, "")
    try:
        region, k, v = make_region(TP, 0)
        group = kvtier.TpGroup(name, TP, 0, ack_timeout_s=ACK_TIMEOUT_S, attach_timeout_s=30)
        settings = {key: val for key, val in SETTINGS.items() if "storage" not in key and
                    "prefetch" not in key}
        cache = kvtier.HierarchicalCache(region, tp_group=group, **settings)
        leader = Leader(cache, k, v)
        leader.serve(list(range(100, 132)))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        start = time.monotonic()
        with pytest.raises(kvtier.UnavailableError, match="rank 1"):
            leader.serve(list(range(100, 140)))
        # The rank's death ends the wait, not the ack timeout: within a hang guard generous
        # enough for a loaded machine and below the timeout, not a speed check.
        assert time.monotonic() - start < 30
        assert cache.tp_stats()["health"] != "OK"
        with pytest.raises(kvtier.UnavailableError, match="rank 1"):
            cache.tp_fence()  # broken: at once, the same error
        cache.close()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_group_fields_are_the_cpp_schema():
    fields = {f["name"]: f for f in kvtier._kvtier.tp_group_fields()}
    assert set(fields) == {"name", "tp_size", "ring_bytes", "ack_timeout_s", "attach_timeout_s",
                           "liveness_poll_s", "follower_poll_s", "follower_doze_s",
                           "leader_poll_s", "ack_each_copy"}
    group = kvtier.TpGroup("g", 2, 0)
    for name, f in fields.items():
        if name not in ("name", "tp_size"):
            assert getattr(group, name) == f["default"], name
    assert fields["follower_poll_s"]["max"] == 1.0


def test_bad_groups_are_refused():
    with pytest.raises(ValueError, match="rank"):
        kvtier.TpGroup("g", 2, 2)
    with pytest.raises(ValueError, match="name"):
        kvtier.TpGroup("", 2, 0)
    region, _, _ = make_region(TP, 1)
    with pytest.raises(ValueError, match="only rank 0"):
        kvtier.HierarchicalCache(region, tp_group=kvtier.TpGroup("g", 2, 1))
    with pytest.raises(ValueError, match="leader"):
        kvtier.TpFollower(region, kvtier.TpGroup("g", 2, 0))
    with pytest.raises(kvtier.InvalidArgumentError, match="ring_bytes"):
        kvtier.HierarchicalCache(region, tp_group=kvtier.TpGroup("g", 2, 0, ring_bytes=100))
    # The poll settings reach the C++ config and its bounds.
    with pytest.raises(kvtier.InvalidArgumentError, match="follower_poll_s"):
        kvtier.HierarchicalCache(region, tp_group=kvtier.TpGroup("g", 2, 0, follower_poll_s=2.0))
    with pytest.raises(kvtier.InvalidArgumentError, match="leader_poll_s"):
        kvtier.HierarchicalCache(region, tp_group=kvtier.TpGroup("g", 2, 0, leader_poll_s=1.0))
    # Types are the C++ schema's: a string or a bool where a number belongs is refused by name.
    with pytest.raises(ValueError, match="ack_timeout_s"):
        kvtier.HierarchicalCache(region, tp_group=kvtier.TpGroup("g", 2, 0, ack_timeout_s="2"))
    with pytest.raises(ValueError, match="ring_bytes"):
        kvtier.HierarchicalCache(region, tp_group=kvtier.TpGroup("g", 2, 0, ring_bytes=True))
    # No leader: the follower gives up after attach_timeout_s, naming the ring.
    start = time.monotonic()
    with pytest.raises(kvtier.UnavailableError):
        kvtier.TpFollower(region, kvtier.TpGroup(f"kvtier-pytest-none-{uuid.uuid4().hex[:8]}", 2,
                                                 1, attach_timeout_s=0.3))
    assert time.monotonic() - start < 60  # bounded (a hang guard, not a speed check)
    # A storage tier needs per-head host pages.
    with pytest.raises(kvtier.InvalidArgumentError, match="page_head"):
        kvtier.HierarchicalCache(region, tp_group=kvtier.TpGroup(
                                     f"kvtier-pytest-store-{uuid.uuid4().hex[:8]}", 1, 0),
                                 storage="memory://?capacity=1MiB")
