#!/usr/bin/env python3
"""Two `kvtier replay` processes at once on one shared host segment: the second gets host hits
for prefixes the first computed (found in the segment by key), and no loaded byte is wrong in
either.

Both replay the same synthetic workload (prompts sharing long documents) on `--shared-host`. The
second starts once the first has published pages (`kvtier shm inspect --json` shows READY pages),
so its first request, which the first process served first, must be a host hit: its own cache is
empty then and it has no storage tier. The two then run side by side to the end.

Usage: replay_shared_host_test.py KVTIER
"""
import json
import os
import subprocess
import sys
import tempfile
import time

from child_process import die_with_parent
from replay_report import load_report


def replay_cmd(kvtier, name, out):
    return [kvtier, "replay", "--workload", "doc-qa", "--requests", "60", "--seed", "5",
            "--model", "tiny", "--compute-model", "llama3-8b", "--device", "cpu",
            "--compute", "model", "--page-size", "64",
            "--device-tokens", "32768", "--host-tokens", "65536", "--shared-host", name,
            "--hicache-write-policy", "write_through", "--sequential", "--runs", "hierarchy",
            "--no-progress", "--json", out]


def ready_pages(kvtier, name):
    proc = subprocess.run([kvtier, "shm", "inspect", name, "--json"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise SystemExit("FAIL: kvtier shm inspect: " + proc.stdout)
    return json.loads(proc.stdout)["ready_pages"]


def hierarchy(report):
    return next(r for r in report["runs"] if r["name"] == "hierarchy")


def finish(proc, label, out):
    stdout, _ = proc.communicate(timeout=600)
    return load_report(proc.returncode, "---- %s ----\n%s" % (label, stdout), out,
                       label="the %s replay" % label)


def main():
    kvtier = sys.argv[1]
    name = "kvtier-replay-test-%d" % os.getpid()
    # The tiny model: 1 layer, K and V of 4 bytes per token; 64-token pages.
    subprocess.run([kvtier, "shm", "create", name, "--layers", "1", "--slot-bytes", "4",
                    "--page-size", "64", "--pages", "32768"], check=True)
    failures = []
    procs = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            outs = [os.path.join(tmp, "first.json"), os.path.join(tmp, "second.json")]
            first = subprocess.Popen(replay_cmd(kvtier, name, outs[0]), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=die_with_parent())
            procs.append(first)
            deadline = time.monotonic() + 120
            while ready_pages(kvtier, name) == 0:
                if first.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            second_started_while_first_ran = first.poll() is None
            second = subprocess.Popen(replay_cmd(kvtier, name, outs[1]), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      preexec_fn=die_with_parent())
            procs.append(second)
            runs = [finish(first, "first", outs[0]), finish(second, "second", outs[1])]
        print("the second replay started while the first was running: %s"
              % second_started_while_first_ran)
        for label, r in zip(("first", "second"), runs):
            if r["integrity"]["wrong_bytes"] != 0:
                failures.append("%s run: %d wrong bytes" % (label, r["integrity"]["wrong_bytes"]))
            if r["integrity"]["bytes_checked"] <= 0:
                failures.append("%s run: no bytes checked" % label)
            if hierarchy(r).get("shared_host", {}).get("name") != name:
                failures.append("%s run: the report names no shared host" % label)
        second = runs[1]
        shared = hierarchy(second)["shared_host"]
        hits = second["timeline"]["hierarchy"]["host_hit"]
        print("second run: host hit rate %.2f %%, first request host hit %d tokens, %d tokens "
              "found in the segment by key"
              % (100 * second["hit_rate_by_tier"]["host"], hits[0], shared["hit_tokens"]))
        if hits[0] <= 0:
            failures.append("the second run's first request found nothing the first computed")
        if shared["hit_tokens"] <= 0:
            failures.append("the second run found no page in the segment by key")
        check = subprocess.run([kvtier, "shm", "inspect", name, "--check"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if check.returncode != 0:
            failures.append("the segment's invariants: " + check.stdout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run([kvtier, "shm", "destroy", name], stderr=subprocess.DEVNULL)
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
