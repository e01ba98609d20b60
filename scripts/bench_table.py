#!/usr/bin/env python3
# scripts/bench_table.py — turn the JSON output of `kvtier bench` on a GPU into the markdown
# tables of docs/perf-notes/gpu-transfer.md (every row; BENCHMARKS.md's "GPU" sections show
# them with the pages side by side).
#
#   scripts/bench_table.py --kernel K.json --dma D.json --auto A.json \
#       [--previous docs/perf-notes/gpu-transfer.md] [--previous-label "run 4"]
#
# K.json, D.json and A.json are written by
#   build-gpu/tools/kvtier bench --backend kernel|dma|auto --json FILE
# (as scripts/gpu_check.sh does). The markdown goes to stdout:
#   1. the one-way table: one line per (shape, op, host layout, page) of the load and backup
#      rows, with the kernel, dma and auto backends side by side, SGLang's numbers, the target
#      (≥ 90 % of ceiling for MHA, ≥ 85 % for MLA) and the distance to it;
#   2. the "both directions at once" table (op "both"), one line per backend and layout;
#   3. one summary line per table.
# With --previous, each table gets a last column with the same line's kernel % (table 1) or
# "× one-way ceiling" (table 2) from the first such table in that markdown file, headed by
# --previous-label.
#
# Standard library only. Exit status 2, with a message on stderr, when a file is missing or
# unreadable, or a row lacks a field the tables need.

import argparse
import json
import re
import sys

BACKENDS = ("kernel", "dma", "auto")
SHAPE_ORDER = ("mha", "mla")
OP_ORDER = ("load", "backup")
LAYOUT_ORDER = ("layer_first", "page_first", "page_first_direct", "page_head")
TARGET_PCT = {"mha": 90.0, "mla": 85.0}
BOTH_TARGET = 1.6
DASH = "—"

KEY_FIELDS = ("shape", "op", "layout", "page_size")
FIELDS_BY_BACKEND = {
    "kernel": ("gbps", "pct_of_ceiling", "host_submit_us", "host_launch_us", "sms_used", "check"),
    "dma": ("gbps", "pct_of_ceiling", "host_submit_us", "check", "note"),
    "auto": ("gbps", "pct_of_ceiling", "check", "note"),
}
BOTH_FIELDS = ("gbps", "pct_of_ceiling", "check", "note")
STRING_FIELDS = ("backend", "shape", "op", "layout", "check", "note")

# sgl-kernel kvcacheio on the H100 reference (docs/performance.md), keyed by
# (shape, op, layout, page).
SGLANG = {
    ("mha", "load", "layer_first", 1): "39.9 k",
    ("mha", "load", "layer_first", 16): "39.4 k; DMA 4.0",
    ("mha", "load", "layer_first", 64): "40.8 k; DMA 25.5",
    ("mha", "load", "page_first", 1): "29.7 k",
    ("mha", "load", "page_first", 16): "29.9 k",
    ("mha", "load", "page_first", 64): "30.1 k",
    ("mha", "load", "page_first_direct", 16): "32.5 DMA",
    ("mha", "load", "page_first_direct", 64): "53.8 DMA",
    ("mha", "backup", "layer_first", 1): "23.6 k",
    ("mha", "backup", "layer_first", 16): "38.9 k; DMA 4.8",
    ("mha", "backup", "layer_first", 64): "49.7 k; DMA 18.1",
    ("mha", "backup", "page_first", 1): "52.3 k",
    ("mha", "backup", "page_first", 16): "51.8 k",
    ("mha", "backup", "page_first", 64): "51.0 k",
    ("mha", "backup", "page_first_direct", 16): "49.5 DMA",
    ("mha", "backup", "page_first_direct", 64): "41.7 DMA",
    ("mla", "load", "layer_first", 1): "23.9 k",
    ("mla", "load", "layer_first", 64): "23.3 k",
    ("mla", "load", "page_first", 1): "20.4 k",
    ("mla", "load", "page_first", 64): "20.4 k",
    ("mla", "backup", "layer_first", 1): "30.0 k",
    ("mla", "backup", "layer_first", 64): "42.0 k",
    ("mla", "backup", "page_first", 1): "48.1 k",
    ("mla", "backup", "page_first", 64): "49.9 k",
}

ONE_WAY_HEADER_START = "| shape | op | host layout | page | kernel GB/s"
BOTH_HEADER_START = "| op | host layout | page | backend | GB/s (sum"


class InputError(Exception):
    """A problem with an input file; the message names the file (and field)."""


# ---------------------------------------------------------------- reading the JSON files


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}")
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON: {e}")


def row_label(row, index=None):
    parts = [str(row.get(f)) for f in KEY_FIELDS if f in row]
    where = " ".join(parts[:3] + [f"p{p}" for p in parts[3:]])
    label = "row" if index is None else f"row {index}"
    return label + (f" ({where})" if where else "")


def require_fields(path, row, index, fields):
    for field in fields:
        value = row.get(field)
        if value is None:
            raise InputError(f"{path}: {row_label(row, index)}: missing field '{field}'")
        wants_string = field in STRING_FIELDS
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if (wants_string and not isinstance(value, str)) or (not wants_string and not is_number):
            kind = "a string" if wants_string else "a number"
            raise InputError(f"{path}: {row_label(row, index)}: field '{field}' is not {kind}")


def needed_fields(backend, op):
    if op == "both":
        return KEY_FIELDS + BOTH_FIELDS
    return KEY_FIELDS + FIELDS_BY_BACKEND[backend]


def load_rows(path, backend):
    """Rows of `backend` with op load/backup/both, keyed by (op class, shape, op, layout, page)."""
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise InputError(f"{path}: missing field 'rows' (a list)")
    rows = {}
    for index, row in enumerate(data["rows"]):
        if not isinstance(row, dict):
            raise InputError(f"{path}: row {index} is not an object")
        require_fields(path, row, index, ("backend", "op"))
        if row["backend"] != backend or row["op"] not in OP_ORDER + ("both",):
            continue
        require_fields(path, row, index, needed_fields(backend, row["op"]))
        if row["shape"] not in TARGET_PCT:
            raise InputError(f"{path}: {row_label(row, index)}: field 'shape' is not mha or mla")
        key = row_key(row)
        if key in rows:
            raise InputError(f"{path}: {row_label(row, index)}: the same row appears twice")
        rows[key] = row
    if not rows:
        raise InputError(f"{path}: no load, backup or both rows with backend '{backend}'")
    return rows


def row_key(row):
    return (row["shape"], row["op"], row["layout"], int(row["page_size"]))


# ---------------------------------------------------------------- parsing the notes


def note_match(pattern, row, path, what):
    match = re.search(pattern, row["note"])
    if not match:
        raise InputError(f"{path}: {row_label(row)}: field 'note' has no {what}: {row['note']!r}")
    return match


def dma_not_run(row):
    return row["note"].startswith("not run")


def dma_plan(row, path):
    """(copy ops, K+V-joined count, streams) from a dma note."""
    ops = int(note_match(r"(\d+) copy ops", row, path, "'N copy ops'").group(1))
    joined = re.search(r"of which (\d+) carry K and V", row["note"])
    streams = re.search(r"(\d+) stream\(s\)", row["note"])
    return ops, int(joined.group(1)) if joined else 0, int(streams.group(1)) if streams else 1


def auto_engine(row, path):
    return note_match(r"auto chose (\w+)", row, path, "'auto chose X'").group(1)


def both_sms(row, path):
    match = note_match(r"SMs: loads (\d+), backup (\d+)", row, path, "'SMs: loads A, backup B'")
    loads, backup = int(match.group(1)), int(match.group(2))
    if loads == 0 and backup == 0:
        return "0"
    return f"{loads or 'dma'} + {backup or 'dma'}"


# ---------------------------------------------------------------- reading the previous run


def split_cells(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def find_table(lines, header_start):
    """Data rows (lists of cells) of the first table whose header starts with header_start."""
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            rows = []
            for data_line in lines[i + 2:]:
                if not data_line.startswith("|"):
                    break
                rows.append(split_cells(data_line))
            return rows
    return []


def read_previous(path):
    """(kernel % by (shape, op, layout, page), × by (op, layout, page, backend)) from markdown."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}")
    one_way = {}
    for cells in find_table(lines, ONE_WAY_HEADER_START):
        pct = re.search(r"\(([\d.]+)%\)", cells[4]) if len(cells) > 4 else None
        if pct:
            one_way[tuple(cells[:4])] = pct.group(1)
    both = {}
    for cells in find_table(lines, BOTH_HEADER_START):
        if len(cells) > 5:
            both[tuple(cells[:4])] = cells[5]
    return one_way, both


# ---------------------------------------------------------------- formatting cells


def escape(text):
    return str(text).replace("|", "\\|")


def rate_pct(row):
    return f"{row['gbps']:.1f} ({row['pct_of_ceiling']:.1f}%)"


def integer(value):
    return str(int(value)) if float(value).is_integer() else str(value)


def order_index(value, order):
    return (order.index(value), "") if value in order else (len(order), value)


def one_way_sort_key(key):
    shape, op, layout, page = key
    return (order_index(shape, SHAPE_ORDER), order_index(op, OP_ORDER),
            order_index(layout, LAYOUT_ORDER), page)


def kernel_cells(row):
    if row is None:
        return [DASH] * 4
    dma_now = row.get("dma_now_gbps")
    # 0 means the rate was not measured (the tool writes 0.0 where it has none).
    dma_now_cell = f"{dma_now:.1f}" if isinstance(dma_now, (int, float)) and dma_now > 0 else DASH
    submit = f"{row['host_submit_us']:.1f} ({row['host_launch_us']:.1f})"
    return [rate_pct(row), submit, integer(row["sms_used"]), dma_now_cell]


def dma_cells(row, path):
    if row is None:
        return [DASH, DASH]
    if dma_not_run(row):
        return ["not run", "≥1M copies"]
    ops, joined, streams = dma_plan(row, path)
    submit = f"{row['host_submit_us']:.0f} / {ops}"
    if joined > 0:
        submit += ", K+V joined"
    if streams > 1:
        submit += f", {streams} streams"
    return [rate_pct(row), submit]


def auto_cell(row, path):
    if row is None:
        return DASH
    return f"{rate_pct(row)} → {escape(auto_engine(row, path))}"


def distance_cell(row, target):
    if row is None:
        return DASH
    short = target - row["pct_of_ceiling"]
    if short <= 0:
        return "met"
    text = f"{short:.1f}"
    return f"**{'<0.1' if text == '0.0' else text} points short**"


def check_cell(rows_by_backend):
    failed = [b for b, row in rows_by_backend.items() if row is not None and not row_ok(b, row)]
    missing = [b for b, row in rows_by_backend.items() if row is None]
    parts = []
    if failed:
        parts.append(f"FAIL ({', '.join(failed)})")
    if missing:
        parts.append(f"no row ({', '.join(missing)})")
    return "; ".join(parts) or "ok"


def row_ok(backend, row):
    return row["check"] == "ok" or (backend == "dma" and dma_not_run(row))


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- table 1: one way


def one_way_keys(rows):
    keys = set()
    for backend in BACKENDS:
        keys |= {key for key in rows[backend] if key[1] in OP_ORDER}
    return sorted(keys, key=one_way_sort_key)


def one_way_line(key, rows, paths, previous):
    shape, op, layout, page = key
    line = {b: rows[b].get(key) for b in BACKENDS}
    kernel = line["kernel"]
    target = TARGET_PCT[shape]
    cells = [shape, op, layout, str(page)]
    cells += kernel_cells(kernel)
    cells += dma_cells(line["dma"], paths["dma"])
    cells.append(auto_cell(line["auto"], paths["auto"]))
    cells.append(SGLANG.get(key, DASH))
    cells.append(f"≥{target:g}%")
    cells.append(distance_cell(kernel, target))
    cells.append(check_cell(line))
    if previous is not None:
        cells.append(previous.get((shape, op, layout, str(page)), DASH))
    return cells


def one_way_table(rows, paths, previous, label):
    header = ["shape", "op", "host layout", "page", "kernel GB/s (% of ceiling)",
              "kernel submit µs (in launch)", "SMs", "DMA rate right after (GB/s)",
              "dma GB/s (%)", "dma submit µs / copy ops", "auto GB/s (%) → engine",
              "SGLang GB/s (k = kernel)", "target", "distance (kernel)", "check"]
    if previous is not None:
        header.append(f"kernel %, {label}")
    lines = [one_way_line(key, rows, paths, previous) for key in one_way_keys(rows)]
    return markdown_table(header, lines)


def one_way_summary(kernel_rows):
    counts = []
    for shape in SHAPE_ORDER:
        for op in OP_ORDER:
            group = [r for k, r in kernel_rows.items() if k[0] == shape and k[1] == op]
            met = sum(1 for r in group if r["pct_of_ceiling"] >= TARGET_PCT[shape])
            counts.append(f"{shape} {op} {met}/{len(group)}")
    submits = []
    for op, name in (("load", "loads"), ("backup", "backups")):
        values = [r["host_submit_us"] for k, r in kernel_rows.items() if k[1] == op]
        span = f"{min(values):.1f}–{max(values):.1f}" if values else DASH
        submits.append(f"{name} {span}")
    return (f"One way, kernel rows meeting their target: {', '.join(counts)}; "
            f"kernel host submit µs: {', '.join(submits)}.")


# ---------------------------------------------------------------- table 2: both directions


def both_rows(rows):
    ordered = []
    for backend in BACKENDS:
        keys = sorted((k for k in rows[backend] if k[1] == "both"), key=one_way_sort_key)
        ordered += [(backend, k, rows[backend][k]) for k in keys]
    return ordered


def both_target_cell(ratio):
    short = BOTH_TARGET - ratio
    if short <= 0:
        return f"≥{BOTH_TARGET:g}× (met)"
    return f"≥{BOTH_TARGET:g}× (**{short:.2f}× short**)"


def both_line(backend, key, row, path, previous):
    shape, _, layout, page = key
    ratio = row["pct_of_ceiling"] / 100
    op_cell = f"{shape} both"
    cells = [op_cell, layout, str(page), backend, f"{row['gbps']:.1f}", f"{ratio:.2f}×",
             both_sms(row, path), both_target_cell(ratio), escape(row["check"])]
    if previous is not None:
        cells.append(previous.get((op_cell, layout, str(page), backend), DASH))
    return cells


def both_table(rows, paths, previous, label):
    header = ["op", "host layout", "page", "backend", "GB/s (sum of both directions)",
              "× one-way ceiling", "SMs (loads + backup)", "target", "check"]
    if previous is not None:
        header.append(label)
    lines = [both_line(b, k, r, paths[b], previous) for b, k, r in both_rows(rows)]
    return markdown_table(header, lines)


def both_summary(rows):
    counts = []
    for backend in BACKENDS:
        group = [r for k, r in rows[backend].items() if k[1] == "both"]
        met = sum(1 for r in group if r["pct_of_ceiling"] / 100 >= BOTH_TARGET)
        counts.append(f"{backend} {met}/{len(group)}")
    return f"Both directions, rows meeting ≥{BOTH_TARGET:g}×: {', '.join(counts)}."


# ---------------------------------------------------------------- main


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Turn `kvtier bench --json` output (GPU) into markdown tables "
        "(docs/perf-notes/gpu-transfer.md).")
    parser.add_argument("--kernel", required=True, help="JSON of kvtier bench --backend kernel")
    parser.add_argument("--dma", required=True, help="JSON of kvtier bench --backend dma")
    parser.add_argument("--auto", required=True, help="JSON of kvtier bench --backend auto")
    parser.add_argument("--previous", help="markdown file with an earlier run's tables "
                        "(docs/perf-notes/gpu-transfer.md)")
    parser.add_argument("--previous-label", default="previous",
                        help="heading of the previous-run column (default: previous)")
    return parser.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    paths = {"kernel": args.kernel, "dma": args.dma, "auto": args.auto}
    try:
        rows = {backend: load_rows(paths[backend], backend) for backend in BACKENDS}
        previous_one_way, previous_both = (None, None)
        if args.previous:
            previous_one_way, previous_both = read_previous(args.previous)
        one_way = one_way_table(rows, paths, previous_one_way, args.previous_label)
        both = both_table(rows, paths, previous_both, args.previous_label)
    except InputError as e:
        print(f"bench_table.py: {e}", file=sys.stderr)
        return 2
    kernel_one_way = {k: r for k, r in rows["kernel"].items() if k[1] in OP_ORDER}
    print(one_way)
    print()
    print(both)
    print()
    print(one_way_summary(kernel_one_way))
    print()
    print(both_summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
