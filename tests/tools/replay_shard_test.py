#!/usr/bin/env python3
"""`kvtier replay --shard I/K --skip N --warmup W --requests R` serves exactly the requests an
independent selection of the trace gives: the conversations whose key (second block id, or the only
one) is I modulo K, in file order, without the first N, then W warm-up requests, then the R measured
ones (compared by their input lengths, from the JSON timeline).

Usage: replay_shard_test.py KVTIER TRACE
"""
import json
import os
import sys
import tempfile

from replay_report import run_replay


def main():
    kvtier, trace = sys.argv[1], sys.argv[2]
    shard, shards, skip, warmup, requests = 3, 8, 40, 7, 25
    with open(trace) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    kept = [r for r in rows if (r["hash_ids"][1] if len(r["hash_ids"]) > 1
                                else r["hash_ids"][0]) % shards == shard]
    want = [r["input_length"] for r in kept[skip + warmup:skip + warmup + requests]]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "shard.json")
        cmd = [kvtier, "replay", "--workload", trace, "--shard", "%d/%d" % (shard, shards),
               "--skip", str(skip), "--warmup", str(warmup), "--requests", str(requests),
               "--model", "tiny", "--compute-model", "llama3-8b", "--device", "cpu",
               "--device-tokens", "65536", "--host-tokens", "131072", "--storage", "none",
               "--sequential", "--runs", "hierarchy", "--no-progress", "--json", out]
        report, _ = run_replay(cmd, out, timeout=120)
    got = report["timeline"]["hierarchy"]["input_tokens"]
    failures = []
    if len(want) != requests:
        failures.append("the trace has too few requests in shard %d/%d" % (shard, shards))
    if got != want:
        failures.append("served input lengths %s, expected %s" % (got[:8], want[:8]))
    if report["integrity"]["wrong_bytes"] != 0:
        failures.append("%d wrong bytes" % report["integrity"]["wrong_bytes"])
    if report["hit_rate"] <= 0:
        failures.append("no hits: the shard's conversations did not come back")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
