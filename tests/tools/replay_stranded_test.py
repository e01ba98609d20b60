#!/usr/bin/env python3
"""No stranded pages: a `kvtier replay` whose file store is far smaller than what the run writes
(thousands of pages evicted) ends with 0 stored pages unreachable from a stored first page — every
page the store keeps follows a stored page of its prompt — and 0 wrong bytes. With the plain LRU
the same run left 11 of 651 stored pages stranded (a page evicted before the pages after it).

Usage: replay_stranded_test.py KVTIER
"""
import os
import sys
import tempfile

from replay_report import run_replay


def main():
    kvtier = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "stranded.json")
        cmd = [kvtier, "replay", "--workload", "doc-qa", "--requests", "200", "--seed", "3",
               "--model", "tiny", "--compute-model", "llama3-8b", "--compute", "model",
               "--device", "cpu", "--device-tokens", "4096", "--host-tokens", "8192",
               "--storage", "file", "--storage-bytes", "3000000",
               "--hicache-write-policy", "write_through",
               "--sequential", "--settle-backups", "--runs", "hierarchy", "--slow-class-warn",
               "--no-progress", "--json", out]
        report, output = run_replay(cmd, out, timeout=240, echo=False)
    run = report["runs"][-1]
    failures = []
    if report["integrity"]["wrong_bytes"] != 0:
        failures.append("%d wrong bytes" % report["integrity"]["wrong_bytes"])
    chains = run.get("stored_chains")
    if chains is None:
        failures.append("no stored_chains in the report")
    else:
        print("stored_chains: %s; %d pages evicted by the store"
              % (chains, run["storage_evicted_pages"]))
        if not chains["checked"]:
            failures.append("the chains were not checked: %s" % chains.get("why_unchecked"))
        if run["storage_evicted_pages"] < 1000:
            failures.append("the store evicted only %d pages: not overfilled, the test proves "
                            "nothing" % run["storage_evicted_pages"])
        if chains["stored_pages"] < 100:
            failures.append("only %d pages stored" % chains["stored_pages"])
        if chains["unreachable_pages"] != 0:
            failures.append("%d stored pages unreachable from a stored first page"
                            % chains["unreachable_pages"])
    if "stored pages unreachable from a stored first page: 0 of" not in output:
        failures.append("the text report lacks the line 'stored pages unreachable ...: 0 of'")
    for f in failures:
        print("FAIL: " + f)
    if failures:
        sys.stdout.write(output)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
