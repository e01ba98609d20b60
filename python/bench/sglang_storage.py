#!/usr/bin/env python3
"""python/bench/sglang_storage.py — HiCache's storage tier side by side, through SGLang's own
cache controller: SGLang's built-in ``file`` backend, kvtier ``file://`` on the same disk, and
kvtier ``redis://`` (a local redis-server), on the same pages, with the same-run N-thread pread
ceiling beside them (issue 37 item 3).

    PYTHONPATH=<build>/python python3 python/bench/sglang_storage.py --sglang-src DIR \\
        [--dir DIR] [--json FILE] [--markdown FILE] [--quick]

Workload: the KV of Llama-3-8B (MHA, 32 layers, 8 KV heads x 128, bf16) and DeepSeek-V3 (MLA,
61 layers, 512 + 64, bf16), pages of 16 and 64 tokens, batches of 128 pages (SGLang's
storage_batch_size); SGLang's host pool in the page_first layout (what kvtier's zero-copy path
needs; SGLang's file backend copies through flat page tensors in any layout).

Method, per model x page size x backend (one HiCacheController each, built as HiRadixCache
builds it; SGLang's storage threads are not involved: the bench calls the controller's own page
functions, which those threads call):
  set      ``controller.page_set_func(keys, host_indices)`` (SGLang's _page_backup step) of one
           128-page batch; GB/s of page bytes, best of --repeats (each repeat new keys);
  get      ``controller.page_get_func(op, keys, host_indices)`` (SGLang's _page_transfer step)
           into other host pages, page-cache hot (the batch was read once before), best of
           --repeats; every page checked byte for byte after the last repeat;
  exists   ``storage_backend.batch_exists(keys)`` of the 128 keys (SGLang's _storage_hit_query
           step): wall µs and host µs (the calling thread's CPU time: what the call costs the
           process beside the store's own threads), median of 20;
  host/call the calling thread's CPU µs of one get and one set (median over the repeats);
  ceiling  the same pages' payloads as plain files on the same disk, page-cache hot, read by
           N threads (N = kvtier's I/O threads, min(cores, 16)) with preadv into the host pool:
           what N threads can take from the page cache on this machine; best of --repeats.
Not a timed test: a benchmark, for BENCHMARKS.md. Prints a table; --json / --markdown write it.

Thread safety: a script; the ceiling's threads read disjoint files into disjoint pages.
"""

from __future__ import annotations

import argparse
import hashlib
import concurrent.futures
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import numpy as np  # noqa: E402

import sglang_harness as harness  # noqa: E402
from redis_process import RedisUnavailable, local_redis  # noqa: E402

BATCH = 128  # SGLang's storage_batch_size
TIMEOUT_MS = 60_000  # kvtier's per-call timeout for the bench's batches


def io_threads() -> int:
    return max(4, min(os.cpu_count() or 4, 16))  # kvtier's DefaultIoThreads


class _AllocatorOfPool:
    """Stands for SGLang's device-slot allocator (the storage paths ask it for the pool)."""

    def __init__(self, pool):
        self.pool = pool

    def get_kvcache(self):
        return self.pool


def build_controller(model, page_size, backend, url, pools):
    from sglang.srt.managers.cache_controller import HiCacheController

    dev, host = pools
    # A 128-page batch of 8 MiB pages is 1 GiB: more than the default 2 s per call may take.
    extra = (harness.kvtier_extra_config(url, timeout_ms=TIMEOUT_MS)
             if backend != "sglang-file" else None)
    return HiCacheController(
        _AllocatorOfPool(dev), host, page_size, tp_group=None, load_cache_event=threading.Event(),
        write_policy="write_through", io_backend="kernel",
        storage_backend="file" if backend == "sglang-file" else "dynamic",
        prefetch_threshold=page_size, model_name=f"bench/{model}",
        storage_backend_extra_config=extra)


def pages_region(host, first_page, num_pages):
    """The bytes of host pages [first_page, first_page + num_pages) of a page_first pool, one
    writable numpy view per buffer (K, V or the MLA buffer): contiguous in that layout."""
    import ctypes

    import torch

    assert host.layout == "page_first", host.layout
    p = host.page_size

    def meta(q):
        return host.get_page_buffer_meta(torch.arange(q * p, (q + 1) * p, dtype=torch.int64))

    (first, sizes), (last, _) = meta(first_page), meta(first_page + num_pages - 1)
    return [np.ctypeslib.as_array((ctypes.c_uint8 * (int(b) - int(a) + int(n))).from_address(
        int(a))) for a, b, n in zip(first, last, sizes)]


def ceiling_gbps(host, pages, page_dir, repeats, threads):
    """N threads of preadv of the pages' payloads (plain files) into the host pool's pages."""
    import ctypes

    import torch

    files = []
    for q in pages:
        path = os.path.join(page_dir, f"{q}.bin")
        with open(path, "wb") as f:
            f.write(harness.page_bytes(host, q * host.page_size).tobytes())
        files.append(path)
    dst = list(range(len(pages) * 2, len(pages) * 3))
    views = []
    for q in dst:
        ptrs, sizes = host.get_page_buffer_meta(
            torch.arange(q * host.page_size, (q + 1) * host.page_size, dtype=torch.int64))
        views.append([memoryview(np.ctypeslib.as_array(
            (ctypes.c_uint8 * int(s)).from_address(int(p)))) for p, s in zip(ptrs, sizes)])
    total = sum(sum(v.nbytes for v in vs) for vs in views)

    def read(i):
        fd = os.open(files[i], os.O_RDONLY)
        try:
            n = os.preadv(fd, views[i], 0)
        finally:
            os.close(fd)
        assert n == sum(v.nbytes for v in views[i])

    best = 0.0
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(read, range(len(files))))  # page-cache hot
        for _ in range(repeats):
            t = time.perf_counter()
            list(pool.map(read, range(len(files))))
            best = max(best, total / (time.perf_counter() - t) / 1e9)
    return best


def run_backend(model, page_size, backend, url, pools, repeats):
    import torch

    from sglang.srt.managers.cache_controller import PrefetchOperation

    dev, host = pools
    ctrl = build_controller(model, page_size, backend, url, pools)
    try:
        p = page_size
        src = torch.arange(0, BATCH * p, dtype=torch.int64)
        dst = torch.arange(BATCH * p, 2 * BATCH * p, dtype=torch.int64)
        rng = np.random.default_rng(len(backend) * page_size)
        for part in pages_region(host, 0, BATCH):
            part[:] = np.frombuffer(rng.bytes(part.size), dtype=np.uint8)
        page_bytes = harness.page_bytes(host, 0).size
        batch_bytes = BATCH * page_bytes
        set_gbps, set_host = [], []
        keys = None
        for r in range(repeats):
            tag = hashlib.sha256(f"{backend}/{r}".encode()).hexdigest()[:32]
            keys = [f"{tag}{i:032x}" for i in range(BATCH)]  # 64 hex digits, as SGLang's
            t0, c0 = time.perf_counter(), time.thread_time()
            ok = ctrl.page_set_func(keys, src)
            c1, t1 = time.thread_time(), time.perf_counter()
            assert ok, f"{backend}: a set failed"
            set_gbps.append(batch_bytes / (t1 - t0) / 1e9)
            set_host.append((c1 - c0) * 1e6)
        want = [harness.page_bytes(host, q * p) for q in range(BATCH)]
        get_gbps, get_host = [], []
        for r in range(repeats + 1):  # the first read makes the pages page-cache hot
            for part in pages_region(host, BATCH, BATCH):  # poisoned before every get
                part[:] = 0xA5
            op = PrefetchOperation(f"bench-{r}", dst, [0] * (BATCH * p))
            t0, c0 = time.perf_counter(), time.thread_time()
            ctrl.page_get_func(op, keys, dst)
            c1, t1 = time.thread_time(), time.perf_counter()
            assert op.completed_tokens == BATCH * p, f"{backend}: a get missed"
            if r:
                get_gbps.append(batch_bytes / (t1 - t0) / 1e9)
                get_host.append((c1 - c0) * 1e6)
        for i, q in enumerate(range(BATCH, 2 * BATCH)):
            got = harness.page_bytes(host, q * p)
            assert np.array_equal(got, want[i]), f"{backend}: page {i} differs"
        ex_wall, ex_host = [], []
        for _ in range(20):
            t0, c0 = time.perf_counter(), time.thread_time()
            hit = ctrl.storage_backend.batch_exists(keys)
            c1, t1 = time.thread_time(), time.perf_counter()
            assert hit == BATCH, f"{backend}: batch_exists {hit}"
            ex_wall.append((t1 - t0) * 1e6)
            ex_host.append((c1 - c0) * 1e6)
        return dict(set_gbps=max(set_gbps), get_gbps=max(get_gbps),
                    exists_us=statistics.median(ex_wall), exists_host_us=statistics.median(ex_host),
                    get_host_us=statistics.median(get_host), set_host_us=statistics.median(set_host),
                    page_bytes=page_bytes)
    finally:
        ctrl.detach_storage_backend()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sglang-src", default=os.environ.get(harness.SRC_ENV))
    ap.add_argument("--dir", default=None, help="a folder on the disk to measure (default: "
                    "a temporary folder under /tmp); removed at the end")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small shapes (4 layers), for a check "
                    "of the bench itself on a CPU box")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    env = harness.load(args.sglang_src)
    harness.set_tp(0, 1)

    base = os.path.abspath(tempfile.mkdtemp(prefix="kvtier-sglang-bench-", dir=args.dir))
    os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = os.path.join(base, "sglang-file")
    models = {"llama3-8b": harness.LLAMA3_8B, "deepseek-v3": harness.DEEPSEEK_V3}
    rows = []
    try:
        redis_cm = local_redis()
        try:
            redis_url = redis_cm.__enter__()
        except RedisUnavailable as e:
            print(f"redis:// left out: {e}")
            redis_cm, redis_url = None, None
        try:
            for model, shape in models.items():
                shape = dict(shape)
                mla = shape.pop("mla")
                if args.quick:
                    shape["layer_num"] = 4
                for page_size in (16, 64):
                    pools = harness.make_pools(mla, "page_first", page_size,
                                               device_tokens=BATCH * page_size,
                                               host_ratio=3.5, **shape)
                    rng = np.random.default_rng(page_size)
                    for part in pages_region(pools[1], 0, BATCH):
                        part[:] = np.frombuffer(rng.bytes(part.size), dtype=np.uint8)
                    row = dict(model=model, page_size=page_size,
                               page_mib=harness.page_bytes(pools[1], 0).size / 2**20)
                    cdir = os.path.join(base, f"ceiling-{model}-{page_size}")
                    os.makedirs(cdir)
                    row["ceiling_gbps"] = ceiling_gbps(pools[1], list(range(BATCH)), cdir,
                                                       args.repeats, io_threads())
                    shutil.rmtree(cdir)
                    backends = [("sglang-file", None),
                                ("kvtier-file", f"file://{base}/kvtier-file")]
                    if redis_url:
                        backends.append(("kvtier-redis", redis_url))
                    for name, url in backends:
                        row[name] = run_backend(model, page_size, name, url, pools, args.repeats)
                        print(f"{model} page {page_size} {name}: {row[name]}", flush=True)
                    rows.append(row)
                    write_outputs(args, rows, env, partial=True)  # a cut run keeps its rows
                    del pools
                    shutil.rmtree(os.path.join(base, "sglang-file"), ignore_errors=True)
                    shutil.rmtree(os.path.join(base, "kvtier-file"), ignore_errors=True)
        finally:
            if redis_cm is not None:
                redis_cm.__exit__(None, None, None)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    write_outputs(args, rows, env, partial=False)
    return 0


def write_outputs(args, rows, env, partial):
    import torch

    meta = dict(sglang_commit=env.commit, torch=torch.__version__, io_threads=io_threads(),
                batch_pages=BATCH, kvtier_timeout_ms=TIMEOUT_MS, device_pools="SGLang's" if env.real_device_pools else
                f"stand-ins ({env.stand_in_reason})", gpu=torch.cuda.get_device_name(0)
                if torch.cuda.is_available() else None, quick=args.quick, partial=partial)
    table = markdown(rows, meta)
    if not partial:
        print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)


def markdown(rows, meta) -> str:
    out = [f"SGLang {meta['sglang_commit'][:10] if meta['sglang_commit'] else '?'}, torch "
           f"{meta['torch']}, {meta['batch_pages']}-page batches, ceiling = "
           f"{meta['io_threads']} pread threads, page-cache hot"
           + (" (PARTIAL: the run was cut)" if meta["partial"] else ""), "",
           "| model | page | MiB/page | backend | set GB/s | get GB/s | get / ceiling | "
           "exists µs (host µs) | host µs per get / set |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for name in ("sglang-file", "kvtier-file", "kvtier-redis"):
            if name not in r:
                continue
            b = r[name]
            out.append(f"| {r['model']} | {r['page_size']} | {r['page_mib']:.2f} | {name} | "
                       f"{b['set_gbps']:.2f} | {b['get_gbps']:.2f} | "
                       f"{100 * b['get_gbps'] / r['ceiling_gbps']:.0f} % | "
                       f"{b['exists_us']:.0f} ({b['exists_host_us']:.0f}) | "
                       f"{b['get_host_us']:.0f} / {b['set_host_us']:.0f} |")
        out.append(f"| {r['model']} | {r['page_size']} | {r['page_mib']:.2f} | pread ceiling |"
                   f" | {r['ceiling_gbps']:.2f} | 100 % | | |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
