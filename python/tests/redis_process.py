"""A throwaway redis-server on a free 127.0.0.1 port, for tests and benches.

    with local_redis() as url:   # "redis://127.0.0.1:PORT"
        ...

It listens on loopback only, persists nothing, dies with the process that started it
(PR_SET_PDEATHSIG) and is killed when the block ends; the wait for it to answer is bounded.
``RedisUnavailable`` when redis-server is not installed (Debian: redis-server).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)  # loaded here, not in the forked child


class RedisUnavailable(RuntimeError):
    pass


def _die_with_parent():
    _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def local_redis(maxmemory: str = "0"):
    exe = shutil.which("redis-server")
    if exe is None:
        raise RedisUnavailable("redis-server is not installed (Debian: redis-server)")
    tmp = tempfile.mkdtemp(prefix="kvtier-redis-")
    port = _free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp, "--save", "",
         "--appendonly", "no", "--maxmemory", maxmemory, "--logfile",
         os.path.join(tmp, "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=_die_with_parent)
    try:
        for _ in range(500):  # up to ~10 s
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited at start (code {proc.returncode})")
            if _ping(port):
                break
            time.sleep(0.02)
        else:
            raise RuntimeError("redis-server did not answer PING within 10 s")
        yield f"redis://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
