#!/usr/bin/env python3
"""`kvtier bench --storage redis://...` against a real redis-server that this test starts on a free
127.0.0.1 port: every kvtier row checks out, the baseline rows are there (redis-benchmark over a
key space as large as kvtier's, the one the percentages use, and redis-benchmark's default of one
literal key), the percentages are computed against the key-space run, and the run leaves nothing
on the server (kvtier's pages, the key space and redis-benchmark's own key are all deleted).

Skips (77; fails under CI=true) only when redis-server / redis-benchmark are not installed or
kvtier was built without hiredis (the GPU machine); CI has all three.

Usage: storage_bench_redis_test.py KVTIER HIREDIS(ON|OFF)
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from child_process import die_with_parent
from missing_dep import missing


# Each store call's timeout: a hang guard (a functional test must pass on a loaded machine).
CALL_TIMEOUT_MS = "60000"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_cli(port, *args):
    return subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port)] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=60).stdout.strip()  # a hang guard


def start_server(port, tmp):
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", tmp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=die_with_parent())
    # A bound for a hung start, not a speed check: generous for a loaded machine.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("redis-server exited with %d" % proc.returncode)
        if redis_cli(port, "PING") == "PONG":
            return proc
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError("redis-server did not answer PING within 60 s")


def main():
    kvtier, hiredis = sys.argv[1], sys.argv[2]
    if hiredis.upper() not in ("ON", "1", "TRUE", "YES"):
        return missing("kvtier was built without hiredis (no redis storage backend)")
    for tool in ("redis-server", "redis-benchmark", "redis-cli"):
        if shutil.which(tool) is None:
            return missing("%s is not installed (Debian: redis-server, redis-tools)" % tool)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = start_server(port, tmp)
        try:
            out = os.path.join(tmp, "bench.json")
            cmd = [kvtier, "bench", "--storage", "redis://127.0.0.1:%d" % port,
                   "--storage-kinds", "mha16", "--storage-bytes", "8MiB", "--storage-batch", "1",
                   "--storage-exists-keys", "50", "--repeats", "2", "--json", out,
                   "--storage-timeout-ms", CALL_TIMEOUT_MS]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=600)
            sys.stdout.write(proc.stdout)
            if proc.returncode != 0:
                print("FAIL: kvtier bench exited with %d" % proc.returncode)
                return 1
            with open(out) as f:
                rows = json.load(f)["rows"]
            # The defaults against Redis (no --storage-batch or --storage-inflight): calls sized
            # and kept in flight by bytes, 4 pages of 2 MiB a call, 2 calls in flight (the file
            # store's 8 batches of 64 pages, 1 GiB in flight, timed out against a local
            # redis-server on 2 cores). That such a call ends within the store's default 2 s on an
            # idle 2-core box is a speed claim, not checked here: on a box at load 20 a call took
            # 2.5 s ("4 of 4 pages not ok"), so the call timeout is a hang guard.
            depth = subprocess.run(
                [kvtier, "bench", "--storage", "redis://127.0.0.1:%d" % port,
                 "--storage-kinds", "mha16", "--storage-bytes", "256MiB", "--repeats", "1",
                 "--storage-exists-keys", "0", "--no-baseline",
                 "--storage-timeout-ms", CALL_TIMEOUT_MS],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
            sys.stdout.write(depth.stdout)
            if depth.returncode != 0:
                failures.append("default depth: kvtier bench exited with %d" % depth.returncode)
            if "2 batches of 4 in flight" not in depth.stdout:
                failures.append("default depth: not 2 calls of 4 pages of 2 MiB in flight")
            left = redis_cli(port, "DBSIZE")
            if left != "0":
                failures.append("%s keys left on the server: %s" %
                                (left, redis_cli(port, "--scan")))
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()

    pages = 4  # 8 MiB of 2 MiB pages
    by_who = {}
    for r in rows:
        by_who.setdefault((r["kind"], r["op"], r["who"]), r)
        if not r["check_ok"]:
            failures.append("row %s/%s/%s failed its check: %s" %
                            (r["kind"], r["op"], r["who"], r["note"]))
    for op in ("set", "get"):
        mine = by_who.get(("mha16", op, "kvtier"))
        spread = by_who.get(("mha16", op, "redis-benchmark -r%d" % pages))
        literal = by_who.get(("mha16", op, "redis-benchmark 1 key"))
        if mine is None or spread is None or literal is None:
            failures.append("%s: missing rows (have %s)" % (op, sorted(by_who)))
            continue
        for r in (mine, spread, literal):
            if not r["gbps"] > 0 or r["pages"] != pages:
                failures.append("%s/%s: gbps %s, pages %s" % (op, r["who"], r["gbps"], r["pages"]))
        expected = 100.0 * mine["gbps"] / spread["gbps"] if spread["gbps"] > 0 else 0
        if abs(mine["pct_of_baseline"] - expected) > 1e-6 * max(1.0, expected):
            failures.append("%s: %% of baseline %.3f is not kvtier / key-space run (%.3f)" %
                            (op, mine["pct_of_baseline"], expected))
    if ("50keys", "exists", "kvtier") not in by_who:
        failures.append("no Exists row")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("PASS: rows checked, percentages against the key-space run, nothing left behind")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
