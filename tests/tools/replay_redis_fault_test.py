#!/usr/bin/env python3
"""`kvtier replay --storage redis --fault storage-down@S`: the replay starts its own redis-server on
a free 127.0.0.1 port, uses it as the storage tier, and stops it (SIGTERM) at S seconds of the
replay's clock; the replay keeps serving with 0 wrong bytes, reports the storage errors and the
hit rate before and after, gets no storage hits after the stop, and leaves no server behind, also
when the replay itself is killed (SIGKILL) mid-run. A redis-server of the test's own at its
maxmemory with noeviction: the writes it refuses are counted in the report.

Skips (77; fails under CI=true) only when redis-server is not installed or kvtier was built
without hiredis
(the GPU machine); CI has both.

Usage: replay_redis_fault_test.py KVTIER HIREDIS(ON|OFF)
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from child_process import die_with_parent
from missing_dep import missing
from replay_report import run_replay


def listening(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def main():
    kvtier, hiredis = sys.argv[1], sys.argv[2]
    if hiredis.upper() not in ("ON", "1", "TRUE", "YES"):
        return missing("kvtier was built without hiredis (no redis storage backend)")
    if shutil.which("redis-server") is None:
        return missing("redis-server is not installed (Debian: redis-server); the test needs a "
                       "real server")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fault.json")
        cmd = [kvtier, "replay", "--workload", "doc-qa", "--requests", "120", "--seed", "5",
               "--model", "tiny", "--compute-model", "llama3-8b", "--device", "cpu",
               "--device-tokens", "32768", "--host-tokens", "65536", "--storage", "redis",
               "--sequential", "--runs", "hierarchy", "--fault", "storage-down@30",
               # Storage hits before the stop must not depend on the server's write speed.
               "--settle-backups",
               "--no-progress", "--json", out]
        report, output = run_replay(cmd, out, timeout=240)
    run = report["runs"][-1]
    failures = []
    if report["integrity"]["wrong_bytes"] != 0:
        failures.append("%d wrong bytes" % report["integrity"]["wrong_bytes"])
    if report["integrity"]["bytes_checked"] <= 0:
        failures.append("no bytes checked")
    m = re.match(r"redis://127\.0\.0\.1:(\d+)$", run.get("storage", ""))
    if not m:
        failures.append("the storage tier is not a local redis-server: %r" % run.get("storage"))
    elif listening(int(m.group(1))):
        failures.append("something still listens on the run's redis port %s" % m.group(1))
    if "fault" not in run:
        failures.append("the storage never went down (no fault in the report)")
    else:
        k = run["fault"]["request"]
        if "redis-server stopped" not in run["fault"].get("action", ""):
            failures.append("the fault did not stop the redis-server: %r" % run["fault"])
        series = report["timeline"]["hierarchy"]["storage_hit"]
        if sum(series[:k]) <= 0:
            failures.append("no storage hits before the fault (the test proves nothing)")
        if sum(series[k:]) != 0:
            failures.append("storage hits after the server stopped: %d tokens" % sum(series[k:]))
        if run["storage_errors"]["errors"] <= 0:
            failures.append("no storage errors reported after the server stopped")
        if "fault: storage down" not in output or "hit rate before" not in output:
            failures.append("the report has no fault line with the hit rate before and after")
    failures += killed_replay_leaves_no_server(kvtier)
    failures += refused_writes_are_reported(kvtier)
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused_writes_are_reported(kvtier):
    """A redis-server at its maxmemory with noeviction refuses writes: the report counts them
    (JSON storage_errors.refused_writes, the text's storage line), where it said "0 errors"."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--maxmemory", "3mb", "--maxmemory-policy", "noeviction",
             "--dir", tmp],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent())
        try:
            deadline = time.monotonic() + 60  # start-up on a loaded box; not a speed check
            while not listening(port):
                if server.poll() is not None or time.monotonic() > deadline:
                    return ["the test's redis-server (noeviction) did not start"]
                time.sleep(0.05)
            out = os.path.join(tmp, "refused.json")
            cmd = [kvtier, "replay", "--workload", "doc-qa", "--requests", "60", "--seed", "5",
                   "--model", "tiny", "--compute-model", "llama3-8b", "--device", "cpu",
                   "--device-tokens", "32768", "--host-tokens", "65536",
                   "--storage", "redis://127.0.0.1:%d" % port, "--sequential",
                   "--runs", "hierarchy", "--no-progress", "--json", out]
            report, output = run_replay(cmd, out, timeout=240, echo=False)
        finally:
            server.terminate()
            server.wait(timeout=60)
    refused = report["runs"][-1]["storage_errors"].get("refused_writes", 0)
    print("noeviction redis at 3 MB: %d refused writes reported" % refused)
    failures = []
    if refused <= 0:
        failures.append("a redis-server at maxmemory (noeviction): no refused writes reported")
    if ("%d writes refused by a full store" % refused) not in output:
        failures.append("the text report's storage line does not count the refused writes")
    return failures


def killed_replay_leaves_no_server(kvtier):
    """SIGKILL the replay while it runs: its redis-server must go with it (PR_SET_PDEATHSIG)."""
    cmd = [kvtier, "replay", "--workload", "doc-qa", "--requests", "100000", "--seed", "5",
           "--model", "tiny", "--compute-model", "llama3-8b", "--device", "cpu",
           "--device-tokens", "32768", "--host-tokens", "65536", "--storage", "redis",
           "--sequential", "--runs", "hierarchy", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=die_with_parent())
    port = None
    try:
        while True:  # bounded by the replay's end (EOF) and the ctest timeout
            line = proc.stderr.readline()
            if not line:
                break
            m = re.search(r"redis-server (\d+) started at redis://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(2))
                break
        if port is None:
            return ["the replay never said which redis-server it started"]
        # The replay says so once the server answers: it serves requests through it now.
        if not listening(port):
            return ["the replay's redis-server on port %d was not listening" % port]
    finally:
        proc.kill()
        proc.wait(timeout=30)
    # The server gets SIGKILL with its parent; a bound for the kernel to close its socket that no
    # loaded machine reaches (not a speed check).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not listening(port):
            print("killed replay: its redis-server on port %d is gone" % port)
            return []
        time.sleep(0.05)
    return ["the redis-server on port %d outlived the killed replay" % port]


if __name__ == "__main__":
    sys.exit(main())
