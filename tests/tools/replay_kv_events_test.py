#!/usr/bin/env python3
"""`kvtier replay --kv-events` against a real pyzmq subscriber, as a KV-aware router uses it.

The replay binds its PUB and replay sockets on 127.0.0.1 with ports the kernel picks
(tcp://127.0.0.1:*, bound as vLLM binds an endpoint with '*') and prints them; the subscriber
connects. While the replay runs, the subscriber restarts once: it closes its socket, connects a
new one, notices the seq gap and fetches the batches it missed from the replay socket (and any it
lost before its first subscription arrived). At the end it has every batch the run numbered (the report's kv_events.batches), rebuilds
from the events alone, per medium (GPU, CPU_PINNED, DISK), the set of cached block hashes, and
compares it with the cache's own per-tier block set in the report: equal, or the test fails.
The run holds its sockets open after the report (--kv-events-hold), so the restart does not race
the run's end; the test ends the hold by terminating the process. Every BlockStored is also checked against hashlib: its block hashes are the last 8 bytes
(big-endian) of the chained SHA-256 page keys of its token ids after its parent block.

Usage: replay_kv_events_test.py KVTIER
"""
import hashlib
import json
import os
import queue
import struct
import subprocess
import sys
import tempfile
import threading
import time

from child_process import die_with_parent
from missing_dep import missing

try:
    import msgpack
    import zmq
except ImportError as e:  # python3-zmq, python3-msgpack
    sys.exit(missing("%s (Debian: python3-zmq, python3-msgpack)" % e))

TOPIC = b"kv"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
WAIT_S = 120


def fail(message):
    raise SystemExit("FAIL: " + message)


def replay_command(kvtier, out):
    return [kvtier, "replay", "--workload", "chat", "--requests", "300", "--rate", "60", "--seed", "3",
            "--model", "tiny", "--compute-model", "llama3-8b", "--device", "cpu",
            "--compute", "model", "--device-tokens", "8192", "--host-tokens", "16384",
            "--hicache-write-policy", "write_through", "--runs", "hierarchy", "--no-progress",
            "--json", out, "--kv-events", "tcp://127.0.0.1:*",
            "--kv-events-replay", "tcp://127.0.0.1:*", "--kv-events-topic", TOPIC.decode(),
            "--kv-events-hold", "120"]


class Stream:
    """The batches received so far, by seq (live or replayed)."""

    def __init__(self):
        self.batches = {}

    def take(self, seq, payload):
        batch = msgpack.unpackb(payload, raw=False)
        if not isinstance(batch, list) or len(batch) != 2 or not isinstance(batch[0], float):
            fail("seq %d: not [ts float, events]" % seq)
        self.batches.setdefault(seq, batch[1])


def connect_sub(ctx, endpoint):
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
    sub.connect(endpoint)
    return sub


def receive(sub, stream, until, idle_ms=200, seqs=None):
    """Takes live messages until `until()` or nothing arrives for idle_ms; appends their seqs to
    `seqs` (a new list by default), which it returns."""
    seqs = [] if seqs is None else seqs
    while not until():
        if not sub.poll(idle_ms):
            break
        frames = sub.recv_multipart()
        if len(frames) != 3 or frames[0] != TOPIC or len(frames[1]) != 8:
            fail("not (topic, 8-byte seq, payload)")
        seq = int.from_bytes(frames[1], "big")
        stream.take(seq, frames[2])
        seqs.append(seq)
    return seqs


def replay_from(ctx, endpoint, start, stream):
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    n = 0
    while True:
        if not dealer.poll(30000):
            fail("replay from %d: no answer in 30 s" % start)
        frames = dealer.recv_multipart()
        if len(frames) != 3 or frames[0] != b"":
            fail("replay answer is not ('', seq, payload)")
        if frames[1] == END_SEQ:
            dealer.close()
            return n
        stream.take(int.from_bytes(frames[1], "big"), frames[2])
        n += 1


def page_keys(tokens, block_size, previous):
    keys = []
    for p in range(len(tokens) // block_size):
        page = tokens[p * block_size:(p + 1) * block_size]
        previous = hashlib.sha256(previous + struct.pack("<%dI" % block_size, *page)).digest()
        keys.append(previous)
    return keys


def rebuild(stream, batches):
    """Per medium, the block hashes the events leave cached; checks every BlockStored's hashes."""
    media = {}
    full_keys = {}  # block hash -> 32-byte key, for chaining children from their parent
    for seq in range(batches):
        for event in stream.batches[seq]:
            tag = event[0]
            if tag == "BlockStored":
                if len(event) < 7:
                    fail("seq %d: BlockStored has %d fields" % (seq, len(event)))
                _, hashes, parent, tokens, block_size, _lora, medium = event[:7]
                if parent is None:
                    previous = b""  # the replay's namespace is "": SGLang's unsalted chain
                elif parent in full_keys:
                    previous = full_keys[parent]
                else:
                    fail("seq %d: parent block %d was never stored" % (seq, parent))
                keys = page_keys(tokens, block_size, previous)
                if [int.from_bytes(k[-8:], "big") for k in keys] != hashes:
                    fail("seq %d: block hashes are not the page keys of the token ids" % seq)
                for h, k in zip(hashes, keys):
                    full_keys[h] = k
                blocks = media.setdefault(medium, set())
                for h in hashes:
                    if h in blocks:
                        fail("seq %d: block %d stored twice in %s" % (seq, h, medium))
                    blocks.add(h)
            elif tag == "BlockRemoved":
                _, hashes, medium = event
                blocks = media.setdefault(medium, set())
                for h in hashes:
                    if h not in blocks:
                        fail("seq %d: block %d removed from %s, which lacks it" % (seq, h, medium))
                    blocks.remove(h)
            else:
                fail("seq %d: unexpected event %r" % (seq, tag))
    return media


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    kvtier = sys.argv[1]
    ctx = zmq.Context()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        sub = None
        proc = subprocess.Popen(replay_command(kvtier, out), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent())
        lines = queue.Queue()
        output = []

        def read(stream):
            for line in stream:
                output.append(line)
                lines.put(line)

        def read_lines(stream):
            read(stream)
            lines.put("")

        for s in (proc.stdout, proc.stderr):
            threading.Thread(target=read_lines, args=(s,), daemon=True).start()
        try:
            def wait_line(needle):
                deadline = time.monotonic() + WAIT_S
                while True:
                    try:
                        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
                    except queue.Empty:
                        fail("kvtier replay did not print '%s' in %d s" % (needle, WAIT_S))
                    if not line:
                        fail("kvtier replay ended without printing '%s'" % needle)
                    if needle in line:
                        return line

            line = wait_line(", replay socket on ")
            endpoint, replay_endpoint = line.split("kv events on ")[1].strip().split(
                ", replay socket on ")
            sub = connect_sub(ctx, endpoint)
            stream = Stream()

            # The first subscriber takes a few batches, then goes away.
            first = []
            deadline = time.monotonic() + WAIT_S
            while len(first) < 20 and time.monotonic() < deadline and proc.poll() is None:
                receive(sub, stream, lambda: len(first) >= 20, seqs=first)
            if not first:
                fail("the first subscriber received nothing")
            last = max(first)
            sub.close()
            sub = None
            # The run ends meanwhile (the report is written); the sockets stay open (--kv-events-hold).
            wait_line("holding the kv event sockets open")
            # The restarted subscriber: everything after its last seq from the replay socket, and
            # anything lost before the first subscription arrived.
            sub = connect_sub(ctx, endpoint)
            replayed = replay_from(ctx, replay_endpoint, last + 1, stream)
            if min(first) > 0 or any(s not in stream.batches for s in range(last)):
                replayed += replay_from(ctx, replay_endpoint, 0, stream)
            rc = proc.poll()
            if rc is not None:
                sys.stdout.write("".join(output))
                fail("kvtier replay exited (%d) during --kv-events-hold" % rc)
        finally:
            if proc.poll() is None:
                proc.terminate()  # ends the hold
                proc.wait(timeout=WAIT_S)
            if sub is not None:
                sub.close()
        with open(out) as f:
            run = json.load(f)["runs"][-1]
        if run["integrity"]["wrong_bytes"] != 0:
            fail("the replay loaded wrong bytes")
        events = run["kv_events"]
        batches = events["batches"]
        if events["dropped_batches"] != 0 or events["send_errors"] != 0:
            fail("the publisher dropped batches: %s" % {k: events[k] for k in events
                                                        if k != "blocks"})
        missing = [s for s in range(batches) if s not in stream.batches]
        if missing:
            fail("%d of %d batches never arrived, first %d" % (len(missing), batches, missing[0]))
        media = rebuild(stream, batches)
        for medium, expected in events["blocks"].items():
            got = sorted(media.get(medium, set()))
            if got != sorted(expected):
                fail("%s: the events leave %d blocks, the cache holds %d (%d differ)" % (
                    medium, len(got), len(expected), len(set(got) ^ set(expected))))
        extra = set(media) - set(events["blocks"])
        if any(media[m] for m in extra):
            fail("events for media the cache does not have: %s" % sorted(extra))
        print("subscriber restart after seq %d: %d batches from the replay socket" % (
            last, replayed))
        print("%d batches rebuild the cache's blocks: %s" % (batches, ", ".join(
            "%s %d" % (m, len(b)) for m, b in sorted(events["blocks"].items()))))
        print("PASS")
    ctx.destroy(linger=0)


if __name__ == "__main__":
    main()
