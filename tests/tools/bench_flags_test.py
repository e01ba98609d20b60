#!/usr/bin/env python3
"""`kvtier bench`'s engine flags come from TransferEngineConfig's schema: a value just outside a
bound is refused while parsing (non-zero exit, nothing run) with the schema's message under the
flag's name; the bound itself is accepted (the run then finishes and checks its bytes); --help
shows the schema's defaults and bounds.

Usage: bench_flags_test.py KVTIER
"""
import subprocess
import sys

REFUSED = [
    (["--dma-ops-per-lane", "1"], "--dma-ops-per-lane = 1 must be in [16, 1048576]"),
    (["--dma-ops-per-lane", "1048577"], "--dma-ops-per-lane = 1048577 must be in [16, 1048576]"),
    (["--dma-lanes", "0"], "--dma-lanes = 0 must be in [1, 16]"),
    (["--dma-lanes", "17"], "--dma-lanes = 17 must be in [1, 16]"),
    (["--dma-min-strided-rows", "1"], "--dma-min-strided-rows = 1 must be in [2, 1048576]"),
    (["--max-sms", "0"], "--max-sms = 0 must be in [1, 1024]"),
    (["--max-sms-to-host", "-1"], "--max-sms-to-host = -1 must be in [0, 1024]"),
    (["--cpu-threads", "1025"], "--cpu-threads = 1025 must be in [0, 1024]"),
    (["--threads", "-1"], "--cpu-threads = -1 must be in [0, 1024]"),  # the older name
    (["--device", "1024"], "--device = 1024 must be in [0, 1023]"),
    (["--cpu-parallel-threshold-bytes", "-1"], "--cpu-parallel-threshold-bytes = -1 must be in [0, "),
]
# Bounds accepted: a tiny cpu run with each (the dma fields are only carried by the cpu rows).
ACCEPTED = [
    ["--dma-ops-per-lane", "16"], ["--dma-lanes", "16"], ["--dma-min-strided-rows", "2"],
    ["--max-sms", "1024"], ["--cpu-threads", "0"], ["--threads", "2"],
]
RUN = ["bench", "--backend", "cpu", "--tokens", "64", "--layers", "2", "--page-sizes", "16",
       "--shapes", "mha", "--layouts", "page_first", "--ops", "load", "--repeats", "1",
       "--warmup", "0"]


def main():
    kvtier = sys.argv[1]
    failures = 0
    for args, needle in REFUSED:
        proc = subprocess.run([kvtier] + RUN + args, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=60)
        ok = proc.returncode != 0 and needle in proc.stderr and "GB/s" not in proc.stdout
        failures += not ok
        print("%-45s exit %d %s: %s" % (" ".join(args), proc.returncode, "ok" if ok else "FAIL",
                                        proc.stderr.strip()[:160]))
    for args in ACCEPTED:
        proc = subprocess.run([kvtier] + RUN + args, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120)
        ok = proc.returncode == 0
        failures += not ok
        print("%-45s exit %d %s" % (" ".join(args), proc.returncode, "ok" if ok else "FAIL: " +
                                    proc.stderr.strip()[:300]))
    help_text = subprocess.run([kvtier, "bench", "--help"], stdout=subprocess.PIPE, text=True,
                               timeout=60).stdout
    for needle in ("--dma-ops-per-lane", "[16, 1048576]", "--cpu-threads", "--max-sms-beside-backup"):
        if needle not in help_text:
            print("--help lacks %r: FAIL" % needle)
            failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
