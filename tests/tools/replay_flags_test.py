#!/usr/bin/env python3
"""`kvtier replay` refuses bad flags at once (exit code 2) with a message naming the flag, and
checks its output paths before it starts.

Usage: replay_flags_test.py KVTIER
"""
import subprocess
import sys

CASES = [
    (["--requests", "-1"], "--requests"),
    (["--concurrency", "-3"], "--concurrency"),
    (["--speed", "0"], "--speed"),
    (["--speed", "nan"], "--speed"),
    (["--tflops", "1e9"], "--tflops"),
    (["--page-size", "48"], "--page-size = 48 must be a power of two in [1, 256]"),
    (["--device-tokens", "0"], "--device-tokens"),
    (["--host-tokens", "-5"], "--host-tokens"),
    (["--host-tokens", "0"], "--host-tokens"),
    (["--model", "gpt-5"], "--model"),
    (["--compute", "magic"], "--compute"),
    (["--verify", "some"], "--verify"),
    (["--hicache-write-policy", "write_sometimes"], "--hicache-write-policy"),
    (["--hicache-storage-prefetch-policy", "eager"], "--hicache-storage-prefetch-policy"),
    (["--hicache-mem-layout", "diagonal"], "--hicache-mem-layout"),
    (["--eviction", "random"], "--eviction"),
    (["--fault", "storage-down@soon"], "--fault"),
    (["--fault", "disk-on-fire@3"], "--fault"),
    (["--storage", "none", "--fault", "storage-down@1"], "--fault"),
    (["--fault", "storage-delay@0"], "--fault"),
    (["--fault", "storage-delay@2.5"], "--fault"),
    (["--fault", "storage-delay@5000"], "--fault"),
    (["--slow-class-margin", "-0.1"], "--slow-class-margin"),
    (["--slow-class-margin", "nan"], "--slow-class-margin"),
    (["--sweep", "device-tokens=1,2"], "--sweep"),
    (["--sweep", "host-tokens=1,x"], "--sweep"),
    (["--storage", "ftp"], "--storage"),
    (["--storage-io-threads", "-1"], "--storage-io-threads = -1 must be in [0, 64]"),
    # The cache's settings: bounds from HierarchicalCacheConfig's schema, under the replay's flags.
    (["--storage-io-threads", "65"], "--storage-io-threads = 65 must be in [0, 64]"),
    (["--write-through-threshold", "0"], "--write-through-threshold = 0 must be in [1, "),
    (["--prefetch-threshold", "-1"], "--prefetch-threshold = -1 must be in [0, "),
    (["--load-back-threshold", "-1"], "--load-back-threshold = -1 must be in [0, "),
    (["--storage-backup-queue-pages", "-1"], "--storage-backup-queue-pages = -1 must be in [0, "),
    (["--storage-min-free-bytes", "-2"], "--storage-min-free-bytes = -2 must be in [-1, "),
    # Every other cache field the replay does not set itself has its flag from the schema.
    (["--max-prefetch-batch-pages", "0"], "--max-prefetch-batch-pages = 0 must be in [1, "),
    (["--cpu-threads", "-1"], "--cpu-threads = -1 must be in [0, "),
    (["--prefill-tokens-per-second", "-1"], "--prefill-tokens-per-second = -1"),
    # A cache field a TP pass sets itself is refused with --tp, by name.
    (["--tp", "2", "--storage-timeout-ms", "5000"],
     "--storage-timeout-ms is not supported with --tp"),
    # Storage admission: one flag per field of StorageAdmissionConfig's schema.
    (["--admission-threshold", "0"], "--admission-threshold = 0 must be in [1, 15]"),
    (["--admission-policy", "lru"], "--admission-policy"),
    (["--admission-backlog-bytes", "-1"], "--admission-backlog-bytes = -1 must be in [0, "),
    (["--shard", "8/8"], "--shard"),
    (["--shard", "1-8"], "--shard"),
    (["--skip", "-1"], "--skip"),
    (["--workload", "chat", "--skip", "3"], "--skip"),
    (["--skip", "20000"], "--skip"),
    (["--kv-events-replay", "tcp://127.0.0.1:*"], "--kv-events"),
    (["--kv-events-topic", "kv"], "--kv-events"),
    (["--kv-events", "tcp://127.0.0.1:*", "--sweep", "host-tokens=1,2"], "--kv-events"),
    (["--kv-events", "tcp://127.0.0.1:*", "--kv-events-hold", "-1"], "--kv-events-hold"),
    (["--pin-system-prompt", "gpu"], "--pin-system-prompt"),
    (["--pin-system-prompt", "device,device"], "--pin-system-prompt"),
    (["--pin-system-prompt", "host", "--host-tokens", "0", "--storage", "none"],
     "--pin-system-prompt host: the hierarchy run has no host tier"),
    (["--pin-system-prompt", "storage", "--storage", "none"], "no storage tier"),
    (["--pin-system-prompt", "device", "--pin-ttl", "-1"], "--pin-ttl"),
    (["--pin-ttl", "60"], "--pin-ttl needs --pin-system-prompt"),
    (["--workload", "doc-qa", "--requests", "5", "--pin-system-prompt", "device"],
     "share no prefix"),
    (["--json", "/nonexistent-dir/x.json"], "--json"),
    (["--plot", "/nonexistent-dir/x.png"], "--plot"),
    (["--sequential", "--concurrency", "4"], "--sequential"),
    (["--workload", "/nonexistent/trace.jsonl"], "/nonexistent/trace.jsonl"),
]


def main():
    kvtier = sys.argv[1]
    failures = 0
    for args, needle in CASES:
        # Refused before any work; no wall-clock bound but the hang guard (a loaded box is slow).
        proc = subprocess.run([kvtier, "replay", "--device", "cpu"] + args,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=120)
        ok = proc.returncode == 2 and needle in proc.stderr
        failures += not ok
        print("%-60s exit %d %s: %s" % (" ".join(args), proc.returncode,
                                        "ok" if ok else "FAIL", proc.stderr.strip()[:160]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
