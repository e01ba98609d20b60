#!/usr/bin/env python3
"""KvEventPublisher against real pyzmq subscribers on 127.0.0.1 (ports chosen by the kernel).

Drives tests/events/kv_event_publisher_tool (a KvEventPublisher fed from stdin; it prints each
batch's events as vLLM's decoder sees them) and checks, with msgpack and pyzmq only:
  1. every message is (topic, seq as 8-byte big-endian, payload), the payload decodes to
     [ts float, events] with each event a list whose first element is the tag, equal to what was
     published;
  2. a stalled subscriber (small high-water marks) loses batches inside ZeroMQ while the caller
     never blocks; it sees the seq gap and recovers every batch from the replay socket;
  3. a subscriber restart: the new subscriber fetches what it missed while it was gone from the
     replay socket, from the old one's last seq;
  4. a queue of one batch under a burst: drops are counted, every dropped batch is a seq that
     neither the PUB socket nor the replay socket ever carries, and nothing else is missing.
Every wait is bounded. Exit 77 (skip) without pyzmq or msgpack; a failure under CI=true
(tests/tools/missing_dep.py).

Usage: kv_event_zmq_test.py KV_EVENT_PUBLISHER_TOOL
"""
import json
import os
import queue
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from child_process import die_with_parent  # noqa: E402
from missing_dep import missing  # noqa: E402

try:
    import msgpack
    import zmq
except ImportError as e:  # python3-zmq, python3-msgpack
    sys.exit(missing("%s (Debian: python3-zmq, python3-msgpack)" % e))

TOPIC = "kv-events"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
WAIT_S = 30


def fail(message):
    raise SystemExit("FAIL: " + message)


class Tool:
    """The publisher process; `batches[seq]` is what it published as batch `seq`."""

    def __init__(self, path, max_queue, send_hwm):
        self.proc = subprocess.Popen(
            [path, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", TOPIC, str(max_queue),
             str(send_hwm)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            preexec_fn=die_with_parent())
        # Lines arrive through a reader thread so that every wait for one is bounded.
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        hello = json.loads(self._line())
        self.endpoint = hello["endpoint"]
        self.replay_endpoint = hello["replay_endpoint"]
        self.batches = []

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def _line(self):
        try:
            line = self.lines.get(timeout=WAIT_S)
        except queue.Empty:
            fail("the publisher tool said nothing for %d s" % WAIT_S)
        if not line:
            fail("the publisher tool exited with %s" % self.proc.poll())
        return line

    def _command(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def publish(self, count, seed, blocks, block_size):
        self._command("publish %d %d %d %d" % (count, seed, blocks, block_size))
        for _ in range(count):
            self.batches.append(json.loads(self._line())["events"])

    def probe(self):
        self._command("probe")
        self.batches.append(json.loads(self._line())["events"])

    def flush(self):
        self._command("flush")
        stats = json.loads(self._line())
        if not stats["flushed"]:
            fail("flush timed out: %s" % stats)
        return stats

    def close(self):
        self.proc.stdin.close()
        try:
            rc = self.proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            fail("the publisher tool did not exit")
        if rc != 0:
            fail("the publisher tool exited with %d" % rc)


def check_payload(tool, seq, payload):
    batch = msgpack.unpackb(payload, raw=False)
    if not isinstance(batch, list) or len(batch) != 2:
        fail(("seq %d: batch is not [ts, events]: %r" % (seq, batch))[:300])
    ts, events = batch
    if not isinstance(ts, float) or abs(ts - time.time()) > 600:
        fail("seq %d: ts %r is not a float near now" % (seq, ts))
    if seq >= len(tool.batches):
        fail("seq %d was never published (%d batches)" % (seq, len(tool.batches)))
    if events != tool.batches[seq]:
        fail("seq %d: events differ from what was published" % seq)


class Subscriber:
    def __init__(self, ctx, tool, rcvhwm):
        self.tool = tool
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        self.sub.connect(tool.endpoint)
        self.ctx = ctx
        self.got = set()

    def _take(self, frames):
        if len(frames) != 3 or frames[0] != TOPIC.encode() or len(frames[1]) != 8:
            fail("not (topic, 8-byte seq, payload): %r" % [f[:16] for f in frames])
        seq = int.from_bytes(frames[1], "big")
        check_payload(self.tool, seq, frames[2])
        self.got.add(seq)
        return seq

    def handshake(self):
        """Probes until one arrives (PUB drops what precedes the subscription); its seq."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            self.tool.probe()
            if self.sub.poll(100):
                seq = self._take(self.sub.recv_multipart())
                self.drain()
                return seq
        fail("no subscription within %d s" % WAIT_S)

    def drain(self, idle_ms=500):
        """Reads until nothing arrives for idle_ms."""
        deadline = time.monotonic() + 120
        while self.sub.poll(idle_ms):
            self._take(self.sub.recv_multipart())
            if time.monotonic() > deadline:
                fail("the subscriber never ran dry")

    def replay(self, start):
        """Asks the replay socket for every buffered batch from `start`; the seqs it sent."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.tool.replay_endpoint)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        seqs = []
        while True:
            if not dealer.poll(WAIT_S * 1000):
                fail("replay from %d: no answer within %d s" % (start, WAIT_S))
            frames = dealer.recv_multipart()
            if len(frames) != 3 or frames[0] != b"":
                fail("replay frame is not ('', seq, payload): %d frames" % len(frames))
            if frames[1] == END_SEQ:
                if frames[2] != b"":
                    fail("the end marker carries a payload")
                dealer.close()
                return seqs
            seq = int.from_bytes(frames[1], "big")
            check_payload(self.tool, seq, frames[2])
            self.got.add(seq)
            seqs.append(seq)

    def close(self):
        self.sub.close()


def stalled_subscriber_and_restart(ctx, tool_path):
    tool = Tool(tool_path, max_queue=100000, send_hwm=16)
    a = Subscriber(ctx, tool, rcvhwm=16)
    first = a.handshake()
    # ~30 MB while `a` reads nothing: more than ZeroMQ's 16 + 16 messages and the sockets' buffers.
    tool.publish(3000, seed=1, blocks=8, block_size=256)
    stats = tool.flush()
    if stats["dropped_batches"] != 0 or stats["send_errors"] != 0:
        fail("stall: the queue dropped or a send failed: %s" % stats)
    if stats["max_publish_us"] > 100000:
        fail("stall: a Publish call took %d us" % stats["max_publish_us"])
    a.drain()
    expected = set(range(first, len(tool.batches)))
    lost = expected - a.got
    if not lost:
        fail("stall: the stalled subscriber lost nothing; the test did not stall it")
    replayed = a.replay(min(lost))
    if expected - a.got:
        fail("stall: still missing after replay: %d seqs" % len(expected - a.got))
    print("stall: subscriber lost %d of %d batches inside ZeroMQ; replay resent %d; all %d "
          "recovered; max Publish %d us" % (len(lost), len(expected), len(replayed),
                                            len(expected), stats["max_publish_us"]))

    last_a = max(a.got)
    a.close()
    tool.publish(200, seed=2, blocks=2, block_size=16)  # while no one listens
    # Sent (to no one) before `b` subscribes: on a loaded box the publisher's thread was still
    # sending them when `b` came, and `b` saw one ("published while it was gone").
    tool.flush()
    b = Subscriber(ctx, tool, rcvhwm=1000)
    first_b = b.handshake()
    if first_b <= last_a + 200:
        fail("restart: the new subscriber got seq %d, published while it was gone" % first_b)
    b.replay(last_a + 1)
    missing = set(range(last_a + 1, len(tool.batches))) - b.got
    if missing:
        fail("restart: %d seqs missing after replay" % len(missing))
    print("restart: new subscriber first saw seq %d, recovered %d..%d from the replay socket"
          % (first_b, last_a + 1, first_b - 1))
    b.close()
    tool.close()


def drops_are_counted(ctx, tool_path):
    tool = Tool(tool_path, max_queue=1, send_hwm=100000)
    c = Subscriber(ctx, tool, rcvhwm=0)
    first = c.handshake()
    tool.publish(3000, seed=3, blocks=1, block_size=16)
    stats = tool.flush()
    c.drain()
    c.replay(first)
    total = len(tool.batches)
    missing = set(range(first, total)) - c.got
    if stats["dropped_batches"] == 0:
        fail("drops: a queue of 1 batch kept up with a burst of 3000")
    if stats["published_batches"] + stats["dropped_batches"] != total:
        fail("drops: published %d + dropped %d != %d batches" % (
            stats["published_batches"], stats["dropped_batches"], total))
    if stats["dropped_events"] != 2 * stats["dropped_batches"]:
        fail("drops: %d events dropped for %d batches of 2" % (
            stats["dropped_events"], stats["dropped_batches"]))
    # The probes before `first` go out one per 100 ms: every drop is in the burst.
    if len(missing) != stats["dropped_batches"]:
        fail("drops: %d seqs never arrived, %d batches counted as dropped" % (
            len(missing), stats["dropped_batches"]))
    print("drops: %d of %d batches dropped and counted; exactly those seqs never arrived" % (
        stats["dropped_batches"], total))
    c.close()
    tool.close()


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    ctx = zmq.Context()
    try:
        stalled_subscriber_and_restart(ctx, sys.argv[1])
        drops_are_counted(ctx, sys.argv[1])
    finally:
        # destroy, not term: term waits for every socket to be closed, and a failure inside
        # Subscriber.replay leaves its DEALER open: the FAIL line became a 900 s ctest timeout.
        ctx.destroy(linger=0)
    print("PASS")


if __name__ == "__main__":
    main()
