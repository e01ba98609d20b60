"""Children of the Python-driven tests (redis-servers, kvtier replays) never outlive the test: each
is started with `preexec_fn=die_with_parent()`, so the kernel sends it SIGKILL when the test
process dies, also when the test itself is SIGKILLed (a ctest timeout) and cannot clean up."""

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    """A Popen preexec_fn: the child gets SIGKILL when this process dies. The parent's pid is taken
    before the fork; a parent that died before prctl took effect is caught by comparing it."""
    parent = os.getpid()

    def preexec():
        if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(126)

    return preexec
