#!/usr/bin/env python3
"""`kvtier replay --fault storage-down@S`: the file store fails mid-run (through the storage fault
wrapper); the replay keeps serving with 0 wrong bytes, reports the storage errors, and its hit rate
before and after the fault, and storage stops giving hits after it.

Usage: replay_fault_test.py KVTIER
"""
import os
import sys
import tempfile

from replay_report import run_replay


def main():
    kvtier = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fault.json")
        cmd = [kvtier, "replay", "--workload", "doc-qa", "--requests", "120", "--seed", "5",
               "--model", "tiny", "--compute-model", "llama3-8b", "--device", "cpu",
               "--device-tokens", "32768", "--host-tokens", "65536", "--storage", "file",
               "--sequential", "--runs", "hierarchy", "--fault", "storage-down@30",
               # One I/O thread: QueryStorage's Exists then waits behind the backups, which paces
               # the replay (its compute is modelled, not run, so it races through requests) to
               # the store. With the reads-first queue (storage c69d53f) and more threads the
               # replay outruns the store's writes: host pages wait for them, backups to host are
               # skipped, and no storage hit happens before the fault (the test proves nothing).
               "--storage-io-threads", "1",
               "--no-progress", "--json", out]
        report, output = run_replay(cmd, out)
    run = report["runs"][-1]
    failures = []
    if report["integrity"]["wrong_bytes"] != 0:
        failures.append("%d wrong bytes" % report["integrity"]["wrong_bytes"])
    if "fault" not in run:
        failures.append("the storage never went down (no fault in the report)")
    else:
        k = run["fault"]["request"]
        series = report["timeline"]["hierarchy"]["storage_hit"]
        if sum(series[:k]) <= 0:
            failures.append("no storage hits before the fault (the test proves nothing)")
        if sum(series[k:]) != 0:
            failures.append("storage hits after the store went down: %d tokens" % sum(series[k:]))
        if run["storage_errors"]["errors"] <= 0:
            failures.append("no storage errors reported after the fault")
        if "fault: storage down" not in output:
            failures.append("the report has no fault line")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
