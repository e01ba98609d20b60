#!/usr/bin/env python3
"""python/bench/compat_host_time.py — every kvtier.compat.sgl_kernel function (and
kvtier.ops.transfer_layer) on the reference workload of docs/performance.md, with PyTorch tensors
on a GPU: host time per call and GPU GB/s, every result byte-checked.

    PYTHONPATH=<build>/python python3 python/bench/compat_host_time.py [--json FILE]

Workload: MHA (Llama-3-8B: 32 layers, 8 KV heads x 128, bf16: 2,048-byte items, K and V) and MLA
(DeepSeek-V3: 61 layers, 576 bf16: 1,152-byte items); a device pool of --pool-slots slots as
per-layer tensors (SGLang's layout: pointer tables on the GPU); --tokens tokens in random pages
drawn independently on each side; page 16 for the kernel functions (host time does not depend on
it), pages 16 and 64 for the direct ones. Kernel functions get int64 CUDA indices (as SGLang);
direct functions get int64 CPU indices.

Method (docs/performance.md, target 8):
  host µs  wall clock around one call on an idle stream (torch.cuda.synchronize() before it),
           median of --repeats calls after --warmup calls; "engine": the part of it inside the
           C++ TransferEngine::Transfer (_kvtier.last_engine_us), the rest is argument handling;
           "back to back": the same, per call, for --repeats calls issued without waiting;
  GPU GB/s CUDA events around one call, the stream held by a sleep kernel until the call is
           submitted (so host submission is not in it), median of --repeats;
  ceiling  one 1 GiB copy each way between pinned host memory and the GPU, median of 5;
  check    the destination rows are poisoned, one call runs, and every written row is compared
           byte for byte (as int16) with the source rows.
Not a timed test: a benchmark, for BENCHMARKS.md.

Thread safety: a script; one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover - a GPU machine has torch
    sys.exit("compat_host_time: needs PyTorch")

import kvtier
from kvtier import _kvtier, ops
from kvtier.compat import sgl_kernel as kv

SHAPES = {  # name: (layers, heads, head_dim, buffers)
    "mha": (32, 8, 128, 2),
    "mla": (61, 1, 576, 1),
}
dev = torch.device("cuda")
DT = torch.bfloat16


def bounded_int(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside [{lo}, {hi}]")
        return value
    return parse


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=bounded_int(64, 1 << 20), default=16384)
    p.add_argument("--pool-slots", type=bounded_int(128, 1 << 22), default=32768)
    p.add_argument("--repeats", type=bounded_int(3, 1000), default=30)
    p.add_argument("--warmup", type=bounded_int(1, 100), default=3)
    p.add_argument("--shapes", default="mha,mla")
    p.add_argument("--json", default=None, help="write the rows here (checked before the run)")
    p.add_argument("--functions", default="",
                   help="comma-separated substrings: only functions whose name holds one")
    p.add_argument("--dma-config", default="",
                   help="kvtier.ops.configure() fields for this run, e.g. dma_lanes=1,"
                        "dma_min_strided_rows=3")
    a = p.parse_args()
    a.config = {}
    for item in filter(None, a.dma_config.split(",")):
        key, _, value = item.partition("=")
        if not key.startswith("dma_") or not value:
            p.error(f"--dma-config: {item!r} is not dma_<field>=<value>")
        a.config[key] = value.lower() == "true" if value.lower() in ("true", "false") else int(value)
    for s in a.shapes.split(","):
        if s not in SHAPES:
            p.error(f"--shapes: {s!r} is not one of {', '.join(SHAPES)}")
    if a.tokens > a.pool_slots // 2:
        p.error(f"--tokens {a.tokens} must be at most half of --pool-slots {a.pool_slots}")
    if a.pool_slots % 64 or a.tokens % 64:
        p.error("--pool-slots and --tokens must be multiples of 64 (the largest page)")
    if a.json:
        directory = os.path.dirname(os.path.abspath(a.json))
        if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
            p.error(f"--json {a.json}: directory {directory} is not writable")
    return a


# ---- measurement --------------------------------------------------------------------------------

_cycles_per_ms = None


def hold_stream(ms: float) -> None:
    """Keeps the current stream busy for about `ms` milliseconds (a sleep kernel)."""
    global _cycles_per_ms
    if ms <= 0:
        return
    if _cycles_per_ms is None:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(10_000_000)
        b.record()
        b.synchronize()
        _cycles_per_ms = 10_000_000 / a.elapsed_time(b)
    torch.cuda._sleep(int(_cycles_per_ms * ms))


def host_us(call, repeats: int, warmup: int):
    """(median host µs of a call, median µs of it inside the C++ engine)."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    samples, engine = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - t0) / 1000)
        engine.append(_kvtier.last_engine_us())
    torch.cuda.synchronize()
    return statistics.median(samples), statistics.median(engine)


def back_to_back_us(call, repeats: int):
    """(host µs per call, µs of it in the engine) for `repeats` calls issued back to back, no
    synchronisation between them: the warm cost of a call (an engine's per-layer loop)."""
    torch.cuda.synchronize()
    engine = 0.0
    t0 = time.perf_counter_ns()
    for _ in range(repeats):
        call()
        engine += _kvtier.last_engine_us()
    total = (time.perf_counter_ns() - t0) / 1000
    torch.cuda.synchronize()
    return total / repeats, engine / repeats


def gpu_ms(call, repeats: int, hold_ms: float) -> float:
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        hold_stream(hold_ms)
        a.record()
        call()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b))
    return statistics.median(samples)


def ceiling() -> dict:
    n = 1 << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(n, dtype=torch.uint8, device=dev)
    out = {}
    for name, (d, s) in {"h2d": (gpu, host), "d2h": (host, gpu)}.items():
        d.copy_(s, non_blocking=True)
        ms = gpu_ms(lambda: d.copy_(s, non_blocking=True), 5, 1.0)
        out[name] = n / ms / 1e6
    del host, gpu
    return out


def random_indices(rng, count: int, slots: int, page: int) -> np.ndarray:
    pages = rng.choice(slots // page, size=count // page, replace=False)
    return (pages[:, None] * page + np.arange(page)[None, :]).reshape(-1).astype(np.int64)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


# ---- the workload -------------------------------------------------------------------------------

class Shape:
    def __init__(self, name: str, pool: int):
        self.name = name
        self.L, self.H, self.D, self.nb = SHAPES[name]
        self.pool = pool
        self.item = self.H * self.D * 2
        # Device pool: one [L, pool, H, D] tensor per buffer, handed out as per-layer views.
        self.dev = [torch.randn(self.L, pool, self.H, self.D, dtype=DT, device=dev)
                    for _ in range(self.nb)]
        self.dev_layers = [[t[l] for l in range(self.L)] for t in self.dev]
        self.dev_tables = [torch.tensor([x.data_ptr() for x in b], dtype=torch.uint64, device=dev)
                           for b in self.dev_layers]

    def host(self, shape) -> list:
        """Pinned host tensors, one per buffer, filled with random bytes (drawn on the GPU)."""
        out = []
        for _ in range(self.nb):
            t = torch.empty(shape, dtype=DT, pin_memory=True)
            t.copy_(torch.randn(shape, dtype=DT, device=dev))
            out.append(t)
        return out


class Row(dict):
    pass


def check(got_want) -> str:
    """got_want: list of (got, want) tensor pairs after one call; 'ok' when all equal."""
    torch.cuda.synchronize()
    for got, want in got_want:
        g = bits(got.to(dev) if not got.is_cuda else got)
        w = bits(want.to(dev) if not want.is_cuda else want)
        if not torch.equal(g, w):
            return f"FAIL ({int((g != w).sum())} elements differ)"
    return "ok"


def measure(rows, args, shape, fn_name, page, nbytes, call, poison, verify, direction, hold_ms):
    wanted = [f for f in args.functions.split(",") if f]
    if wanted and not any(f in fn_name for f in wanted):
        return
    host, engine_us = host_us(call, args.repeats, args.warmup)
    warm, warm_engine = back_to_back_us(call, args.repeats)
    ms = gpu_ms(call, args.repeats, max(hold_ms, 2 * host / 1000))
    # Also with nothing holding the stream: what a caller sees when submission is the slower part
    # (how SGLang's figures were taken: events around the call).
    ms_open = gpu_ms(call, args.repeats, 0)
    poison()
    torch.cuda.synchronize()
    call()
    torch.cuda.synchronize()  # before verify() reads host memory the copy writes
    status = check(verify())
    row = Row(shape=shape.name, function=fn_name, page=page, direction=direction,
              tokens=args.tokens, bytes=nbytes, host_us=round(host, 1),
              engine_us=round(engine_us, 1), warm_host_us=round(warm, 1),
              warm_engine_us=round(warm_engine, 1), gpu_ms=round(ms, 4),
              gbps=round(nbytes / ms / 1e6, 2), gpu_ms_open=round(ms_open, 4),
              gbps_open=round(nbytes / ms_open / 1e6, 2), check=status, config=args.config)
    rows.append(row)
    print(f"{shape.name:4} {fn_name:38} p{page:<3} host {host:9.1f} us "
          f"(engine {engine_us:8.1f}; back to back {warm:8.1f}, engine {warm_engine:8.1f})  "
          f"gpu {ms:8.3f} ms  "
          f"{row['gbps']:6.2f} GB/s  (unheld {row['gbps_open']:6.2f})  {status}", flush=True)


def run_shape(rows, args, shape: Shape, rng) -> None:
    L, nb, item, T = shape.L, shape.nb, shape.item, args.tokens
    mla = nb == 1
    layer = L // 2

    def idx(page, device):
        si = random_indices(rng, T, shape.pool, page)
        di = random_indices(rng, T, shape.pool, page)
        return torch.from_numpy(si).to(device), torch.from_numpy(di).to(device)

    def poison_rows(tensors, rows_index, dim=0):
        def go():
            for t in tensors:
                bits(t).index_fill_(dim, rows_index.to(t.device), 0x5A5A)
        return go

    # Kernel functions, page 16 (page_head needs a page size; the others do not use it).
    P = 16
    si, di = idx(P, dev)
    si_h, di_h = si.cpu(), di.cpu()
    one_layer = T * item * nb
    all_layers = one_layer * L

    # page_first host pool [pool, L, H, D].
    pf = shape.host((shape.pool, L, shape.H, shape.D))
    dst = [shape.dev_layers[b][layer] for b in range(nb)]
    if mla:
        call = lambda: kv.transfer_kv_per_layer_mla_pf_lf(pf[0], dst[0], si, di, layer, item,
                                                           L * item)
        name = "transfer_kv_per_layer_mla_pf_lf"
    else:
        call = lambda: kv.transfer_kv_per_layer_pf_lf(pf[0], dst[0], pf[1], dst[1], si, di,
                                                       layer, item, L * item)
        name = "transfer_kv_per_layer_pf_lf"
    measure(rows, args, shape, name, P, one_layer, call, poison_rows(dst, di),
            lambda: [(dst[b][di], pf[b][si_h, layer]) for b in range(nb)], "load", 0.5)

    # ops.transfer_layer, the same copy through a kvtier.ops region pair.
    src_r = ops.KvRegion(layout="page_first", num_layers=L, slot_bytes=item, k=pf[0],
                         v=None if mla else pf[1], mla=mla, name="src")
    dst_r = ops.KvRegion(layout="layer_first", num_layers=L, slot_bytes=item,
                         k=shape.dev[0], v=None if mla else shape.dev[1], mla=mla, name="dst")
    call = lambda: ops.transfer_layer(src_r, dst_r, si, di, layer, backend="kernel")
    measure(rows, args, shape, "ops.transfer_layer (page_first)", P, one_layer, call,
            poison_rows(dst, di), lambda: [(dst[b][di], pf[b][si_h, layer]) for b in range(nb)],
            "load", 0.5)

    # all-layer backup, tables -> page_first.
    tables = shape.dev_tables
    if mla:
        call = lambda: kv.transfer_kv_all_layer_mla_lf_pf(tables[0], pf[0], si, di, item,
                                                          L * item, L)
        name = "transfer_kv_all_layer_mla_lf_pf"
    else:
        call = lambda: kv.transfer_kv_all_layer_lf_pf(tables[0], pf[0], tables[1], pf[1], si, di,
                                                      item, L * item, L)
        name = "transfer_kv_all_layer_lf_pf"
    measure(rows, args, shape, name, P, all_layers, call, poison_rows(pf, di_h),
            lambda: [(pf[b][di_h], shape.dev[b][:, si].transpose(0, 1)) for b in range(nb)],
            "backup", 1.0)
    del pf, src_r

    # layer_first host pool as per-layer tensors: per-layer load and all-layer backup by tables.
    lf = shape.host((L, shape.pool, shape.H, shape.D))
    lf_layers = [[t[l] for l in range(L)] for t in lf]
    lf_tables = [torch.tensor([x.data_ptr() for x in b], dtype=torch.uint64, device=dev)
                 for b in lf_layers]
    src = [lf_layers[b][layer] for b in range(nb)]
    if mla:
        call = lambda: kv.transfer_kv_per_layer_mla(src[0], dst[0], si, di, item)
        name = "transfer_kv_per_layer_mla"
    else:
        call = lambda: kv.transfer_kv_per_layer(src[0], dst[0], src[1], dst[1], si, di, item)
        name = "transfer_kv_per_layer"
    measure(rows, args, shape, name, P, one_layer, call, poison_rows(dst, di),
            lambda: [(dst[b][di], src[b][si_h]) for b in range(nb)], "load", 0.5)
    if mla:
        call = lambda: kv.transfer_kv_all_layer_mla(tables[0], lf_tables[0], si, di, item, L)
        name = "transfer_kv_all_layer_mla"
    else:
        call = lambda: kv.transfer_kv_all_layer(tables[0], lf_tables[0], tables[1], lf_tables[1],
                                                si, di, item, L)
        name = "transfer_kv_all_layer"
    measure(rows, args, shape, name, P, all_layers, call, poison_rows(lf, di_h, dim=1),
            lambda: [(lf[b][:, di_h], shape.dev[b][:, si]) for b in range(nb)], "backup", 1.0)

    # transfer_kv_direct: one layer, layer_first host rows -> device rows (per-run DMA).
    for page in (16, 64):
        sih, dih = (t.cpu() for t in idx(page, "cpu"))
        call = lambda: kv.transfer_kv_direct(src, dst, sih, dih, page)
        measure(rows, args, shape, "transfer_kv_direct (one layer)", page, one_layer, call,
                poison_rows(dst, dih), lambda: [(dst[b][dih], src[b][sih]) for b in range(nb)],
                "load", 1.0)
    del lf, lf_layers, lf_tables

    if not mla:
        # page_head host pool [pool/P, H, P, L, D].
        ph = shape.host((shape.pool // P, shape.H, P, L, shape.D))
        call = lambda: kv.transfer_kv_per_layer_ph_lf(ph[0], dst[0], ph[1], dst[1], si, di, layer,
                                                      item, L * item, P, shape.H)

        def ph_rows(b, idx_h, lay):
            return ph[b][idx_h // P, :, idx_h % P, lay]

        measure(rows, args, shape, "transfer_kv_per_layer_ph_lf", P, one_layer, call,
                poison_rows(dst, di), lambda: [(dst[b][di], ph_rows(b, si_h, layer))
                                               for b in range(nb)], "load", 0.5)
        call = lambda: kv.transfer_kv_all_layer_lf_ph(tables[0], ph[0], tables[1], ph[1], si, di,
                                                      item, L * item, L, P, shape.H)

        def poison_ph():
            for b in range(nb):
                bits(ph[b])[di_h // P, :, di_h % P] = 0x5A5A

        def verify_ph():
            out = []
            for b in range(nb):
                got = ph[b][di_h // P, :, di_h % P]               # [T, H, L, D]
                want = shape.dev[b][:, si].permute(1, 2, 0, 3)   # [T, H, L, D]
                out.append((got, want))
            return out

        measure(rows, args, shape, "transfer_kv_all_layer_lf_ph", P, all_layers, call, poison_ph,
                verify_ph, "backup", 1.0)
        del ph

    # Direct functions on a page_first_direct host pool [pool/P, L, P, H, D]. The all-layer
    # backup runs twice: from per-layer views of one device pool, and from separately allocated
    # per-layer tensors (as SGLang's MHATokenToKVPool allocates them).
    all_dev = [x for b in range(nb) for x in shape.dev_layers[b]]
    separate = [x.clone() for x in all_dev]
    for page in (16, 64):
        pfd = shape.host((shape.pool // page, L, page, shape.H, shape.D))
        sih, dih = idx(page, "cpu")
        call = lambda: kv.transfer_kv_per_layer_direct_pf_lf(pfd, dst, sih, dih, layer, page)

        def pfd_rows(b, idx_h, lay=None):
            rows_ = pfd[b][idx_h // page, :, idx_h % page]  # [T, L, H, D]
            return rows_ if lay is None else rows_[:, lay]

        measure(rows, args, shape, "transfer_kv_per_layer_direct_pf_lf", page, one_layer, call,
                poison_rows(dst, dih), lambda: [(dst[b][dih], pfd_rows(b, sih, layer))
                                                for b in range(nb)], "load", 2.0)
        call = lambda: kv.transfer_kv_all_layer_direct_lf_pf(all_dev, pfd, sih, dih, page)

        def poison_pfd():
            for b in range(nb):
                bits(pfd[b])[dih // page, :, dih % page] = 0x5A5A

        measure(rows, args, shape, "transfer_kv_all_layer_direct_lf_pf", page, all_layers, call,
                poison_pfd, lambda: [(pfd_rows(b, dih), shape.dev[b][:, sih.to(dev)]
                                      .transpose(0, 1)) for b in range(nb)], "backup", 5.0)
        call = lambda: kv.transfer_kv_all_layer_direct_lf_pf(separate, pfd, sih, dih, page)
        sid = sih.to(dev)
        measure(rows, args, shape, "transfer_kv_all_layer_direct_lf_pf (separate layers)", page,
                all_layers, call, poison_pfd,
                lambda: [(pfd_rows(b, dih), torch.stack([separate[b * L + l][sid]
                                                         for l in range(L)], dim=1))
                         for b in range(nb)], "backup", 5.0)
        del pfd


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available() or not kvtier.built_with_cuda():
        sys.exit("compat_host_time: needs a GPU and kvtier built with CUDA")
    torch.manual_seed(0)
    rng = np.random.default_rng(14)
    if args.config:
        ops.configure(**args.config)
        print(f"engine configuration: {ops.engine_config()}", flush=True)
    ceil = ceiling()
    print(f"ceiling: H2D {ceil['h2d']:.1f} GB/s, D2H {ceil['d2h']:.1f} GB/s "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__})", flush=True)
    rows: list = []
    for name in args.shapes.split(","):
        shape = Shape(name, args.pool_slots)
        run_shape(rows, args, shape, rng)
        del shape
        torch.cuda.empty_cache()
    for r in rows:
        c = ceil["h2d"] if r["direction"] == "load" else ceil["d2h"]
        r["pct_of_ceiling"] = round(100 * r["gbps"] / c, 1)
    failed = [r for r in rows if r["check"] != "ok"]
    print(f"{len(rows)} rows, {len(failed)} failed checks")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ceiling": ceil, "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "args": vars(args), "rows": rows}, f,
                      indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
