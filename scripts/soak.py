#!/usr/bin/env python3
"""kvtier soak: long-running caches under storage faults, with bounded resources and exact bytes.

  scripts/soak.py --minutes 3 --cli build-release/tools/kvtier   (PYTHONPATH: the built package)
  scripts/soak.py ... --device gpu --io-backend kernel             (scripts/soak_gpu.sh)

Four worker processes run kvtier.HierarchicalCache in a loop of match -> query_storage ->
prefetch -> load_back -> check every loaded byte -> allocate -> write -> insert, over 300 prompts
of 1-12 pages drawn with a skew (so pages move through device, host and storage and come back).
--device cpu (the default, CI's): the cpu backend over a host-memory "device" pool (numpy).
--device gpu: a device pool on CUDA device 0 (torch uint8 tensors) copied by --io-backend (kernel,
dma or auto): loads, backups and prefetches between the GPU, pinned host memory, the shared
segment (registered with CUDA) and storage; the loaded slots are read back from the GPU with torch
(after the load on the same stream) and compared with the expected bytes, new KV is written into
the GPU pool with torch before insert (which orders its backups after that write).

  redis    storage redis:// on a redis-server of the soak's own; the server is SIGKILLed and
           restarted (empty) every 20 s, and SIGSTOPped for 3 s (a slow store) every 25 s;
  file     storage file:// (capacity 8 MiB); every 10 s stored page files are corrupted (bytes
           flipped), and every 30 s the worker's RLIMIT_FSIZE drops to 1 KiB for 5 s (every page
           write fails as on a full disk, SIGXFSZ ignored), then comes back;
  shared-a a host tier shared through a segment (`kvtier shm create`), long-lived;
  shared-b the same segment; SIGKILLed and restarted every 15 s.

Every 2 s the driver samples, per long-lived worker, RSS, open fds and threads, and globally
the soak's segments in /dev/shm and the stores' bytes. It fails (exit 1) when a worker reports a
wrong byte, a request that took longer than --stall-seconds, or an error it did not expect; when a
long-lived worker dies; when RSS grows without bound (the least-squares slope over the second half
of the run, times that half's length, above max(16 MiB, 25 % of the median)); when the median of
fds or threads over the second half exceeds the first half's maximum by more than 4; when
segments are left or the file store outgrows its capacity. It prints the figures (requests, faults of each kind survived,
wrong bytes, RSS start/end) and writes them as JSON with --json.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

L, S, P = 2, 64, 4      # layers, slot bytes, page size of every worker
DEVICE_SLOTS = 64       # the worker's "device" pool, in tokens: most prompts do not stay
PROMPTS = 300
STALL_SECONDS_DEFAULT = 10.0
READY_SECONDS = 120     # how long the driver waits for the workers' first requests


# ---- the worker --------------------------------------------------------------------------------

def token_ids(prompt, length):
    import numpy as np
    j = np.arange(length, dtype=np.int64)
    return ((prompt * 1000003 + j * 7919 + 17) % 2_000_000_000).astype(np.int32)


def pattern(prompt, first, count):
    """The KV bytes of tokens [first, first + count) of `prompt`: [2 (k, v), L, count, S]."""
    import numpy as np
    j = np.arange(first, first + count, dtype=np.int64)[None, None, :, None]
    kv = np.arange(2, dtype=np.int64)[:, None, None, None]
    layer = np.arange(L, dtype=np.int64)[None, :, None, None]
    b = np.arange(S, dtype=np.int64)[None, None, None, :]
    return ((prompt * 131 + j * 17 + layer * 7 + kv * 3 + b * 5) % 256).astype(np.uint8)


class HostPool:
    """The worker's "device" pool in host memory (--device cpu): numpy, slot lists numpy."""

    def __init__(self):
        import numpy as np
        self.np = np
        self.k = np.zeros((L, DEVICE_SLOTS, S), np.uint8)
        self.v = np.zeros((L, DEVICE_SLOTS, S), np.uint8)

    def slots(self, obj):
        return self.np.asarray(obj, dtype=self.np.int64)

    def concat(self, a, b):
        return self.np.concatenate([a, b])

    def read(self, slots):
        """[2 (k, v), L, len(slots), S] bytes of the slots."""
        return self.np.stack([self.k[:, slots], self.v[:, slots]])

    def write(self, slots, kv):
        self.k[:, slots], self.v[:, slots] = kv[0], kv[1]

    def flip(self, slot):
        self.k[0, slot, 0] ^= 1


class GpuPool(HostPool):
    """A device pool on CUDA device 0 (--device gpu): torch uint8 tensors; slot lists are the
    cache's CUDA int64 tensors. Reads and writes run on the current stream, where the cache's
    loads are enqueued and after which insert orders its backups; read() waits for them."""

    def __init__(self):
        import torch
        self.torch = torch
        self.dev = torch.device("cuda", 0)
        self.k = torch.zeros((L, DEVICE_SLOTS, S), dtype=torch.uint8, device=self.dev)
        self.v = torch.zeros_like(self.k)

    def slots(self, obj):
        return obj.to(self.dev, self.torch.int64)

    def concat(self, a, b):
        return self.torch.cat([a, b])

    def read(self, slots):
        return self.torch.stack([self.k[:, slots], self.v[:, slots]]).cpu().numpy()

    def write(self, slots, kv):
        kv = self.torch.from_numpy(kv).to(self.dev)
        self.k[:, slots] = kv[0]
        self.v[:, slots] = kv[1]

    def flip(self, slot):
        self.k[0, slot, 0] ^= 1


def run_worker(args):
    import numpy as np

    import kvtier
    from kvtier import ops

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails (EFBIG)
    pool = GpuPool() if args.device == "gpu" else HostPool()
    region = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=S, page_size=P,
                          k=pool.k, v=pool.v, name="device_pool")
    config = dict(write_policy="write_through", prefetch_threshold_tokens=0)
    if args.device == "gpu":
        config["transfer_backend"] = args.io_backend
    if args.segment:
        cache = kvtier.HierarchicalCache(region, shared_host=args.segment, **config)
    else:
        cache = kvtier.HierarchicalCache(region, storage=args.storage, storage_model_id="soak",
                                         host_capacity_bytes=32 * P * L * S * 2,
                                         storage_timeout_ms=1000, **config)
    rng = random.Random(args.seed)
    weights = [1.0 / (i + 1) for i in range(PROMPTS)]
    counts = dict(requests=0, tokens_checked=0, wrong_bytes=0, stalls=0, errors=0,
                  max_request_s=0.0, hit_tokens=0)
    last_error = ""
    leak = []  # --inject (the soak's self-check): memory this worker keeps for ever
    injected = False
    end = time.monotonic() + args.seconds
    report_at = time.monotonic() + 1.0

    def report():
        counts["last_error"] = last_error
        try:
            stats = cache.stats()
            for key in ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens",
                        "prefetched_tokens", "shared_host_hit_tokens", "storage_errors",
                        "storage_read_timeouts", "storage_write_timeouts"):
                if key in stats:
                    counts[key] = stats[key]
        except Exception:  # noqa: BLE001 (a closed cache: the last figures stay)
            pass
        tmp = args.report + ".tmp"
        with open(tmp, "w") as f:
            json.dump(counts, f)
        os.replace(tmp, args.report)

    while time.monotonic() < end:
        prompt = rng.choices(range(PROMPTS), weights)[0]
        length = P * (1 + prompt % 12)
        tokens = token_ids(prompt, length)
        t0 = time.monotonic()
        try:
            with cache.match(tokens) as m:
                if cache.has_storage and m.device_tokens + m.host_tokens < length:
                    cache.query_storage(m)
                    if m.storage_tokens > 0:
                        cache.prefetch(m, "wait_complete")
                        cache.finish_prefetch(m)
                loaded = cache.load_back(m)
                slots = pool.slots(loaded.device_slots)
                n = len(slots)
                if args.inject == "wrong-byte" and n and counts["requests"] >= 500 and \
                        not injected:
                    pool.flip(slots[0])  # the self-check's wrong byte (the first hit from 500 on)
                    injected = True
                if args.inject == "leak":
                    leak.append(bytearray(64 << 10))  # about 1 MiB per 16 requests
                if n:
                    want = pattern(prompt, 0, n)
                    got = pool.read(slots)
                    wrong = int(np.count_nonzero(got != want))
                    counts["wrong_bytes"] += wrong
                    counts["tokens_checked"] += n
                    counts["hit_tokens"] += n
                    if wrong:
                        last_error = "prompt %d: %d wrong bytes in %d loaded tokens" % (
                            prompt, wrong, n)
                if n < length:
                    new = pool.slots(cache.allocate_device_slots(length - n))[:length - n]
                    pool.write(new, pattern(prompt, n, length - n))
                    cache.insert(tokens, pool.concat(slots, new))
        except MemoryError as e:  # every device page pinned at once: a refusal, not a failure
            last_error = "MemoryError: %s" % e
        except Exception as e:  # noqa: BLE001 (counted and reported; the driver judges)
            counts["errors"] += 1
            last_error = "%s: %s" % (type(e).__name__, e)
        took = time.monotonic() - t0
        counts["requests"] += 1
        counts["max_request_s"] = max(counts["max_request_s"], took)
        if took > args.stall_seconds:
            counts["stalls"] += 1
            last_error = "a request took %.1f s" % took
        if time.monotonic() >= report_at:
            report()
            report_at = time.monotonic() + 1.0
    report()
    cache.close()
    return 0


# ---- the driver --------------------------------------------------------------------------------

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, tmp):
        self.port = free_port()
        self.dir = tmp
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--maxmemory", "32mb",
             "--maxmemory-policy", "allkeys-lru"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not listen within 10 s")

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def used_bytes(self):
        try:
            out = subprocess.run(["redis-cli", "-p", str(self.port), "INFO", "memory"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                 timeout=2).stdout
        except (OSError, subprocess.TimeoutExpired):
            return -1
        for line in out.splitlines():
            if line.startswith("used_memory:"):
                return int(line.split(":")[1])
        return -1


def proc_stats(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            status = f.read()
        rss = threads = 0
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
        fds = len(os.listdir("/proc/%d/fd" % pid))
        return {"rss": rss, "fds": fds, "threads": threads}
    except OSError:
        return None


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def slope(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den


def corrupt_pages(store, rng):
    """Flips one byte in up to 5 random page files of the store; returns how many."""
    files = []
    for root, _, names in os.walk(store):
        files += [os.path.join(root, n) for n in names if not n.startswith(".")]
    done = 0
    for path in rng.sample(files, min(5, len(files))):
        try:
            with open(path, "r+b") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    continue
                at = rng.randrange(size)
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([byte[0] ^ 0x5A]))
            done += 1
        except OSError:
            pass
    return done


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--cli", default=os.environ.get("KVTIER_CLI", "build-release/tools/kvtier"))
    ap.add_argument("--stall-seconds", type=float, default=STALL_SECONDS_DEFAULT)
    ap.add_argument("--sample-seconds", type=float, default=2.0)
    ap.add_argument("--json", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--storage", default="", help=argparse.SUPPRESS)
    ap.add_argument("--segment", default="", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--report", default="", help=argparse.SUPPRESS)
    ap.add_argument("--inject", default="", choices=("", "leak", "wrong-byte"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                    help="the workers' device pool: host memory on the cpu backend (default), or "
                         "CUDA device 0 (torch) copied by --io-backend")
    ap.add_argument("--io-backend", choices=("kernel", "dma", "auto"), default="kernel",
                    help="the transfer backend of --device gpu")
    ap.add_argument("--self-check", action="store_true",
                    help="make shared-a leak memory and the file worker load a wrong byte: the "
                         "soak must then fail on both (a check of the soak itself)")
    args = ap.parse_args()
    if args.worker:
        return run_worker(args)

    for tool in ("redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            print("soak: %s is not installed (Debian: redis-server, redis-tools)" % tool)
            return 1
    if not os.path.exists(args.cli):
        print("soak: no kvtier CLI at %s (--cli)" % args.cli)
        return 1
    if args.device == "gpu":
        probe = subprocess.run(
            [sys.executable, "-c", "import torch, kvtier; import sys; sys.exit(0 if "
             "torch.cuda.is_available() and kvtier.built_with_cuda() and "
             "kvtier.cuda_device_count() > 0 else 3)"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if probe.returncode != 0:
            print("soak: --device gpu needs torch with CUDA and kvtier built with CUDA for %s "
                  "(PYTHONPATH), and a GPU: %s" % (sys.executable, probe.stdout.strip()[-300:]
                                                   or "no GPU seen"))
            return 1
    seconds = args.minutes * 60
    tmp = tempfile.mkdtemp(prefix="kvtier-soak-")
    segment = "kvtier-soak-%d" % os.getpid()
    # The soak's own segments (other programs on the machine make theirs meanwhile).
    def own_segments():
        return set(n for n in os.listdir("/dev/shm") if n.startswith("kvtier.") and segment in n)
    rng = random.Random(7)
    redis = Redis(tmp)
    workers = {}
    failures = []
    faults = {"redis_killed": 0, "redis_paused": 0, "pages_corrupted": 0, "disk_full": 0,
              "shared_killed": 0}
    samples = []
    file_store = os.path.join(tmp, "store")
    file_capacity = 8 << 20
    os.makedirs(file_store)
    me = os.path.abspath(__file__)

    def spawn(name, extra, seed, run_seconds):
        report = os.path.join(tmp, name + ".json")
        cmd = [sys.executable, me, "--worker", "--seconds", str(run_seconds), "--seed", str(seed),
               "--report", report, "--stall-seconds", str(args.stall_seconds),
               "--device", args.device, "--io-backend", args.io_backend] + extra
        log = open(os.path.join(tmp, name + ".log"), "ab")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        workers[name] = {"proc": proc, "report": report, "restarts": 0, "totals": {}}

    def read_report(name):
        try:
            with open(workers[name]["report"]) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def add_totals(name):  # a killed worker's last report joins the totals
        r = read_report(name)
        t = workers[name]["totals"]
        for key in ("requests", "tokens_checked", "wrong_bytes", "stalls", "errors"):
            t[key] = t.get(key, 0) + r.get(key, 0)

    try:
        redis.start()
        subprocess.run([args.cli, "shm", "create", segment, "--layers", str(L), "--slot-bytes",
                        str(S), "--page-size", str(P), "--pages", "128"], check=True,
                       stdout=subprocess.DEVNULL)
        # The workers run past the end; the driver stops them (SIGTERM) after the last sample.
        run_for = seconds + 30 + READY_SECONDS
        spawn("redis", ["--storage", "redis://127.0.0.1:%d?timeout_ms=500&connect_timeout_ms=300"
                        % redis.port], 1, run_for)
        spawn("file", ["--storage", "file://%s?capacity=%d" % (file_store, file_capacity)] +
              (["--inject", "wrong-byte"] if args.self_check else []), 2, run_for)
        spawn("shared-a", ["--segment", segment] +
              (["--inject", "leak"] if args.self_check else []), 3, run_for)
        spawn("shared-b", ["--segment", segment], 4, run_for)
        # The clock starts once every sampled worker serves requests (its first report): the
        # threads and memory of start-up (importing torch, a CUDA context) are not growth.
        ready_by = time.monotonic() + READY_SECONDS
        while not all(os.path.exists(workers[n]["report"]) for n in ("redis", "file", "shared-a")):
            dead = [n for n in ("redis", "file", "shared-a")
                    if workers[n]["proc"].poll() is not None]
            if dead or time.monotonic() > ready_by:
                print("soak: FAILED: workers %s did not start serving within %d s (logs in %s)"
                      % (dead or [n for n in ("redis", "file", "shared-a")
                                  if not os.path.exists(workers[n]["report"])],
                         READY_SECONDS, tmp), flush=True)
                raise SystemExit(1)  # (the finally below stops everything it started)
            time.sleep(0.1)
        start = time.monotonic()
        next_at = {"redis_kill": 20, "redis_pause": 25, "corrupt": 10, "fsize": 30,
                   "shared_kill": 15, "sample": 0}
        fsize_until = None
        print("soak: %.1f min, workers redis/file/shared-a/shared-b, device %s%s, scratch %s" %
              (args.minutes, args.device,
               " (%s backend)" % args.io_backend if args.device == "gpu" else " (cpu backend)",
               tmp), flush=True)
        while True:
            now = time.monotonic() - start
            if now >= seconds:
                break
            for name in ("redis", "file", "shared-a"):
                rc = workers[name]["proc"].poll()
                if rc is not None:
                    failures.append("worker %s died (exit %s) at %.0f s" % (name, rc, now))
            if failures:
                break
            if now >= next_at["redis_kill"]:
                redis.kill()
                time.sleep(1.0)
                redis.start()
                faults["redis_killed"] += 1
                next_at["redis_kill"] += 20
            if now >= next_at["redis_pause"] and redis.proc is not None:
                redis.proc.send_signal(signal.SIGSTOP)
                time.sleep(3.0)
                redis.proc.send_signal(signal.SIGCONT)
                faults["redis_paused"] += 1
                next_at["redis_pause"] += 25
            if now >= next_at["corrupt"]:
                faults["pages_corrupted"] += corrupt_pages(file_store, rng)
                next_at["corrupt"] += 10
            if fsize_until is None and now >= next_at["fsize"]:
                import resource
                resource.prlimit(workers["file"]["proc"].pid, resource.RLIMIT_FSIZE, (1024, -1))
                fsize_until = now + 5
                faults["disk_full"] += 1
                next_at["fsize"] += 30
            if fsize_until is not None and now >= fsize_until:
                import resource
                resource.prlimit(workers["file"]["proc"].pid, resource.RLIMIT_FSIZE,
                                 (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
                fsize_until = None
            if now >= next_at["shared_kill"]:
                b = workers["shared-b"]
                b["proc"].send_signal(signal.SIGKILL)
                b["proc"].wait()
                add_totals("shared-b")
                restarts = b["restarts"] + 1
                totals = b["totals"]
                try:
                    os.remove(b["report"])
                except OSError:
                    pass
                spawn("shared-b", ["--segment", segment], 4 + restarts, run_for)
                workers["shared-b"]["restarts"], workers["shared-b"]["totals"] = restarts, totals
                faults["shared_killed"] += 1
                next_at["shared_kill"] += 15
            if now >= next_at["sample"]:
                sample = {"t": now, "shm": len(own_segments()),
                          "file_store_bytes": dir_bytes(file_store),
                          "redis_bytes": redis.used_bytes()}
                for name in ("redis", "file", "shared-a"):
                    sample[name] = proc_stats(workers[name]["proc"].pid)
                samples.append(sample)
                next_at["sample"] += args.sample_seconds
            time.sleep(0.1)
    finally:
        results = {}
        for name, w in workers.items():
            if w["proc"].poll() is None:
                w["proc"].send_signal(signal.SIGTERM)
        for name, w in workers.items():
            try:
                w["proc"].wait(timeout=20)
            except subprocess.TimeoutExpired:
                w["proc"].kill()
                w["proc"].wait()
                failures.append("worker %s did not stop within 20 s of SIGTERM" % name)
            add_totals(name)
            last = read_report(name)
            # The cache's own counters of the last run (a killed worker's restarted one).
            hits = {k: v for k, v in last.items() if k.endswith("_tokens") or
                    k in ("storage_errors", "storage_read_timeouts", "storage_write_timeouts")}
            results[name] = dict(w["totals"], restarts=w["restarts"],
                                 last_error=last.get("last_error", ""),
                                 max_request_s=last.get("max_request_s", 0), cache=hits)
        redis.kill()
        subprocess.run([args.cli, "shm", "destroy", segment], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        shm_left = own_segments()

    # ---- judge -------------------------------------------------------------------------------
    for name, r in results.items():
        if r.get("wrong_bytes", 0):
            failures.append("%s: %d wrong bytes (%s)" % (name, r["wrong_bytes"], r["last_error"]))
        if r.get("stalls", 0):
            failures.append("%s: %d requests past %.0f s (%s)" % (
                name, r["stalls"], args.stall_seconds, r["last_error"]))
        if r.get("requests", 0) == 0:
            failures.append("%s: no request served" % name)
        if name.startswith("shared") and r.get("errors", 0):
            failures.append("%s: %d errors (%s)" % (name, r["errors"], r["last_error"]))
    half = [s for s in samples if s["t"] >= seconds / 2]
    first = [s for s in samples if s["t"] < seconds / 2]
    growth = {}
    if len(half) >= 5 and first:
        for name in ("redis", "file", "shared-a"):
            pts = [(s["t"], s[name]) for s in half if s.get(name)]
            if len(pts) < 5:
                continue
            xs = [t for t, _ in pts]
            rss = [p["rss"] for _, p in pts]
            span = xs[-1] - xs[0]
            grew = slope(xs, rss) * span
            median = sorted(rss)[len(rss) // 2]
            growth[name] = grew
            if grew > max(16 << 20, 0.25 * median):
                failures.append("%s: RSS grows %.1f MiB over the second half (%.1f MiB/min)" % (
                    name, grew / 2**20, slope(xs, rss) * 60 / 2**20))
            for metric in ("fds", "threads"):
                # The second half's median against the first half's maximum: a leak moves the
                # median, one sample taken while I/O threads held files open does not.
                before = max((s[name][metric] for s in first if s.get(name)), default=0)
                after = sorted(p[metric] for _, p in pts)[len(pts) // 2]
                if after > before + 4:
                    failures.append("%s: %s grew from at most %d to a median of %d" % (
                        name, metric, before, after))
        if max(s["file_store_bytes"] for s in samples) > file_capacity * 1.25:
            failures.append("the file store outgrew its capacity: %d bytes" %
                            max(s["file_store_bytes"] for s in samples))
    elif not failures:
        failures.append("too few samples (%d) to judge growth" % len(samples))
    if shm_left:
        failures.append("segments left in /dev/shm: %s" % sorted(shm_left))

    def rss(name, i):
        pts = [s[name]["rss"] for s in samples if s.get(name)]
        return pts[i] / 2**20 if pts else 0.0

    summary = {"minutes": args.minutes, "device": args.device,
               "backend": args.io_backend if args.device == "gpu" else "cpu",
               "faults": faults, "workers": results,
               "rss_mib": {n: [round(rss(n, 0), 1), round(rss(n, -1), 1)]
                           for n in ("redis", "file", "shared-a")},
               "rss_growth_second_half_mib": {n: round(g / 2**20, 2) for n, g in growth.items()},
               "samples": len(samples), "failures": failures}
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(summary, series=samples), f)
    if failures:
        print("soak: FAILED (logs in %s)" % tmp)
        for f in failures:
            print("FAIL: " + f)
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print("soak: passed: %d requests, %d wrong bytes, faults %s" % (
        sum(r.get("requests", 0) for r in results.values()),
        sum(r.get("wrong_bytes", 0) for r in results.values()), faults))
    return 0


if __name__ == "__main__":
    sys.exit(main())
