#!/usr/bin/env python3
"""`kvtier replay --tp 2` on the cpu device: two processes serve the requests as one TP group (one
cache decision, each rank its heads' pools; MLA: the full latent); the hit rates equal TP=1's on
the same requests, both tiers are hit, every rank's bytes were checked (exit 0), decisions went
through the ring and the leader waited once per record (no collective).

Usage: replay_tp_test.py KVTIER
"""
import json
import os
import subprocess
import sys
import tempfile


def run(kvtier, model, tmp):
    out = os.path.join(tmp, model + ".json")
    cmd = [kvtier, "replay", "--tp", "2", "--model", model, "--device", "cpu",
           "--workload", "chat", "--requests", "60", "--warmup", "10", "--page-size", "16",
           "--device-tokens", "2048", "--host-tokens", "16384", "--storage", "none",
           "--no-progress", "--json", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return None, "%s: exit %d\n%s%s" % (model, p.returncode, p.stdout, p.stderr)
    with open(out) as f:
        return json.load(f), None


def main():
    kvtier = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("qwen2.5-0.5b", "deepseek-v2-lite"):
            report, err = run(kvtier, model, tmp)
            if err:
                failures.append(err)
                continue
            tp1, tp2 = report["passes"]
            if not report["hit_rates_equal"]:
                failures.append("%s: hit rates differ" % model)
            for key in ("device_hit_tokens", "host_hit_tokens", "loaded_tokens"):
                if tp1[key] != tp2[key]:
                    failures.append("%s: %s %d at TP=1, %d at TP=2" % (model, key, tp1[key],
                                                                       tp2[key]))
            if tp2["host_hit_tokens"] <= 0 or tp2["device_hit_tokens"] <= 0:
                failures.append("%s: the workload did not reach both tiers" % model)
            if tp2["decision_records"] <= tp2["requests"]:
                failures.append("%s: %d decision records for %d requests" %
                                (model, tp2["decision_records"], tp2["requests"]))
            # The leader waits once per step and once per copy, never more (point to point).
            if tp2["leader_waits"] != tp2["decision_records"]:
                failures.append("%s: %d leader waits for %d records" %
                                (model, tp2["leader_waits"], tp2["decision_records"]))
            if tp2["bytes_checked_rank0"] <= 0:
                failures.append("%s: no bytes checked" % model)
    for f in failures:
        print("FAIL:", f)
    print("replay --tp: %s" % ("FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
