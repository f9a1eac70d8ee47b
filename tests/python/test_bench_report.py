"""The benchmark report generator on the recorded results of the last GPU run (CI): it must run,
draw a plot per family, and reproduce the committed BENCHMARKS.md exactly, so that no number
there was typed by hand."""

import json
import os
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
import bench_report  # noqa: E402


def test_report_reproduces_benchmarks_md(tmp_path):
    with open(os.path.join(ROOT, "benches", "results", "latest.json")) as f:
        results = json.load(f)
    text = bench_report.render(results, str(tmp_path), "benches/plots")
    with open(os.path.join(ROOT, "BENCHMARKS.md")) as f:
        committed = f.read()
    assert text == committed, "BENCHMARKS.md differs from the generator's output: regenerate it with python/bench_report.py"
    families = {m["family"] for m in results["meta"]} - {"ceilings", "host_cost"}
    for family in families:
        assert f"## {family}" in text
        assert (tmp_path / f"{family}.png").stat().st_size > 1000
    assert results["gpu"] in text and results["date"] in text


def test_ceiling_and_ratios_follow_the_data():
    results = {
        "date": "d", "gpu": "G", "driver": "1", "torch": "t", "command": "c",
        "criterion": [{"id": "ceilings/copy", "median_ns": 1000.0}, {"id": "fam/k", "median_ns": 2000.0}],
        "meta": [
            {"family": "ceilings", "id": "ceilings/copy", "implementation": "copy", "shape": "s", "dtype": "u8", "bytes": 4_000_000, "flops": 0, "workspace_bytes": 0},
            {"family": "rmsnorm", "id": "fam/k", "implementation": "dlkern", "shape": "8x8", "dtype": "f16", "bytes": 2_000_000, "flops": 0, "workspace_bytes": 0},
        ],
        "comparison": [
            {"family": "rmsnorm", "implementation": "dlkern", "shape": "8x8", "dtype": "f16", "time_us": 1.0, "bytes": 2_000_000, "flops": 0},
            {"family": "rmsnorm", "implementation": "base", "shape": "8x8", "dtype": "f16", "time_us": 3.0, "bytes": 2_000_000, "flops": 0},
        ],
    }
    assert abs(bench_report.ceiling_tbps(results) - 4.0) < 1e-9
    # A read-only ceiling, faster per byte than the copy, is listed but is not the ceiling.
    results["criterion"].append({"id": "ceilings/stream_read_serialized/w4", "median_ns": 100.0})
    results["meta"].append({"family": "ceilings", "id": "ceilings/stream_read_serialized/w4", "implementation": "probe_stream_read (plain launches)", "shape": "w4", "dtype": "u8", "bytes": 4_000_000, "flops": 0, "workspace_bytes": 0})
    assert abs(bench_report.ceiling_tbps(results) - 4.0) < 1e-9
    text = bench_report.render(results)
    assert "| u8 w4 | probe_stream_read (plain launches) | 0.10 us |" in text, text
    row = [l for l in text.splitlines() if l.startswith("| f16 | 8x8")][0]
    assert "| base | 3.00 us | 3.00 |" in row and "2.00 TB/s" in row and "50%" in row, row


def test_other_dlkern_variants_get_their_own_rows():
    meta = lambda impl, i: {"family": "matmul_w8a8", "id": f"m/{i}", "implementation": impl, "shape": "M1", "dtype": "int8", "bytes": 1_000_000, "flops": 0, "workspace_bytes": 0}
    results = {
        "date": "d", "gpu": "G", "driver": "1", "torch": "t", "command": "c",
        "criterion": [{"id": "m/a", "median_ns": 2000.0}, {"id": "m/b", "median_ns": 1000.0}, {"id": "m/c", "median_ns": 4000.0}],
        "meta": [meta("dlkern", "a"), meta("dlkern packed W", "b"), meta("cuBLAS", "c")],
        "comparison": [],
    }
    lines = bench_report.render(results).splitlines()
    plain = [l for l in lines if l.startswith("| int8 | M1 |")]
    packed = [l for l in lines if l.startswith("| int8 | M1 (packed W) |")]
    assert len(plain) == 1 and "| cuBLAS (criterion) | 4.00 us | 2.00 |" in plain[0], plain
    assert len(packed) == 1 and "| 1.00 us | n/a | cuBLAS (criterion) | 4.00 us | 4.00 |" in packed[0], packed


def test_c_abi_column_shows_device_and_host_time_per_call():
    """The C ABI column: the graph replay's device time and the host time per call where the record
    has both, the device time alone where it has no host time, n/a where there is none; a variant's
    row takes the C ABI record of its variant, which gets no row of its own. The ratio divides by the
    C ABI's device time."""
    meta = lambda impl, i, shape: {"family": "matmul_w8a8", "id": f"m/{i}", "implementation": impl, "shape": shape,
                                   "dtype": "int8", "bytes": 1_000_000, "flops": 0, "workspace_bytes": 0}
    abi = lambda impl, shape, **host: dict({"family": "matmul_w8a8", "implementation": impl, "shape": shape,
                                            "dtype": "int8", "time_us": 1.5, "bytes": 1_000_000, "flops": 0}, **host)
    shapes = ("M1", "M2", "M3")
    results = {
        "date": "d", "gpu": "G", "driver": "1", "torch": "t", "command": "c",
        "criterion": [{"id": f"m/{s}", "median_ns": 2000.0} for s in shapes]
                     + [{"id": f"m/base{s}", "median_ns": 3000.0} for s in shapes] + [{"id": "m/packed", "median_ns": 1000.0}],
        "meta": [meta("dlkern", s, s) for s in shapes] + [meta("cuBLAS", f"base{s}", s) for s in shapes]
                + [meta("dlkern packed W", "packed", "M1")],
        "comparison": [abi("dlkern", "M1", host_us=9.85), abi("dlkern", "M2"), abi("dlkern packed W", "M1", host_us=8.5)],
    }
    text = bench_report.render(results)
    assert "| dtype | shape | dlkern (criterion) | dlkern C ABI (graph / host per call) | baseline |" in text
    row = lambda shape: [l for l in text.splitlines() if l.startswith(f"| int8 | {shape} |")]
    assert row("M1") == [row("M1")[0]] and "| 2.00 us | 1.50 / 9.85 us | cuBLAS (criterion) | 3.00 us | 2.00 |" in row("M1")[0]
    assert "| 2.00 us | 1.50 us | cuBLAS (criterion) | 3.00 us | 2.00 |" in row("M2")[0], row("M2")
    assert "| 2.00 us | n/a | cuBLAS (criterion) | 3.00 us | 1.50 |" in row("M3")[0], row("M3")
    packed = row("M1 (packed W)")
    assert len(packed) == 1 and "| 1.00 us | 1.50 / 8.50 us | cuBLAS (criterion) | 3.00 us | 2.00 |" in packed[0], packed


def test_matmul_nbits_ratio_is_against_its_issue_baseline():
    """W4A16's issue sets cuBLAS f16 as the bar: the ratio uses it even where another baseline
    (PyTorch's own W4A16 kernel) is faster, which is then listed among the others."""
    meta = lambda impl, i: {"family": "matmul_nbits", "id": f"w/{i}", "implementation": impl, "shape": "M1", "dtype": "f16", "bytes": 1_000_000, "flops": 0, "workspace_bytes": 0}
    results = {
        "date": "d", "gpu": "G", "driver": "1", "torch": "t", "command": "c",
        "criterion": [{"id": "w/a", "median_ns": 1000.0}, {"id": "w/b", "median_ns": 3000.0}],
        "meta": [meta("dlkern", "a"), meta("cuBLAS f16", "b")],
        "comparison": [{"family": "matmul_nbits", "implementation": "int4 kernel", "shape": "M1", "dtype": "f16", "time_us": 2.0, "bytes": 1_000_000, "flops": 0}],
    }
    row = [l for l in bench_report.render(results).splitlines() if l.startswith("| f16 | M1 |")][0]
    assert "| cuBLAS f16 (criterion) | 3.00 us | 3.00 |" in row and "| int4 kernel 2.00 us |" in row, row


def test_host_cost_rows_get_their_own_table():
    results = {
        "date": "d", "gpu": "G", "driver": "1", "torch": "t", "command": "c",
        "criterion": [{"id": "host_cost/registry call x", "median_ns": 5230.0}],
        "meta": [{"family": "host_cost", "id": "host_cost/registry call x", "implementation": "dlkern", "shape": "",
                  "dtype": "", "bytes": 0, "flops": 0, "workspace_bytes": 0}],
        "comparison": [],
    }
    lines = bench_report.render_host_cost(results)
    assert "| registry call x | 5.23 us |" in lines
    text = bench_report.render(results, None, None)
    assert "| registry call x | 5.23 us |" in text and "## host_cost" not in text


def test_ort_host_rows_get_their_own_table_and_stay_out_of_the_comparison():
    host = {"op": "MatMulNBits", "case": "M 1", "nodes": 17, "kind": "host", "ort_run_us": 30.0, "ort_host_us": 4.25,
            "dlkern_run_us": 40.0, "dlkern_host_us": 9.5}
    failed = {"op": "GroupQueryAttention", "case": "decode", "nodes": 17, "kind": "host", "dlkern_error": "boom"}
    node = {"op": "MatMulNBits", "case": "M 1 node", "ort_sync_us": 20.0, "ort_device_us": 10.0,
            "dlkern_sync_us": 25.0, "dlkern_device_us": 8.0, "bytes": 8_000_000}
    results = {"date": "d", "gpu": "G", "driver": "1", "torch": "t", "command": "c", "criterion": [], "meta": [],
               "comparison": [], "ort_comparison": [host, failed, node]}
    text = bench_report.render(results, None, None)
    host_table = text[text.index("## Host time per ORT node"):]
    assert "| MatMulNBits | M 1 | 17 | 4.25 us | 9.50 us | 30.0 us | 40.0 us |" in host_table
    assert "| GroupQueryAttention | decode | 17 | boom |" in host_table
    comparison = text[text.index("## ORT drop-ins"):text.index("## Host time per ORT node")]
    assert "| MatMulNBits | M 1 node |" in comparison and "| M 1 |" not in comparison


def test_ort_gpu_columns_take_the_busy_time_and_mark_summed_durations():
    old = {"op": "MatMulNBits", "case": "old", "ort_sync_us": 20.0, "ort_device_us": 10.0,
           "dlkern_sync_us": 25.0, "dlkern_device_us": 8.0, "bytes": 8_000_000}
    new = dict(old, case="new", ort_busy_us=9.0, dlkern_busy_us=4.0)
    results = {"date": "d", "gpu": "G", "driver": "1", "torch": "t", "command": "c", "criterion": [], "meta": [],
               "comparison": [], "ort_comparison": [old, new]}
    text = bench_report.render(results, None, None)
    assert "| MatMulNBits | old | 20.0 us | 10.0 us* | 25.0 us | 8.0 us* | 0.80 | 1.25 | 1.00 TB/s |" in text
    assert "| MatMulNBits | new | 20.0 us | 9.0 us | 25.0 us | 4.0 us | 0.80 | 2.25 | 2.00 TB/s |" in text


def test_matmul_nbits_rows_with_cublas_get_their_own_table():
    row = {"op": "MatMulNBits", "case": "M 2048, o 4096 x 4096, block 32 sym", "ort_sync_us": 120.0,
           "ort_device_us": 112.0, "ort_busy_us": 110.0, "dlkern_sync_us": 100.0, "dlkern_device_us": 101.0,
           "dlkern_busy_us": 100.0, "cublas_us": 95.0, "bytes": 9_437_184, "flops": 2 * 2048 * 4096 * 4096}
    failed = {"op": "MatMulNBits", "case": "M 1, up 14336 x 4096, block 16 zp", "ort_error": "refused",
              "cublas_us": 20.0}
    gqa = {"op": "GroupQueryAttention", "case": "decode", "ort_sync_us": 20.0, "ort_device_us": 10.0,
           "dlkern_sync_us": 25.0, "dlkern_device_us": 8.0, "kv_bytes": 8_000_000}
    results = {"date": "d", "gpu": "G", "driver": "1", "torch": "t", "command": "c", "criterion": [], "meta": [],
               "comparison": [], "ort_comparison": [gqa, row, failed]}
    text = bench_report.render(results, None, None)
    table = text[text.index("## MatMulNBits against onnxruntime-gpu's own node and cuBLAS f16"):]
    assert ("| M 2048, o 4096 x 4096, block 32 sym | 120.0 us | 110.0 us | 100.0 us | 100.0 us | 1.20 | 1.10 | "
            "95.0 us | 0.95 | 687 TFLOP/s |") in table
    assert "| M 1, up 14336 x 4096, block 16 zp | refused |" in table
    nodes = text[text.index("## ORT drop-ins"):text.index("## MatMulNBits against")]
    assert "| GroupQueryAttention | decode |" in nodes and "block 32 sym" not in nodes


def test_busy_time_counts_overlapping_kernels_once():
    sys.path.insert(0, os.path.join(ROOT, "benches"))
    from cupti import busy_time

    assert busy_time([]) == 0
    # A dependent launched under the kernel ahead of it; a gap; one kernel inside another.
    assert busy_time([(10, 20), (0, 12), (30, 40), (32, 35)]) == 30
    assert busy_time([(0, 5), (5, 7)]) == 7


def test_a_partial_run_replaces_only_the_rows_it_measured():
    import merge_results

    base = {"date": "d1", "gpu": "G", "driver": "1", "torch": "t", "command": "full", "e2e": {"rows": 1},
            "criterion": [{"id": "a/x", "median_ns": 1.0}, {"id": "host_cost/y", "median_ns": 2.0}],
            "meta": [{"id": "a/x", "family": "a"}, {"id": "host_cost/y", "family": "host_cost"}],
            "comparison": [{"family": "a", "implementation": "i", "shape": "s", "dtype": "f16", "time_us": 1.0}],
            "ort_comparison": [{"op": "MatMulNBits", "case": "M 1"}, {"op": "MatMulNBits", "case": "M 16"},
                               {"op": "SkipSimplifiedLayerNormalization", "case": "n"}]}
    part = {"date": "d2", "gpu": "G", "driver": "2", "torch": "t", "command": "part", "e2e": {},
            "criterion": [{"id": "host_cost/y", "median_ns": 3.0}, {"id": "host_cost/z", "median_ns": 4.0}],
            "meta": [{"id": "host_cost/y", "family": "host_cost"}, {"id": "host_cost/z", "family": "host_cost"}],
            "comparison": [],
            "ort_comparison": [{"op": "MatMulNBits", "case": "M 1"},
                               {"op": "MatMulNBits", "case": "host", "kind": "host"}]}
    merged = merge_results.merge(base, part, "host rows")
    assert {r["id"]: r["median_ns"] for r in merged["criterion"]} == {"a/x": 1.0, "host_cost/y": 3.0, "host_cost/z": 4.0}
    assert sorted(r["id"] for r in merged["meta"]) == ["a/x", "host_cost/y", "host_cost/z"]
    assert merged["comparison"] == base["comparison"] and merged["e2e"] == {"rows": 1}
    # The op the partial run measured loses its old rows (M 16 too); the others keep theirs.
    assert [(r["op"], r["case"]) for r in merged["ort_comparison"]] == [
        ("SkipSimplifiedLayerNormalization", "n"), ("MatMulNBits", "M 1"), ("MatMulNBits", "host")]
    assert merged["date"] == "d2" and merged["command"] == "full; then on d2 (host rows): part"
    import pytest
    with pytest.raises(ValueError, match="different GPUs"):
        merge_results.merge(base, dict(part, gpu="H"), "x")
    # By case: only the cases measured again lose their old rows.
    merged = merge_results.merge(base, part, "M 1 again", by_case=True)
    assert [(r["op"], r["case"]) for r in merged["ort_comparison"]] == [
        ("MatMulNBits", "M 16"), ("SkipSimplifiedLayerNormalization", "n"), ("MatMulNBits", "M 1"),
        ("MatMulNBits", "host")]


def test_a_run_on_another_gpu_is_kept_whole_under_its_own_header():
    import merge_results

    base = {"date": "d1", "gpu": "H200", "driver": "1", "torch": "t", "command": "full", "criterion": [], "meta": [],
            "comparison": [], "ort_comparison": [{"op": "MatMulNBits", "case": "M 1 main", "ort_sync_us": 9.0,
                                                   "ort_device_us": 7.0, "dlkern_sync_us": 8.0, "dlkern_device_us": 6.0,
                                                   "bytes": 1_000_000}]}
    part = {"date": "d2", "gpu": "H100", "driver": "2", "torch": "t", "command": "part", "e2e": {},
            "criterion": [{"id": "host_cost/call x", "median_ns": 3210.0}],
            "meta": [{"id": "host_cost/call x", "family": "host_cost"}], "comparison": [],
            "ort_comparison": [{"op": "MatMulNBits", "case": "M 1", "nodes": 17, "kind": "host", "ort_run_us": 30.0,
                                "ort_host_us": 3.5, "dlkern_run_us": 31.0, "dlkern_host_us": 4.5}]}
    merged = merge_results.add_supplement(base, part, "host cost")
    # The same GPU and day again: its rows take the repeated ones' places, the others stay.
    again = dict(part, command="again", criterion=[{"id": "host_cost/call x", "median_ns": 3210.0},
                                                   {"id": "host_cost/call y", "median_ns": 1.0}], ort_comparison=[])
    merged = merge_results.add_supplement(merged, again, "more host cost")
    assert merged["date"] == "d1" and merged["ort_comparison"] == base["ort_comparison"]
    [supplement] = merged["supplements"]
    assert supplement["command"] == "part; then on d2 (more host cost): again"
    assert supplement["note"] == "host cost; more host cost"
    assert [r["id"] for r in supplement["criterion"]] == ["host_cost/call x", "host_cost/call y"]
    assert len(supplement["ort_comparison"]) == 1
    text = bench_report.render(merged)
    head, tail = text.split("## Later partial run: d2, H100")
    assert "- later partial run: d2 on H100 (host cost; more host cost), at the end" in head and "M 1 main" in head
    assert "### Host time per call" in tail and "| call x | 3.21 us |" in tail
    assert "### Host time per ORT node" in tail and "| 3.50 us | 4.50 us |" in tail and "M 1 main" not in tail


def test_a_later_supplement_from_the_same_gpu_supersedes_the_rows_it_measured_again():
    import merge_results

    base = {"date": "d1", "gpu": "H200", "driver": "1", "torch": "t", "command": "full", "criterion": [], "meta": [],
            "comparison": []}
    row = lambda i: {"id": i, "median_ns": 1.0}
    day1 = {"date": "d1", "gpu": "H100", "driver": "2", "torch": "t", "command": "one", "e2e": {"rows": 1},
            "criterion": [row("host_cost/a"), row("attention/b")], "meta": [], "comparison": [],
            "ort_comparison": [{"op": "MatMulNBits", "case": "M 1", "kind": "host"}]}
    day2 = {"date": "d2", "gpu": "H100", "driver": "2", "torch": "t", "command": "two", "e2e": {},
            "criterion": [row("host_cost/a")], "meta": [], "comparison": [],
            "ort_comparison": [{"op": "MatMulNBits", "case": "M 1", "kind": "host"}]}
    merged = merge_results.add_supplement(merge_results.add_supplement(base, day1, "first"), day2, "second")
    first, second = merged["supplements"]
    assert [r["id"] for r in first["criterion"]] == ["attention/b"] and first["ort_comparison"] == []
    assert first["e2e"] == {"rows": 1} and second["command"] == "two"
    # A supplement left with nothing goes.
    day3 = dict(day2, date="d3", criterion=[row("attention/b")], e2e={"rows": 2})
    merged = merge_results.add_supplement(merged, day3, "third")
    assert [s["date"] for s in merged["supplements"]] == ["d2", "d3"]


def test_a_supplement_renders_its_family_tables_against_its_own_ceilings():
    """A partial run on another GPU that timed a kernel family (attention against SDPA and
    cuBLAS's dense rate) shows that table under its own header, divided by its own ceiling."""
    import merge_results

    base = {"date": "d1", "gpu": "H200", "driver": "1", "torch": "t", "command": "full", "criterion": [], "meta": [],
            "comparison": []}
    meta = lambda family, impl, i, shape, flops: {"family": family, "id": i, "implementation": impl, "shape": shape,
                                                  "dtype": "f16", "bytes": 1_000_000, "flops": flops, "workspace_bytes": 0}
    part = {"date": "d2", "gpu": "H100", "driver": "2", "torch": "t", "command": "part",
            "criterion": [{"id": "ceilings/cublas_gemm_f16/8192x8192x8192", "median_ns": 2_000_000.0},
                          {"id": "attention/a", "median_ns": 1_000_000.0}, {"id": "attention/b", "median_ns": 2_000_000.0}],
            "meta": [meta("ceilings", "cuBLAS", "ceilings/cublas_gemm_f16/8192x8192x8192", "8192x8192x8192", 2 * 8192 ** 3),
                     meta("attention", "dlkern", "attention/a", "B1", 400_000_000_000),
                     meta("attention", "dlkern mma.sync", "attention/b", "B1", 400_000_000_000)],
            "comparison": [{"family": "attention", "implementation": "SDPA cuDNN", "shape": "B1", "dtype": "f16",
                            "time_us": 800.0, "bytes": 1_000_000, "flops": 400_000_000_000}]}
    text = bench_report.render(merge_results.add_supplement(base, part, "attention"))
    head, tail = text.split("## Later partial run: d2, H100")
    assert "## attention" not in head and "### Measured ceilings" in tail and "549.8 TFLOP/s" in tail
    rows = [l for l in tail.splitlines() if l.startswith("| f16 | B1")]
    assert len(rows) == 2 and "| SDPA cuDNN | 800.00 us | 0.80 |" in rows[0] and "73%" in rows[0], rows
    assert "(mma.sync)" in rows[1] and "| 0.40 |" in rows[1], rows


def test_attention_and_decode_divide_by_their_own_ceilings():
    """Attention's "% of ceiling" is its FLOP rate over cuBLAS's dense rate of the same dtype;
    decode's is its KV-read rate over the read-only stream rate at 1 GiB; without those rows,
    the copy rate (as before)."""
    ceiling = lambda cid, impl, shape, dtype, nbytes, flops: (
        {"id": cid, "median_ns": 1000.0},
        {"family": "ceilings", "id": cid, "implementation": impl, "shape": shape, "dtype": dtype, "bytes": nbytes, "flops": flops, "workspace_bytes": 0},
    )
    rows = [
        ceiling("ceilings/copy", "copy", "s", "u8", 4_000_000, 0),  # 4 TB/s
        ceiling("ceilings/gemm_f16", "cuBLAS", "8192x8192x8192", "f16", 0, 500_000_000),  # 500 TFLOP/s
        ceiling("ceilings/gemm_bf16", "cuBLAS", "8192x8192x8192", "bf16", 0, 400_000_000),
        ceiling("ceilings/stream_read_serialized/decode_kv_1g", "probe_stream_read (plain launches)", "1 GiB", "u8", 5_000_000, 0),
    ]
    kernel = lambda cid, family, shape, dtype, nbytes, flops: (
        {"id": cid, "median_ns": 2000.0},
        {"family": family, "id": cid, "implementation": "dlkern", "shape": shape, "dtype": dtype, "bytes": nbytes, "flops": flops, "workspace_bytes": 0},
    )
    rows += [
        kernel("attention/a", "attention", "S1", "f16", 1_000_000, 500_000_000),  # 250 TFLOP/s: 50% of f16
        kernel("attention/b", "attention", "S1", "bf16", 1_000_000, 500_000_000),  # 250 of 400: 62%
        kernel("paged_attention/p", "paged_attention", "B1", "f16", 4_000_000, 1),  # 2 TB/s of 5: 40%
        kernel("rmsnorm/r", "rmsnorm", "8x8", "f16", 4_000_000, 1),  # 2 TB/s of the 4 TB/s copy: 50%
    ]
    results = {"date": "d", "gpu": "G", "driver": "1", "torch": "t", "command": "c",
               "criterion": [c for c, _ in rows], "meta": [m for _, m in rows], "comparison": []}
    text = bench_report.render(results)
    row = lambda prefix: [l for l in text.splitlines() if l.startswith(prefix)][0]
    assert "| 50% |" in row("| f16 | S1 |") and "| 62% |" in row("| bf16 | S1 |")
    assert "| 40% |" in row("| f16 | B1 |") and "| 50% |" in row("| f16 | 8x8 |")
    assert "cuBLAS's dense rate" in text and "read-only stream rate at 1 GiB in this run (5.00 TB/s)" in text
    # Without the 1 GiB read row, decode falls back to the copy rate: 2 of 4 TB/s.
    results["criterion"] = [c for c in results["criterion"] if "decode_kv" not in c["id"]]
    assert "| 50% |" in [l for l in bench_report.render(results).splitlines() if l.startswith("| f16 | B1 |")][0]


def test_compute_bound_rows_of_memory_bound_families_report_flops():
    """W4A16 at large M does hundreds of FLOPs per byte: its row reports TFLOP/s and divides by
    cuBLAS's dense rate of the run, while a decode-sized row of the same family stays in bytes
    over the copy rate; ORT's node rows follow the same rule."""
    ceiling = lambda cid, dtype, nbytes, flops: (
        {"id": cid, "median_ns": 1000.0},
        {"family": "ceilings", "id": cid, "implementation": "x", "shape": "8192x8192x8192" if flops else "s", "dtype": dtype, "bytes": nbytes, "flops": flops, "workspace_bytes": 0},
    )
    kernel = lambda cid, shape, nbytes, flops: (
        {"id": cid, "median_ns": 2000.0},
        {"family": "matmul_nbits", "id": cid, "implementation": "dlkern", "shape": shape, "dtype": "f16", "bytes": nbytes, "flops": flops, "workspace_bytes": 0},
    )
    rows = [
        ceiling("ceilings/copy", "u8", 4_000_000, 0),  # 4 TB/s
        ceiling("ceilings/gemm_f16", "f16", 0, 500_000_000),  # 500 TFLOP/s
        kernel("w/big", "M2048", 1_000_000, 500_000_000),  # 500 FLOPs per byte: 250 TFLOP/s, 50%
        kernel("w/small", "M1", 4_000_000, 8_000_000),  # 2 per byte: 2 TB/s, 50% of the copy
    ]
    results = {"date": "d", "gpu": "G", "driver": "1", "torch": "t", "command": "c",
               "criterion": [c for c, _ in rows], "meta": [m for _, m in rows], "comparison": []}
    text = bench_report.render(results)
    row = lambda prefix: [l for l in text.splitlines() if l.startswith(prefix)][0]
    assert "| 250.0 TFLOP/s | 50% |" in row("| f16 | M2048 |"), row("| f16 | M2048 |")
    assert "| 2.00 TB/s | 50% |" in row("| f16 | M1 |"), row("| f16 | M1 |")
    node = lambda case, flops: {"op": "MatMulNBits", "case": case, "ort_sync_us": 2.0, "ort_device_us": 2.0,
                                "dlkern_sync_us": 1.0, "dlkern_device_us": 1.0, "bytes": 1_000_000, "flops": flops}
    lines = bench_report.render_ort([node("M 2048", 500_000_000), node("M 1", 2_000_000)])
    assert [l for l in lines if "| M 2048 |" in l][0].endswith("| 500 TFLOP/s |")
    assert [l for l in lines if "| M 1 |" in l][0].endswith("| 1.00 TB/s |")
    # Records of runs before compare_ort.py recorded FLOPs: from the case's M, N and K.
    old = {"op": "MatMulNBits", "case": "M 2048, o 4096 x 4096, block 32 sym", "ort_sync_us": 2.0, "ort_device_us": 2.0,
           "dlkern_sync_us": 1.0, "dlkern_device_us": 100.0, "bytes": 9_437_184}
    assert bench_report.render_ort([old])[-2].endswith("| 687 TFLOP/s |"), bench_report.render_ort([old])[-2]
