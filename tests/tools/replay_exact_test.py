#!/usr/bin/env python3
"""Exact mode of `kvtier replay` against an independent leaf-LRU prefix cache.

`kvtier replay --sequential --host-tokens 0 --storage none --eviction lru` makes the device tier
a plain prefix cache whose hit rate can be computed without kvtier. This file computes it from the
trace alone (sharing no code with the cache: pages are named by the trace's block ids, not by
tokens) and compares it with the replay's JSON, for a few capacities. The semantics (issue #16,
item 7):
  - a request's hit is its longest chain of cached whole pages from the start;
  - then all of its whole pages are inserted;
  - a page's recency is the last request that matched or inserted it;
  - when room is needed, pages go one at a time: the tail page of the least recently used leaf
    that the request in progress does not use;
  - a request longer than the whole tier inserts only the prefix that fits.
Equal within 0.1 points, or the test fails.

Usage: replay_exact_test.py KVTIER TRACE [--requests N] [--page-size P] [--capacities A,B,C]
"""
import argparse
import heapq
import json
import os
import sys
import tempfile
import time

from replay_report import run_replay

BLOCK = 512  # tokens per hash id in Mooncake traces


def read_trace(path, limit):
    requests = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            if limit and len(requests) >= limit:
                break
            r = json.loads(line)
            requests.append((r["input_length"], r["hash_ids"]))
    return requests


def reference_hit_rate(requests, page_size, capacity_tokens):
    """Leaf-LRU page cache over block-id prefixes; returns hit tokens / input tokens."""
    assert BLOCK % page_size == 0
    per_block = BLOCK // page_size
    capacity = capacity_tokens // page_size
    block_node = {}  # (parent block node, hash id) -> block node number
    # Cached pages: key -> [recency, children, parent key]
    pages = {}
    heap = []  # (recency, tie, key): candidates; stale entries are skipped
    tie = 0
    hit_tokens = 0
    input_tokens = 0
    for i, (input_length, ids) in enumerate(requests):
        input_tokens += input_length
        n_pages = input_length // page_size
        keys = []
        node = -1
        for p in range(n_pages):
            b, o = divmod(p, per_block)
            if o == 0:
                node = block_node.setdefault((node, ids[b]), len(block_node))
            keys.append((node, o))
        hit = 0
        while hit < n_pages and keys[hit] in pages:
            hit += 1
        hit_tokens += hit * page_size
        for k in keys[:hit]:
            pages[k][0] = i
        if hit > 0 and pages[keys[hit - 1]][1] == 0:
            tie += 1
            heapq.heappush(heap, (i, tie, keys[hit - 1]))
        in_use = set(keys)
        for p in range(hit, n_pages):
            if len(pages) >= capacity:
                # Evict the least recently used leaf the request does not use.
                set_aside = []
                evicted = False
                while heap:
                    recency, t, k = heapq.heappop(heap)
                    entry = pages.get(k)
                    if entry is None or entry[0] != recency or entry[1] != 0:
                        continue  # stale: gone, touched since, or has children now
                    if k in in_use:
                        set_aside.append((recency, t, k))
                        continue
                    del pages[k]
                    parent = entry[2]
                    if parent is not None:
                        pages[parent][1] -= 1
                        if pages[parent][1] == 0:
                            tie += 1
                            heapq.heappush(heap, (pages[parent][0], tie, parent))
                    evicted = True
                    break
                for e in set_aside:
                    heapq.heappush(heap, e)
                if not evicted:
                    break  # only the request's own pages are left: the rest does not fit
            parent = keys[p - 1] if p > 0 else None
            pages[keys[p]] = [i, 0, parent]
            if parent is not None:
                pages[parent][1] += 1
        # The deepest page inserted (or matched) is a leaf now.
        last = None
        for p in range(n_pages - 1, -1, -1):
            if keys[p] in pages:
                last = keys[p]
                break
        if last is not None and pages[last][1] == 0:
            tie += 1
            heapq.heappush(heap, (pages[last][0], tie, last))
    return hit_tokens / input_tokens if input_tokens else 0.0


def replay_hit_rate(kvtier, trace, requests, page_size, capacity_tokens):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "replay.json")
        cmd = [kvtier, "replay", "--workload", trace, "--requests", str(requests),
               "--model", "tiny", "--page-size", str(page_size),
               "--device-tokens", str(capacity_tokens), "--host-tokens", "0",
               "--storage", "none", "--eviction", "lru", "--sequential",
               "--runs", "hierarchy", "--no-progress", "--json", out]
        report, _ = run_replay(cmd, out, echo=False)
    assert report["exact_mode"], "the replay did not run in exact mode"
    assert report["integrity"]["wrong_bytes"] == 0, report["integrity"]
    assert report["integrity"]["bytes_checked"] > 0, report["integrity"]
    return report["hit_rate"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvtier")
    ap.add_argument("trace")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--capacities", default="262144,1048576,4194304")
    args = ap.parse_args()
    requests = read_trace(args.trace, args.requests)
    failures = 0
    for cap in [int(c) for c in args.capacities.split(",")]:
        t0 = time.time()
        want = reference_hit_rate(requests, args.page_size, cap)
        t1 = time.time()
        got = replay_hit_rate(args.kvtier, args.trace, len(requests), args.page_size, cap)
        t2 = time.time()
        diff = abs(100 * (got - want))
        ok = diff <= 0.1
        failures += not ok
        print("capacity %9d tokens: reference %.3f %%, kvtier replay %.3f %% (diff %.3f points) "
              "%s  [reference %.1f s, replay %.1f s]"
              % (cap, 100 * want, 100 * got, diff, "ok" if ok else "MISMATCH", t1 - t0, t2 - t1))
    if failures:
        print("%d capacities differ by more than 0.1 points" % failures)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
