#!/usr/bin/env python3
"""Side by side on one disk: the same KV blocks through vLLM's file-system secondary tier and
through kvtier's tier (kvtier.integrations.vllm.KvtierTier over file://), with the same-run
N-thread pread ceiling.

    PYTHONPATH=build-release/python python3 python/bench/vllm_tiers.py --vllm-src .engines/vllm \
        --dir /mnt/nvme/bench [--total-mib 1024] [--tokens 16 64] [--json out.json]

Blocks have Llama-3-8B's shape (32 layers x 8 KV heads x 128 dims x bf16, K and V: 4 KiB per
token and layer, 2 MiB per 16-token block, 8 MiB per 64-token block) and live in one page-aligned
host pool, as vLLM's CPU tier keeps them. Per block size and tier:

- warm-up (not measured): every block stored once under other keys (a fresh store creates its
  directories on first use: 1 s for kvtier's first 64 pages on the build box, 60 ms after).
- store: every block of --total-mib in jobs of --job-blocks blocks, all jobs submitted at once
  (vLLM cascades each step's stores as one job per tier), completion polled as vLLM's scheduler
  polls get_finished(); GB/s = bytes / wall time from the first submit to the last completion.
- load: the pool poisoned, every block loaded back the same way, then every byte compared.
  kvtier's file store reads through the page cache (hot right after the store).
- host time per call: the time the calling (scheduler) thread spent inside submit + poll calls,
  divided by the calls, wall and (in parentheses) the thread's CPU time: what the tier costs
  vLLM's scheduler loop.
- lookup: a fresh tier (nothing known) asked about every stored block: kvtier's None -> answer
  round trip (one exists on the tier's lookup threads) and the scheduler-thread time per call;
  vLLM's tier answers with os.path.exists on the scheduler thread.
- pread ceiling: --threads Python threads preading the block files vLLM's path wrote (page-cache
  hot after one warm-up pass) into the pool: the rate the page cache gives N readers here.
- --cpu-hogs N: N processes spinning on a core for the whole run (each stops by itself after
  10 minutes, and with this process), standing for a busy host (the soak beside an H100 run);
  every row, the ceiling included, is measured beside them.

kvtier rows (--kvtier-options): the defaults (16 blocks a PageStore call, each block a store call
of its own for file://: max_batch_pages=1), max_batch_pages=4096 (16 blocks a store call, the
default before: one I/O thread owns each call), pages_per_call=1 (one PageStore call per block).

vLLM's tier at the pinned commit: its data path (tiering/fs/io.py store_block / load_block on
tiering/fs/thread_pool.py's DualQueueThreadPool, one task per block, 16 + 16 threads: exactly what
its FileSystemTierManager submits) with O_DIRECT as shipped; where the file system refuses
O_DIRECT, and also as a second row, with buffered I/O (io.O_DIRECT = 0: what later vLLM falls back
to). The FileSystemTierManager class itself (file naming, lookup) is not part of the
reconstructed source: files are named <dir>/vllm/<key hex>.bin.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import multiprocessing
import os
import signal
import shutil
import sys
import threading
import time

import numpy as np

LAYERS, KV_HEADS, HEAD_DIM, DTYPE_BYTES = 32, 8, 128, 2
TOKEN_LAYER_BYTES = 2 * KV_HEADS * HEAD_DIM * DTYPE_BYTES  # K and V


def add_vllm(src: str) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests"))
    os.environ["KVTIER_VLLM_SRC"] = src
    from vllm_source import add_vllm_to_path

    why = add_vllm_to_path()
    if why:
        sys.exit(f"vllm_tiers: {why}")


def make_pool(num_blocks: int, row: int) -> tuple[mmap.mmap, np.ndarray]:
    buf = mmap.mmap(-1, num_blocks * row)  # page-aligned, as vLLM's shared region
    pool = np.frombuffer(buf, dtype=np.int8).reshape(num_blocks, row)
    return buf, pool


def fill(pool: np.ndarray, seed: int) -> np.ndarray:
    """Distinct bytes per block: one random row, each block's 4 KiB pages stamped with its index."""
    rng = np.random.default_rng(seed)
    base = rng.integers(-128, 128, pool.shape[1], dtype=np.int8)
    pool[:] = base
    stamps = pool.view(np.int64).reshape(pool.shape[0], -1, 512)
    stamps[:, :, 0] = np.arange(pool.shape[0], dtype=np.int64)[:, None] * 7919 + seed
    return pool.copy()


class HostClock:
    """Time the calling thread spends inside the tier's calls: wall (what the scheduler loop waits,
    preemption included) and the thread's CPU time (what the calls cost it)."""

    def __init__(self):
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self.calls = 0

    def __call__(self, fn, *args):
        t, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t
            self.cpu_seconds += time.thread_time() - c
            self.calls += 1

    def per_call_us(self) -> float:
        return 1e6 * self.seconds / max(1, self.calls)

    def cpu_per_call_us(self) -> float:
        return 1e6 * self.cpu_seconds / max(1, self.calls)


def run_jobs(submit, poll, jobs, clock: HostClock) -> float:
    """Submits every job, polls until all finished; returns wall seconds. Fails on a failed job."""
    t0 = time.perf_counter()
    pending = set()
    for job_id, job in jobs:
        clock(submit, job)
        pending.add(job_id)
    while pending:
        for job_id, ok in clock(poll):
            if not ok:
                raise RuntimeError(f"job {job_id} failed")
            pending.discard(job_id)
        if pending:
            time.sleep(0.0002)
    return time.perf_counter() - t0


def parse_options(spec: str) -> dict:
    """'max_batch_pages=1,io_threads=16' -> {'max_batch_pages': 1, 'io_threads': 16}."""
    out = {}
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        out[name] = int(value) if value.lstrip("-").isdigit() else value
    return out


class KvtierSide:
    def __init__(self, root, pool, tokens, options: str, index: int):
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

        self.factory = SecondaryTierFactory
        self.name = "kvtier file://" + (f" ({options})" if options else "")
        self.options = parse_options(options)
        self.url = f"file://{root}/kvtier{index}"
        self.pool, self.tokens = pool, tokens
        self.tier = self.new_tier()

    def new_tier(self):
        cfg = {"type": "KvtierTier", "module_path": "kvtier.integrations.vllm", "url": self.url,
               "model_id": "meta-llama/Meta-Llama-3-8B", "kv_dtype": "bfloat16", "mla": False,
               "num_layers": LAYERS, "block_tokens": self.tokens, "world_size": 1,
               **self.options}
        return self.factory.create_secondary_tier(cfg, memoryview(self.pool), None)

    def submit_store(self, job):
        self.tier.submit_store(job)

    def submit_load(self, job):
        self.tier.submit_load(job)

    def poll(self):
        return [(r.job_id, r.success) for r in self.tier.get_finished()]

    def lookup_latency(self, keys, req):
        """Fresh tier: per key, None then the answer; returns (us per key, host us per call)."""
        tier = self.new_tier()
        clock = HostClock()
        t0 = time.perf_counter()
        try:
            for key in keys:
                while clock(tier.lookup, key, req) is not True:
                    time.sleep(0)
        finally:
            tier.shutdown()
        return 1e6 * (time.perf_counter() - t0) / len(keys), clock.per_call_us()

    def close(self):
        if self.tier is not None:
            self.tier.shutdown()
            self.tier = None


class VllmFsSide:
    def __init__(self, root, pool, o_direct: bool):
        from vllm.v1.kv_offload.tiering.fs import io as fs_io
        from vllm.v1.kv_offload.tiering.fs.thread_pool import DualQueueThreadPool

        self.io = fs_io
        self.o_direct = o_direct
        self.name = "vLLM fs tier" + (" (O_DIRECT)" if o_direct else " (buffered)")
        self.root = os.path.join(root, "vllm_direct" if o_direct else "vllm_buffered")
        self.view = memoryview(pool)
        self.block_size = pool.strides[0]
        self.threads = DualQueueThreadPool(16, 16, thread_name_prefix="vllm_kv_py_fs")

    def path(self, key: bytes) -> str:
        h = key.hex()
        return os.path.join(self.root, h[:3], h + ".bin")

    def _tasks(self, fn, job):
        return [
            (lambda p=self.path(bytes(k)), off=int(b) * self.block_size: fn(
                p, self.view, off, self.block_size))
            for k, b in zip(job.keys, job.block_ids)
        ]

    def _with_mode(self, enqueue, job, fn):
        self.io.O_DIRECT = getattr(os, "O_DIRECT", 0) if self.o_direct else 0
        enqueue(job.job_id, len(job.keys), self._tasks(fn, job))

    def submit_store(self, job):
        self._with_mode(self.threads.enqueue_store, job, self.io.store_block)

    def submit_load(self, job):
        self._with_mode(self.threads.enqueue_load, job, self.io.load_block)

    def poll(self):
        return self.threads.get_finished()

    def lookup_latency(self, keys, req):
        clock = HostClock()
        t0 = time.perf_counter()
        for key in keys:
            assert clock(os.path.exists, self.path(bytes(key)))
        us = 1e6 * (time.perf_counter() - t0) / len(keys)
        return us, clock.per_call_us()

    def close(self):
        if self.threads is not None:
            self.threads.shutdown()
            self.threads = None


def pread_ceiling(paths, pool, threads: int, passes: int = 2) -> float:
    """GB/s of `threads` threads preading whole files into pool rows; the last pass counts."""
    row = pool.shape[1]
    view = memoryview(pool).cast("B")
    rate = 0.0
    for _ in range(passes):
        next_index = [0]
        lock = threading.Lock()

        def reader():
            while True:
                with lock:
                    i = next_index[0]
                    next_index[0] += 1
                if i >= len(paths):
                    return
                fd = os.open(paths[i], os.O_RDONLY)
                try:
                    n = os.preadv(fd, [view[i * row:(i + 1) * row]], 0)
                finally:
                    os.close(fd)
                if n != row:
                    raise RuntimeError(f"short read of {paths[i]}")

        t0 = time.perf_counter()
        workers = [threading.Thread(target=reader) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        rate = len(paths) * row / (time.perf_counter() - t0) / 1e9
    return rate


HOG_SECONDS = 600  # a hog stops by itself after this, whatever happens to the bench


def _hog(deadline: float) -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    while time.monotonic() < deadline:
        pass


def start_hogs(n: int) -> list:
    deadline = time.monotonic() + HOG_SECONDS
    hogs = [multiprocessing.get_context("fork").Process(target=_hog, args=(deadline,), daemon=True)
            for _ in range(n)]
    for h in hogs:
        h.start()
    return hogs


def stop_hogs(hogs: list) -> None:
    for h in hogs:
        h.kill()
    for h in hogs:
        h.join()


def o_direct_works(directory: str) -> bool:
    path = os.path.join(directory, ".o_direct_probe")
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | getattr(os, "O_DIRECT", 0), 0o644)
        try:
            buf = mmap.mmap(-1, 4096)
            os.write(fd, buf)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False
    finally:
        if os.path.exists(path):
            os.remove(path)


def bench_block_size(args, tokens: int) -> list[dict]:
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import JobMetadata

    row = LAYERS * tokens * TOKEN_LAYER_BYTES
    num_blocks = max(args.job_blocks, args.total_mib * (1 << 20) // row)
    buf, pool = make_pool(num_blocks, row)
    expected = fill(pool, seed=tokens)
    rng = np.random.default_rng(tokens)
    keys = [make_offload_key(rng.bytes(32), 0) for _ in range(num_blocks)]
    warmup_keys = [make_offload_key(rng.bytes(32), 0) for _ in range(num_blocks)]
    req = ReqContext(req_id="bench")

    def jobs(start_id, is_promotion, job_keys=keys):
        out = []
        for j, first in enumerate(range(0, num_blocks, args.job_blocks)):
            ids = np.arange(first, min(num_blocks, first + args.job_blocks), dtype=np.int64)
            out.append((start_id + j, JobMetadata(job_id=start_id + j,
                                                  keys=[job_keys[i] for i in ids], block_ids=ids,
                                                  is_promotion=is_promotion, req_context=req)))
        return out

    root = os.path.join(args.dir, f"t{tokens}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    sides = [KvtierSide(root, pool, tokens, opts, i) for i, opts in enumerate(args.kvtier_options)]
    direct_ok = o_direct_works(root)
    if direct_ok:
        sides.append(VllmFsSide(root, pool, o_direct=True))
    sides.append(VllmFsSide(root, pool, o_direct=False))

    rows = []
    total_gb = num_blocks * row / 1e9
    for side in sides:
        try:
            pool[:] = expected
            # Warm-up, not measured: the same blocks under other keys (a fresh store creates its
            # directories on first use; both tiers pay that once, not per block).
            run_jobs(side.submit_store, side.poll, jobs(2 * 10**6, False, warmup_keys), HostClock())
            store_clock, load_clock = HostClock(), HostClock()
            store_s = run_jobs(side.submit_store, side.poll, jobs(0, False), store_clock)
            pool[:] = np.int8(-91)
            load_s = run_jobs(side.submit_load, side.poll, jobs(10**6, True), load_clock)
            ok = bool(np.array_equal(pool, expected))
            side.close()  # the lookups below run on a fresh tier over the same files
            lookup_us, lookup_host_us = side.lookup_latency(keys[: min(256, num_blocks)], req)
            rows.append({
                "tokens": tokens, "tier": side.name, "block_mib": row / (1 << 20),
                "blocks": num_blocks, "store_gbps": total_gb / store_s,
                "load_gbps": total_gb / load_s, "bytes_ok": ok,
                "store_host_us_per_call": store_clock.per_call_us(),
                "load_host_us_per_call": load_clock.per_call_us(),
                "store_host_cpu_us_per_call": store_clock.cpu_per_call_us(),
                "load_host_cpu_us_per_call": load_clock.cpu_per_call_us(),
                "lookup_us": lookup_us, "lookup_host_us_per_call": lookup_host_us,
            })
        finally:
            side.close()
    buffered = sides[-1]
    paths = [buffered.path(bytes(k)) for k in keys]
    ceiling = pread_ceiling(paths, pool, args.threads)
    ok = bool(np.array_equal(pool, expected))
    rows.append({"tokens": tokens, "tier": f"pread ceiling ({args.threads} threads, hot)",
                 "block_mib": row / (1 << 20), "blocks": num_blocks, "load_gbps": ceiling,
                 "bytes_ok": ok})
    for r in rows:
        r["load_pct_of_ceiling"] = 100.0 * r["load_gbps"] / ceiling
    if not direct_ok:
        rows.append({"tokens": tokens, "tier": "vLLM fs tier (O_DIRECT)", "skipped":
                     f"O_DIRECT is refused by the file system of {args.dir}"})
    shutil.rmtree(root, ignore_errors=True)
    return rows


def markdown_table(rows: list[dict], args) -> str:
    beside = f", beside {args.cpu_hogs} spinning processes" if args.cpu_hogs else ""
    out = [f"Blocks of Llama-3-8B shape, {args.total_mib} MiB per run, jobs of {args.job_blocks} "
           f"blocks, pread ceiling with {args.threads} threads (page-cache hot){beside}.", "",
           "| tokens/block | tier | store GB/s | load GB/s | load % of ceiling | scheduler us/call "
           "store, load (CPU) | lookup us (scheduler us/call) | bytes |",
           "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        if "skipped" in r:
            out.append(f"| {r['tokens']} | {r['tier']} | skipped: {r['skipped']} | | | | | |")
            continue
        store = f"{r['store_gbps']:.2f}" if "store_gbps" in r else ""
        host = (f"{r['store_host_us_per_call']:.0f}, {r['load_host_us_per_call']:.0f} "
                f"({r['store_host_cpu_us_per_call']:.0f}, {r['load_host_cpu_us_per_call']:.0f})"
                if "store_host_us_per_call" in r else "")
        look = (f"{r['lookup_us']:.0f} ({r['lookup_host_us_per_call']:.1f})"
                if "lookup_us" in r else "")
        out.append(f"| {r['tokens']} | {r['tier']} | {store} | {r['load_gbps']:.2f} | "
                   f"{r['load_pct_of_ceiling']:.0f} | {host} | {look} | "
                   f"{'ok' if r['bytes_ok'] else 'BAD'} |")
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm-src", required=True, help="vLLM source folder (see docs/vllm.md)")
    p.add_argument("--dir", required=True, help="a directory on the disk to measure (emptied)")
    p.add_argument("--total-mib", type=int, default=1024, help="bytes of blocks per run")
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 64], help="tokens per block")
    p.add_argument("--job-blocks", type=int, default=16, help="blocks per store/load job")
    p.add_argument("--threads", type=int, default=16, help="pread ceiling threads")
    p.add_argument("--cpu-hogs", type=int, default=0,
                   help="processes spinning on a core during the whole run (a busy host)")
    p.add_argument("--kvtier-options", nargs="+",
                   default=["", "max_batch_pages=4096", "pages_per_call=1"],
                   help="one kvtier row per item: tier options 'name=value,...' ('' = defaults)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--markdown", help="write the table here (BENCHMARKS.md's form)")
    args = p.parse_args()
    add_vllm(args.vllm_src)
    args.dir = os.path.abspath(args.dir)  # file:// URLs take absolute paths
    os.makedirs(args.dir, exist_ok=True)
    free = shutil.disk_usage(args.dir).free
    need = 2 * (len(args.kvtier_options) + 2) * args.total_mib * (1 << 20)  # warm-up + measured
    if free < 2 * need:
        sys.exit(f"vllm_tiers: {args.dir} has {free >> 20} MiB free, need {2 * need >> 20}")

    rows = []
    hogs = start_hogs(args.cpu_hogs)
    try:
        for tokens in args.tokens:
            rows += bench_block_size(args, tokens)
    finally:
        stop_hogs(hogs)
    print(f"{'tokens':>6} {'tier':<40} {'store GB/s':>10} {'load GB/s':>9} {'% ceil':>6} "
          f"{'host us/call st/ld (cpu)':>30} {'lookup us (host)':>17} {'bytes':>5}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['tokens']:>6} {r['tier']:<40} skipped: {r['skipped']}")
            continue
        st = f"{r['store_gbps']:10.2f}" if "store_gbps" in r else f"{'':>10}"
        host = (f"{r['store_host_us_per_call']:7.0f}/{r['load_host_us_per_call']:<7.0f}"
                f"({r['store_host_cpu_us_per_call']:5.0f}/{r['load_host_cpu_us_per_call']:<5.0f})"
                if "store_host_us_per_call" in r else f"{'':>30}")
        look = (f"{r['lookup_us']:8.1f} ({r['lookup_host_us_per_call']:5.1f})" if "lookup_us" in r
                else f"{'':>17}")
        print(f"{r['tokens']:>6} {r['tier']:<40} {st} {r['load_gbps']:9.2f} "
              f"{r['load_pct_of_ceiling']:6.0f} {host} {look} "
              f"{'ok' if r['bytes_ok'] else 'BAD':>5}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown_table(rows, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "dir": args.dir, "total_mib": args.total_mib}, f, indent=1)
    return 0 if all(r.get("bytes_ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
