"""python/bench/sglang_kernels.py without a GPU: its argument checks, the table and verdict it
renders from rows, its exit statuses, and that it refuses loudly (status 2, saying why) where it
cannot run. The measurement itself needs a GPU and SGLang's source
(scripts/sglang_kernels_check.sh on the GPU machine).

Thread safety: pytest runs these in one thread.
"""

import json
import os
import sys

import pytest

pytest.importorskip("torch")  # compat_host_time, whose helpers the bench imports, needs it

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import sglang_kernels as bench  # noqa: E402


def side(gbps_held, gbps_plain, host, check="ok"):
    return {"check": check, "gbps_held": gbps_held, "gbps_plain": gbps_plain, "host_us": host}


def row(shape, function, page, s, k, label=None):
    r = {"shape": shape, "label": label or function, "function": function, "page": page,
         "tokens": 8192, "bytes": 1, "direction": "load", "repeats": 10, "sglang": s, "kvtier": k}
    for key in ("held", "plain"):
        a, b = s.get(f"gbps_{key}"), k.get(f"gbps_{key}")
        r[f"ratio_{key}"] = round(b / a, 3) if a and b else None
    return r


META = {"device": "test", "torch": "x", "sglang_commit": "e99f87c974a07a5400eb96cea1a05f886c5d5b6a",
        "kvtier_commit": "abc", "sglang_direct_path": "cudaMemcpyBatchAsync (v13 signature)",
        "ceiling": {"h2d": 55.6, "d2h": 55.4}, "complete": True}


def test_table_marks_rows_below_sglang_and_judges_page_first_direct_rows():
    rows = [
        row("mla", "transfer_kv_per_layer_direct_pf_lf", 64, side(42.7, 40.0, 200.0),
            side(37.1, 41.0, 180.0)),
        row("mha", "transfer_kv_all_layer_direct_lf_pf", 16, side(28.4, 28.0, 900.0),
            side(47.0, 46.0, 800.0)),
        row("mha", "transfer_kv_per_layer", 16, side(50.0, 49.0, 10.0), side(50.0, 49.0, 12.0)),
    ]
    text = bench.markdown(META, rows)
    assert "| mla | transfer_kv_per_layer_direct_pf_lf | 64 | 8192 | load | 42.70 | 37.10 | "\
        "**0.87×** | 40.00 | 41.00 | 1.02× | 200.0 | 180.0 | 10 | ok / ok |" in text
    assert "3 rows, 0 with a failed check or error" in text
    assert "stream held: NOT MET on 1 of 2 page_first_direct rows (mla "\
        "transfer_kv_per_layer_direct_pf_lf p64 0.87x)" in text
    assert "plain: met on all 2 page_first_direct rows (lowest 1.02x)" in text
    assert "PARTIAL" not in text
    assert "PARTIAL" in bench.markdown(dict(META, complete=False), rows)


def test_failed_check_or_error_counts_and_is_not_met():
    rows = [row("mha", "transfer_kv_all_layer_direct_lf_pf", 64, {"check": "ERROR RuntimeError: x"},
                side(50.0, 50.0, 300.0))]
    text = bench.markdown(META, rows)
    assert "1 rows, 1 with a failed check or error" in text
    assert "| — | 50.00 | — |" in text
    assert "NOT MET on 1 of 1" in text


def test_render_exit_status(tmp_path):
    good = [row("mha", "transfer_kv_per_layer", 16, side(1.0, 1.0, 1.0), side(1.0, 1.0, 1.0))]
    bad = [row("mha", "transfer_kv_per_layer", 16, side(1.0, 1.0, 1.0),
               side(1.0, 1.0, 1.0, check="FAIL (3 elements differ)"))]
    for rows, status in ((good, 0), (bad, 1)):
        path = tmp_path / f"run{status}.json"
        path.write_text(json.dumps({"meta": META, "rows": rows}))
        assert bench.main(["--render", str(path)]) == status


@pytest.mark.parametrize("argv,message", [
    ([], "--sglang-src is required"),
    (["--sglang-src", "x", "--direct-pages", "32"], "32 is not one of 1, 16, 64"),
    (["--sglang-src", "x", "--direct-pages", "a,b"], "not a comma-separated list"),
    (["--sglang-src", "x", "--tokens", "8192", "--pool-slots", "8192"], "at most half"),
    (["--sglang-src", "x", "--page1-tokens", "16384"], "at most --tokens"),
    (["--sglang-src", "x", "--tokens", "1000", "--page1-tokens", "64"], "multiples of 64"),
    (["--sglang-src", "x", "--shapes", "gqa"], "'gqa' is not one of"),
    (["--sglang-src", "x", "--json", "/nonexistent/dir/x.json"], "is not writable"),
    (["--render", "/nonexistent.json"], "no such file"),
    (["--sglang-src", "x", "--variants", "lanes-64,fast"], "'fast' is not one of first-piece-64"),
    (["--sglang-src", "x", "--variant-repeats", "4"], "4 is outside [5, 1000]"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_variants_are_parsed_into_names():
    args = bench.parse_args(["--sglang-src", "x"])
    # The batch splits by default; the all-layer backups' shapes (decided) on request.
    assert args.variants == ["first-piece-64", "whole-batch", "whole-when-busy"]
    assert args.variant_repeats == 5
    assert bench.parse_args(["--sglang-src", "x", "--variants", "none"]).variants == []
    assert bench.parse_args(["--sglang-src", "x", "--variants", "layer-copies,kv-separate"]) \
        .variants == ["layer-copies", "kv-separate"]


def variant(r, name, dma_held=None, dma_plain=None):
    k = dict(r["kvtier"], dma={"copy_ops": 32768, "copies_2d": 0, "batch_calls": 60, "lanes": 4})
    if dma_held is not None:
        k["dma_held"], k["dma_plain"] = dma_held, dma_plain
    return dict(r, variant=name, variant_settings=dict(bench.VARIANTS[name]), kvtier=k)


def test_variants_table_lists_each_shape_beside_sglang_and_says_which_is_never_behind():
    fn = "transfer_kv_all_layer_direct_lf_pf"
    default = row("mha", fn, 1, side(17.3, 3.2, 35000.0), side(15.2, 14.8, 2100.0))
    rows = [
        default,
        variant(row("mha", fn, 1, side(17.0, 3.2, 35000.0), side(27.7, 3.0, 23000.0)),
                "layer-copies"),
        variant(row("mha", fn, 1, side(17.1, 3.1, 35000.0), side(18.0, 14.0, 2000.0)), "lanes-64"),
        row("mha", "transfer_kv_per_layer", 16, side(50.0, 49.0, 10.0), side(50.0, 49.0, 12.0)),
    ]
    text = bench.markdown(META, rows)
    # The main table and its verdict hold the default configuration's rows only.
    assert "2 rows, 0 with a failed check or error" in text
    assert "stream held: NOT MET on 1 of 1 page_first_direct rows (mha "\
        "transfer_kv_all_layer_direct_lf_pf p1 0.88x)" in text
    assert f"| mha | {fn} | 1 | 8192 | default | — | 17.30 | 15.20 | **0.88×** | 3.20 | 14.80 | "\
        "4.62× | 2100.0 | — | — / — | 10 | ok / ok |" in text
    assert f"| mha | {fn} | 1 | 8192 | layer-copies | dma_stride_layers=False | 17.00 | 27.70 | "\
        "1.63× | 3.20 | 3.00 | **0.94×** | 23000.0 | 32768 / 0 / 60 / 4 | — / — | 10 | ok / ok |" \
        in text
    assert "- default: held >= 1.00x on 0 of 1, lowest 0.88x; plain >= 1.00x on 1 of 1, lowest "\
        "4.62x" in text
    assert "- layer-copies: held >= 1.00x on 1 of 1, lowest 1.63x; plain >= 1.00x on 0 of 1" in text
    assert "- lanes-64: held >= 1.00x on 1 of 1, lowest 1.05x; plain >= 1.00x on 1 of 1, lowest "\
        "4.52x -> >= 1.0x on every row" in text
    assert "2 variant rows, 0 with a failed check or error" in text
    assert "Variants" not in bench.markdown(META, rows[:1] + rows[3:])


def test_batch_split_variants_follow_the_loads_and_show_the_held_calls():
    load, sep = bench.LOAD_LABEL, bench.SEPARATE_LABEL
    fn = bench.VARIANT_FUNCTION
    rows = [
        row("mla", load, 64, side(52.5, 30.5, 137.0), side(49.9, 35.1, 187.0)),
        variant(row("mla", load, 64, side(52.4, 30.4, 137.0), side(52.6, 30.6, 180.0)),
                "whole-batch", {"batch_calls": 1, "whole_batch": True}),
        variant(row("mla", load, 64, side(52.3, 30.3, 137.0), side(52.5, 35.0, 185.0)),
                "whole-when-busy", {"batch_calls": 1, "whole_batch": True},
                {"batch_calls": 4, "whole_batch": False}),
        row("mla", fn, 64, side(55.1, 33.4, 15000.0), side(53.4, 51.9, 1020.0), label=sep),
        variant(row("mla", fn, 64, side(55.0, 33.3, 15000.0), side(55.2, 51.8, 1000.0), label=sep),
                "whole-when-busy", {"batch_calls": 4, "whole_batch": True}),
    ]
    text = bench.markdown(META, rows)
    assert "2 rows, 0 with a failed check or error" in text
    assert f"| mla | {load} | 64 | 8192 | whole-batch | dma_batch_split=whole | 52.40 | 52.60 | "\
        "1.00× | 30.40 | 30.60 | 1.01× | 180.0 | 32768 / 0 / 60 / 4 | 1 (whole) / — | 10 | ok / ok |" \
        in text
    assert f"| mla | {sep} | 64 | 8192 | whole-when-busy | dma_batch_split=whole_when_busy | " \
        "55.00 | 55.20 | 1.00× | 33.30 | 51.80 | 1.56× | 1000.0 | 32768 / 0 / 60 / 4 | 4 (whole) / — |"\
        in text
    assert f"| mla | {load} | 64 | 8192 | whole-when-busy | dma_batch_split=whole_when_busy | "\
        "52.30 | 52.50 | 1.00× | 30.30 | 35.00 | 1.16× | 185.0 | 32768 / 0 / 60 / 4 | 1 (whole) / 4 |"\
        in text
    assert "- default: held >= 1.00x on 0 of 2, lowest 0.95x; plain >= 1.00x on 2 of 2" in text
    assert "- whole-batch: held >= 1.00x on 1 of 1, lowest 1.00x; plain >= 1.00x on 1 of 1, "\
        "lowest 1.01x -> >= 1.0x on every row" in text
    assert "- whole-when-busy: held >= 1.00x on 2 of 2, lowest 1.00x; plain >= 1.00x on 2 of 2, "\
        "lowest 1.16x -> >= 1.0x on every row" in text
    assert "3 variant rows, 0 with a failed check or error" in text


def test_a_failed_variant_fails_the_run(tmp_path):
    fn = "transfer_kv_all_layer_direct_lf_pf"
    rows = [row("mla", fn, 16, side(1.0, 1.0, 1.0), side(1.0, 1.0, 1.0)),
            variant(row("mla", fn, 16, side(1.0, 1.0, 1.0),
                        side(None, None, None, check="FAIL (8 elements differ)")), "kv-separate")]
    text = bench.markdown(META, rows)
    assert "1 rows, 0 with a failed check or error" in text
    assert "1 variant rows, 1 with a failed check or error" in text
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"meta": META, "rows": rows}))
    assert bench.main(["--render", str(path)]) == bench.EXIT_FAILED


def test_missing_sglang_files_are_named(tmp_path):
    with pytest.raises(bench.CannotRun) as e:
        bench.sglang_files(str(tmp_path))
    assert "sgl-kernel/csrc/kvcacheio/transfer.cu" in str(e.value)
    assert "sgl-kernel/python/sgl_kernel/kvcacheio.py" in str(e.value)


def test_without_a_gpu_it_cannot_run_and_says_so(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: scripts/sglang_kernels_check.sh runs the bench there")
    assert bench.main(["--sglang-src", str(tmp_path)]) == bench.EXIT_CANNOT_RUN
    assert "CANNOT RUN: needs a GPU" in capsys.readouterr().err


def test_direct_path_text_follows_transfer_cu_tests():
    assert bench.direct_path_text([13000, 13000, 13000, 1]).startswith(
        "cudaMemcpyBatchAsync (v13 signature")
    assert bench.direct_path_text([12090, 12090, 12090, 1]).startswith(
        "cudaMemcpyBatchAsync (v12 signature")
    for info in ([0, 13000, 13000, 1], [13000, 12040, 13000, 1], [13000, 13000, 13000, 0],
                 [13000, 13000, -1, 1]):
        assert bench.direct_path_text(info).startswith("FALLBACK"), info


# ---- the rows' poison and byte checks, on the CPU ---------------------------------------------
# The row builders (direct_rows, kernel_rows) run here on host memory, with kvtier's CPU backend
# standing in on the SGLang side too: what is tested is the bench's own poison / reference / check
# logic (a wrong reference would fail kvtier's correct copy), and that a side writing wrong bytes
# or raising is reported and not timed. CUDA events are replaced by the wall clock and
# torch.cuda.synchronize by nothing (there is no stream); no timing is asserted.

@pytest.fixture
def on_cpu(monkeypatch):
    import time

    import torch

    import compat_host_time as cht

    if not hasattr(torch, "uint64"):  # torch 1.13: kvtier takes int64 address tables too
        monkeypatch.setattr(torch, "uint64", torch.int64, raising=False)
    monkeypatch.setattr(cht, "dev", torch.device("cpu"))
    monkeypatch.setattr(cht.Shape, "host",
                        lambda self, shape: [torch.randn(shape, dtype=cht.DT)
                                             for _ in range(self.nb)])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)

    def wall_ms(call, repeats, hold_ms):
        t0 = time.perf_counter()
        call()
        return max((time.perf_counter() - t0) * 1000, 1e-6)

    monkeypatch.setattr(cht, "gpu_ms", wall_ms)
    args = bench.parse_args(["--sglang-src", "unused", "--tokens", "128", "--pool-slots", "256",
                             "--page1-tokens", "64", "--repeats", "3", "--warmup", "1"])
    return args


def run_rows(args, sglang_side, shapes=("mha", "mla"), pages=(16, 64, 1), kernels=True):
    import numpy as np

    from kvtier.compat import sgl_kernel as kv

    rows = []
    ctx = bench.Context(args, {"complete": False}, sglang_side, kv)
    rng = np.random.default_rng(3)
    for name in shapes:
        pools = bench.Pools(name, args.pool_slots)
        for page in pages:
            bench.direct_rows(ctx, rows, pools, page, rng)
        if kernels:
            bench.kernel_rows(ctx, rows, pools, rng)
    return rows


def test_every_row_checks_every_byte(on_cpu):
    from kvtier.compat import sgl_kernel as kv

    rows = run_rows(on_cpu, kv)
    variants = [r for r in rows if r.get("variant")]
    rows = bench.main_rows(rows)
    # 5 direct rows x 3 pages x 2 shapes, 6 MHA and 4 MLA kernel rows.
    assert len(rows) == 40
    # Each per-layer load and separate-layers backup row (3 pages x 2 shapes) again in each
    # default variant (the batch splits), kvtier's side checked byte for byte; SGLang's side
    # (here kvtier too) reuses its default row's check.
    assert len(variants) == 2 * 3 * 2 * len(bench.DEFAULT_VARIANTS)
    assert {r["label"] for r in variants} == {bench.LOAD_LABEL, bench.SEPARATE_LABEL}
    assert [r for r in variants if not bench.row_ok(r)] == []
    assert all(r["kvtier"]["gbps_held"] > 0 and r["sglang"]["gbps_plain"] > 0 for r in variants)
    assert {r["function"] for r in rows} == set(bench.FUNCTIONS)
    assert [r for r in rows if not bench.row_ok(r)] == []
    assert all(r["sglang"]["gbps_held"] > 0 and r["kvtier"]["gbps_plain"] > 0 for r in rows)
    # kvtier's host time split: the part inside the C++ engine, at most the whole call.
    assert all(0 < r["kvtier"]["engine_us"] <= r["kvtier"]["host_us"] for r in rows)


def test_the_backup_shapes_follow_the_all_layer_backups_on_request(on_cpu):
    from kvtier.compat import sgl_kernel as kv

    on_cpu.variants = list(bench.VARIANTS)
    variants = [r for r in run_rows(on_cpu, kv, pages=(16,), kernels=False) if r.get("variant")]
    for r in variants:
        assert r["label"] in bench.VARIANT_ROWS[r["variant"]], (r["variant"], r["label"])
    shapes = [r for r in variants if r["label"] == bench.BACKUP_LABEL]
    assert len(shapes) == 4 + 3  # MHA, MLA (no kv-separate: one buffer)
    assert "kv-separate" not in {r["variant"] for r in shapes if r["shape"] == "mla"}
    assert len(variants) == len(shapes) + 2 * 2 * len(bench.BATCH_SPLIT_VARIANTS)
    assert [r for r in variants if not bench.row_ok(r)] == []


def test_a_side_that_writes_wrong_bytes_or_raises_is_reported_and_not_timed(on_cpu):
    import types

    from kvtier.compat import sgl_kernel as kv

    def raises(*args):
        raise RuntimeError("transfer failed")

    wrong = types.SimpleNamespace(**{name: getattr(kv, name) for name in bench.FUNCTIONS})
    wrong.transfer_kv_per_layer_direct_pf_lf = lambda *args: None  # writes nothing
    wrong.transfer_kv_all_layer_direct_lf_pf = raises
    rows = run_rows(on_cpu, wrong, shapes=("mla",), pages=(16,), kernels=False)
    by_label = {r["label"]: r for r in rows}
    load = by_label["transfer_kv_per_layer_direct_pf_lf"]
    assert load["sglang"]["check"].startswith("FAIL")
    assert "gbps_held" not in load["sglang"] and load["ratio_held"] is None
    assert load["kvtier"]["check"] == "ok" and load["kvtier"]["gbps_held"] > 0
    backup = by_label["transfer_kv_all_layer_direct_lf_pf"]
    assert backup["sglang"]["check"] == "ERROR RuntimeError: transfer failed"
    assert not bench.row_ok(load) and not bench.row_ok(backup)
    assert bench.row_ok(by_label["transfer_kv_direct (one layer)"])
    assert "NOT MET on 3 of 3" in "\n".join(bench.verdict(rows))


def test_each_variant_reaches_the_engine_for_its_row_only(on_cpu, monkeypatch):
    import numpy as np

    import kvtier.ops
    from kvtier.compat import sgl_kernel as kv

    before = kvtier.ops.engine_config()
    seen = []  # (function, the engine configuration) of each kvtier call of the direct functions

    def recording(name):
        real = getattr(kv, name)

        def call(*args):
            seen.append((name, kvtier.ops.engine_config()))
            return real(*args)
        return call

    names = (bench.LOAD_LABEL, bench.VARIANT_FUNCTION)
    wrapped = types_namespace(kv, **{name: recording(name) for name in names})
    on_cpu.variants = list(bench.VARIANTS)
    rows = []
    ctx = bench.Context(on_cpu, {"complete": False}, kv, wrapped)
    bench.direct_rows(ctx, rows, bench.Pools("mha", on_cpu.pool_slots), 16,
                      np.random.default_rng(5))
    assert kvtier.ops.engine_config() == before  # restored after the last variant
    variants = [r for r in rows if r.get("variant")]
    splits, shapes = list(bench.BATCH_SPLIT_VARIANTS), \
        [v for v in bench.VARIANTS if v not in bench.BATCH_SPLIT_VARIANTS]
    assert [(r["label"], r["variant"]) for r in variants] == \
        [(bench.LOAD_LABEL, v) for v in splits] + [(bench.BACKUP_LABEL, v) for v in shapes] + \
        [(bench.SEPARATE_LABEL, v) for v in splits]
    for r in variants:
        assert r["variant_settings"] == bench.VARIANTS[r["variant"]]
        assert r["repeats"] == on_cpu.variant_repeats
        assert r["sglang"]["check"] == "ok" and r["kvtier"]["check"] == "ok"
    keys = sorted({k for settings in bench.VARIANTS.values() for k in settings})
    defaults = {k: before[k] for k in keys}
    assert defaults == {f["name"]: f["default"] for f in kvtier.ops.config_fields()
                        if f["name"] in keys}  # the rows without a variant ran the defaults
    configs = {name: [{k: c[k] for k in keys} for n, c in seen if n == name] for name in names}
    # Every kvtier call of a variant row saw exactly its settings on top of the defaults.
    for name in splits:
        assert dict(defaults, **bench.VARIANTS[name]) in configs[bench.LOAD_LABEL], name
        assert dict(defaults, **bench.VARIANTS[name]) in configs[bench.VARIANT_FUNCTION], name
    for name in shapes:
        assert dict(defaults, **bench.VARIANTS[name]) in configs[bench.VARIANT_FUNCTION], name
        assert dict(defaults, **bench.VARIANTS[name]) not in configs[bench.LOAD_LABEL], name
    allowed = [defaults] + [dict(defaults, **v) for v in bench.VARIANTS.values()]
    assert all(c in allowed for cs in configs.values() for c in cs)
    assert sum(c == defaults for c in configs[bench.LOAD_LABEL]) >= 3  # the default row's calls


def types_namespace(module, **overrides):
    import types

    names = {name: getattr(module, name) for name in bench.FUNCTIONS}
    names.update(overrides)
    return types.SimpleNamespace(**names)
