"""A pyzmq subscriber to a kvtier.PageStore's KV events, for the tests (vLLM's wire protocol,
include/kvtier/kv_events.h): it connects to the store's PUB endpoint, makes sure its subscription
is live before the test starts (probe sets until one is heard), and replays the events into the
set of block hashes per medium a router would hold. Every wait is bounded; the context is
destroyed with linger 0.
"""

import time

import msgpack
import numpy as np
import zmq

WAIT_S = 30


def block_hash(key):
    """BlockHashOf a page key given as 64 hex digits: its last 8 bytes, big-endian."""
    return int(key[-16:], 16)


class Listener:
    def __init__(self, store, probe_key):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(store.kv_events_endpoint)
        self.batches = []  # (topic, seq, ts, events) in arrival order
        self.blocks = {}  # medium -> set of block hashes, replayed from the events
        self._probe(store, probe_key)

    def _probe(self, store, key):
        """Sets `key` until an event arrives: the subscription is live from then on."""
        page = np.zeros(store.page_bytes, dtype=np.uint8)
        deadline = time.monotonic() + WAIT_S
        while not self.sub.poll(100):
            assert time.monotonic() < deadline, "no KV event reached the subscriber"
            assert store.set([key], [page.ctypes.data]) == [True]
        self.drain(0)

    def drain(self, wait_ms=200):
        """Receives what is there (waiting up to wait_ms for the first message)."""
        while self.sub.poll(wait_ms):
            topic, seq, payload = self.sub.recv_multipart()
            ts, events = msgpack.unpackb(payload, raw=False)[:2]
            seq = int.from_bytes(seq, "big")
            if self.batches:
                assert seq == self.batches[-1][1] + 1, "a gap in the stream"
            self.batches.append((topic, seq, ts, events))
            for event in events:
                self._apply(event)
            wait_ms = 0

    def catch_up(self, store):
        """Receives every batch the store has published so far (bounded)."""
        assert store.flush_kv_events(WAIT_S), "the store's events were not sent in time"
        self.wait_for(store.stats()["kv_events_published_batches"])

    def wait_for(self, published_batches):
        """Receives until the batch with seq published_batches - 1 has arrived (bounded)."""
        deadline = time.monotonic() + WAIT_S
        while not self.batches or self.batches[-1][1] < published_batches - 1:
            assert time.monotonic() < deadline, (
                f"{published_batches} batches published, last seen "
                f"{self.batches[-1][1] if self.batches else None}")
            self.drain(100)

    def _apply(self, event):
        tag = event[0]
        if tag == "BlockStored":
            hashes, parent, tokens, block_size, lora, medium = event[1:7]
            self.blocks.setdefault(medium, set()).update(hashes)
        elif tag == "BlockRemoved":
            hashes, medium = event[1:3]
            self.blocks.setdefault(medium, set()).difference_update(hashes)
        else:
            raise AssertionError(f"unexpected event {event!r}")

    def events(self, tag=None):
        return [e for _, _, _, events in self.batches for e in events if tag in (None, e[0])]

    def close(self):
        self.ctx.destroy(linger=0)
