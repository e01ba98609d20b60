"""kvtier.PageStore's KV events (kv_events_* options): a pyzmq subscriber on 127.0.0.1 sees
BlockStored for every page a set wrote and BlockRemoved for every page the store evicted by
itself or remove() / clear() removed, in the store's medium; replaying the events gives exactly
the pages the store holds. Bad options are errors naming the field.
"""

import os
import tempfile

import numpy as np
import pytest

import kvtier

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from kv_events_listener import Listener, block_hash  # noqa: E402

PAGE_SIZE = 4
NAMESPACE = dict(model_id="events/model", kv_dtype="bf16", layout="page_first", mla=True,
                 num_layers=1, slot_bytes=64, page_size=PAGE_SIZE)


def open_store(url, **options):
    return kvtier.PageStore(url, kv_events_endpoint="tcp://127.0.0.1:*", **NAMESPACE, **options)


def chains(count, length, seed):
    """`count` prompts of `length` pages each: their page keys (hex) in prompt order."""
    rng = np.random.default_rng(seed)
    return [kvtier.page_keys(rng.integers(0, 50000, size=length * PAGE_SIZE).tolist(), PAGE_SIZE,
                             f"salt{seed}") for _ in range(count)]


def held(store, keys):
    """The block hashes of `keys` the store holds now."""
    return {block_hash(k) for k, there in zip(keys, store.exists(keys)) if there}


def test_block_hash_is_the_page_keys_int_form():
    tokens = list(range(3 * PAGE_SIZE))
    assert [block_hash(k) for k in kvtier.page_keys(tokens, PAGE_SIZE, "s")] == \
        kvtier.page_keys(tokens, PAGE_SIZE, "s", as_int=True)


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_events_replay_to_what_the_store_holds(scheme):
    """Prompts stored chain by chain into a store that holds a third of them: BlockStored for the
    written pages (parents chained), BlockRemoved for the evicted ones, one medium."""
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store("memory://" if scheme == "memory" else f"file://{tmp}/store")
        probe = chains(1, 1, seed=99)[0]
        listener = Listener(store, probe[0])
        try:
            page_bytes = store.page_bytes
            stored_bytes = store.stats()["stored_bytes"]  # the probe page, header included
            capacity = 12 * stored_bytes
            store.close()
            url = (f"memory://?capacity={capacity}" if scheme == "memory"
                   else f"file://{tmp}/store2?capacity={capacity}")
            listener.close()
            store = open_store(url)
            listener = Listener(store, probe[0])
            prompts = chains(6, 6, seed=1)
            rng = np.random.default_rng(2)
            pages = rng.integers(0, 256, size=(6, page_bytes), dtype=np.uint8)
            for keys in prompts:
                parents = [None] + keys[:-1]
                ok = store.set(keys, [p.ctypes.data for p in pages], parents)
                assert any(ok)
            assert store.stats()["evicted_pages"] > 0, "the test needs the store to evict"
            listener.catch_up(store)
            medium = "MEMORY" if scheme == "memory" else "DISK"
            assert store.kv_events_medium == medium
            assert set(listener.blocks) == {medium}
            all_keys = [k for keys in prompts for k in keys] + probe
            assert listener.blocks[medium] == held(store, all_keys)
            stored = listener.events("BlockStored")
            assert all(e[3] == [] and e[4] == PAGE_SIZE for e in stored)  # no tokens known
            # Parents: an event that starts inside a prompt names the page before it.
            parent_of = {block_hash(k): block_hash(p) for keys in prompts
                         for p, k in zip(keys, keys[1:])}
            for e in stored:
                first = e[1][0]
                assert e[2] == parent_of.get(first), e
                for a, b in zip(e[1], e[1][1:]):
                    assert parent_of[b] == a  # one event: one chain, in order
            assert listener.events("BlockRemoved")
            assert all(topic == b"" for topic, _, _, _ in listener.batches)
        finally:
            store.close()
            listener.close()


def test_remove_and_clear_publish_block_removed():
    store = open_store("memory://", kv_events_topic="kvtier", kv_events_medium="STORAGE")
    listener = Listener(store, chains(1, 1, seed=98)[0][0])
    try:
        (keys,) = chains(1, 5, seed=3)
        pages = np.zeros((5, store.page_bytes), dtype=np.uint8)
        assert store.set(keys, [p.ctypes.data for p in pages]) == [True] * 5
        assert store.remove(keys[:2]) == [True, True]
        listener.catch_up(store)
        assert listener.blocks["STORAGE"] == held(store, keys) | {
            block_hash(chains(1, 1, seed=98)[0][0])}
        removed = listener.events("BlockRemoved")
        assert removed == [["BlockRemoved", [block_hash(k) for k in keys[:2]], "STORAGE"]]
        # Without parents each page is an event of its own (nothing says they are one chain).
        assert [e[1] for e in listener.events("BlockStored")][-5:] == \
            [[block_hash(k)] for k in keys]
        assert store.clear() == 4  # three of the prompt and the probe page
        listener.catch_up(store)
        assert listener.blocks["STORAGE"] == set()
        assert all(topic == b"kvtier" for topic, _, _, _ in listener.batches)
    finally:
        store.close()
        listener.close()


def test_a_dropped_page_is_removed_after_it_is_stored_and_a_failed_set_publishes_nothing():
    # A store of one page: a page whose chain is the store's only one is its chain's tail, which
    # the store evicts first: written, then dropped at once (the set says True). A page whose
    # parent is gone is refused: no event.
    one_page = 328  # the page's 256 bytes and its 72-byte header (memory:// refuses less)
    store = open_store(f"memory://?capacity={one_page}")
    probe = chains(1, 1, seed=97)[0][0]
    listener = Listener(store, probe)
    try:
        (keys,) = chains(1, 3, seed=4)
        pages = np.zeros((3, store.page_bytes), dtype=np.uint8)
        assert store.set(keys[:1], [pages[0].ctypes.data]) == [True]
        assert store.set(keys[1:2], [pages[1].ctypes.data], [keys[0]]) == [True]
        assert store.flush_kv_events()
        published = store.stats()["kv_events_published_batches"]
        assert store.set(keys[2:3], [pages[2].ctypes.data], [keys[1]]) == [False]
        assert store.flush_kv_events()
        assert store.stats()["kv_events_published_batches"] == published
        listener.wait_for(published)
        h = [block_hash(k) for k in keys]
        assert listener.batches[-1][3] == [
            ["BlockStored", [h[1]], h[0], [], PAGE_SIZE, None, "MEMORY", None],
            ["BlockRemoved", [h[1]], "MEMORY"]]
        assert listener.blocks["MEMORY"] == held(store, keys + [probe]) == {h[0]}
    finally:
        store.close()
        listener.close()


def test_without_a_subscriber_sets_do_not_wait():
    # A connected PUB endpoint nobody listens on: the publisher queues and ZeroMQ drops; every set
    # still completes (the caller never waits for the socket).
    store = kvtier.PageStore("memory://", kv_events_endpoint="tcp://127.0.0.1:9", **NAMESPACE)
    try:
        pages = np.zeros((8, store.page_bytes), dtype=np.uint8)
        for keys in chains(20, 8, seed=5):
            assert store.set(keys, [p.ctypes.data for p in pages]) == [True] * 8
        assert store.kv_events_endpoint == "tcp://127.0.0.1:9"
    finally:
        store.close()


def test_no_events_without_an_endpoint():
    store = kvtier.PageStore("memory://", **NAMESPACE)
    try:
        assert store.kv_events_endpoint == "" and store.kv_events_medium == ""
        assert "kv_events_published_batches" not in store.stats()
    finally:
        store.close()


@pytest.mark.parametrize("options,text", [
    (dict(kv_events_endpoint="not-an-endpoint"), "kv_events_endpoint = 'not-an-endpoint'"),
    (dict(kv_events_endpoint="tcp://127.0.0.1:*", kv_events_replay_endpoint="bogus"),
     "kv_events_replay_endpoint = 'bogus'"),
    (dict(kv_events_topic="t"), "kv_events_topic"),
    (dict(kv_events_medium="DISK"), "kv_events_medium"),
    (dict(kv_events_endpoint="tcp://127.0.0.1:*", kv_events_medium="TWO WORDS"),
     "kv_events_medium"),
    (dict(kv_events_endpoint=5), "kv_events_endpoint"),
    (dict(kv_event_endpoint="tcp://127.0.0.1:*"), "kv_event_endpoint"),
])
def test_bad_options_name_the_field(options, text):
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.PageStore("memory://", **NAMESPACE, **options)
    assert text in str(e.value), str(e.value)


def test_options_are_listed_with_the_storage_options():
    names = [f["name"] for f in kvtier.PageStore.storage_option_fields()]
    for name in ("kv_events_endpoint", "kv_events_replay_endpoint", "kv_events_topic",
                 "kv_events_medium"):
        assert name in names
    assert names.index("io_threads") < names.index("kv_events_endpoint")


if __name__ == "__main__":
    raise SystemExit(pytest.main([os.path.abspath(__file__), "-v"]))
