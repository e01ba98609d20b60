"""kvtier.PageStore: pages moved between raw host addresses and kvtier's stores (memory://,
file://, redis://), checked byte for byte on random data read into poisoned buffers.

The redis tests start a redis-server on a free loopback port (killed at the end, and with the test
process if it dies); without redis-server they skip, and fail under CI=true.
"""

import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest

import kvtier

NUM_LAYERS = 2
PAGE_SIZE = 4
SLOT_BYTES = 64  # one buffer, one token, one layer


def open_store(url, mla, model_id="test/model", **options):
    return kvtier.PageStore(url, model_id=model_id, kv_dtype="bf16", layout="page_first", mla=mla,
                            num_layers=NUM_LAYERS, slot_bytes=SLOT_BYTES, page_size=PAGE_SIZE,
                            **options)


class Pages:
    """`n` pages in numpy memory, in one of the address forms PageStore takes."""

    def __init__(self, store, n, form, rng):
        self.form = form
        seg = store.page_bytes // (2 if form.startswith("pairs") else 1)
        if form.startswith("pairs"):
            self.k = rng.integers(0, 256, size=(n, seg), dtype=np.uint8)
            self.v = rng.integers(0, 256, size=(n, seg), dtype=np.uint8)
            self.arrays = [self.k, self.v]
        else:
            self.whole = rng.integers(0, 256, size=(n, seg), dtype=np.uint8)
            self.arrays = [self.whole]
        self.n = n

    def addrs(self):
        rows = [[a.ctypes.data + i * a.strides[0] for a in self.arrays] for i in range(self.n)]
        if self.form == "ints":
            return [r[0] for r in rows]
        if self.form == "pairs":
            return [tuple(r) for r in rows]
        if self.form == "array":
            return np.array([r[0] for r in rows], dtype=np.int64)
        assert self.form == "pairs_array"
        return np.array(rows, dtype=np.int64).reshape(self.n, 2)

    def poisoned_copy(self):
        """The same shape, every byte different from this one's (~x)."""
        out = object.__new__(Pages)
        out.form, out.n = self.form, self.n
        out.arrays = [np.bitwise_not(a) for a in self.arrays]
        return out

    def assert_equal(self, other, pages=None):
        for a, b in zip(self.arrays, other.arrays):
            idx = slice(None) if pages is None else pages
            np.testing.assert_array_equal(a[idx], b[idx])


def keys_for(n, tag):
    return [hashlib.sha256(f"{tag}/{i}".encode()).hexdigest() for i in range(n)]


# ---- redis-server ----------------------------------------------------------------------------

# The server helpers shared with the other Python tests (redis_process.py): a free loopback
# port, a PING, and a server that dies with the test process.
from redis_process import _die_with_parent, _free_port, _ping  # noqa: E402


@pytest.fixture
def redis_server():
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed (Debian: redis-server) and CI=true")
        pytest.skip("redis-server is not installed (Debian: redis-server)")
    tmp = tempfile.mkdtemp(prefix="kvtier-pagestore-redis-")
    port = _free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp, "--save", "",
         "--appendonly", "no", "--logfile", os.path.join(tmp, "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=_die_with_parent)
    try:
        for _ in range(500):  # up to ~10 s
            if proc.poll() is not None:
                pytest.fail(f"redis-server exited at start (code {proc.returncode})")
            if _ping(port):
                break
            time.sleep(0.02)
        else:
            pytest.fail("redis-server did not answer PING within 10 s")
        yield proc, port
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


# ---- stores ----------------------------------------------------------------------------------

@pytest.fixture(params=["memory", "file"])
def url(request, tmp_path):
    if request.param == "memory":
        return "memory://?capacity=64MiB"
    return f"file://{tmp_path}/store?capacity=64MiB"


FORMS_MHA = ["pairs", "pairs_array", "ints", "array"]


@pytest.mark.parametrize("mla,form", [(True, "ints"), (True, "array")] +
                         [(False, f) for f in FORMS_MHA])
def test_round_trip_every_byte(url, mla, form):
    rng = np.random.default_rng(1)
    with open_store(url, mla) as store:
        assert store.num_buffers == (1 if mla else 2)
        assert store.page_bytes == store.num_buffers * NUM_LAYERS * PAGE_SIZE * SLOT_BYTES
        src = Pages(store, 9, form, rng)
        keys = keys_for(9, f"rt-{mla}-{form}")
        assert store.set(keys, src.addrs()) == [True] * 9
        assert store.exists(keys) == [True] * 9
        assert store.exists_prefix(keys) == 9
        dst = src.poisoned_copy()
        assert store.get(keys, dst.addrs()) == [True] * 9
        src.assert_equal(dst)
        st = store.stats()
        assert st["get_hit_pages"] == 9 and st["set_ok_pages"] == 9


def test_misses_are_false(url):
    rng = np.random.default_rng(2)
    with open_store(url, mla=False) as store:
        src = Pages(store, 4, "pairs", rng)
        keys = keys_for(4, "miss")
        assert store.set([keys[0], keys[2]], src.addrs()[0:3:2]) == [True, True]
        dst = src.poisoned_copy()
        assert store.get(keys, dst.addrs()) == [True, False, True, False]
        src.assert_equal(dst, pages=[0, 2])
        assert store.exists(keys) == [True, False, True, False]
        assert store.exists_prefix(keys) == 1
        assert store.exists_prefix(keys[1:]) == 0
        assert store.exists([]) == [] and store.get([], []) == [] and store.exists_prefix([]) == 0


def test_wrong_namespace_misses(tmp_path):
    rng = np.random.default_rng(3)
    for url in (f"file://{tmp_path}/shared?capacity=64MiB", "memory://nsdemo?capacity=64MiB"):
        with open_store(url, mla=True) as a, open_store(url, mla=True, model_id="other") as b:
            assert a.namespace_name != b.namespace_name
            src = Pages(a, 3, "ints", rng)
            keys = keys_for(3, "ns")
            assert a.set(keys, src.addrs()) == [True] * 3
            dst = src.poisoned_copy()
            assert b.get(keys, dst.addrs()) == [False] * 3
            assert b.exists(keys) == [False] * 3 and b.exists_prefix(keys) == 0
            assert a.get(keys, dst.addrs()) == [True] * 3
            src.assert_equal(dst)


def test_key_forms(url):
    """64 lowercase hex digits and 32 bytes are keys as they are; other text, bytes and ints are
    hashed with SHA-256 (an int: of its decimal text)."""
    rng = np.random.default_rng(4)
    with open_store(url, mla=True) as store:
        src = Pages(store, 4, "ints", rng)
        hexkey = keys_for(1, "forms")[0]
        assert store.set([hexkey, "hello", b"raw", 12345], src.addrs()) == [True] * 4
        same = [bytes.fromhex(hexkey), hashlib.sha256(b"hello").digest(),
                hashlib.sha256(b"raw").hexdigest(), hashlib.sha256(b"12345").hexdigest()]
        dst = src.poisoned_copy()
        assert store.get(same, dst.addrs()) == [True] * 4
        src.assert_equal(dst)
        assert store.exists([np.int64(12345), "12345", hexkey.upper()]) == [True, True, False]


def test_chunks_beyond_max_batch_pages(url):
    rng = np.random.default_rng(5)
    with open_store(url, mla=False, max_batch_pages=3) as store:
        src = Pages(store, 10, "pairs_array", rng)
        keys = keys_for(10, "chunks")
        assert store.set(keys[:7], src.addrs()[:7]) == [True] * 7
        assert store.exists_prefix(keys) == 7
        dst = src.poisoned_copy()
        job = store.submit_get(keys, dst.addrs())
        assert job.wait(timeout_s=60) == [True] * 7 + [False] * 3
        src.assert_equal(dst, pages=slice(0, 7))


def test_submit_jobs(url):
    rng = np.random.default_rng(6)
    with open_store(url, mla=False) as store:
        src = Pages(store, 5, "pairs", rng)
        keys = keys_for(5, "jobs")
        job = store.submit_set(keys, src.addrs())
        assert isinstance(job, kvtier.PageStoreJob)
        assert job.wait() == [True] * 5
        assert job.done()
        dst = src.poisoned_copy()
        job = store.submit_get(keys, dst.addrs())
        assert job.wait(timeout_s=60) == [True] * 5
        assert job.done() and job.wait(timeout_s=0) == [True] * 5
        src.assert_equal(dst)
        assert store.remove(keys[:2]) == [True, True]
        assert store.exists(keys) == [False, False, True, True, True]


def test_threads_share_a_store(url):
    rng = np.random.default_rng(7)
    with open_store(url, mla=False) as store:
        srcs = [Pages(store, 6, "pairs", rng) for _ in range(4)]
        errors = []

        def worker(t):
            try:
                keys = keys_for(6, f"thread{t}")
                for _ in range(5):
                    assert store.set(keys, srcs[t].addrs()) == [True] * 6
                    dst = srcs[t].poisoned_copy()
                    assert store.get(keys, dst.addrs()) == [True] * 6
                    srcs[t].assert_equal(dst)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors


def test_close_while_calls_run(url):
    """close() from one thread while others call: each call returns its outcome (a hit, or False
    once the backend is closing) or raises FailedPreconditionError once the store is closed;
    nothing crashes and every returned hit has the right bytes."""
    rng = np.random.default_rng(11)
    store = open_store(url, mla=True)
    src = Pages(store, 8, "array", rng)
    keys = keys_for(8, "closing")
    assert store.set(keys, src.addrs()) == [True] * 8
    errors, closed_seen = [], []
    started = threading.Barrier(4)

    def worker():
        started.wait(timeout=60)
        try:
            for _ in range(200):
                dst = src.poisoned_copy()
                try:
                    got = store.get(keys, dst.addrs())
                except kvtier.FailedPreconditionError:
                    closed_seen.append(True)
                    return
                hits = [i for i, ok in enumerate(got) if ok]
                src.assert_equal(dst, pages=hits)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for th in threads:
        th.start()
    started.wait(timeout=60)
    store.close()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    with pytest.raises(kvtier.FailedPreconditionError):
        store.exists_prefix(keys)


# ---- layer-strided pages (a layer_first host pool) ----------------------------------------

class LayerFirstPool:
    """A layer_first host pool in numpy memory, as SGLang's MHATokenToKVPoolHost /
    MLATokenToKVPoolHost keep it: per buffer [num_layers, tokens, slot_bytes]; a page is one piece
    per layer (page_size * slot_bytes bytes) at a layer stride of tokens * slot_bytes."""

    def __init__(self, mla, num_pages, fill):
        self.buffers = [fill((NUM_LAYERS, num_pages * PAGE_SIZE, SLOT_BYTES))
                        for _ in range(1 if mla else 2)]
        self.layer_stride = num_pages * PAGE_SIZE * SLOT_BYTES

    def addrs(self, pages):
        rows = np.array([[b[0, q * PAGE_SIZE].ctypes.data for b in self.buffers] for q in pages],
                        dtype=np.int64)
        return rows[:, 0].copy() if len(self.buffers) == 1 else rows  # [n] or [n, 2]

    def page(self, q):
        """Page q's bytes per buffer, its layers in order: what a page_first pool would hold."""
        return [b[:, q * PAGE_SIZE:(q + 1) * PAGE_SIZE].reshape(-1) for b in self.buffers]


@pytest.mark.parametrize("mla", [False, True])
def test_layer_strided_round_trip_every_byte(url, mla):
    rng = np.random.default_rng(11)
    with open_store(url, mla, max_batch_pages=2) as store:  # several chunks per call
        src = LayerFirstPool(mla, 8, lambda shape: rng.integers(0, 256, shape, dtype=np.uint8))
        keys = keys_for(5, f"strided-{mla}")
        src_pages = [1, 3, 4, 6, 7]
        assert store.set(keys, src.addrs(src_pages), layer_stride=src.layer_stride) == [True] * 5
        # Stored as a page_first page: K of every layer, then V of every layer.
        flat = np.full((5, store.page_bytes), 0x5A, dtype=np.uint8)
        assert store.get(keys, [flat[i].ctypes.data for i in range(5)]) == [True] * 5
        for i, q in enumerate(src_pages):
            np.testing.assert_array_equal(flat[i], np.concatenate(src.page(q)))
        # Read back into a poisoned pool at other pages, with a miss among them.
        dst = LayerFirstPool(mla, 8, lambda shape: np.full(shape, 0xA5, dtype=np.uint8))
        dst_pages = [7, 0, 2, 5, 3, 6]
        got = store.get(keys[:3] + keys_for(1, "absent") + keys[3:], dst.addrs(dst_pages),
                        layer_stride=dst.layer_stride)
        assert got == [True, True, True, False, True, True]
        for q_src, q_dst in zip([1, 3, 4, 6, 7], [7, 0, 2, 3, 6]):
            for a, b in zip(src.page(q_src), dst.page(q_dst)):
                np.testing.assert_array_equal(a, b)
        for q in (1, 4, 5):  # the miss's page and the pages no call named stay poison
            assert all((b == 0xA5).all() for b in dst.page(q)), q
        job = store.submit_get(keys, dst.addrs(src_pages), layer_stride=dst.layer_stride)
        assert job.wait(timeout_s=60) == [True] * 5
        for q in src_pages:
            for a, b in zip(src.page(q), dst.page(q)):
                np.testing.assert_array_equal(a, b)


def test_layer_strided_bad_arguments_name_the_problem():
    with open_store("memory://", mla=False) as store:
        pool = LayerFirstPool(False, 4, lambda shape: np.zeros(shape, dtype=np.uint8))
        k = keys_for(2, "bad-strided")
        pairs = pool.addrs([0, 1])
        piece = PAGE_SIZE * SLOT_BYTES
        cases = [
            (lambda: store.get(k, pairs, layer_stride=-1), "layer_stride"),
            (lambda: store.get(k, pairs, layer_stride=piece - 1), "layers would overlap"),
            (lambda: store.set(k, pairs[:, 0], layer_stride=pool.layer_stride),
             "(K, V) pair"),
            (lambda: store.get(k, pairs, layer_stride="x"), "layer_stride"),
        ]
        for call, text in cases:
            with pytest.raises(ValueError) as e:
                call()
            assert text in str(e.value), (text, str(e.value))


# ---- parents: a chain's tail is evicted first ---------------------------------------------

@pytest.mark.parametrize("with_parents", [True, False])
def test_parents_reach_the_store_tail_evicted_first(tmp_path, url, with_parents):
    """A store of a few pages holds a 3-page chain written with its parents, then unrelated
    pages until it evicts: with parents the chain's tail goes first (the store knows the head is
    the others' prefix), without them the oldest page (the head) goes first, as plain LRU."""
    rng = np.random.default_rng(12)
    small = url.replace("capacity=64MiB", "capacity=12KiB")
    with open_store(small, mla=False) as store:
        chain = keys_for(3, f"chain-{with_parents}")
        src = Pages(store, 3, "pairs", rng)
        parents = [None, chain[0], chain[1]]
        addrs = src.addrs()
        # One call a page: a file store writes one call's pages in parallel, so they would land
        # (and age) in any order, and the expected order below would be a matter of timing.
        for i in range(3):
            assert store.set(chain[i:i + 1], addrs[i:i + 1],
                             parents[i:i + 1] if with_parents else None) == [True]
        filler = Pages(store, 1, "pairs", rng)
        for i in range(64):
            assert store.set(keys_for(1, f"filler-{with_parents}-{i}"), filler.addrs()) == [True]
            if store.stats()["evicted_pages"] > 0:
                break
        # The file store evicts down below its capacity (maybe more than one page at a time).
        gone = store.stats()["evicted_pages"]
        assert 1 <= gone <= 2, store.stats()
        expected = [i < 3 - gone for i in range(3)] if with_parents else [i >= gone
                                                                          for i in range(3)]
        assert store.exists(chain) == expected


def test_parents_bad_arguments_name_the_problem():
    with open_store("memory://", mla=True) as store:
        page = np.zeros((2, store.page_bytes), dtype=np.uint8)
        addrs = [page.ctypes.data, page.ctypes.data + store.page_bytes]
        k = keys_for(2, "bad-parents")
        for parents, text in [([None], "parents has 1 entries for 2 keys"),
                              ("ab", "parents must be None or a list"),
                              ([None, 1.5], "parents[1]")]:
            with pytest.raises(ValueError) as e:
                store.set(k, addrs, parents)
            assert text in str(e.value), (text, str(e.value))
        assert store.submit_set(k, addrs, [None, k[0]]).wait() == [True, True]


# ---- clear --------------------------------------------------------------------------------

def test_clear_removes_this_namespace_only(url):
    rng = np.random.default_rng(13)
    if url.startswith("memory://"):
        url = "memory://cleartest?capacity=64MiB"  # one store for the three
    with open_store(url, mla=True) as a, open_store(url, mla=True) as a2, \
            open_store(url, mla=True, model_id="other") as b:
        src = Pages(a, 4, "ints", rng)
        keys = keys_for(4, "clear")
        assert a.set(keys[:2], src.addrs()[:2]) == [True] * 2
        assert a2.set(keys[2:], src.addrs()[2:]) == [True] * 2  # another writer, same namespace
        assert b.set(keys, src.addrs()) == [True] * 4
        assert a.clear() == 4
        assert a.exists(keys) == [False] * 4
        # The other writer's pages are gone too: a get misses (a file store's other processes may
        # still answer exists() from their own index until then, as after any removal by another
        # process), and a store opened now finds none.
        dst = src.poisoned_copy()
        assert a2.get(keys, dst.addrs()) == [False] * 4
        with open_store(url, mla=True) as fresh:
            assert fresh.exists(keys) == [False] * 4
        assert b.exists(keys) == [True] * 4
        assert a.clear() == 0
        assert a.set(keys, src.addrs()) == [True] * 4  # usable after clear
        dst = src.poisoned_copy()
        assert a.get(keys, dst.addrs()) == [True] * 4
        src.assert_equal(dst)


# ---- bad input -------------------------------------------------------------------------------

def test_bad_arguments_name_the_problem():
    store = open_store("memory://", mla=True)
    page = np.zeros((2, store.page_bytes), dtype=np.uint8)
    a0 = page.ctypes.data
    a1 = a0 + store.page_bytes
    k = keys_for(2, "bad")
    cases = [
        (lambda: store.get("abc", [a0]), "keys must be a list"),
        (lambda: store.get([k[0], 1.5], [a0, a1]), "keys[1]"),
        (lambda: store.get([k[0], None], [a0, a1]), "keys[1]"),
        (lambda: store.exists([k[0], ""]), "keys[1] is empty"),
        (lambda: store.get(k, [a0]), "addrs has 1 entries for 2 keys"),
        (lambda: store.get(k, [a0, 0]), "addrs[1]"),
        (lambda: store.get(k, [a0, -5]), "addrs[1]"),
        (lambda: store.get(k, [a0, "x"]), "addrs[1]"),
        (lambda: store.set(k, [(a0, a0), (a1, a1)]), "MLA page is one buffer"),
        (lambda: store.get(k, np.array([a0, a1], dtype=np.int32)), "int64"),
        (lambda: store.get(k, np.array([a0, a1, a1], dtype=np.int64)), "3 rows for 2 keys"),
        (lambda: store.get(k, np.zeros((2, 3), dtype=np.int64)), "shape"),
        (lambda: store.get(k, np.array([a0, 0], dtype=np.int64)), "addrs[1] = 0"),
        (lambda: store.get(k, {a0, a1}), "addrs must be"),
        (lambda: store.submit_get(k, [a0]), "addrs has"),
    ]
    for call, text in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert text in str(e.value), (text, str(e.value))
    job = store.submit_get(k, [a0, a1])
    with pytest.raises(ValueError, match="timeout_s"):
        job.wait(timeout_s=-1)
    assert job.wait() == [False, False]
    store.close()
    store.close()  # idempotent
    with pytest.raises(kvtier.FailedPreconditionError, match="closed"):
        store.get(k, [a0, a1])


def test_bad_constructor_arguments_name_the_problem(tmp_path):
    base = dict(model_id="m", kv_dtype="bf16", layout="page_first", mla=False, num_layers=2,
                slot_bytes=64, page_size=4)
    cases = [
        (dict(base, frobnicate=1), "frobnicate"),
        (dict(base, timeout_ms=0), "timeout_ms"),
        (dict(base, io_threads="4"), "io_threads"),
        (dict(base, layout="sideways"), "sideways"),
        (dict(base, num_layers=0), "num_layers"),
        (dict(base, page_size=3), "page_size"),
        (dict(base, mla=1), "mla"),
        (dict(base, slot_bytes=True), "slot_bytes"),
        (dict(base, tp_rank=2, tp_size=2), "tp_rank"),
        (dict(base, model_id=5), "model_id"),
    ]
    for kwargs, text in cases:
        with pytest.raises(ValueError) as e:
            kvtier.PageStore("memory://", **kwargs)
        assert text in str(e.value), (text, str(e.value))
    for url, text in [("nowhere", "no scheme"), ("ftp://x", "unknown scheme"),
                      ("file://relative/dir", "file")]:
        with pytest.raises(ValueError) as e:
            kvtier.PageStore(url, **base)
        assert text in str(e.value), (text, str(e.value))
    with pytest.raises(TypeError):
        kvtier.PageStore("memory://", "m", "bf16")  # the namespace fields are keyword-only
    names = {f["name"] for f in kvtier.PageStore.storage_option_fields()}
    assert {"io_threads", "timeout_ms", "max_batch_pages", "max_queued_batches"} <= names


# ---- redis -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mla,form", [(True, "array"), (False, "pairs_array"), (False, "ints")])
def test_redis_round_trip(redis_server, mla, form):
    _, port = redis_server
    rng = np.random.default_rng(8)
    with open_store(f"redis://127.0.0.1:{port}", mla) as store, \
            open_store(f"redis://127.0.0.1:{port}", mla, model_id="other") as other:
        src = Pages(store, 12, form, rng)
        keys = keys_for(12, f"redis-{mla}-{form}")
        assert store.set(keys[:8], src.addrs()[:8]) == [True] * 8
        assert store.exists_prefix(keys) == 8
        assert store.exists(keys) == [True] * 8 + [False] * 4
        dst = src.poisoned_copy()
        assert store.get(keys, dst.addrs()) == [True] * 8 + [False] * 4
        src.assert_equal(dst, pages=slice(0, 8))
        assert other.get(keys[:8], dst.addrs()[:8]) == [False] * 8


def _wait_until(predicate, what, limit_s=60):
    for _ in range(int(limit_s / 0.01)):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"not within {limit_s} s: {what}")


def test_redis_clear_is_refused(redis_server):
    _, port = redis_server
    with open_store(f"redis://127.0.0.1:{port}", mla=True) as store:
        with pytest.raises(kvtier.FailedPreconditionError, match="cannot list"):
            store.clear()


def test_redis_paused_gil_released_and_job_not_done(redis_server):
    """While redis-server is stopped (SIGSTOP) a get cannot finish. A helper Python thread counts
    its polls of the store's counters until it sees the get submitted (get_calls), then resumes
    the server: the get returns hits only if Python code ran while it was in flight (the GIL was
    released); holding the GIL it would time out after 120 s with misses. No timing threshold:
    the order of events decides. Then a job: done() is False while the server is stopped (it
    does not wait for the store), and True once the job is."""
    proc, port = redis_server
    rng = np.random.default_rng(9)
    with open_store(f"redis://127.0.0.1:{port}", False, timeout_ms=120_000) as store:
        src = Pages(store, 3, "pairs", rng)
        keys = keys_for(3, "paused")
        assert store.set(keys, src.addrs()) == [True] * 3
        gets_before = store.stats()["get_calls"]
        polls = [0]
        stop = threading.Event()

        def helper():
            # Count while no get has been taken, then resume the server.
            while store.stats()["get_calls"] == gets_before and not stop.is_set():
                polls[0] += 1
                time.sleep(0.001)
            os.killpg(proc.pid, signal.SIGCONT)

        os.killpg(proc.pid, signal.SIGSTOP)
        try:
            th = threading.Thread(target=helper)
            th.start()
            dst = src.poisoned_copy()
            result = store.get(keys, dst.addrs())  # returns only once the helper resumed redis
            stop.set()
            th.join(timeout=60)
            assert result == [True] * 3
            src.assert_equal(dst)

            # A job against a stopped server: done() answers at once, False.
            os.killpg(proc.pid, signal.SIGSTOP)
            dst = src.poisoned_copy()
            job = store.submit_get(keys, dst.addrs())
            assert [job.done() for _ in range(100)] == [False] * 100
            with pytest.raises(TimeoutError):
                job.wait(timeout_s=0.05)
            assert not job.done()
            os.killpg(proc.pid, signal.SIGCONT)
            assert job.wait(timeout_s=120) == [True] * 3
            assert job.done()
            src.assert_equal(dst)
        finally:
            stop.set()
            os.killpg(proc.pid, signal.SIGCONT)


def test_redis_down_is_a_miss_within_the_timeout(redis_server):
    proc, port = redis_server
    rng = np.random.default_rng(10)
    with open_store(f"redis://127.0.0.1:{port}", True, timeout_ms=300) as store:
        src = Pages(store, 2, "ints", rng)
        keys = keys_for(2, "down")
        assert store.set(keys, src.addrs()) == [True, True]
        os.killpg(proc.pid, signal.SIGSTOP)
        try:
            assert store.get(keys, src.poisoned_copy().addrs()) == [False, False]
            assert store.exists_prefix(keys) == 0
        finally:
            os.killpg(proc.pid, signal.SIGCONT)
