#!/usr/bin/env python3
"""`kvtier bench --storage redis://...` with a flaky redis-benchmark (a wrapper first on PATH that
prints only its CSV header, as the real one now and then does on a busy box):

  - flaky once: the baseline is retried and measured; exit 0 with every row there;
  - failing always: kvtier's rows are still measured and checked, the baseline is reported in a
    row of its own ("baseline not measured", baseline_failed in --json), and the exit code is 0.

Skips (77; fails under CI=true) only when redis-server / redis-benchmark are not installed or
kvtier was built without hiredis.

A killed bench (SIGKILL) takes its redis-benchmark with it.

Usage: storage_bench_flaky_baseline_test.py KVTIER HIREDIS(ON|OFF)
"""
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time

from child_process import die_with_parent
from missing_dep import missing


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError("redis-server did not listen within 60 s")


def write_wrapper(directory, real, failures_first):
    """A redis-benchmark that prints only the CSV header for its first `failures_first` runs
    (counted in a file beside it), then runs the real one."""
    path = os.path.join(directory, "redis-benchmark")
    count = os.path.join(directory, "runs")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n"
                "n=$(cat %s 2>/dev/null || echo 0); echo $((n + 1)) > %s\n"
                "if [ \"$n\" -lt %d ]; then\n"
                "  echo '\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\","
                "\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"'\n"
                "  exit 0\n"
                "fi\n"
                "exec %s \"$@\"\n" % (count, count, failures_first, real))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return count


def killed_bench_leaves_no_baseline(kvtier, port, tmp):
    """SIGKILL `kvtier bench --storage redis://` while its redis-benchmark runs (a wrapper that
    says its pid, then hangs): the redis-benchmark must go with it (PR_SET_PDEATHSIG), not live
    on reparented to init. The wrapper's pid file is the signal; the wait for the child to go is
    bounded (the kernel's SIGKILL, not a speed check). Returns failures."""
    wrapper_dir = tempfile.mkdtemp(dir=tmp)
    pid_file = os.path.join(wrapper_dir, "pid")
    path = os.path.join(wrapper_dir, "redis-benchmark")
    with open(path, "w") as f:
        f.write("#!/bin/sh\necho $$ > %s.tmp && mv %s.tmp %s\nexec sleep 3600\n"
                % (pid_file, pid_file, pid_file))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=wrapper_dir + os.pathsep + os.environ["PATH"])
    cmd = [kvtier, "bench", "--storage", "redis://127.0.0.1:%d" % port, "--storage-kinds",
           "mha16", "--storage-bytes", "1MiB", "--storage-batch", "2", "--storage-exists-keys",
           "0", "--repeats", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            preexec_fn=die_with_parent())
    child = None
    try:
        while child is None and proc.poll() is None:  # bounded by the ctest timeout
            if os.path.exists(pid_file):
                with open(pid_file) as f:
                    child = int(f.read())
            else:
                time.sleep(0.05)
        if child is None:
            return ["killed bench: kvtier bench exited (%d) before its redis-benchmark started"
                    % proc.returncode]
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open("/proc/%d/stat" % child) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X"):
                break
        except OSError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        return ["killed bench: its redis-benchmark (pid %d) outlived it" % child]
    print("killed bench: its redis-benchmark (pid %d) is gone" % child)
    return []


def main():
    kvtier, hiredis = sys.argv[1], sys.argv[2]
    if hiredis.upper() not in ("ON", "1", "TRUE", "YES"):
        return missing("kvtier was built without hiredis (no redis storage backend)")
    real = shutil.which("redis-benchmark")
    if shutil.which("redis-server") is None or real is None:
        return missing("redis-server / redis-benchmark not installed (Debian: redis-server, "
                       "redis-tools)")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = start_server(port, tmp)
        try:
            for label, failures_first in (("flaky once", 1), ("failing always", 1000)):
                wrapper_dir = tempfile.mkdtemp(dir=tmp)
                runs_file = write_wrapper(wrapper_dir, real, failures_first)
                out = os.path.join(tmp, "bench.json")
                env = dict(os.environ, PATH=wrapper_dir + os.pathsep + os.environ["PATH"])
                cmd = [kvtier, "bench", "--storage", "redis://127.0.0.1:%d" % port,
                       "--storage-kinds", "mha16", "--storage-bytes", "1MiB", "--storage-batch",
                       "2", "--storage-exists-keys", "0", "--repeats", "1", "--json", out]
                proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, timeout=240, env=env)
                print("---- %s: exit %d\n%s" % (label, proc.returncode, proc.stdout[-1500:]))
                if proc.returncode != 0:
                    failures.append("%s: exit %d" % (label, proc.returncode))
                    continue
                with open(out) as f:
                    rows = json.load(f)["rows"]
                kvtier_rows = [r for r in rows if r["who"] == "kvtier"]
                if len(kvtier_rows) < 3 or not all(r["check_ok"] for r in kvtier_rows):
                    failures.append("%s: kvtier's rows missing or not checked" % label)
                failed = [r for r in rows if r.get("baseline_failed")]
                measured = [r for r in rows if r["who"].startswith("redis-benchmark")]
                with open(runs_file) as f:
                    runs = int(f.read())
                if failures_first == 1:
                    if failed or len(measured) < 2:
                        failures.append("%s: the baseline was not measured after a retry "
                                        "(%d runs)" % (label, runs))
                else:
                    if len(failed) != 1 or "twice" not in failed[0]["note"]:
                        failures.append("%s: no row says the baseline failed twice: %r" %
                                        (label, failed))
                    if "baseline not measured" not in proc.stdout:
                        failures.append("%s: the table does not show the failed baseline" % label)
            failures += killed_bench_leaves_no_baseline(kvtier, port, tmp)
        finally:
            server.kill()
            server.wait()
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
