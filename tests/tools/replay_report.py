"""Shared by the kvtier replay tests: run a replay that writes its JSON report, fail clearly when it
does not exit 0, and return the report."""

import json
import subprocess
import sys


def load_report(returncode, output, out, label="kvtier replay", echo=True):
    """The JSON report a finished replay wrote to `out`. Prints its `output` (always when `echo`,
    else only when it failed); SystemExit("FAIL: ...") when `returncode` is not 0."""
    if echo or returncode != 0:
        sys.stdout.write(output)
    if returncode != 0:
        raise SystemExit("FAIL: %s exited with %d" % (label, returncode))
    with open(out) as f:
        return json.load(f)


def run_replay(cmd, out, timeout=None, echo=True, env=None):
    """Runs `cmd`, a kvtier replay command line whose --json is `out`, in `env` (None: this
    process's environment): (its report, what it printed)."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=env)
    return load_report(proc.returncode, proc.stdout, out, echo=echo), proc.stdout
