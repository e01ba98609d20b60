#!/usr/bin/env python3
"""`kvtier replay --tp 2` on the cpu device: two processes serve the requests as one TP group (one
cache decision, each rank its heads' pools; MLA: the full latent) over a file store of per-head
objects; the hit rates equal TP=1's on the same requests, device, host and storage are all hit,
every rank's bytes were checked (exit 0), decisions went through the ring and the leader waited
once per record (no collective), and the report has the leader's decision time and each rank's
loads (the same copies on every rank at both sizes, each rank's bytes) and load bandwidth. Then
a rank is killed (SIGKILL) mid-replay: rank 0 stops with an error naming the dead rank, within
the timeout.

Usage: replay_tp_test.py KVTIER
"""
import json
import os
import subprocess
import sys
import tempfile
import time


def run(kvtier, model, tmp):
    out = os.path.join(tmp, model + ".json")
    cmd = [kvtier, "replay", "--tp", "2", "--model", model, "--device", "cpu",
           "--workload", "chat", "--requests", "60", "--warmup", "10", "--page-size", "16",
           "--device-tokens", "2048", "--host-tokens", "4096", "--storage", "file",
           "--tp-equal-bytes", "--no-progress", "--json", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return None, "%s: exit %d\n%s%s" % (model, p.returncode, p.stdout, p.stderr)
    with open(out) as f:
        return json.load(f), None


def children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in "ZX":
            out.append(int(entry))
    return out


def kill_a_rank(kvtier):
    """Starts a long replay --tp 2, SIGKILLs rank 1 once it serves, and returns a failure text or
    None."""
    cmd = [kvtier, "replay", "--tp", "2", "--tp-timeout", "5", "--model", "qwen2.5-0.5b",
           "--device", "cpu", "--workload", "chat", "--requests", "1000", "--page-size", "16",
           "--device-tokens", "2048", "--host-tokens", "16384", "--storage", "none",
           "--no-progress"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        rank = []
        while not rank and time.time() < deadline and p.poll() is None:
            time.sleep(0.05)
            rank = children(p.pid)  # rank 1 exists once the TP=1 pass is over
        if not rank:
            return "no rank 1 process appeared"
        time.sleep(0.3)  # it attaches, then serves (1,000 requests: still serving when killed)
        os.kill(rank[0], 9)
        killed = time.time()
        _, err = p.communicate(timeout=60)
        waited = time.time() - killed
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if p.returncode != 1:
        return "exit %d after the kill, expected 1" % p.returncode
    if "rank 1 (pid %d) died" % rank[0] not in err:
        return "the error does not name the dead rank: %s" % err.strip()[-300:]
    if waited > 5 + 2:
        return "rank 0 stopped %.1f s after the kill (timeout 5 s)" % waited
    return None


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
            for key in ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens",
                        "loaded_tokens"):
                if tp1[key] != tp2[key]:
                    failures.append("%s: %s %d at TP=1, %d at TP=2" % (model, key, tp1[key],
                                                                       tp2[key]))
            for tier in ("device", "host", "storage"):
                if tp2[tier + "_hit_tokens"] <= 0:
                    failures.append("%s: no %s hits" % (model, tier))
            for p in (tp1, tp2):
                trouble = {k: p[k] for k in ("storage_errors", "storage_read_timeouts",
                                             "storage_write_timeouts",
                                             "storage_queue_drops", "prefetch_partial",
                                             "prefetch_timed_out") if p[k]}
                if trouble:
                    failures.append("%s: TP=%d storage trouble: %s" % (model, p["tp"], trouble))
                if p["collectives"] != 0 or not p["decision_ms_p50"] > 0 or \
                        not p["decision_cpu_ms_p50"] > 0:
                    failures.append("%s: TP=%d decision time or collectives missing: %s" %
                                    (model, p["tp"], p))
            if len(tp2["load_gbps_per_rank"]) != 2 or min(tp2["load_gbps_per_rank"]) <= 0 or \
                    tp1["load_gbps_per_rank"][0] <= 0:
                failures.append("%s: load bandwidth per rank missing: %s / %s" %
                                (model, tp1["load_gbps_per_rank"], tp2["load_gbps_per_rank"]))
            # The same loads on every rank at both sizes (the measured requests' only): each
            # rank moved its heads' bytes (MHA: half of TP=1's at TP=2; MLA: the whole latent).
            share = 1 if model == "deepseek-v2-lite" else 2
            if tp2["loads_per_rank"] != [tp1["loads_per_rank"][0]] * 2 or \
                    tp1["loads_per_rank"][0] <= 0:
                failures.append("%s: loads per rank %s at TP=1, %s at TP=2" %
                                (model, tp1["loads_per_rank"], tp2["loads_per_rank"]))
            if tp2["load_bytes_per_rank"] != [tp1["load_bytes_per_rank"][0] // share] * 2 or \
                    tp1["load_bytes_per_rank"][0] % share:
                failures.append("%s: load bytes per rank %s at TP=1, %s at TP=2" %
                                (model, tp1["load_bytes_per_rank"], tp2["load_bytes_per_rank"]))
            if len(report["load_gbps_vs_tp1_per_rank"]) != 2:
                failures.append("%s: no load bandwidth ratio per rank" % model)
            # --tp-equal-bytes (MHA): TP=1 at one rank's share of the heads, the same hits and
            # copies, each the size of a TP=2 rank's.
            shard = report["tp1_shard_pass"]
            if share == 2:
                if not shard or len(report["load_gbps_vs_tp1_shard_per_rank"]) != 2:
                    failures.append("%s: no equal-bytes baseline pass" % model)
                else:
                    for key in ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens",
                                "loaded_tokens", "loads_per_rank"):
                        if shard[key] != tp1[key]:
                            failures.append("%s: %s %s at TP=1, %s at 1/2 of the heads" %
                                            (model, key, tp1[key], shard[key]))
                    if shard["load_bytes_per_rank"] != tp2["load_bytes_per_rank"][:1]:
                        failures.append("%s: %s bytes at 1/2 of the heads, %s per TP=2 rank" %
                                        (model, shard["load_bytes_per_rank"],
                                         tp2["load_bytes_per_rank"]))
            elif shard is not None:  # MLA: every rank's copies are TP=1's already
                failures.append("%s: an equal-bytes pass for MLA" % model)
            # Each rank against TP=1 on its own device at its bytes per copy (the cpu device: one
            # pass for both ranks; MLA: the TP=1 pass itself), aggregate and median per copy.
            own = report["own_gpu_passes"]
            if len(own) != 2 or len(report["load_gbps_vs_own_gpu_per_rank"]) != 2 or \
                    min(report["load_gbps_vs_own_gpu_per_rank"] +
                        report["load_gbps_median_vs_own_gpu_per_rank"]) <= 0:
                failures.append("%s: no per-rank baseline on its own device: %s" %
                                (model, {k: report[k] for k in (
                                    "load_gbps_vs_own_gpu_per_rank",
                                    "load_gbps_median_vs_own_gpu_per_rank")}))
            else:
                for b in own:
                    for key in ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens",
                                "loaded_tokens", "loads_per_rank"):
                        if b[key] != tp1[key]:
                            failures.append("%s: %s %s at TP=1, %s in rank %d's baseline" %
                                            (model, key, tp1[key], b[key], b["rank"]))
                    if b["load_bytes_per_rank"] != tp2["load_bytes_per_rank"][:1]:
                        failures.append("%s: rank %d's baseline moved %s bytes, a rank %s" %
                                        (model, b["rank"], b["load_bytes_per_rank"],
                                         tp2["load_bytes_per_rank"]))
            if len(tp2["load_gbps_median_per_rank"]) != 2 or \
                    min(tp2["load_gbps_median_per_rank"]) <= 0 or \
                    len(tp2["placement"]) != 2 or tp2["placement"][0]["gpu"] != -1:
                failures.append("%s: per-copy median or placement missing: %s / %s" %
                                (model, tp2["load_gbps_median_per_rank"], tp2["placement"]))
            # The decision CPU split by call adds up to its mean (the same measurement).
            split = sum(tp2["decision_cpu_ms_mean_by_call"].values())
            if abs(split - tp2["decision_cpu_ms_mean"]) > 1e-6 + 1e-6 * split:
                failures.append("%s: decision CPU by call %.6f vs mean %.6f" %
                                (model, split, tp2["decision_cpu_ms_mean"]))
            if tp2["decision_records"] <= tp2["requests"]:
                failures.append("%s: %d decision records for %d requests" %
                                (model, tp2["decision_records"], tp2["requests"]))
            # The leader waits (point to point) for each step and each storage decision, not for
            # its copies (TpGroupConfig::ack_each_copy is off): at least one wait per request,
            # fewer waits than records.
            if not tp2["requests"] <= tp2["leader_waits"] < tp2["decision_records"]:
                failures.append("%s: %d leader waits for %d records and %d requests" %
                                (model, tp2["leader_waits"], tp2["decision_records"],
                                 tp2["requests"]))
            if tp2["bytes_checked_rank0"] <= 0:
                failures.append("%s: no bytes checked" % model)
    err = kill_a_rank(kvtier)
    if err:
        failures.append("rank killed: " + err)
    for f in failures:
        print("FAIL:", f)
    print("replay --tp: %s" % ("FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
