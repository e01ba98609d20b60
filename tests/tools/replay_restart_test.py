#!/usr/bin/env python3
"""Two `kvtier replay` runs in a row on one file store: the second process finds the first's
prefixes in storage (restart survival), and no loaded byte is wrong in either.

The first run replays a synthetic workload whose prompts share long prefixes (a system prompt,
documents); the second replays the same requests with a fresh cache, so everything it hits beyond
its own inserts must come from the store the first run wrote.

Usage: replay_restart_test.py KVTIER
"""
import os
import sys
import tempfile

from replay_report import run_replay


def replay(kvtier, store, out, workload):
    cmd = [kvtier, "replay", "--workload", workload, "--requests", "60", "--seed", "3",
           "--model", "tiny", "--compute-model", "llama3-8b", "--device", "cpu",
           "--compute", "model",
           "--device-tokens", "32768", "--host-tokens", "65536",
           "--storage", "file://" + store, "--hicache-write-policy", "write_through",
           "--hicache-storage-prefetch-policy", "wait_complete",
           "--sequential", "--runs", "hierarchy", "--no-progress", "--json", out]
    return run_replay(cmd, out)[0]


def main():
    kvtier = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        first = replay(kvtier, store, os.path.join(tmp, "first.json"), "doc-qa")
        second = replay(kvtier, store, os.path.join(tmp, "second.json"), "doc-qa")
    for name, r in (("first", first), ("second", second)):
        if r["integrity"]["wrong_bytes"] != 0:
            failures.append("%s run: %d wrong bytes" % (name, r["integrity"]["wrong_bytes"]))
        if r["integrity"]["bytes_checked"] <= 0:
            failures.append("%s run: no bytes checked" % name)
    s1 = first["hit_rate_by_tier"]["storage"]
    s2 = second["hit_rate_by_tier"]["storage"]
    print("storage hit rate: first run %.2f %%, second run %.2f %%" % (100 * s1, 100 * s2))
    if s2 <= s1:
        failures.append("the second run got no more storage hits than the first (%.4f <= %.4f)"
                        % (s2, s1))
    # The second run's first request already finds its document in the store.
    hits = second["timeline"]["hierarchy"]["storage_hit"]
    if hits[0] <= 0:
        failures.append("the second run's first request found nothing in the store")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
