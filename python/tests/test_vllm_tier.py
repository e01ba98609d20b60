"""kvtier as a vLLM secondary tier, driven by vLLM's own classes (unmodified, from the source folder
of vllm_source.py): vLLM's SecondaryTierFactory loads kvtier.integrations.vllm.KvtierTier by module
path, vLLM's TieringOffloadingManager drives it behind vLLM's CPUPrimaryTierOffloadingManager over
vLLM's SharedOffloadRegion (the CPU KV pool). Each test: store blocks (random bytes written into the
pool rows vLLM hands out, standing for the GPU->CPU copy), evict them from the CPU tier by storing
others, poison the whole pool, look them up and load them back through vLLM's promotion path, and
compare every byte. MHA (K and V) and MLA block shapes; file://, memory:// and redis:// stores.

The loops below step vLLM's engine by calling take_events() (vLLM's end-of-step hook) until an
answer comes; they are bounded by a deadline, never by a timing assumption.
"""

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import types
import uuid

import numpy as np
import pytest

from vllm_source import add_vllm_to_path

_why_not = add_vllm_to_path()
if _why_not:
    pytest.skip(_why_not, allow_module_level=True)

import kvtier  # noqa: E402

if not hasattr(kvtier, "PageStore"):
    if os.environ.get("KVTIER_VLLM_REQUIRED") == "1":
        raise RuntimeError("this kvtier build has no kvtier.PageStore")
    pytest.skip("this kvtier build has no kvtier.PageStore", allow_module_level=True)

from vllm.v1.kv_offload.base import (  # noqa: E402
    ReqContext,
    get_offload_block_hash,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.manager import (  # noqa: E402
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)

from kvtier.integrations.vllm import KvtierTier, page_key_of  # noqa: E402

DEADLINE_S = 60.0
NUM_CPU_BLOCKS = 8
LAYERS, BLOCK_TOKENS = 4, 16
# Bytes per token and layer of one buffer: MHA 2 KV heads x 64 dims x bf16 (K and V apart);
# MLA DeepSeek's 512 + 64 latent dims x bf16.
SHAPES = {"mha": (False, 2 * 64 * 2), "mla": (True, 576 * 2)}


def row_bytes(mla: bool, slot: int) -> int:
    return (1 if mla else 2) * LAYERS * BLOCK_TOKENS * slot


def tier_config(url: str, mla: bool, **extra) -> dict:
    return {
        "type": "KvtierTier",
        "module_path": "kvtier.integrations.vllm",
        "url": url,
        "model_id": "test/vllm-tier",
        "kv_dtype": "bfloat16",
        "mla": mla,
        "num_layers": LAYERS,
        "block_tokens": BLOCK_TOKENS,
        "world_size": 1,
        **extra,
    }


class Engine:
    """vLLM's tiering stack as TieringOffloadingSpec.get_manager() assembles it (the spec itself
    needs vLLM's VllmConfig, which is not part of the reconstructed source)."""

    def __init__(self, url: str, mla: bool, slot: int, **extra):
        self.row = row_bytes(mla, slot)
        self.region = SharedOffloadRegion(
            engine_id=f"kvtier_test_{uuid.uuid4().hex}",
            num_blocks=NUM_CPU_BLOCKS,
            rank=None,
            kv_bytes_per_block=self.row,
            cpu_page_size=self.row,
        )
        primary = CPUPrimaryTierOffloadingManager(
            num_blocks=NUM_CPU_BLOCKS, mmap_region=self.region
        )
        view = primary.get_kv_memoryview()
        self.tier = SecondaryTierFactory.create_secondary_tier(
            tier_config(url, mla, **extra), view, None
        )
        self.manager = TieringOffloadingManager(primary_tier=primary, secondary_tiers=[self.tier])
        self.pool = np.asarray(view)  # (blocks, row) int8 over vLLM's shared region

    def step(self) -> None:
        list(self.manager.take_events())

    def drain(self) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while self.manager._transfer_jobs:
            assert time.monotonic() < deadline, "secondary-tier jobs did not finish"
            self.step()
            time.sleep(0.001)

    def store(self, keys, rng) -> dict:
        """GPU -> CPU (random bytes into the rows vLLM allocates), then vLLM cascades to kvtier."""
        req = ReqContext(req_id=f"store-{uuid.uuid4().hex}")
        out = self.manager.prepare_store(keys, req)
        assert out is not None and list(out.keys_to_store) == list(keys)
        data = {}
        for key, block in zip(keys, out.store_spec.block_ids):
            data[key] = rng.integers(-128, 128, self.row, dtype=np.int8)
            self.pool[block] = data[key]
        self.manager.complete_store(keys, req)
        self.drain()
        return data

    def lookup_until_settled(self, keys, req) -> list:
        """Steps the engine until every key's lookup is True or False (None = in flight)."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            answers = [self.manager.lookup(k, req) for k in keys]
            if all(a is not None for a in answers):
                return answers
            assert time.monotonic() < deadline, f"lookups still in flight: {answers}"
            self.step()
            time.sleep(0.001)

    def shutdown(self) -> None:
        self.manager.shutdown()


def make_keys(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [make_offload_key(rng.bytes(32), 0) for _ in range(n)]


PROBE_NAMESPACE = dict(model_id="probe", kv_dtype="bfloat16", layout="page_first_direct",
                       mla=True, num_layers=1, slot_bytes=4096, page_size=1)


def _die_with_parent():
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A redis-server on a free 127.0.0.1 port, stopped after the module (or with this process)."""
    def missing(why):  # CI installs redis-server and builds with hiredis; elsewhere they may lack
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)

    if shutil.which("redis-server") is None:
        missing("redis-server is not installed (Debian: redis-server)")
    try:
        kvtier.PageStore("redis://127.0.0.1:1", **PROBE_NAMESPACE).close()
    except kvtier.InvalidArgumentError as e:
        if "without hiredis" in str(e):
            missing(str(e))
    except kvtier.KvtierError:
        pass  # hiredis is there; nothing listens on port 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path_factory.mktemp("redis"))],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + 60  # a hang guard: a loaded box starts it slowly
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(params=["file", "memory", "redis"])
def url(request, tmp_path):
    if request.param == "redis":
        return request.getfixturevalue("redis_url")
    return f"file://{tmp_path}/store" if request.param == "file" else "memory://"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("calls", ["calls_unbounded", "one_call_at_a_time"])
def test_store_evict_lookup_load_every_byte(url, shape, calls):
    mla, slot = SHAPES[shape]
    rng = np.random.default_rng(1)
    # One call in flight: every other chunk waits in the tier until a poll finds room.
    extra = {"max_calls_in_flight": 1} if calls == "one_call_at_a_time" else {}
    engine = Engine(url, mla, slot, **extra)
    try:
        first = make_keys(NUM_CPU_BLOCKS, seed=2)
        data = engine.store(first, rng)
        engine.store(make_keys(NUM_CPU_BLOCKS, seed=3), rng)  # evicts `first` from the CPU tier
        req = ReqContext(req_id="load")
        assert all(engine.manager.primary_tier.lookup(k, req) is False for k in first)

        engine.pool[:] = np.int8(-91)  # poison: every byte that comes back came from kvtier
        assert engine.lookup_until_settled(first, req) == [True] * len(first)
        spec = engine.manager.prepare_load(first, req)
        for key, block in zip(first, spec.block_ids):
            np.testing.assert_array_equal(engine.pool[block], data[key])
        engine.manager.complete_load(first, req)
        assert engine.tier.store.stats()["set_ok_pages"] == 2 * NUM_CPU_BLOCKS
    finally:
        engine.shutdown()


def test_another_engine_sees_the_blocks_lookups_in_flight_then_settled(tmp_path):
    url = f"file://{tmp_path}/store"
    mla, slot = SHAPES["mha"]
    rng = np.random.default_rng(4)
    writer = Engine(url, mla, slot)
    try:
        stored = make_keys(3, seed=5)
        data = writer.store(stored, rng)
    finally:
        writer.shutdown()
    reader = Engine(url, mla, slot)
    try:
        req = ReqContext(req_id="reader")
        never_stored = make_keys(1, seed=6)[0]
        # A block the tier has not seen: the first answer is always "in flight" (an exists query
        # was started), never a blocking call on the scheduler thread.
        assert reader.tier.lookup(stored[0], req) is None
        assert reader.tier.lookup(never_stored, req) is None
        reader.pool[:] = np.int8(-91)
        assert reader.lookup_until_settled(stored + [never_stored], req) == [True] * 3 + [False]
        spec = reader.manager.prepare_load(stored, req)
        for key, block in zip(stored, spec.block_ids):
            np.testing.assert_array_equal(reader.pool[block], data[key])
        reader.manager.complete_load(stored, req)
        # The absent verdict holds for the request that asked, until it finishes.
        assert reader.tier.lookup(never_stored, req) is False
        reader.manager.request_finished(req)
        assert reader.tier.lookup(never_stored, req) is None
        # A request that never asks again (aborted) leaves no query behind once it finishes.
        reader.manager.request_finished(req)
        assert reader.tier._lookups_in_flight == {}
    finally:
        reader.shutdown()


def test_failed_load_is_reported_failed_then_absent_never_wrong_bytes(tmp_path):
    mla, slot = SHAPES["mla"]
    rng = np.random.default_rng(7)
    engine = Engine(f"file://{tmp_path}/store", mla, slot)
    try:
        first = make_keys(NUM_CPU_BLOCKS, seed=8)
        data = engine.store(first, rng)
        engine.store(make_keys(NUM_CPU_BLOCKS, seed=9), rng)
        lost = first[0]
        assert engine.tier.store.remove([page_key_of(lost)]) == [True]  # the store lost it after the tier saw it

        engine.pool[:] = np.int8(-91)
        req = ReqContext(req_id="load")
        # The tier still believes `lost` is present: its promotion fails (the whole batched job
        # reports failure, vLLM frees the slots), then `lost` is absent and the rest load again.
        answers = engine.lookup_until_settled(first, req)
        assert answers == [False] + [True] * (len(first) - 1)
        assert engine.manager.primary_tier.lookup(lost, req) is False
        spec = engine.manager.prepare_load(first[1:], req)
        for key, block in zip(first[1:], spec.block_ids):
            np.testing.assert_array_equal(engine.pool[block], data[key])
        engine.manager.complete_load(first[1:], req)
    finally:
        engine.shutdown()


def test_vllm_factory_loads_the_tier_by_module_path():
    cls = SecondaryTierFactory.get_tier_class(
        {"type": "KvtierTier", "module_path": "kvtier.integrations.vllm"}
    )
    assert cls is KvtierTier


def _try_config(tmp_path, **changes):
    cfg = tier_config(f"file://{tmp_path}/store", False)
    cfg.update(changes)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    view = memoryview(np.zeros((2, row_bytes(False, 256)), dtype=np.int8))
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, None)
    tier.shutdown()


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"url": None}, "url"),
        ({"num_layers": "4"}, "num_layers"),
        ({"mla": 1}, "mla"),
        ({"block_tokens": 0}, "block_tokens"),
        ({"num_layers": 3}, "num_layers"),  # the row is not 2 x 3 layers x 16 tokens x bytes
        ({"no_such_option": 1}, "no_such_option"),  # not a tier field nor a storage option
        ({"model_id": None}, "model_id"),  # not given, and no vLLM config to read it from
    ],
)
def test_bad_config_is_a_value_error_naming_the_field(tmp_path, changes, named):
    with pytest.raises(ValueError, match=named):
        _try_config(tmp_path, **changes)


def offloading_spec_stand_in():
    """Stands for vLLM's OffloadingSpec (only the attributes the tier reads): the real one needs
    vLLM's VllmConfig (vllm.config), which is not part of the reconstructed source."""
    return types.SimpleNamespace(
        vllm_config=types.SimpleNamespace(
            model_config=types.SimpleNamespace(model="org/model-8b", dtype="torch.bfloat16",
                                               use_mla=False),
            cache_config=types.SimpleNamespace(cache_dtype="auto"),
            parallel_config=types.SimpleNamespace(world_size=1),
        ),
        kv_cache_config=types.SimpleNamespace(
            kv_cache_groups=[types.SimpleNamespace(layer_names=[f"l{i}" for i in range(LAYERS)])]
        ),
        gpu_block_size=(BLOCK_TOKENS,),
        block_size_factor=1,
    )


def test_settings_default_to_vllms_config(tmp_path):
    """The namespace comes from vLLM's config when the tier's dict omits it."""
    cfg = {"type": "KvtierTier", "module_path": "kvtier.integrations.vllm",
           "url": f"file://{tmp_path}/store"}
    spec = offloading_spec_stand_in()
    view = memoryview(np.zeros((2, row_bytes(False, 256)), dtype=np.int8))
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    try:
        explicit = SecondaryTierFactory.create_secondary_tier(
            {**tier_config(f"file://{tmp_path}/store", False), "model_id": "org/model-8b"},
            view, None)
        try:
            assert tier.store.namespace_name == explicit.store.namespace_name
        finally:
            explicit.shutdown()
        assert tier.store.page_bytes == row_bytes(False, 256)
    finally:
        tier.shutdown()


def test_docs_list_every_tier_field():
    from kvtier.integrations.vllm import TIER_FIELDS, TIER_STORAGE_DEFAULTS

    docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "vllm.md")
    with open(docs) as f:
        text = f.read()
    assert [f.name for f in TIER_FIELDS if f"| `{f.name}` |" not in text] == []
    assert [n for n, _, _ in TIER_STORAGE_DEFAULTS if f"| `{n}` |" not in text] == []


def test_file_stores_get_one_store_call_per_block_and_a_queue_bound_to_match(tmp_path):
    """file://: 16 blocks a tier call, each block its own store call (max_batch_pages=1), and so
    8 tier calls in flight (128 store calls, half the store's queue); the config overrides each."""
    from kvtier.integrations.vllm import resolve_tier_config

    settings, storage = resolve_tier_config(None, tier_config(f"file://{tmp_path}/s", False))
    assert (settings["pages_per_call"], storage["max_batch_pages"],
            settings["max_calls_in_flight"]) == (16, 1, 8)
    settings, storage = resolve_tier_config(
        None, tier_config(f"file://{tmp_path}/s", False, max_batch_pages=4, max_queued_batches=64))
    assert (storage["max_batch_pages"], settings["max_calls_in_flight"]) == (4, 8)
    settings, storage = resolve_tier_config(None, tier_config("memory://", False))
    assert "max_batch_pages" not in storage  # the store's own default: one store call a tier call
    assert (settings["pages_per_call"], settings["max_calls_in_flight"]) == (64, 128)


def test_blocks_the_store_holds_are_not_rewritten(tmp_path):
    from vllm.v1.kv_offload.tiering.base import JobMetadata

    mla, slot = SHAPES["mha"]
    engine = Engine(f"file://{tmp_path}/store", mla, slot)
    try:
        keys = make_keys(4, seed=10)
        engine.store(keys, np.random.default_rng(11))
        written = engine.tier.store.stats()["set_ok_pages"]
        assert written == 4
        req = ReqContext(req_id="again")
        again = keys[:2] + make_keys(1, seed=12)
        engine.tier.submit_store(JobMetadata(job_id=10**9, keys=again,
                                             block_ids=np.arange(3, dtype=np.int64),
                                             is_promotion=False, req_context=req))
        deadline = time.monotonic() + DEADLINE_S
        results = []
        while not results:
            assert time.monotonic() < deadline
            results = list(engine.tier.get_finished())
            time.sleep(0.001)
        assert [(r.job_id, r.success) for r in results] == [(10**9, True)]
        assert engine.tier.store.stats()["set_ok_pages"] == written + 1
    finally:
        engine.shutdown()


def test_the_docs_config_builds_a_tier(tmp_path):
    """docs/vllm.md's --kv-transfer-config, its tier entry as vLLM's factory receives it (the
    store directory moved under tmp_path)."""
    docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "vllm.md")
    with open(docs) as f:
        text = f.read()
    config = json.loads(text.split("--kv-transfer-config '", 1)[1].split("'", 1)[0])
    (tier_cfg,) = config["kv_connector_extra_config"]["secondary_tiers"]
    path, _, query = tier_cfg["url"].removeprefix("file://").partition("?")
    tier_cfg = {**tier_cfg, "url": f"file://{tmp_path}{path}?{query}"}
    view = memoryview(np.zeros((2, row_bytes(False, 256)), dtype=np.int8))
    tier = SecondaryTierFactory.create_secondary_tier(tier_cfg, view, offloading_spec_stand_in())
    tier.shutdown()


def vllm_event_hash(offload_key) -> int:
    """The hash vLLM's own KV events carry for the block of an offload key: vLLM's
    maybe_convert_block_hash (vllm/v1/core/kv_cache_utils.py, with vLLM's default
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1; that module imports the rest of vLLM, so its one-line
    rule is restated here) of get_offload_block_hash (vLLM's own, from kv_offload/base.py)."""
    return int.from_bytes(get_offload_block_hash(offload_key), "big") & ((1 << 64) - 1)


def one_value_bytes(url: str, mla: bool, slot: int) -> int:
    """What one block takes of a store's capacity (its value, header included)."""
    sizer = kvtier.PageStore(url, model_id="sizer", kv_dtype="bf16", layout="page_first",
                             mla=True, num_layers=1, slot_bytes=row_bytes(mla, slot), page_size=1)
    try:
        page = np.zeros(sizer.page_bytes, dtype=np.uint8)
        assert sizer.set([page_key_of(make_offload_key(b"\x05" * 32, 0))],
                         [page.ctypes.data]) == [True]
        return sizer.stats()["stored_bytes"]
    finally:
        sizer.close()


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_kv_events_carry_vllms_block_hashes_and_storage_medium(tmp_path, kind):
    """With kv_events_endpoint the tier's store publishes vLLM-format KV events with the medium of
    vLLM's own storage tiers and vLLM's own block hashes: BlockStored for the blocks a store job
    wrote, BlockRemoved for the ones the store evicted by itself; replaying them gives the blocks
    the store holds, each by the hash vLLM's events give it (a router joins the two streams)."""
    pytest.importorskip("zmq")
    pytest.importorskip("msgpack")
    from kv_events_listener import Listener

    mla, slot = SHAPES["mha"]
    probe_key = make_offload_key(b"\x07" * 32, 0)
    base = "memory://" if kind == "memory" else f"file://{tmp_path}/store"
    value_bytes = one_value_bytes(base if kind == "memory" else f"file://{tmp_path}/sizer",
                                  mla, slot)
    engine = Engine(f"{base}?capacity={6 * value_bytes}", mla, slot,
                    kv_events_endpoint="tcp://127.0.0.1:*")
    listener = None
    try:
        store = engine.tier.store
        assert store.kv_events_medium == "STORAGE"
        listener = Listener(store, page_key_of(probe_key))
        rng = np.random.default_rng(31)
        keys = []
        for batch in range(4):  # 16 blocks through a store that holds 6
            batch_keys = make_keys(4, seed=300 + batch)
            engine.store(batch_keys, rng)
            keys += batch_keys
        assert store.stats()["evicted_pages"] > 0
        listener.catch_up(store)
        assert set(listener.blocks) == {"STORAGE"}
        there = store.exists([page_key_of(k) for k in keys + [probe_key]])
        assert listener.blocks["STORAGE"] == {
            vllm_event_hash(k) for k, t in zip(keys + [probe_key], there) if t}
        stored = {h for e in listener.events("BlockStored") for h in e[1]}
        assert {vllm_event_hash(k) for k in keys} <= stored
        removed = {h for e in listener.events("BlockRemoved") for h in e[1]}
        assert removed and removed <= {vllm_event_hash(k) for k in keys + [probe_key]}
    finally:
        if listener is not None:
            listener.close()
        engine.shutdown()


def test_evictions_after_a_restart_carry_vllms_block_hashes(tmp_path):
    """A file store evicts blocks another tier wrote before this one opened (found by its restart
    scan): their BlockRemoved carries vLLM's block hashes too, since the page key encodes them."""
    pytest.importorskip("zmq")
    pytest.importorskip("msgpack")
    from kv_events_listener import Listener

    mla, slot = SHAPES["mla"]
    sizer_url = f"file://{tmp_path}/sizer"
    url = f"file://{tmp_path}/store?capacity={6 * one_value_bytes(sizer_url, mla, slot)}"
    rng = np.random.default_rng(41)
    before = make_keys(4, seed=400)
    writer = Engine(url, mla, slot)
    try:
        writer.store(before, rng)
    finally:
        writer.shutdown()
    engine = Engine(url, mla, slot, kv_events_endpoint="tcp://127.0.0.1:*")
    listener = None
    try:
        store = engine.tier.store
        listener = Listener(store, page_key_of(make_offload_key(b"\x07" * 32, 0)))
        after = make_keys(4, seed=401) + make_keys(4, seed=402)
        engine.store(after[:4], rng)
        engine.store(after[4:], rng)
        listener.catch_up(store)
        gone = [k for k, t in zip(before, store.exists([page_key_of(k) for k in before])) if not t]
        assert gone, "the store evicted none of the blocks written before it opened"
        removed = {h for e in listener.events("BlockRemoved") for h in e[1]}
        assert {vllm_event_hash(k) for k in gone} <= removed
    finally:
        if listener is not None:
            listener.close()
        engine.shutdown()


def test_raw_bytes_block_hashes_are_refused_with_events(monkeypatch):
    """vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 (raw-bytes hashes in its events) cannot be
    matched by kvtier's 64-bit events: a ValueError naming it, not events a router cannot join."""
    mla, slot = SHAPES["mla"]
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    with pytest.raises(ValueError, match="VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"):
        Engine("memory://", mla, slot, kv_events_endpoint="tcp://127.0.0.1:*")
    Engine("memory://", mla, slot).shutdown()  # without events the setting does not matter


def test_page_keys_keep_blocks_and_groups_apart():
    """page_key_of is one-to-one on vLLM's offload keys (32-byte sha256 hashes up to the 4 bytes it
    drops, 16-byte xxhash ones wholly) and ends in vLLM's 64-bit event hash."""
    rng = np.random.default_rng(50)
    keys = [make_offload_key(rng.bytes(n), g)
            for n in (32, 16) for g in (0, 1, 7) for _ in range(50)]
    pages = [page_key_of(k) for k in keys]
    assert all(len(p) == 32 for p in pages)
    assert len(set(pages)) == len(keys)
    assert all(int.from_bytes(p[-8:], "big") == vllm_event_hash(k) for k, p in zip(keys, pages))
    with pytest.raises(ValueError, match="offload key"):
        page_key_of(b"\0\0\0\0")


def test_kv_events_medium_can_be_set():
    mla, slot = SHAPES["mla"]
    engine = Engine("memory://", mla, slot, kv_events_endpoint="tcp://127.0.0.1:*",
                    kv_events_medium="KVTIER")
    try:
        assert engine.tier.store.kv_events_medium == "KVTIER"
    finally:
        engine.shutdown()
    with pytest.raises(ValueError, match="kv_events_endpoint"):
        Engine("memory://", mla, slot, kv_events_endpoint="no-such-transport")
