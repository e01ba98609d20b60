#!/usr/bin/env python3
"""No Redis password in anything kvtier prints or writes: a redis-server that this test starts on a
free 127.0.0.1 port with `requirepass`, and `kvtier replay` / `kvtier bench --storage` given its URL
with the password (as `--storage URL` and `--storage=URL`), a wrong password, a mistyped scheme and
bad parameters. Their stdout, stderr and --json must not hold the password anywhere; the runs that
can work must work (exit 0, the store used), the others fail with a message.

Skips (77; fails under CI=true) only when redis-server is not installed or kvtier was built
without hiredis.

Usage: secret_redaction_test.py KVTIER HIREDIS(ON|OFF)
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from child_process import die_with_parent
from missing_dep import missing

SECRET = "s3cretPW"  # also the needle: it must appear nowhere


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port, tmp):
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", tmp,
                             "--requirepass", SECRET],
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


def run(cmd, json_path=None):
    """(exit code, everything printed and written) of one kvtier command."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)
    text = proc.stdout
    if json_path and os.path.exists(json_path):
        with open(json_path) as f:
            text += f.read()
        os.remove(json_path)
    return proc.returncode, text


def main():
    kvtier, hiredis = sys.argv[1], sys.argv[2]
    if hiredis.upper() not in ("ON", "1", "TRUE", "YES"):
        return missing("kvtier was built without hiredis (no redis storage backend)")
    if shutil.which("redis-server") is None:
        return missing("redis-server is not installed (Debian: redis-server)")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = start_server(port, tmp)
        try:
            url = "redis://:%s@127.0.0.1:%d" % (SECRET, port)
            out = os.path.join(tmp, "out.json")
            replay = [kvtier, "replay", "--workload", "doc-qa", "--requests", "20", "--model",
                      "tiny", "--device", "cpu", "--device-tokens", "8192", "--host-tokens",
                      "16384", "--sequential", "--runs", "hierarchy", "--no-progress",
                      "--json", out]
            bench = [kvtier, "bench", "--storage-bytes", "1MiB", "--storage-batch", "2",
                     "--storage-kinds", "mha16", "--storage-exists-keys", "50", "--repeats", "1",
                     "--no-baseline", "--json", out]
            # (command, must it succeed?)
            cases = [
                (replay + ["--storage", url], True),
                (replay + ["--storage=" + url], True),
                (replay + ["--storage", url + "?timeout_ms=3000"], True),
                (bench + ["--storage", url], True),
                (replay + ["--storage", "redis://:wrong%s@127.0.0.1:%d" % (SECRET, port)], False),
                (replay + ["--storage", "rediss://:%s@127.0.0.1:%d" % (SECRET, port)], False),
                (replay + ["--storage", url + "?bogus=1"], False),
                (replay + ["--storage", "redis://user:%s@127.0.0.1:1" % SECRET], False),
                (bench + ["--storage", "rediss://:%s@127.0.0.1:%d" % (SECRET, port)], False),
                (bench + ["--storage", url + "?bogus=1"], False),
            ]
            for cmd, should_work in cases:
                rc, text = run(cmd, out)
                shown = " ".join(cmd[1:2] + cmd[-2:])
                if SECRET in text:
                    at = text.index(SECRET)
                    failures.append("%s: the password is in its output: ...%s..." %
                                    (shown, text[max(0, at - 80):at + 20].replace("\n", " | ")))
                if should_work and rc != 0:
                    failures.append("%s: exit %d:\n%s" % (shown, rc, text[-800:]))
                if should_work and "127.0.0.1:%d" % port not in text:
                    failures.append("%s: the report does not name the store" % shown)
                if not should_work and rc == 0:
                    failures.append("%s: exit 0 for a URL that cannot work" % shown)
                print("%-70s exit %d" % (shown, rc))
        finally:
            server.kill()
            server.wait()
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
