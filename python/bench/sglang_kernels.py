#!/usr/bin/env python3
"""python/bench/sglang_kernels.py — kvtier's drop-in (kvtier.compat.sgl_kernel) against SGLang's
own transfer kernels (sgl_kernel.kvcacheio), built from SGLang's source in this run and timed on
the same tensors, call by call (issue 37 item 4; docs/sglang.md "Kernels side by side").

    PYTHONPATH=<build>/python python3 python/bench/sglang_kernels.py --sglang-src .engines/sglang \\
        [--json FILE] [--markdown FILE] [--build-root DIR]
    python3 python/bench/sglang_kernels.py --render FILE.json    # an earlier run's table (no GPU)

SGLang's side, never part of kvtier: SGLANG_SRC/sgl-kernel/csrc/kvcacheio/transfer.cu and its
Python wrappers SGLANG_SRC/sgl-kernel/python/sgl_kernel/kvcacheio.py, unmodified, at the commit in
SGLANG_SRC/COMMIT. torch.utils.cpp_extension.load compiles transfer.cu with kvtier's binding
(sglang_kernel_stubs/sglang_kvcacheio_ops.cc: SGLang's schemas as torch.ops.sgl_kernel.*) and a
stand-in for FlashInfer's pytorch_extension_utils.h (sglang_kernel_stubs/), with sgl-kernel's
CMake flags that matter (-O3 -DNDEBUG, this GPU's arch only), into a temporary folder; SGLang's
functions are then called through SGLang's own wrappers (their defaults: block_quota=2,
num_warps_per_block=32). The header line "SGLang direct path" says whether SGLang's
page_first_direct functions used cudaMemcpyBatchAsync in this process or their per-page fallback
(transfer.cu decides by CUDA_VERSION, the driver, the runtime and the symbol; the same tests are
repeated by the binding).

kvtier's side: the function of the same name in kvtier.compat.sgl_kernel, the same arguments.

Workload (python/bench/compat_host_time.py's, whose helpers this imports): MHA Llama-3-8B (32
layers, 8 KV heads x 128, bf16: 2,048-byte items, K and V) and MLA DeepSeek-V3 (61 layers, 576
bf16: 1,152-byte items); a device pool of --pool-slots slots per layer as per-layer tensors
(views of one [L, slots, H, D] tensor, and for one row separately allocated layers, as SGLang's
device pools hold them); a host pool of the same slots, pinned, viewed in SGLang's host layouts:
layer_first [L, slots, H, D] (per-layer tensors and their uint64 address tables), page_first
[slots, L, H, D], page_head [slots/P, H, P, L, D] (MHA), page_first_direct [slots/P, L, P, H, D];
--tokens tokens in random whole pages drawn independently on each side. Kernel functions: page
16, int64 CUDA indices (as SGLang's kernel io backend passes them). Direct functions: pages
--direct-pages, int64 CPU indices (as SGLang's direct io backend passes them); page 1 rows move
--page1-tokens tokens (one copy per token and layer: the submission is the whole cost).

Method, per row (one function, one page size), every call on one side stream of PyTorch's (as
SGLang's HiCache issues its copies on its own streams; SGLang's direct functions refuse the legacy
default stream, where kvtier would add a fence):
  check    for SGLang's function and then kvtier's: the destination rows poisoned (0x5A5A), one
           call, synchronize, every written row compared byte for byte (as int16) with the source
           rows, the reference taken by torch indexing (neither implementation); a function that
           fails its check or raises is not timed;
  host µs  wall clock around one call on an idle stream (synchronized before it); the two
           functions alternate call by call (which goes first alternates too); median;
  held     GB/s from CUDA events around one call, the stream held by a sleep kernel until the call
           is submitted (the copy's own time, not the host submission), median; the hold is the
           same for both (2 x the slower host time, at least the row's floor);
  plain    the same with nothing holding the stream (events around the call: how SGLang's
           published figures were taken; includes submission the GPU waits for);
  ratio    kvtier GB/s / SGLang GB/s (> 1: kvtier faster).
  JSON only, kvtier's side: engine_us, the median part of its host µs inside the C++
           TransferEngine::Transfer (the rest is argument handling), and for the direct functions
           dma, what the dma engine did in the checked call (copy_ops, batch_calls, copies_2d,
           lanes, kv_merged: _kvtier.sgl_direct_last_stats), to tell where host time goes.
Variants (--variants, JSON rows with "variant"; the second table): right after the rows a
variant is for (VARIANT_ROWS), the same arguments again with kvtier's dma engine reconfigured
(kvtier.ops.configure, restored after the row), each beside SGLang's function in the same
alternation as above, --variant-repeats timed calls (at least 5) after the warm-up. How the
single copies of a batch are split over cudaMemcpyBatchAsync calls (the default set; after each
transfer_kv_per_layer_direct_pf_lf row and each separate-layers transfer_kv_all_layer_direct_lf_pf
row, whose copies are single copies):
  first-piece-64   growing pieces from 64 copies instead of 16 (dma_first_batch_piece=64)
  whole-batch      one batch call per lane, SGLang's shape (dma_batch_split=whole)
  whole-when-busy  one call per lane when the stream has work pending as the copies are
                   submitted (held rows), growing pieces when it is idle (plain rows)
                   (dma_batch_split=whole_when_busy)
The all-layer backups' copy shapes (after each transfer_kv_all_layer_direct_lf_pf row whose pool
layers are views of one allocation; decided by the H100 run at e4884d9, so only on request):
  no-overlap-hint  the strided batch without cudaMemcpyFlagPreferOverlapWithCompute
                   (dma_overlap_hint=False)
  lanes-64         the strided copies over up to 4 streams (dma_ops_per_lane=64)
  kv-separate      K and V as separate depth-1 strided copies (dma_join_kv=False; MHA only)
  layer-copies     one plain copy per (page, layer, K/V), SGLang's shape, over up to 4 streams
                   (dma_stride_layers=False)
kvtier's side is checked byte for byte in every variant row (it is a different plan); SGLang's
call and arguments are those of the row just above, whose check it reuses. JSON only, kvtier's
side of a direct row: dma_held and dma_plain, what the dma engine did in the last held and plain
calls (whole_batch: its single copies went in one call per lane).
Repeats: --repeats, fewer (at least 3) where a row would take longer than --row-budget-s.
Rows: the direct functions at pages 16 and 64 first (the issue's item), then the kernel
functions, then the direct functions at page 1; JSON and Markdown are rewritten after every row,
so a run cut by a time limit keeps what it measured ("complete": false).

Exit status: 0 every row measured and every byte of both sides matched; 1 a byte differed or a
call raised (the row says which side); 2 the run could not start: no GPU, kvtier without CUDA,
SGLang's files missing, or SGLang's transfer.cu did not compile / load (the compiler's output is
printed). Not a timed test: a benchmark, for BENCHMARKS.md.

Thread safety: a script; one thread.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STUBS = os.path.join(HERE, "sglang_kernel_stubs")
BINDING = os.path.join(STUBS, "sglang_kvcacheio_ops.cc")
TRANSFER_CU = ("sgl-kernel", "csrc", "kvcacheio", "transfer.cu")
KVCACHEIO_PY = ("sgl-kernel", "python", "sgl_kernel", "kvcacheio.py")
# The functions both sides must have (sgl_kernel.kvcacheio's CUDA transfer functions).
FUNCTIONS = (
    "transfer_kv_per_layer", "transfer_kv_per_layer_pf_lf", "transfer_kv_per_layer_ph_lf",
    "transfer_kv_all_layer", "transfer_kv_all_layer_lf_pf", "transfer_kv_all_layer_lf_ph",
    "transfer_kv_per_layer_mla", "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf", "transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_all_layer_direct_lf_pf",
)
# Rows judged by issue 37 item 4: the page_first_direct functions.
PAGE_FIRST_DIRECT = ("transfer_kv_per_layer_direct_pf_lf", "transfer_kv_all_layer_direct_lf_pf")
# Other configurations of kvtier's dma engine (the module doc): name -> kvtier.ops.configure
# settings (TransferEngineConfig fields, include/kvtier/transfer.h).
VARIANT_FUNCTION = "transfer_kv_all_layer_direct_lf_pf"
LOAD_LABEL = "transfer_kv_per_layer_direct_pf_lf"
BACKUP_LABEL = VARIANT_FUNCTION  # pool layers as views of one allocation
SEPARATE_LABEL = "transfer_kv_all_layer_direct_lf_pf (separate layers)"
VARIANTS = {
    "first-piece-64": {"dma_first_batch_piece": 64},
    "whole-batch": {"dma_batch_split": "whole"},
    "whole-when-busy": {"dma_batch_split": "whole_when_busy"},
    "no-overlap-hint": {"dma_overlap_hint": False},
    "lanes-64": {"dma_ops_per_lane": 64},
    "kv-separate": {"dma_join_kv": False},
    "layer-copies": {"dma_stride_layers": False},
}
# The rows (labels) each variant is timed after: the batch splits where the copies are single
# copies, the backup shapes where they are strided.
BATCH_SPLIT_VARIANTS = ("first-piece-64", "whole-batch", "whole-when-busy")
VARIANT_ROWS = {name: (LOAD_LABEL, SEPARATE_LABEL) if name in BATCH_SPLIT_VARIANTS else
                (BACKUP_LABEL,) for name in VARIANTS}
DEFAULT_VARIANTS = BATCH_SPLIT_VARIANTS
# Variants that change nothing for a pool of one buffer (MLA): not run there.
K_AND_V_VARIANTS = ("kv-separate",)
EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2


class CannotRun(Exception):
    """The comparison cannot start (exit status 2); the message says why and what to do."""


# ---- arguments ----------------------------------------------------------------------------------

def int_list(text: str) -> list:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") \
            from None
    if not values:
        raise argparse.ArgumentTypeError("the list is empty")
    return values


def parse_args(argv=None) -> argparse.Namespace:
    from compat_host_time import SHAPES, bounded_int

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sglang-src", help="SGLang source folder holding sgl-kernel/ (e.g. "
                   ".engines/sglang); required unless --render")
    p.add_argument("--render", metavar="JSON", help="print the table of an earlier run's JSON")
    p.add_argument("--tokens", type=bounded_int(64, 1 << 20), default=8192)
    p.add_argument("--pool-slots", type=bounded_int(128, 1 << 22), default=16384)
    p.add_argument("--page1-tokens", type=bounded_int(64, 1 << 20), default=512)
    p.add_argument("--direct-pages", type=int_list, default=[16, 64, 1])
    p.add_argument("--repeats", type=bounded_int(3, 1000), default=10)
    p.add_argument("--warmup", type=bounded_int(1, 100), default=2)
    p.add_argument("--row-budget-s", type=float, default=2.0,
                   help="fewer repeats (at least 3) where a row would take longer")
    p.add_argument("--shapes", default="mha,mla")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"comma-separated dma engine configurations to time beside the default "
                   f"({', '.join(VARIANTS)}; default: {', '.join(DEFAULT_VARIANTS)}); 'none' for "
                   f"none")
    p.add_argument("--variant-repeats", type=bounded_int(5, 1000), default=5,
                   help="timed calls of each side per variant row (after the warm-up)")
    p.add_argument("--functions", default="",
                   help="comma-separated substrings: only rows whose label holds one")
    p.add_argument("--build-root", default=None,
                   help="folder for the temporary build of SGLang's kernels (default: $TMPDIR)")
    p.add_argument("--keep-build", action="store_true", help="keep the build folder")
    p.add_argument("--json", default=None, help="write the rows here (after every row)")
    p.add_argument("--markdown", default=None, help="write the table here (after every row)")
    a = p.parse_args(argv)
    if a.render:
        if not os.path.isfile(a.render):
            p.error(f"--render {a.render}: no such file")
        return a
    if not a.sglang_src:
        p.error("--sglang-src is required (a SGLang source folder holding sgl-kernel/)")
    a.variants = [] if a.variants in ("", "none") else a.variants.split(",")
    for v in a.variants:
        if v not in VARIANTS:
            p.error(f"--variants: {v!r} is not one of {', '.join(VARIANTS)} (or 'none')")
    for s in a.shapes.split(","):
        if s not in SHAPES:
            p.error(f"--shapes: {s!r} is not one of {', '.join(SHAPES)}")
    for page in a.direct_pages:
        if page not in (1, 16, 64):
            p.error(f"--direct-pages: {page} is not one of 1, 16, 64")
    if a.tokens > a.pool_slots // 2:
        p.error(f"--tokens {a.tokens} must be at most half of --pool-slots {a.pool_slots}")
    if a.page1_tokens > a.tokens:
        p.error(f"--page1-tokens {a.page1_tokens} must be at most --tokens {a.tokens}")
    if a.pool_slots % 64 or a.tokens % 64 or a.page1_tokens % 64:
        p.error("--pool-slots, --tokens and --page1-tokens must be multiples of 64 (the largest "
                "page)")
    if not 0 < a.row_budget_s <= 600:
        p.error(f"--row-budget-s {a.row_budget_s} is outside (0, 600]")
    for option, path in (("--json", a.json), ("--markdown", a.markdown),
                         ("--build-root", a.build_root)):
        if path:
            directory = path if option == "--build-root" else os.path.dirname(
                os.path.abspath(path))
            if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
                p.error(f"{option} {path}: directory {directory} is not writable")
    return a


# ---- the table ----------------------------------------------------------------------------------

def fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def below_sglang(ratio) -> bool:
    """A row kvtier loses: no ratio (a side failed), or below 1.00 at the table's two decimals."""
    return ratio is None or round(ratio, 2) < 1.0


def ratio_text(value) -> str:
    if value is None:
        return "—"
    return f"**{value:.2f}×**" if below_sglang(value) else f"{value:.2f}×"


def verdict(rows: list) -> list:
    """Lines judging issue 37 item 4: every page_first_direct row at >= 1.0x SGLang's GB/s."""
    judged = [r for r in main_rows(rows) if r["function"] in PAGE_FIRST_DIRECT]
    if not judged:
        return ["issue 37 item 4 (page_first_direct >= 1.0x SGLang): no page_first_direct rows"]
    lines = []
    for key, name in (("ratio_held", "stream held"), ("ratio_plain", "plain")):
        short = [r for r in judged if below_sglang(r.get(key))]
        if short:
            listed = "; ".join(
                f"{r['shape']} {r['label']} p{r['page']} {fmt(r.get(key), '.2f')}x"
                for r in short)
            lines.append(f"issue 37 item 4, {name}: NOT MET on {len(short)} of {len(judged)} "
                         f"page_first_direct rows ({listed})")
        else:
            worst = min(r[key] for r in judged)  # every ratio is there: none was short
            lines.append(f"issue 37 item 4, {name}: met on all {len(judged)} page_first_direct "
                         f"rows (lowest {worst:.2f}x)")
    return lines


def main_rows(rows: list) -> list:
    """The rows of kvtier's default configuration (the main table)."""
    return [r for r in rows if not r.get("variant")]


def variant_rows(rows: list) -> list:
    """The variants table's rows: each row of the default configuration that has variants, as
    "default", followed by its variants, in run order."""
    out = []
    for i, r in enumerate(rows):
        if r.get("variant"):
            out.append(r)
        elif i + 1 < len(rows) and rows[i + 1].get("variant"):
            out.append(dict(r, variant="default", variant_settings={}))
    return out


def variant_verdict(rows: list) -> list:
    """Per copy shape: on how many of its rows it is >= 1.00x SGLang, held and plain."""
    lines = []
    names = list(dict.fromkeys(r["variant"] for r in rows))
    for name in names:
        mine = [r for r in rows if r["variant"] == name]
        parts = []
        for key, what in (("ratio_held", "held"), ("ratio_plain", "plain")):
            short = [r for r in mine if below_sglang(r.get(key))]
            ratios = [r[key] for r in mine if r.get(key) is not None]
            low = f", lowest {min(ratios):.2f}x" if ratios else ""
            parts.append(f"{what} >= 1.00x on {len(mine) - len(short)} of {len(mine)}{low}")
        every = all(not below_sglang(r.get(k)) for r in mine
                    for k in ("ratio_held", "ratio_plain"))
        lines.append(f"- {name}: {'; '.join(parts)}"
                     f"{' -> >= 1.0x on every row' if every else ''}")
    return lines


def variants_markdown(rows: list) -> list:
    """The second table: kvtier's direct functions with its dma engine in other configurations,
    each beside SGLang's."""
    table = variant_rows(rows)
    if not table:
        return []
    out = [
        "",
        "Variants: kvtier's dma engine in other configurations (kvtier.ops.configure settings), "
        "each beside SGLang's function in its own alternation; copies / 2D / batch calls / lanes "
        "of the checked call (idle stream), batch calls of the last held and plain calls (whole: "
        "one per lane)",
        "",
        "| shape | function | page | tokens | variant | settings | SGLang GB/s held | kvtier GB/s "
        "held | ratio held | SGLang GB/s plain | kvtier GB/s plain | ratio plain | kvtier host µs "
        "| copies / 2D / batch calls / lanes | batch calls held / plain | n | check SGLang / kvtier "
        "|",
        "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|",
    ]
    for r in table:
        s, k = r["sglang"], r["kvtier"]
        settings = ", ".join(f"{key}={val}" for key, val in r["variant_settings"].items()) or "—"
        dma = k.get("dma") or {}
        shape_text = "—" if not dma else " / ".join(
            str(dma.get(f, "?")) for f in ("copy_ops", "copies_2d", "batch_calls", "lanes"))
        held_text = " / ".join(
            "—" if not k.get(key) else f"{k[key].get('batch_calls', '?')}"
            f"{' (whole)' if k[key].get('whole_batch') else ''}" for key in ("dma_held", "dma_plain"))
        out.append(
            f"| {r['shape']} | {r['label']} | {r['page']} | {r['tokens']} | {r['variant']} | "
            f"{settings} | "
            f"{fmt(s.get('gbps_held'), '.2f')} | {fmt(k.get('gbps_held'), '.2f')} | "
            f"{ratio_text(r.get('ratio_held'))} | {fmt(s.get('gbps_plain'), '.2f')} | "
            f"{fmt(k.get('gbps_plain'), '.2f')} | {ratio_text(r.get('ratio_plain'))} | "
            f"{fmt(k.get('host_us'), '.1f')} | {shape_text} | {held_text} | "
            f"{r.get('repeats', '—')} | {s['check']} / {k['check']} |")
    out += ["", "Per configuration (ratio = kvtier / SGLang GB/s):"] + variant_verdict(table)
    return out


def markdown(meta: dict, rows: list) -> str:
    """The run's table: a header naming what ran where, one line per row, the verdict; then the
    variants table when the run has variant rows."""
    every_row = rows
    rows = main_rows(rows)
    out = [
        f"SGLang kernels vs kvtier.compat.sgl_kernel — {meta.get('device', '?')}, "
        f"torch {meta.get('torch', '?')}, SGLang {meta.get('sglang_commit', '?')[:12]}, "
        f"kvtier {meta.get('kvtier_commit', '?')}",
        "",
        f"- SGLang direct path: {meta.get('sglang_direct_path', '?')}",
        f"- ceilings (1 GiB pinned copy): H2D {fmt(meta.get('ceiling', {}).get('h2d'), '.1f')} "
        f"GB/s, D2H {fmt(meta.get('ceiling', {}).get('d2h'), '.1f')} GB/s",
        "- held: the stream held until the call is submitted (copy time); plain: events around "
        "the call. Ratio = kvtier / SGLang GB/s, two decimals; **bold** below 1.00 (kvtier "
        "slower).",
    ]
    if not meta.get("complete", False):
        out.append("- **PARTIAL**: the run stopped before its last row (time limit or error)")
    out += [
        "",
        "| shape | function | page | tokens | dir | SGLang GB/s held | kvtier GB/s held | ratio "
        "held | SGLang GB/s plain | kvtier GB/s plain | ratio plain | SGLang host µs | kvtier "
        "host µs | n | check SGLang / kvtier |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        s, k = r["sglang"], r["kvtier"]
        out.append(
            f"| {r['shape']} | {r['label']} | {r['page']} | {r['tokens']} | {r['direction']} | "
            f"{fmt(s.get('gbps_held'), '.2f')} | {fmt(k.get('gbps_held'), '.2f')} | "
            f"{ratio_text(r.get('ratio_held'))} | {fmt(s.get('gbps_plain'), '.2f')} | "
            f"{fmt(k.get('gbps_plain'), '.2f')} | {ratio_text(r.get('ratio_plain'))} | "
            f"{fmt(s.get('host_us'), '.1f')} | {fmt(k.get('host_us'), '.1f')} | "
            f"{r.get('repeats', '—')} | {s['check']} / {k['check']} |")
    failed = [r for r in rows if not row_ok(r)]
    out += ["", f"{len(rows)} rows, {len(failed)} with a failed check or error"]
    out += verdict(rows)
    failed_variants = [r for r in every_row if r.get("variant") and not row_ok(r)]
    out += variants_markdown(every_row)
    if variant_rows(every_row):
        out.append(f"{len(every_row) - len(rows)} variant rows, {len(failed_variants)} with a "
                   "failed check or error")
    return "\n".join(out) + "\n"


def row_ok(row: dict) -> bool:
    return row["sglang"]["check"] == "ok" and row["kvtier"]["check"] == "ok"


def write_outputs(args, meta: dict, rows: list) -> None:
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    if args.markdown:
        with open(args.markdown + ".tmp", "w") as f:
            f.write(markdown(meta, rows))
        os.replace(args.markdown + ".tmp", args.markdown)


# ---- SGLang's kernels, built here ---------------------------------------------------------------

def sglang_files(src: str) -> tuple:
    """(transfer.cu, kvcacheio.py, commit) under a SGLang source folder, or CannotRun."""
    src = os.path.abspath(src)
    cu, py = os.path.join(src, *TRANSFER_CU), os.path.join(src, *KVCACHEIO_PY)
    missing = [f for f in (cu, py) if not os.path.isfile(f)]
    if missing:
        raise CannotRun(
            f"SGLang's kernel files are missing: {', '.join(missing)}. Put SGLang's "
            f"{'/'.join(TRANSFER_CU)} and {'/'.join(KVCACHEIO_PY)}, unmodified, at the commit "
            f"docs/sglang.md names, under {src} (e.g. git show <commit>:<path>)")
    commit = "unknown (no COMMIT file)"
    commit_file = os.path.join(src, "COMMIT")
    if os.path.isfile(commit_file):
        with open(commit_file) as f:
            commit = f.readline().strip() or commit
    return cu, py, commit


def build_sglang(cu: str, build_dir: str):
    """Compiles SGLang's transfer.cu with kvtier's binding into build_dir and loads it, which
    registers torch.ops.sgl_kernel.* (SGLang's functions) and torch.ops.kvtier_sglang_build.info.
    CannotRun with the compiler's output when it does not build or load."""
    import torch
    from torch.utils import cpp_extension

    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        major, minor = torch.cuda.get_device_capability()
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"  # this GPU only (sgl-kernel: 9.0)
    t0 = time.monotonic()
    try:
        # sgl-kernel's CMake: -O3 -DNDEBUG for nvcc and the C++ compiler (cpp_extension adds no
        # optimisation flag of its own); transfer.cu's host code (the direct functions' loops) is
        # compiled by nvcc's host compiler, so -O3 goes to nvcc too.
        cpp_extension.load(
            name="sglang_kvcacheio", sources=[BINDING, cu],
            extra_cflags=["-O3", "-DNDEBUG"],
            extra_cuda_cflags=["-O3", "-DNDEBUG", "--expt-extended-lambda"],
            extra_include_paths=[STUBS], build_directory=build_dir, verbose=False,
            with_cuda=True, is_python_module=False)
    except Exception as e:  # noqa: BLE001 - any failure here is "SGLang's kernels did not build"
        raise CannotRun(f"SGLang's transfer.cu did not build or load ({type(e).__name__}; the "
                        f"build folder {build_dir} is kept):\n{e}") from None
    print(f"built SGLang's transfer.cu with kvtier's binding in {time.monotonic() - t0:.0f} s "
          f"(TORCH_CUDA_ARCH_LIST={os.environ['TORCH_CUDA_ARCH_LIST']}, {build_dir})", flush=True)
    missing = [f for f in FUNCTIONS if not hasattr(torch.ops.sgl_kernel, f)]
    if missing:
        raise CannotRun(f"the built library lacks torch.ops.sgl_kernel.{', '.join(missing)}")


def load_sglang_wrappers(py: str):
    """SGLang's own kvcacheio.py (its Python wrappers of torch.ops.sgl_kernel.*), as a module."""
    spec = importlib.util.spec_from_file_location("sglang_sgl_kernel_kvcacheio", py)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = [f for f in FUNCTIONS if not callable(getattr(module, f, None))]
    if missing:
        raise CannotRun(f"{py} lacks {', '.join(missing)}: not the SGLang commit docs/sglang.md "
                        "names?")
    return module


def direct_path_text(info: list) -> str:
    """Which path transfer.cu's page_first_direct functions take, by its own tests."""
    compiled, driver, runtime, symbol = info
    facts = (f"CUDA_VERSION {compiled} at compile time, driver {driver}, runtime {runtime}, "
             f"cudaMemcpyBatchAsync {'found' if symbol else 'not found'}")
    if compiled >= 12080 and driver >= 12080 and symbol and runtime > 0:
        signature = "v13" if runtime >= 13000 else "v12"
        return f"cudaMemcpyBatchAsync ({signature} signature; {facts})"
    return (f"FALLBACK to one tensor copy per page and layer ({facts}): SGLang's direct rows "
            f"are not its fast path on this machine")


# ---- measurement --------------------------------------------------------------------------------

def measure_pair(ctx, rows: list, shape, label: str, fn: str, page: int, tokens: int,
                 nbytes: int, fargs: tuple, poison, verify, direction: str,
                 floor_hold_ms: float, variant: str = "", sglang_check: str = ""):
    """One row: SGLang's fn and kvtier's fn on the same arguments (see the module doc); returns
    the row, or None when --functions leaves it out. `variant`: a VARIANTS name, kvtier's engines
    reconfigured to it for this row only; `sglang_check`: SGLang's check result of the row with
    the same call and arguments (SGLang's check is then not repeated)."""
    import kvtier.ops
    import torch

    args = ctx.args
    wanted = [f for f in args.functions.split(",") if f]
    if wanted and not any(f in label for f in wanted):
        return None
    if not variant:
        return measure_configured(ctx, rows, shape, label, fn, page, tokens, nbytes, fargs,
                                  poison, verify, direction, floor_hold_ms, "", "")
    settings = VARIANTS[variant]
    before = kvtier.ops.engine_config()
    torch.cuda.synchronize()
    kvtier.ops.configure(**settings)
    try:
        return measure_configured(ctx, rows, shape, label, fn, page, tokens, nbytes, fargs,
                                  poison, verify, direction, floor_hold_ms, variant, sglang_check)
    finally:
        torch.cuda.synchronize()  # nothing of the variant's engines in flight when they go
        kvtier.ops.configure(**{key: before[key] for key in settings})


def measure_configured(ctx, rows: list, shape, label: str, fn: str, page: int, tokens: int,
                       nbytes: int, fargs: tuple, poison, verify, direction: str,
                       floor_hold_ms: float, variant: str, sglang_check: str) -> dict:
    """measure_pair's row with kvtier's engines as they are configured now."""
    import kvtier.ops
    import torch
    from compat_host_time import check, gpu_ms, host_us

    args = ctx.args
    sides = {"sglang": getattr(ctx.sglang, fn), "kvtier": getattr(ctx.kvtier, fn)}
    calls = {side: (lambda f=f: f(*fargs)) for side, f in sides.items()}
    result = {side: {"check": "not run"} for side in sides}
    if sglang_check:
        result["sglang"]["check"] = sglang_check
    # Correctness first: a function that writes wrong bytes or raises is not timed.
    for side, call in calls.items():
        if side == "sglang" and sglang_check:
            continue
        try:
            poison()
            torch.cuda.synchronize()
            call()
            torch.cuda.synchronize()
            result[side]["check"] = check(verify())
        except Exception as e:  # noqa: BLE001 - reported in the row, the run goes on
            torch.cuda.synchronize()
            first = (str(e).splitlines() or [""])[0][:200]
            result[side]["check"] = f"ERROR {type(e).__name__}: {first}"
    timed = [side for side in sides if result[side]["check"] == "ok"]
    last_stats = None  # what the dma engine did in kvtier's last direct call
    if "direct" in fn and "kvtier" in timed and torch.cuda.is_available():
        from kvtier import _kvtier

        stats_of = getattr(_kvtier, "sgl_direct_last_stats", None)
        if stats_of is not None:
            last_stats = lambda: stats_of(torch.cuda.current_device())  # noqa: E731
            result["kvtier"]["dma"] = last_stats()  # the checked call
    repeats = args.repeats
    try:
        t_call = 0.0  # the slower side's warm call, submission to completion
        for _ in range(args.warmup):
            for side in timed:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                calls[side]()
                torch.cuda.synchronize()
                t_call = max(t_call, time.perf_counter() - t0)
        # A repeat is 3 calls of each side plus the holds (up to 2 calls' time): bound the row.
        repeats = args.variant_repeats if variant else \
            max(3, min(args.repeats, int(args.row_budget_s / max(10 * t_call, 1e-6))))
        host = {side: [] for side in timed}
        engine = {side: [] for side in timed}  # kvtier's only: SGLang has no engine
        for i in range(repeats):
            for side in (timed if i % 2 == 0 else timed[::-1]):
                h, e = host_us(calls[side], 1, 0)
                host[side].append(h)
                engine[side].append(e)
        host_med = {side: statistics.median(v) for side, v in host.items()}
        hold = max(floor_hold_ms, 2 * max(host_med.values(), default=0) / 1000)
        held = {side: [] for side in timed}
        plain = {side: [] for side in timed}
        for i in range(repeats):
            for side in (timed if i % 2 == 0 else timed[::-1]):
                held[side].append(gpu_ms(calls[side], 1, hold))
                if side == "kvtier" and last_stats is not None:
                    result[side]["dma_held"] = last_stats()
                plain[side].append(gpu_ms(calls[side], 1, 0))
                if side == "kvtier" and last_stats is not None:
                    result[side]["dma_plain"] = last_stats()
    except Exception as e:  # noqa: BLE001 - a call that passed its check raised while timed
        torch.cuda.synchronize()
        for side in timed:
            first = (str(e).splitlines() or [""])[0][:200]
            result[side]["check"] = f"ERROR while timed {type(e).__name__}: {first}"
        timed = []
    for side in timed:
        ms_held, ms_plain = statistics.median(held[side]), statistics.median(plain[side])
        if side == "kvtier":
            result[side]["engine_us"] = round(statistics.median(engine[side]), 1)
        result[side].update(host_us=round(host_med[side], 1), gpu_ms_held=round(ms_held, 4),
                            gbps_held=round(nbytes / ms_held / 1e6, 2),
                            gpu_ms_plain=round(ms_plain, 4),
                            gbps_plain=round(nbytes / ms_plain / 1e6, 2))
    row = {"shape": shape.name, "label": label, "function": fn, "page": page, "tokens": tokens,
           "bytes": nbytes, "direction": direction, "repeats": repeats if timed else 0,
           "sglang": result["sglang"], "kvtier": result["kvtier"]}
    if variant:
        # What the engine ran under, read back (the settings reached it, not just were asked).
        config = kvtier.ops.engine_config()
        row.update(variant=variant,
                   variant_settings={key: config[key] for key in VARIANTS[variant]})
    for key in ("held", "plain"):
        s, k = result["sglang"].get(f"gbps_{key}"), result["kvtier"].get(f"gbps_{key}")
        row[f"ratio_{key}"] = round(k / s, 3) if s and k else None
    rows.append(row)
    s, k = result["sglang"], result["kvtier"]
    shown = f"{label} [{variant}]" if variant else label
    print(f"{shape.name:4} {shown:48} p{page:<3} {tokens:6} tok  held SGLang "
          f"{fmt(s.get('gbps_held'), '6.2f')} kvtier {fmt(k.get('gbps_held'), '6.2f')} GB/s "
          f"({fmt(row['ratio_held'], '.2f')}x)  plain {fmt(s.get('gbps_plain'), '6.2f')} / "
          f"{fmt(k.get('gbps_plain'), '6.2f')} ({fmt(row['ratio_plain'], '.2f')}x)  host us "
          f"{fmt(s.get('host_us'), '.1f')} / {fmt(k.get('host_us'), '.1f')}  n={row['repeats']}  "
          f"check {s['check']} / {k['check']}", flush=True)
    ctx.write(rows)
    return row


class Pools:
    """One shape's device pool (compat_host_time.Shape) and a pinned host pool of the same slots,
    viewed in each of SGLang's host layouts (one allocation: every layout has the same bytes)."""

    def __init__(self, name: str, slots: int):
        import torch
        from compat_host_time import Shape, dev

        self.shape = shape = Shape(name, slots)
        L, H, D = shape.L, shape.H, shape.D
        self.flat = shape.host((slots * L * H * D,))  # per buffer: random bytes, pinned
        self.lf = [t.view(L, slots, H, D) for t in self.flat]  # layer_first
        self.lf_layers = [[t[l] for l in range(L)] for t in self.lf]
        self.lf_tables = [torch.tensor([x.data_ptr() for x in b], dtype=torch.uint64, device=dev)
                          for b in self.lf_layers]
        self.pf = [t.view(slots, L, H, D) for t in self.flat]  # page_first
        # Device layers allocated one by one (as SGLang's MHATokenToKVPool / MLATokenToKVPool).
        self.separate = [[x.clone() for x in b] for b in shape.dev_layers]

    def ph(self, page: int) -> list:  # page_head [slots/P, H, P, L, D]
        s = self.shape
        return [t.view(s.pool // page, s.H, page, s.L, s.D) for t in self.flat]

    def pfd(self, page: int) -> list:  # page_first_direct [slots/P, L, P, H, D]
        s = self.shape
        return [t.view(s.pool // page, s.L, page, s.H, s.D) for t in self.flat]


def whole_on_gpu(t):
    """A host view copied whole to the GPU (one pinned copy), where the check gathers its rows:
    gathering the rows of a GiB host pool on the CPU would take longer than the row's timing."""
    from compat_host_time import dev

    return t.to(dev)


def poison_rows(tensors, index, dim: int = 0):
    from compat_host_time import bits

    def go():
        for t in tensors:
            bits(t).index_fill_(dim, index.to(t.device), 0x5A5A)
    return go


def direct_rows(ctx, rows: list, pools: Pools, page: int, rng) -> None:
    """The *_direct* functions at one page size (CPU indices)."""
    import torch
    from compat_host_time import bits, dev, random_indices

    s = pools.shape
    L, nb, item = s.L, s.nb, s.item
    T = ctx.args.page1_tokens if page == 1 else ctx.args.tokens
    layer = L // 2
    one_layer, all_layers = T * item * nb, T * item * nb * L
    si = torch.from_numpy(random_indices(rng, T, s.pool, page))
    di = torch.from_numpy(random_indices(rng, T, s.pool, page))
    si_d, di_d = si.to(dev), di.to(dev)
    dst = [s.dev_layers[b][layer] for b in range(nb)]
    src = [pools.lf_layers[b][layer] for b in range(nb)]
    all_dev = [x for b in range(nb) for x in s.dev_layers[b]]
    all_host = [x for b in range(nb) for x in pools.lf_layers[b]]
    separate = [x for b in range(nb) for x in pools.separate[b]]

    # layer_first host pool: one layer loaded, every layer backed up (SGLang's direct io backend).
    measure_pair(ctx, rows, s, "transfer_kv_direct (one layer)", "transfer_kv_direct", page, T,
                 one_layer, (src, dst, si, di, page), poison_rows(dst, di),
                 lambda: [(dst[b][di_d], whole_on_gpu(src[b])[si_d]) for b in range(nb)],
                 "load", 1.0)
    measure_pair(ctx, rows, s, "transfer_kv_direct (all layers)", "transfer_kv_direct", page, T,
                 all_layers, (all_dev, all_host, si, di, page), poison_rows(pools.lf, di, dim=1),
                 lambda: [(whole_on_gpu(pools.lf[b])[:, di_d], s.dev[b][:, si_d])
                          for b in range(nb)],
                 "backup", 5.0)

    # page_first_direct host pool.
    pfd = pools.pfd(page)

    def pfd_rows(b, idx, lay=None):
        got = whole_on_gpu(pfd[b])[idx // page, :, idx % page]  # [T, L, H, D]
        return got if lay is None else got[:, lay]

    def poison_pfd():
        for b in range(nb):
            bits(pfd[b])[di // page, :, di % page] = 0x5A5A

    def with_variants(*row_args):
        """The row in the default configuration, then again in each variant that is for it."""
        default = measure_pair(*row_args)
        label = row_args[3]
        for variant in ctx.args.variants if default is not None else ():
            if label not in VARIANT_ROWS[variant] or (nb == 1 and variant in K_AND_V_VARIANTS):
                continue
            measure_pair(*row_args, variant=variant, sglang_check=default["sglang"]["check"])

    with_variants(ctx, rows, s, LOAD_LABEL, "transfer_kv_per_layer_direct_pf_lf", page, T,
                  one_layer, (pfd, dst, si, di, layer, page), poison_rows(dst, di),
                  lambda: [(dst[b][di_d], pfd_rows(b, si_d, layer)) for b in range(nb)], "load",
                  2.0)
    with_variants(ctx, rows, s, BACKUP_LABEL, VARIANT_FUNCTION, page, T, all_layers,
                  (all_dev, pfd, si, di, page), poison_pfd,
                  lambda: [(pfd_rows(b, di_d), s.dev[b][:, si_d].transpose(0, 1))
                           for b in range(nb)], "backup", 5.0)
    with_variants(ctx, rows, s, SEPARATE_LABEL, VARIANT_FUNCTION, page, T, all_layers,
                  (separate, pfd, si, di, page), poison_pfd,
                  lambda: [(pfd_rows(b, di_d), torch.stack([pools.separate[b][l][si_d]
                                                          for l in range(L)], dim=1))
                           for b in range(nb)], "backup", 5.0)


def kernel_rows(ctx, rows: list, pools: Pools, rng) -> None:
    """The kernel functions, page 16 (int64 CUDA indices)."""
    from compat_host_time import bits, dev, random_indices
    import torch

    s = pools.shape
    L, nb, item, T, P = s.L, s.nb, s.item, ctx.args.tokens, 16
    mla = nb == 1
    layer = L // 2
    one_layer, all_layers = T * item * nb, T * item * nb * L
    si_h = torch.from_numpy(random_indices(rng, T, s.pool, P))
    di_h = torch.from_numpy(random_indices(rng, T, s.pool, P))
    si, di = si_h.to(dev), di_h.to(dev)
    dst = [s.dev_layers[b][layer] for b in range(nb)]
    pf, lf, tables, lf_tables = pools.pf, pools.lf, s.dev_tables, pools.lf_tables
    src = [pools.lf_layers[b][layer] for b in range(nb)]

    def row(fn, nbytes, fargs, poison, verify, direction, hold):
        measure_pair(ctx, rows, s, fn, fn, P, T, nbytes, fargs, poison, verify, direction, hold)

    pf_load = lambda: [(dst[b][di], whole_on_gpu(pf[b])[si, layer])  # noqa: E731
                       for b in range(nb)]
    pf_backup = lambda: [(whole_on_gpu(pf[b])[di], s.dev[b][:, si].transpose(0, 1))  # noqa: E731
                         for b in range(nb)]
    lf_load = lambda: [(dst[b][di], whole_on_gpu(src[b])[si]) for b in range(nb)]  # noqa: E731
    lf_backup = lambda: [(whole_on_gpu(lf[b])[:, di], s.dev[b][:, si])  # noqa: E731
                         for b in range(nb)]
    if mla:
        row("transfer_kv_per_layer_mla_pf_lf", one_layer,
            (pf[0], dst[0], si, di, layer, item, L * item), poison_rows(dst, di), pf_load,
            "load", 0.5)
        row("transfer_kv_all_layer_mla_lf_pf", all_layers,
            (tables[0], pf[0], si, di, item, L * item, L), poison_rows(pf, di_h), pf_backup,
            "backup", 1.0)
        row("transfer_kv_per_layer_mla", one_layer, (src[0], dst[0], si, di, item),
            poison_rows(dst, di), lf_load, "load", 0.5)
        row("transfer_kv_all_layer_mla", all_layers,
            (tables[0], lf_tables[0], si, di, item, L), poison_rows(lf, di_h, dim=1), lf_backup,
            "backup", 1.0)
        return
    row("transfer_kv_per_layer_pf_lf", one_layer,
        (pf[0], dst[0], pf[1], dst[1], si, di, layer, item, L * item), poison_rows(dst, di),
        pf_load, "load", 0.5)
    row("transfer_kv_all_layer_lf_pf", all_layers,
        (tables[0], pf[0], tables[1], pf[1], si, di, item, L * item, L), poison_rows(pf, di_h),
        pf_backup, "backup", 1.0)
    row("transfer_kv_per_layer", one_layer, (src[0], dst[0], src[1], dst[1], si, di, item),
        poison_rows(dst, di), lf_load, "load", 0.5)
    row("transfer_kv_all_layer", all_layers,
        (tables[0], lf_tables[0], tables[1], lf_tables[1], si, di, item, L),
        poison_rows(lf, di_h, dim=1), lf_backup, "backup", 1.0)
    ph = pools.ph(P)

    def poison_ph():
        for b in range(nb):
            bits(ph[b])[di_h // P, :, di_h % P] = 0x5A5A

    row("transfer_kv_per_layer_ph_lf", one_layer,
        (ph[0], dst[0], ph[1], dst[1], si, di, layer, item, L * item, P, s.H),
        poison_rows(dst, di),
        lambda: [(dst[b][di], whole_on_gpu(ph[b])[si // P, :, si % P, layer])
                 for b in range(nb)],
        "load", 0.5)
    row("transfer_kv_all_layer_lf_ph", all_layers,
        (tables[0], ph[0], tables[1], ph[1], si, di, item, L * item, L, P, s.H), poison_ph,
        lambda: [(whole_on_gpu(ph[b])[di // P, :, di % P], s.dev[b][:, si].permute(1, 2, 0, 3))
                 for b in range(nb)], "backup", 1.0)


class Context:
    def __init__(self, args, meta, sglang, kvtier_module):
        self.args, self.meta, self.sglang, self.kvtier = args, meta, sglang, kvtier_module

    def write(self, rows: list) -> None:
        write_outputs(self.args, self.meta, rows)


def kvtier_commit() -> str:
    # KVTIER_COMMIT, when the caller sets it, names the tree: a copy of a working tree carried to
    # another machine may hold a .git whose HEAD is older than its files.
    if os.environ.get("KVTIER_COMMIT"):
        return os.environ["KVTIER_COMMIT"]
    try:
        import subprocess
        return subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except Exception:  # noqa: BLE001 - a copy without git: the commit is unknown
        return "?"


def run(args) -> int:
    import numpy as np
    import torch
    import kvtier
    from kvtier.compat import sgl_kernel as kv
    from compat_host_time import ceiling

    if not torch.cuda.is_available() or not kvtier.built_with_cuda():
        raise CannotRun("needs a GPU and kvtier built with CUDA (PYTHONPATH=<CUDA build>/python)")
    cu, py, commit = sglang_files(args.sglang_src)
    build_dir = tempfile.mkdtemp(prefix="kvtier-sglang-kernels-", dir=args.build_root)
    build_sglang(cu, build_dir)  # on failure the folder stays, its build.ninja for a look
    if not args.keep_build:
        shutil.rmtree(build_dir, ignore_errors=True)  # the loaded library stays mapped
    sglang = load_sglang_wrappers(py)
    info = list(torch.ops.kvtier_sglang_build.info())
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda_runtime_torch": torch.version.cuda, "sglang_commit": commit,
            "sglang_src": os.path.abspath(args.sglang_src), "kvtier_commit": kvtier_commit(),
            "sglang_build_info": dict(zip(("cuda_version_compiled", "driver", "runtime",
                                           "batch_symbol"), info)),
            "sglang_direct_path": direct_path_text(info),
            "args": {k: v for k, v in vars(args).items()},
            "variants": {v: VARIANTS[v] for v in args.variants}, "complete": False}
    print(f"SGLang {commit} from {args.sglang_src}; {meta['device']}, torch {meta['torch']}",
          flush=True)
    print(f"SGLang direct path: {meta['sglang_direct_path']}", flush=True)
    torch.manual_seed(0)
    rng = np.random.default_rng(37)
    ctx = Context(args, meta, sglang, kv)
    rows: list = []
    # Everything on one side stream, as SGLang's HiCache runs its copies on its own load and
    # write streams: SGLang's direct functions cannot run on the legacy default stream
    # (cudaMemcpyBatchAsync refuses it; kvtier fences it to a private stream, a cost SGLang's
    # callers never pay).
    with torch.cuda.stream(torch.cuda.Stream()):
        meta["ceiling"] = ceiling()
        print(f"ceiling: H2D {meta['ceiling']['h2d']:.1f} GB/s, D2H "
              f"{meta['ceiling']['d2h']:.1f} GB/s", flush=True)
        pools = {name: Pools(name, args.pool_slots) for name in args.shapes.split(",")}
        first = [p for p in args.direct_pages if p != 1]
        steps = [("direct", p) for p in first] + [("kernel", 16)] + \
            [("direct", 1) for p in args.direct_pages if p == 1]
        for section, page in steps:
            for pool in pools.values():
                if section == "direct":
                    direct_rows(ctx, rows, pool, page, rng)
                else:
                    kernel_rows(ctx, rows, pool, rng)
    meta["complete"] = True
    ctx.write(rows)
    print()
    print(markdown(meta, rows), flush=True)
    return EXIT_OK if all(row_ok(r) for r in rows) else EXIT_FAILED


def main(argv=None) -> int:
    sys.path.insert(0, HERE)  # compat_host_time, when run from elsewhere
    args = parse_args(argv)
    if args.render:
        with open(args.render) as f:
            data = json.load(f)
        print(markdown(data["meta"], data["rows"]), end="")
        return EXIT_OK if all(row_ok(r) for r in data["rows"]) else EXIT_FAILED
    try:
        return run(args)
    except CannotRun as e:
        print(f"sglang_kernels: CANNOT RUN: {e}", file=sys.stderr, flush=True)
        return EXIT_CANNOT_RUN


if __name__ == "__main__":
    sys.exit(main())
