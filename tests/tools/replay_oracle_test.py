#!/usr/bin/env python3
"""The storage oracle of `kvtier replay` (tools/replay/replay_oracle.h) on a trace whose answer is
known. Four prompts of 16 pages (page 64, 1,024 tokens: no two share a page) are served twice in
turn, A B C D A B C D, sequentially, every backup settled before the next request, with a device
tier of one prompt and a host tier of two: when a prompt comes back the device holds the one
before it and the host the two before it, so the second round's prompts can come only from
storage, and only whole: 4 x 1,024 tokens. The run's store holds them all. Admission is the
default (frequency, threshold 2): with every backup settled the write queue always has room, so
it admits every page offered.

  write_through: every page is offered, admitted and stored: the run has the oracle's 4,096
      storage tokens, 0 lost; admit-all has them too.
  write_through_selective, threshold 100: nothing is ever backed up, so nothing is offered to
      admission and nothing stored: the run has 0 storage tokens, and so has the oracle (the
      run's admissions done at once: none), 0 lost; admit-all (every write admitted) still has
      4,096, reported beside the oracle and not counted as lost.
  write_through, the store down from the start (--fault storage-down@0): every page is admitted
      and every write fails: the run has 0 storage tokens, the oracle 4,096, all of them lost, in
      4 requests.

In both, the oracle is a bound: its storage tokens >= the run's. Both in the JSON
(runs[-1].storage_oracle, timeline) and in the text report.

Usage: replay_oracle_test.py KVTIER
"""
import json
import os
import sys
import tempfile

from replay_report import run_replay

PAGE = 64
PROMPT = 1024  # tokens: two Mooncake blocks of 512
PROMPTS = [[1, 2], [3, 4], [5, 6], [7, 8]]
SECOND_ROUND = len(PROMPTS) * PROMPT


def run(kvtier, tmp, policy, extra=()):
    trace = os.path.join(tmp, "trace.jsonl")
    with open(trace, "w") as f:
        for _ in range(2):
            for ids in PROMPTS:
                f.write(json.dumps({"timestamp": 0, "input_length": PROMPT, "output_length": 1,
                                    "hash_ids": ids}) + "\n")
    out = os.path.join(tmp, "oracle-%s%s.json" % (policy, len(extra)))
    cmd = [kvtier, "replay", "--workload", trace, "--requests", "8", "--page-size", str(PAGE),
           "--model", "tiny", "--compute-model", "llama3-8b", "--compute", "model",
           "--device", "cpu", "--device-tokens", str(PROMPT), "--host-tokens", str(2 * PROMPT),
           "--storage", "file", "--hicache-write-policy", policy,
           "--write-through-threshold", "100",
           "--hicache-storage-prefetch-policy", "wait_complete",
           "--sequential", "--settle-backups", "--runs", "hierarchy", "--slow-class-warn",
           "--no-progress", "--json", out] + list(extra)
    return run_replay(cmd, out, timeout=240, echo=False)


def check(label, report, output, want_storage, want_oracle, want_lost, want_lost_requests,
          failures):
    run = report["runs"][-1]
    o = run.get("storage_oracle")
    if o is None:
        failures.append("%s: no storage_oracle in the JSON" % label)
        return
    print("%s: %s" % (label, json.dumps(o)))
    got = (o["storage_tokens"], o["oracle_storage_tokens"], o["lost_tokens"], o["lost_requests"],
           o["admit_all_storage_tokens"])
    want = (want_storage, want_oracle, want_lost, want_lost_requests, SECOND_ROUND)
    if got != want:
        failures.append("%s: (storage, oracle, lost, lost requests, admit-all) = %s, expected %s"
                        % (label, got, want))
    if o["oracle_storage_tokens"] < o["storage_tokens"]:
        failures.append("%s: the oracle (%d tokens) is below the run (%d): not a bound"
                        % (label, o["oracle_storage_tokens"], o["storage_tokens"]))
    t = report["timeline"]["hierarchy"]
    if sum(t["oracle_storage_hit"]) != o["oracle_storage_tokens"] or \
            sum(t["lost_storage_hit"]) != o["lost_tokens"]:
        failures.append("%s: the timeline's per-request oracle/lost hits do not add up" % label)
    if t["oracle_storage_hit"][:len(PROMPTS)] != [0] * len(PROMPTS):
        failures.append("%s: the oracle has storage hits in the first round: %s"
                        % (label, t["oracle_storage_hit"]))
    if report["integrity"]["wrong_bytes"] != 0:
        failures.append("%s: %d wrong bytes" % (label, report["integrity"]["wrong_bytes"]))
    for line in ("hits lost to writes not done: %d tokens" % want_lost,
                 "admit-all (same capacity, every write admitted and done at once, not a bound) "
                 "%.2f %%" % (100.0 * SECOND_ROUND / (2 * SECOND_ROUND))):
        if line not in output:
            failures.append("%s: the text report lacks '%s'" % (label, line))


def main():
    kvtier = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        report, output = run(kvtier, tmp, "write_through")
        check("write_through", report, output, SECOND_ROUND, SECOND_ROUND, 0, 0, failures)
        report, output = run(kvtier, tmp, "write_through_selective")
        check("write_through_selective(100)", report, output, 0, 0, 0, 0, failures)
        report, output = run(kvtier, tmp, "write_through", ["--fault", "storage-down@0"])
        check("write_through, store down", report, output, 0, SECOND_ROUND, SECOND_ROUND,
              len(PROMPTS), failures)
    for f in failures:
        print("FAIL: " + f)
    if failures:
        sys.stdout.write(output)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
