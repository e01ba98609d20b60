#!/usr/bin/env python3
"""`kvtier demo`: gets hits in all three tiers, 0 wrong bytes; and, given --max-seconds (the
README's "under a minute" on a quiet machine: a benchmark, not ctest's functional check, which
must pass on a loaded box), finishes within that bound.

Usage: demo_test.py KVTIER [--max-seconds S]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvtier")
    ap.add_argument("--max-seconds", type=float, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "demo.json")
        t0 = time.time()
        proc = subprocess.run([args.kvtier, "demo", "--json", out], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        seconds = time.time() - t0
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            print("FAIL: kvtier demo exited with %d" % proc.returncode)
            return 1
        with open(out) as f:
            report = json.load(f)
    failures = []
    if args.max_seconds is not None and seconds > args.max_seconds:
        failures.append("took %.1f s (bound %.0f s)" % (seconds, args.max_seconds))
    for tier, rate in sorted(report["hit_rate_by_tier"].items()):
        if rate <= 0:
            failures.append("no hits in the %s tier" % tier)
    integrity = report["integrity"]
    if integrity["wrong_bytes"] != 0:
        failures.append("%d wrong bytes" % integrity["wrong_bytes"])
    if integrity["bytes_checked"] <= 0:
        failures.append("no bytes were checked")
    if "0 wrong" not in proc.stdout:
        failures.append("the report does not say '0 wrong'")
    print("demo: %.1f s, hit rate by tier %s, %s" % (seconds, report["hit_rate_by_tier"],
                                                     integrity))
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
