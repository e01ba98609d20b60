#!/usr/bin/env python3
"""`kvtier replay --concurrency N --decode-ms-per-token D`: a closed loop's request holds its
client until its output is decoded, as in SGLang's and vLLM's serving benchmarks with
--max-concurrency (cpu device, the shipped Mooncake trace, whose requests carry output_length):

- every request's arrival, start and end in the JSON timeline follow the rule stated in
  tools/replay/replay_timeline.h, recomputed here from each request's service time and output
  length: request i arrives when request i - N has decoded its output_length - 1 tokens after its
  first one, paused by every prefill that runs meanwhile; a prefill waits for the device, and one that
  arrives while decodes run waits for the decode step in progress (steps back to back from the
  last prefill's end);
- the decode holds the clients: arrivals come later and queueing is shorter than with no decode
  (the device is not busy with prefill all the time), and every byte checks out;
- one request at a time (--sequential) is never queued, with or without decode;
- bad values are refused with exit code 2 and a message naming the flag: a negative or
  non-number value, decode with an open loop, and "measure" where compute is the cost model.

Usage: replay_decode_test.py KVTIER
"""
import math
import os
import subprocess
import sys
import tempfile

from replay_report import run_replay

BASE = ["replay", "--workload", "mooncake", "--requests", "40", "--skip", "20", "--model",
        "tiny", "--compute-model", "llama3-8b", "--tflops", "400", "--device", "cpu",
        "--page-size", "16", "--device-tokens", "8192", "--host-tokens", "16384",
        "--storage", "file", "--runs", "no_cache,hierarchy", "--no-progress"]
DECODE_MS = 3.0
TOL_MS = 1e-6


def simulate(service, outputs, n_clients, decode_ms):
    """The replay's timeline rule, written out again: (arrival, start, end) per request."""
    n = len(service)
    start, end = [0.0] * n, [0.0] * n
    arrival = [0.0] * n
    free = 0.0

    def done(k, served):
        t = end[k]
        left = decode_ms * max(0, outputs[k] - 1)
        for j in range(k + 1, served):
            if left <= 0 or start[j] >= t + left:
                break
            if start[j] > t:
                left -= start[j] - t
            t = max(t, end[j])
        return t + left

    for i in range(n):
        a = 0.0 if i < n_clients else done(i - n_clients, i)
        s = max(free, a)
        if decode_ms > 0 and a >= free:
            if any(done(k, i) > a for k in range(max(0, i - n_clients + 1), i)):
                s = free + math.ceil((a - free) / decode_ms) * decode_ms
        arrival[i], start[i], end[i] = a, s, s + service[i]
        free = end[i]
    return arrival, start, end


def check_timeline(report, n_clients, decode_ms, failures, label):
    for name, t in report["timeline"].items():
        n = len(t["ttft_ms"])
        arrival = t["arrival_ms"]
        start = [arrival[i] + t["queue_ms"][i] for i in range(n)]
        end = [arrival[i] + t["ttft_ms"][i] for i in range(n)]
        service = [end[i] - start[i] for i in range(n)]
        if any(o <= 0 for o in t["output_tokens"]):
            failures.append("%s %s: a request without its output length: %s"
                            % (label, name, t["output_tokens"][:10]))
        a2, s2, e2 = simulate(service, t["output_tokens"], n_clients, decode_ms)
        # Times are sums of a few hundred doubles: compare with a tolerance relative to them.
        bad = [(i, arrival[i], a2[i], start[i], s2[i]) for i in range(n)
               if abs(arrival[i] - a2[i]) > TOL_MS * max(1.0, e2[i]) * 1e3
               or abs(start[i] - s2[i]) > TOL_MS * max(1.0, e2[i]) * 1e3]
        if bad:
            failures.append("%s %s: %d requests off the rule (index, arrival, expected, start, "
                            "expected): %s" % (label, name, len(bad), bad[:5]))


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    kvtier = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        plain, _ = run_replay([kvtier] + BASE + ["--concurrency", "2", "--json", out], out,
                              timeout=240, echo=False)
        decoded, text = run_replay([kvtier] + BASE + ["--concurrency", "2",
                                                     "--decode-ms-per-token", str(DECODE_MS),
                                                     "--json", out], out, timeout=240)
        check_timeline(plain, 2, 0.0, failures, "no decode")
        check_timeline(decoded, 2, DECODE_MS, failures, "decode")
        if decoded["decode"]["ms_per_token"] != DECODE_MS:
            failures.append("the JSON's decode: %s" % decoded["decode"])
        if "until its output is decoded at 3.00 ms a token" not in text:
            failures.append("the printed settings do not say how the decode holds the clients")
        for r in (plain, decoded):
            if r["integrity"]["wrong_bytes"] != 0:
                failures.append("%d wrong bytes" % r["integrity"]["wrong_bytes"])
            if r["headline"]["ideal_above_measured"] != 0:
                failures.append("the ideal is above %d measured TTFTs"
                                % r["headline"]["ideal_above_measured"])
        # The decode holds each client for its output: later arrivals, shorter queues.
        for name in ("no_cache", "hierarchy"):
            p, q = plain["timeline"][name], decoded["timeline"][name]
            if not q["arrival_ms"][-1] > p["arrival_ms"][-1]:
                failures.append("%s: the last arrival did not move with decode (%.1f, %.1f ms)"
                                % (name, p["arrival_ms"][-1], q["arrival_ms"][-1]))
            if not sum(q["queue_ms"]) < sum(p["queue_ms"]):
                failures.append("%s: queueing did not shrink with decode (%.1f, %.1f ms)"
                                % (name, sum(p["queue_ms"]), sum(q["queue_ms"])))
            if not any(x == 0 for x in q["queue_ms"][2:]):
                failures.append("%s: no request after the first two found the device free"
                                % name)

        seq, _ = run_replay([kvtier] + BASE + ["--sequential", "--decode-ms-per-token", "3",
                                               "--json", out], out, timeout=240, echo=False)
        check_timeline(seq, 1, DECODE_MS, failures, "sequential")
        for name, t in seq["timeline"].items():
            if any(x != 0 for x in t["queue_ms"]):
                failures.append("sequential %s: a request was queued" % name)

    for bad, want in ((["--concurrency", "2", "--decode-ms-per-token", "-1"],
                       "--decode-ms-per-token = '-1'"),
                      (["--concurrency", "2", "--decode-ms-per-token", "fast"],
                       "--decode-ms-per-token = 'fast'"),
                      (["--decode-ms-per-token", "3"], "an open loop"),
                      (["--concurrency", "2", "--decode-ms-per-token", "measure"],
                       "measure times a decode step's GEMMs on a GPU")):
        proc = subprocess.run([kvtier] + BASE + bad, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=120)
        if proc.returncode != 2 or want not in proc.stdout:
            failures.append("%s: exit %d, want 2 and %r: %s"
                            % (" ".join(bad), proc.returncode, want, proc.stdout[-300:]))

    if failures:
        for f in failures:
            print("FAIL:", f)
        sys.exit(1)
    print("replay_decode_test: OK")


if __name__ == "__main__":
    main()
