#!/usr/bin/env python3
"""`kvtier replay --fault storage-down@S`: the file store fails mid-run (through the storage fault
wrapper); the replay keeps serving with 0 wrong bytes, reports the storage errors, and its hit rate
before and after the fault, and storage stops giving hits after it. The pass's temporary file
store (made in TMPDIR) is gone when the replay ends (issue 36: a pass's store is removed).

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
        store_tmp = os.path.join(tmp, "TMPDIR")  # the replay's TMPDIR: only its stores go there
        os.mkdir(store_tmp)
        cmd = [kvtier, "replay", "--workload", "doc-qa", "--requests", "120", "--seed", "5",
               "--model", "tiny", "--compute-model", "llama3-8b", "--device", "cpu",
               "--device-tokens", "32768", "--host-tokens", "65536", "--storage", "file",
               "--sequential", "--runs", "hierarchy", "--fault", "storage-down@30",
               # Each request's backups land before the next is served: without it the storage hits
               # before the fault depend on how fast this machine's store writes compared with the
               # replay's modelled compute (a fast CI machine raced past the writes: no storage
               # hit before the fault, and the test proved nothing).
               "--settle-backups",
               "--no-progress", "--json", out]
        report, output = run_replay(cmd, out, env=dict(os.environ, TMPDIR=store_tmp))
        left = os.listdir(store_tmp)
    run = report["runs"][-1]
    failures = []
    if left:
        failures.append("the pass's file store is still in TMPDIR after the run: %s" % left)
    if "file://" + os.path.join(store_tmp, "kvtier-replay-") not in output:
        failures.append("the store was not made in TMPDIR (the check above proves nothing)")
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
