#!/usr/bin/env python3
"""`kvtier replay --tp 2` on the cpu device: two processes serve the requests as one TP group (one
cache decision, each rank its heads' pools; MLA: the full latent) over a file store of per-head
objects; the hit rates equal TP=1's on the same requests, device, host and storage are all hit,
every rank's bytes were checked (exit 0), decisions went through the ring and the leader waited
once per record (no collective), and the report has the leader's decision time and each rank's
loads (the same copies on every rank at both sizes, each rank's bytes) and load bandwidth. Then
a rank is killed (SIGKILL) mid-replay, once the leader has said every rank attached: rank 0 stops
with an error naming the dead rank (no wall-clock bound: the ctest timeout catches a hang). And
rank 0 killed (SIGKILL) once its ring exists and again once the ranks attached: rank 1 dies with
it, and nothing of the run stays (no segment in /dev/shm, no file store in TMPDIR). And the
cache's flags (--admission-policy, --eviction) reach the leader cache of both passes.

Usage: replay_tp_test.py KVTIER
"""
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from child_process import die_with_parent

_libc = ctypes.CDLL(None, use_errno=True)


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


ATTACHED = re.compile(r"kvtier replay --tp: (.*) attached; serving at TP=")


def kill_a_rank(kvtier):
    """Starts a long replay --tp 2, SIGKILLs rank 1 once the leader says every rank attached, and
    returns a failure text or None. No timing: the leader's line is the signal, and rank 0 must
    name the dead rank (not time out) whenever it notices."""
    cmd = [kvtier, "replay", "--tp", "2", "--tp-timeout", "5", "--model", "qwen2.5-0.5b",
           "--device", "cpu", "--workload", "chat", "--requests", "1000", "--page-size", "16",
           "--device-tokens", "2048", "--host-tokens", "16384", "--storage", "none",
           "--no-progress"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=die_with_parent())
    err = ""
    rank = None
    try:
        # Bounded by the ctest timeout; the TP=1 pass comes first.
        for line in p.stderr:
            err += line
            m = ATTACHED.search(line)
            if m:
                pids = re.findall(r"rank 1 \(pid (\d+)\)", m.group(1))
                rank = int(pids[0]) if pids else None
                break
        if rank is None:
            p.wait(timeout=60)
            return "the leader never said rank 1 attached (exit %s): %s" % (p.returncode,
                                                                            err.strip()[-300:])
        os.kill(rank, 9)  # it serves 1,000 requests: still serving when killed
        _, rest = p.communicate(timeout=240)
        err += rest or ""
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if p.returncode != 1:
        return "exit %d after the kill, expected 1" % p.returncode
    if "rank 1 (pid %d) died" % rank not in err:
        return "the error does not name the dead rank: %s" % err.strip()[-300:]
    return None


def gone(pid):
    """Whether `pid` has exited (a zombie counts: it runs no more)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


PR_SET_CHILD_SUBREAPER = 36


def subreaper(on):
    """Makes this process the reaper of its orphaned descendants (a killed leader's ranks and its
    janitor), so that it can wait for every one of them to exit."""
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_all(seconds):
    """Reaps every child (with subreaper(True): every orphaned descendant too) until none is
    left. The bound is a hang guard, not a timing check. Returns the pids still running then."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return []
        if pid == 0:
            if time.monotonic() > deadline:
                return sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and
                              _parent(int(p)) == os.getpid())
            time.sleep(0.05)


def _parent(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


CREATED = re.compile(r"kvtier replay --tp: group '(.*)' created")


def kill_the_leader(kvtier, at):
    """SIGKILLs rank 0 once it says `at` ("created": the ring exists and the ranks are starting;
    "attached": every rank attached, TP=2 serving): rank 1 must die with it (PR_SET_PDEATHSIG),
    not serve on as an orphan, and nothing of the run may stay: no segment of its group in
    /dev/shm, nothing in its TMPDIR (the passes' file stores). Every descendant is waited for
    (this process reaps the orphans), bounded by a hang guard. Returns a failure text or None."""
    # The TP=1 pass comes first; at "attached" the TP=2 pass of 300 requests has seconds to go
    # when the kill lands (the test reacts to the line at once).
    requests = "300" if at == "attached" else "100"
    cmd = [kvtier, "replay", "--tp", "2", "--model", "qwen2.5-0.5b", "--device", "cpu",
           "--workload", "chat", "--requests", requests, "--page-size", "16",
           "--device-tokens", "2048", "--host-tokens", "16384", "--storage", "file",
           "--no-progress"]
    signal_line = CREATED if at == "created" else ATTACHED
    with tempfile.TemporaryDirectory() as tmpdir:
        subreaper(True)
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True, preexec_fn=die_with_parent(),
                                 env=dict(os.environ, TMPDIR=tmpdir))
            group = None
            rank = None
            err = ""
            try:
                for line in p.stderr:
                    err += line
                    m = CREATED.search(line)
                    if m:
                        group = m.group(1)
                    m = ATTACHED.search(line)
                    if m:
                        pids = re.findall(r"rank 1 \(pid (\d+)\)", m.group(1))
                        rank = int(pids[0]) if pids else None
                    if signal_line.search(line):
                        break
                else:
                    return "the leader never said '%s': %s" % (at, err.strip()[-300:])
                leader = p.pid
                p.kill()
                p.wait()
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                p.stderr.close()
            left = reap_all(120)
            if left:
                for pid in left:
                    os.kill(pid, 9)
                reap_all(30)
                return "killed at '%s': processes outlived the leader: %s" % (at, left)
        finally:
            subreaper(False)
        if rank is not None and not gone(rank):
            return "rank 1 (pid %d) outlived the killed leader" % rank
        own = "replay-tp.%d" % leader  # the run's group (the leader's pid names it)
        shm = [f for f in os.listdir("/dev/shm") if own in f]
        stores = os.listdir(tmpdir)
        if shm or stores:
            return "killed at '%s': /dev/shm holds %s, TMPDIR holds %s" % (at, shm, stores)
        if group != own:
            return "killed at '%s': the group is %r, not %s" % (at, group, own)
    return None


def cache_flags_reach_tp(kvtier, tmp):
    """The cache's flags reach the TP passes' leader cache through ReplayOptions::cache, none named
    by the TP code: a TP replay with --admission-policy all and --eviction fifo reports them in
    both passes' cache_config and in its leader line. A failure text or None."""
    out = os.path.join(tmp, "flags.json")
    cmd = [kvtier, "replay", "--tp", "2", "--model", "qwen2.5-0.5b", "--device", "cpu",
           "--workload", "chat", "--requests", "12", "--page-size", "16",
           "--device-tokens", "2048", "--host-tokens", "4096", "--storage", "file",
           "--admission-policy", "all", "--eviction", "fifo", "--no-progress", "--json", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return "exit %d\n%s%s" % (p.returncode, p.stdout, p.stderr)
    with open(out) as f:
        report = json.load(f)
    want = {"admission_policy": "all", "device_eviction": "fifo", "host_eviction": "fifo",
            "page_size": "16", "write_policy": "write_through"}
    for pass_ in report["passes"]:
        got = {k: pass_["cache_config"].get(k) for k in want}
        if got != want:
            return "TP=%d's leader cache has %s, the flags asked for %s" % (pass_["tp"], got, want)
    line = [l for l in p.stdout.splitlines() if l.startswith("leader cache at TP=2")]
    if not line or "admission_policy all" not in line[0]:
        return "no leader line naming admission_policy all: %s" % line
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
        err = cache_flags_reach_tp(kvtier, tmp)
        if err:
            failures.append("cache flags with --tp: " + err)
    err = kill_a_rank(kvtier)
    if err:
        failures.append("rank killed: " + err)
    for at in ("created", "attached"):
        err = kill_the_leader(kvtier, at)
        if err:
            failures.append("leader killed: " + err)
    for f in failures:
        print("FAIL:", f)
    print("replay --tp: %s" % ("FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
