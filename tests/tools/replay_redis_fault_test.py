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
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from child_process import die_with_parent
from missing_dep import missing, required_dependencies_must_be_present
from replay_report import run_replay


def listening(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def replay_cmd(kvtier, requests, storage, *extra):
    """`kvtier replay` of doc-qa on the tiny model, sequential, on `storage`, plus `extra`."""
    return [kvtier, "replay", "--workload", "doc-qa", "--requests", str(requests), "--seed", "5",
            "--model", "tiny", "--compute-model", "llama3-8b", "--device", "cpu",
            "--device-tokens", "32768", "--host-tokens", "65536", "--storage", storage,
            "--sequential", "--runs", "hierarchy", "--no-progress"] + list(extra)


def main():
    kvtier, hiredis = sys.argv[1], sys.argv[2]
    if hiredis.upper() not in ("ON", "1", "TRUE", "YES"):
        return missing("kvtier was built without hiredis (no redis storage backend)")
    if shutil.which("redis-server") is None:
        return missing("redis-server is not installed (Debian: redis-server); the test needs a "
                       "real server")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fault.json")
        cmd = replay_cmd(kvtier, 120, "redis", "--fault", "storage-down@30",
                         # Storage hits before the stop must not depend on the server's write
                         # speed.
                         "--settle-backups", "--json", out)
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
    failures += paused_during_the_ceiling(kvtier)
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
        server = start_redis_server(port, tmp, "--maxmemory", "3mb",
                                    "--maxmemory-policy", "noeviction")
        if server is None:
            return ["the test's redis-server (noeviction) did not start"]
        try:
            out = os.path.join(tmp, "refused.json")
            cmd = replay_cmd(kvtier, 60, "redis://127.0.0.1:%d" % port, "--json", out)
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


def start_redis_server(port, tmp, *extra):
    """A redis-server of the test's own on 127.0.0.1:`port`, listening, or None."""
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", tmp] + list(extra),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent())
    deadline = time.monotonic() + 60  # start-up on a loaded box; not a speed check
    while not listening(port):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            server.wait()
            return None
        time.sleep(0.05)
    return server


def running(pid):
    """Whether `pid` is in the process table (a zombie, not yet reaped, counts)."""
    return os.path.exists("/proc/%d" % pid)


def benchmarks_of(port):
    """Pids of redis-benchmark processes aimed at `port`."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"redis-benchmark") and str(port).encode() in args:
            pids.append(int(p))
    return pids


# The ceiling's bound for the replay's store timeout (StorageOptions' default 2000 ms):
# RedisCeilingTimeLimit = 5 timeouts, within 5-60 s.
CEILING_LIMIT_S = 10


def paused_during_the_ceiling(kvtier):
    """Probe 6: the server stops answering (SIGSTOP) while the replay measures its storage read
    ceiling with redis-benchmark. The pause is put exactly there: redis-benchmark is found on
    PATH as a two-line wrapper that stops the server and then execs the real redis-benchmark
    (the real program, against the real server, paused). The replay must kill and reap
    redis-benchmark at the bound its store's timeout gives (the report names it), go on without
    a ceiling against the still paused server (every storage call a timeout) and end; the wait
    for that is a hang guard, not a timing check. Before the bound it waited 60 s plus a DEL's
    own timeouts (~85 s in all) and then reported the DEL's error."""
    real = shutil.which("redis-benchmark")
    if real is None:
        return ["redis-benchmark is not installed (Debian: redis-tools), which the replay's "
                "ceiling uses"] if required_dependencies_must_be_present() else []
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = start_redis_server(port, tmp)
        if server is None:
            return ["the test's redis-server did not start"]
        pid_file = os.path.join(tmp, "benchmark.pid")
        wrapper = os.path.join(tmp, "redis-benchmark")
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\necho $$ > '%s'\nkill -STOP %d\nexec '%s' \"$@\"\n" %
                    (pid_file, server.pid, real))
        os.chmod(wrapper, 0o755)
        out = os.path.join(tmp, "paused.json")
        cmd = replay_cmd(kvtier, 20, "redis://127.0.0.1:%d" % port, "--json", out)
        env = dict(os.environ, PATH=tmp + os.pathsep + os.environ.get("PATH", ""))
        try:
            replay = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env, preexec_fn=die_with_parent())
            try:
                # A hang guard: the replay needs the ceiling's 10 s and 20 requests' storage
                # timeouts (~20 s on the 2-core box).
                output, _ = replay.communicate(timeout=240)
            except subprocess.TimeoutExpired:
                replay.kill()
                output, _ = replay.communicate()
                failures.append("the replay did not end with the server paused in its ceiling")
            left = benchmarks_of(port)
        finally:
            os.kill(server.pid, signal.SIGCONT)
            server.terminate()
            server.wait(timeout=60)
        if not os.path.exists(pid_file):
            return failures + ["the replay never ran redis-benchmark (no ceiling measured)"]
        with open(pid_file) as f:
            bench = int(f.read())
        if running(bench) or left:
            failures.append("redis-benchmark outlived the replay: pid %d running %s, on port %d: "
                            "%s" % (bench, running(bench), port, left))
        if replay.returncode != 0:
            failures.append("the replay exited %d with the server paused in its ceiling:\n%s" %
                            (replay.returncode, output[-2000:]))
            return failures
        with open(out) as f:
            how = json.load(f)["ceilings"]["storage_read_how"]
        print("server paused in the ceiling: %s" % how)
        said = "the server did not answer: redis-benchmark ran past %d s" % CEILING_LIMIT_S
        if said not in how or "2000 ms timeout" not in how:
            failures.append("the report does not say that the server did not answer within "
                            "the bound of the store's timeout: %r" % how)
        if said not in output:
            failures.append("the text report does not say why there is no storage ceiling")
    return failures


def killed_replay_leaves_no_server(kvtier):
    """SIGKILL the replay while it runs: its redis-server must go with it (PR_SET_PDEATHSIG)."""
    cmd = replay_cmd(kvtier, 100000, "redis")
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
