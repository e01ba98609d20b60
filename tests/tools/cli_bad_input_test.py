#!/usr/bin/env python3
"""Values the kvtier CLI used to accept although they cannot work: each is refused at once with a
message naming the problem (and exit code != 0), in bounded time and memory.

  - a trace line that never ends (--workload /dev/zero) or is too long (file:line in the message),
    with the child's peak RSS bounded;
  - kvtier shm create with --pages 2^63-1, --layers 0, --page-size 3;
  - kvtier replay --host-tokens -1 (it silently meant the default);
  - kvtier bench --storage '' (it silently ran the whole transfer bench);
  - kvtier replay --plot /dev/full (it exited 0, said it wrote the plot and wrote /dev/full.png);
    --json /dev/full and `kvtier replay > /dev/full` (a write error seen only after the run, or
    exit 0);
  - --kv-events tcp://*:99999 or tcp://HOST:-1 (libzmq bound a random port / 65535), an ipc://
    socket another process listens on (silently taken over);
  - --tp with --kv-events, --sweep, --concurrency or --pin-system-prompt (silently ignored);
  - integers above 2^63 - 1 (saturated to 2^63 - 1), nan and inf (passed every range check);
  - kvtier bench --storage-hit '' (it ran the whole transfer bench).

Usage: cli_bad_input_test.py KVTIER
"""
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

# What bounded input may add to the peak RSS of the binary itself (which, in a CUDA build, maps
# the CUDA libraries: cuBLAS alone is over 100 MiB resident at start). An unbounded read of
# /dev/zero grows by gigabytes within the time limit.
MAX_GROWTH_KB = 128 * 1024


def run(cmd, timeout=120):
    """(exit code, stdout + stderr, seconds, the child's peak RSS in KiB)."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return -9, out, time.time() - t0, 0
    # The peak of this child alone: RUSAGE_CHILDREN is a maximum over all children so far, so
    # the test runs the checked commands in the order of growing expectations.
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return proc.returncode, out, time.time() - t0, rss


def main():
    kvtier = sys.argv[1]
    failures = []
    # The binary's own peak, first, so that RUSAGE_CHILDREN's running maximum starts there.
    _, _, _, base_rss = run([kvtier, "--help"])
    max_rss_kb = base_rss + MAX_GROWTH_KB

    # No wall-clock bound beyond run()'s hang guard (a loaded machine is slow, not wrong): an
    # unbounded read is caught by the peak RSS, a hang by the timeout (exit -9).
    def expect_refused(cmd, needle, check_rss=False):
        rc, out, took, rss = run(cmd)
        ok = rc not in (0, -9) and needle in out
        if check_rss and rss > max_rss_kb:
            ok = False
            out += "\n(peak RSS %d MiB)" % (rss // 1024)
        print("%-70s exit %d %.2f s %s: %s" % (" ".join(cmd[1:])[:70], rc, took,
                                               "ok" if ok else "FAIL", out.strip()[-200:]))
        if not ok:
            failures.append(" ".join(cmd[1:]))
        return out

    replay = [kvtier, "replay", "--device", "cpu", "--model", "tiny", "--no-progress"]
    # Bounded input: checked first, so RUSAGE_CHILDREN's maximum is theirs.
    expect_refused(replay + ["--workload", "/dev/zero"], "/dev/zero:1", check_rss=True)
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "long_line.jsonl")
        good = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
        with open(trace, "w") as f:
            f.write(good + good + '{"timestamp": 1, "hash_ids": [' + "1," * (2 << 20) + "1]}\n")
        expect_refused(replay + ["--workload", trace], trace + ":3", check_rss=True)

        name = "kvtier-badinput-%d" % os.getpid()
        shm = [kvtier, "shm", "create", name, "--slot-bytes", "256"]
        expect_refused(shm + ["--layers", "2", "--pages", "9223372036854775807"], "--pages")
        out = expect_refused(shm + ["--layers", "0", "--pages", "4"], "--layers")
        if "1.79e308" in out:
            failures.append("--layers 0: the message shows a floating-point range")
        expect_refused(shm + ["--layers", "2", "--pages", "4", "--page-size", "3"],
                       "--page-size = 3 must be a power of two")
        subprocess.run([kvtier, "shm", "destroy", name], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

        expect_refused(replay + ["--host-tokens", "-1"], "--host-tokens")
        expect_refused([kvtier, "bench", "--storage", ""], "--storage")
        # The file store's free-space floor from the command line (StorageOptions'
        # min_free_bytes): bounded by its schema, and it reaches the store: a floor above any
        # disk's free space refuses every page (the bench's check fails, exit 1).
        store_bench = [kvtier, "bench", "--storage", "file://" + os.path.join(tmp, "floor"),
                       "--storage-kinds", "mha4", "--storage-bytes", "1MiB",
                       "--storage-exists-keys", "0", "--no-baseline"]
        expect_refused(store_bench + ["--storage-min-free-bytes", "-2"],
                       "--storage-min-free-bytes = -2 must be in [-1, ")
        out = expect_refused(store_bench + ["--storage-min-free-bytes", str(1 << 60)],
                             "pages not ok")
        if "FAILED Set" not in out:
            failures.append("--storage-min-free-bytes 2^60: the Set was not refused")

        stray = "/dev/full.png"
        existed = os.path.exists(stray)
        small = replay + ["--workload", "chat", "--requests", "5", "--runs", "hierarchy",
                          "--storage", "none"]
        expect_refused(small + ["--plot", "/dev/full"], "--plot /dev/full")
        expect_refused(small + ["--json", "/dev/full"], "--json /dev/full: not a regular file")
        # Standard output that refuses writes: refused before the run, never exit 0.
        with open("/dev/full", "w") as full:
            proc = subprocess.run(small, stdout=full, stderr=subprocess.PIPE, text=True,
                                  timeout=120)
        ok = proc.returncode != 0 and "cannot write to standard output" in proc.stderr
        print("%-70s exit %d %s: %s" % ("replay > /dev/full", proc.returncode,
                                        "ok" if ok else "FAIL", proc.stderr.strip()[-200:]))
        if not ok:
            failures.append("replay > /dev/full")

        # Event endpoints: a tcp port outside [1, 65535] (libzmq binds a random port for 99999,
        # 65535 for -1), and an ipc:// socket another process listens on (binding it would
        # silently take it over).
        expect_refused(small + ["--kv-events", "tcp://*:99999"], "port '99999' must be")
        expect_refused(small + ["--kv-events", "tcp://127.0.0.1:-1"], "port '-1' must be")
        expect_refused(small + ["--kv-events", "tcp://*:*", "--kv-events-replay", "tcp://*:0"],
                       "--kv-events-replay tcp://*:0: port '0' must be")
        sock_path = os.path.join(tmp, "taken.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as taken:
            taken.bind(sock_path)
            taken.listen(4)
            expect_refused(small + ["--kv-events", "ipc://" + sock_path],
                           "another process is listening")

        # --tp refuses the flags it does not implement instead of ignoring them.
        tp = small + ["--tp", "2"]
        for flag in (["--kv-events", "tcp://127.0.0.1:*"], ["--sweep", "host-tokens=4096,8192"],
                     ["--concurrency", "2"], ["--pin-system-prompt", "device"]):
            expect_refused(tp + flag, "%s is not supported with --tp" % flag[0])

        # Numbers CLI11 would have saturated or let through every range check.
        expect_refused(small[:2] + ["--requests", "9223372036854775808"], "out of range")
        expect_refused(small[:2] + ["--seed", "18446744073709551616"], "out of range")
        expect_refused(small[:2] + ["--tp", "2", "--tp-timeout", "nan"], "--tp-timeout = nan")
        expect_refused(small[:2] + ["--tflops", "inf"], "not a finite number")
        expect_refused([kvtier, "bench", "--storage-hit", ""], "--storage-hit is empty")
        if not existed and os.path.exists(stray):
            failures.append("--plot /dev/full wrote %s instead" % stray)
            os.remove(stray)
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
