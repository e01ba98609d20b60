#!/usr/bin/env python3
"""`kvtier replay`'s honest numbers on the cpu device: the report carries the ceilings the ideal
charges (host -> device and the storage read ceiling measured at start), how loads were timed, the
headline ratios with their bootstrap intervals, and TTFT per hit class against no cache. A store
made slow through the fault wrapper (--fault storage-delay@MS) makes the storage class slower than
no cache: the replay exits 3 with a clear line, or only warns with --slow-class-warn; with the
store at its own speed no class is slower and the replay exits 0. A near-zero compute (--model
tiny alone) reports and exits 0: a verdict needs the p50s 1 ms apart as well as the ratio.

Usage: replay_classes_test.py KVTIER
"""
import json
import os
import subprocess
import sys
import tempfile

from replay_report import run_replay

# A short sequential doc-qa slice that gets hits in every tier: the tiny model's KV (cheap to
# move and check) with Llama-3-8B's prefill costed by the model (a prompt costs hundreds of ms at
# the default 400 TFLOP/s, far above the wall-clock jitter of the loads on a busy machine).
BASE = ["replay", "--workload", "doc-qa", "--requests", "40", "--seed", "5", "--model", "tiny",
        "--compute-model", "llama3-8b", "--device", "cpu",
        "--device-tokens", "32768", "--host-tokens", "65536", "--storage", "file", "--sequential",
        "--runs", "no_cache,hierarchy", "--no-progress",
        # Storage hits must not depend on how fast this machine's store writes (a loaded machine
        # got none in the slow-store run, and the test then proved nothing).
        "--settle-backups"]


def interval_ok(i, requests=None):
    ok = i["lo"] <= i["value"] + 1e-9 and i["value"] <= i["hi"] + 1e-9 and i["value"] > 0
    return ok and (requests is None or i["requests"] == requests)


def classes_of(report):
    return {c["class"]: c for c in report["hit_classes"]["classes"]}


def check_fields(report, output, failures):
    c = report["ceilings"]
    if not c["host_to_device_gbps"] > 0 or "memcpy" not in c["host_to_device_how"]:
        failures.append("host -> device ceiling missing or not the cpu memcpy: %s" % c)
    if not c["storage_read_gbps"] > 0 or "pread" not in c["storage_read_how"]:
        failures.append("storage read ceiling missing or not the pread baseline: %s" % c)
    if report["load_timing"] != "cpu_synchronous_wall_time":
        failures.append("load_timing is %r on the cpu device" % report["load_timing"])
    h = report["headline"]
    if h["requests"] != 40 or h["min_requests"] != 300:
        failures.append("headline over %s requests (min %s)" % (h["requests"], h["min_requests"]))
    for key in ("hierarchy_over_ideal_p50", "hierarchy_over_ideal_p90"):
        if not interval_ok(h[key], 40):
            failures.append("%s has no sound interval: %s" % (key, h[key]))
    m = report["mostly_cached"]
    if m["requests"] > 0 and not interval_ok(h["mostly_cached_speedup_p50"], m["requests"]):
        failures.append("mostly-cached speed-up has no sound interval: %s"
                        % h["mostly_cached_speedup_p50"])
    if "bootstrap" not in h["spread"]:
        failures.append("the spread does not say how it was made: %r" % h["spread"])
    classes = classes_of(report)
    # The first request matches nothing; which tiers serve the others depends on how fast the
    # store's writes land, so only "none" is certain here (the slow store below needs storage).
    if "none" not in classes or not set(classes) <= {"none", "device", "host", "storage"}:
        failures.append("hit classes: %s" % sorted(classes))
    hier = report["timeline"]["hierarchy"]
    if sum(c["requests"] for c in classes.values()) != len(hier["ttft_ms"]):
        failures.append("the hit classes do not cover every request once")
    for name, c in classes.items():
        if not interval_ok(c["ratio_p50"], c["requests"]):
            failures.append("class %s has no sound interval: %s" % (name, c["ratio_p50"]))
    if [r["name"] for r in report["runs"]] != ["no_cache", "hierarchy"]:
        failures.append("--runs no_cache,hierarchy made the runs %s"
                        % [r["name"] for r in report["runs"]])
    run = report["runs"][-1]
    if run["load_back"]["requests"] <= 0 or not run["load_back"]["gbps_end_to_end"] > 0:
        failures.append("no load-back timing in the hierarchy run: %s" % run["load_back"])
    for needle in ("TTFT per hit class", "hierarchy / ideal: p50", "95 % interval",
                   "storage ceiling", "fewer than 300", "the copy is synchronous"):
        if needle not in output:
            failures.append("the printed report lacks %r" % needle)


def main():
    kvtier = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        # The store at its own speed: no class slower than no cache, exit 0.
        out = os.path.join(tmp, "fast.json")
        report, output = run_replay([kvtier] + BASE + ["--json", out], out)
        check_fields(report, output, failures)
        if report["hit_classes"]["any_slower"]:
            failures.append("a class is slower than no cache with the store at its own speed")

        # Every storage call 100 ms late, and the prefill costed at 20,000 TFLOP/s (a prompt costs
        # milliseconds): a storage hit costs more than recomputing, the storage class is slower
        # than no cache.
        for warn in (False, True):
            out = os.path.join(tmp, "slow%d.json" % warn)
            cmd = [kvtier] + BASE + ["--tflops", "20000", "--fault", "storage-delay@100",
                                     "--json", out]
            if warn:
                cmd.append("--slow-class-warn")
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=300)
            sys.stdout.write(proc.stdout)
            want_code = 0 if warn else 3
            word = "WARNING" if warn else "FAIL"
            if proc.returncode != want_code:
                failures.append("slow store%s: exit %d, expected %d"
                                % (" with --slow-class-warn" if warn else "", proc.returncode,
                                   want_code))
            if "kvtier replay: %s: hit class storage is slower than no cache" % word \
                    not in proc.stdout:
                failures.append("slow store: no %s line for the storage class" % word)
            with open(out) as f:
                slow = json.load(f)
            storage = classes_of(slow).get("storage")
            if storage is None or not storage["slower"] or not storage["ratio_p50"]["lo"] > 1.05:
                failures.append("slow store: the storage class is not marked slower: %s" % storage)
            if slow["integrity"]["wrong_bytes"] != 0:
                failures.append("slow store: %d wrong bytes" % slow["integrity"]["wrong_bytes"])

        # A near-zero compute (the tiny model's own prefill: microseconds): the classes' TTFTs
        # are all noise, and a ratio of two near-zero times (0.02 ms against 0.01 ms) is no
        # verdict. The replay reports and exits 0; a class marked slower is slower by at least
        # the floor of 1 ms.
        out = os.path.join(tmp, "tiny.json")
        cmd = [kvtier, "replay", "--model", "tiny", "--device", "cpu", "--workload", "chat",
               "--requests", "200", "--runs", "no_cache,hierarchy", "--no-progress",
               "--json", out]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=300)
        if proc.returncode != 0:
            sys.stdout.write(proc.stdout)
            failures.append("--model tiny: exit %d, expected 0" % proc.returncode)
        else:
            with open(out) as f:
                tiny = json.load(f)
            if tiny["hit_classes"].get("min_difference_ms") != 1.0:
                failures.append("--model tiny: the verdict's floor is not in the JSON")
            for name, c in classes_of(tiny).items():
                if c["slower"] and c["hierarchy_p50_ms"] - c["no_cache_p50_ms"] < 1.0:
                    failures.append("--model tiny: class %s marked slower by %.3f ms" %
                                    (name, c["hierarchy_p50_ms"] - c["no_cache_p50_ms"]))
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
