"""Generates BENCHMARKS.md and one PNG plot per kernel family from a results.json gathered on the
GPU host by scripts/gpu-bench.sh. Numbers in README/BENCHMARKS.md come only from here.

    python python/bench_report.py benches/results/latest.json --out BENCHMARKS.md --plots benches/plots
"""

import argparse
import collections
import json
import os
import re


def ceiling_tbps(results):
    """The measured device-to-device copy bandwidth (read + written), the memory ceiling (the
    read-only ceilings, `ceilings/stream_read_*`, are listed beside it, not used for it)."""
    meta = {m["id"]: m for m in results["meta"]}
    best = 0.0
    for c in results["criterion"]:
        m = meta.get(c["id"])
        if m and m["family"] == "ceilings" and not m["flops"] and c["id"].startswith("ceilings/copy"):
            best = max(best, m["bytes"] / c["median_ns"] / 1e3)
    return best


def dense_tflops(results, dtype):
    """cuBLAS's dense rate for `dtype` at 8192^3 in the same run (the tensor cores' ceiling), or
    None when the run has no such row."""
    meta = {m["id"]: m for m in results["meta"]}
    for c in results["criterion"]:
        m = meta.get(c["id"])
        if m and m["family"] == "ceilings" and m["flops"] and m["dtype"] == dtype and m["shape"] == "8192x8192x8192":
            return m["flops"] / c["median_ns"] / 1e3
    return None


def read_ceiling_tbps(results, name):
    """The read-only stream rate (`probe_stream_read`, plain launches) of the ceiling `name`
    measured in the same run, or None."""
    meta = {m["id"]: m for m in results["meta"]}
    for c in results["criterion"]:
        m = meta.get(c["id"])
        if m and c["id"] == f"ceilings/stream_read_serialized/{name}":
            return m["bytes"] / c["median_ns"] / 1e3
    return None


def family_ceiling(results, family, copy):
    """What a family's "% of ceiling" divides by: (a function of the row's dtype giving the
    ceiling and its unit, the note under the family's heading, or None for the copy rate).
    Attention (compute bound) divides its FLOP rate by cuBLAS's dense rate of the same dtype;
    decode divides its KV-read rate by the read-only stream rate at 1 GiB where the run has it;
    every other family its bytes moved by the copy rate, except on compute-bound rows
    (`compute_bound`), which divide their FLOP rate by the dense rate like attention (the
    function takes the row's record too)."""
    rates = {d: r for d in ("f16", "bf16") if (r := dense_tflops(results, d))}
    dense_note = ("dlkern's TFLOP/s over cuBLAS's dense rate of the same dtype at 8192^3 in this run ("
                  + ", ".join(f"{d} {r:.1f} TFLOP/s" for d, r in rates.items()) + ")")
    if family == "attention" and rates:
        return (lambda dtype, rec: (rates.get(dtype), "flops")), f"% of ceiling: {dense_note}."
    if family == "paged_attention":
        read = read_ceiling_tbps(results, "decode_kv_1g")
        if read:
            note = f"% of ceiling: KV bytes read per second over the read-only stream rate at 1 GiB in this run ({read:.2f} TB/s)."
            return (lambda dtype, rec: (read, "bytes")), note
    if family in MEMORY_BOUND and rates:
        def ceiling_of(dtype, rec):
            if compute_bound(rec["flops"], rec["bytes"]):
                return rates.get(dtype), "flops"
            return copy, "bytes"
        note = (f"% of ceiling: bytes moved over the copy rate; on rows above {COMPUTE_BOUND_FLOPS_PER_BYTE} FLOPs "
                f"per byte (compute bound), {dense_note}.")
        return ceiling_of, note
    return (lambda dtype, rec: (copy, "bytes")), None


def rows_by_family(results):
    """(family, dtype, shape) -> {implementation: record} from criterion runs and the PyTorch
    comparison (which also times dlkern, through the C ABI)."""
    meta = {m["id"]: m for m in results["meta"]}
    table = collections.defaultdict(dict)
    for c in results["criterion"]:
        m = meta.get(c["id"])
        if not m or m["family"] in ("ceilings", "host_cost"):
            continue
        key = (m["family"], m["dtype"], m["shape"])
        table[key][m["implementation"] + " (criterion)"] = dict(m, time_us=c["median_ns"] / 1e3)
    for r in results["comparison"]:
        table[(r["family"], r["dtype"], r["shape"])][r["implementation"]] = r
    return table


# Variants that left main (issue 37: the planner never chose them), with the numbers of the last
# run that measured them; appended to the report so that their numbers stay in BENCHMARKS.md.
PRUNED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benches", "pruned.md")

# Families bound by memory traffic: their rate is bytes per second, except on rows that do more
# than COMPUTE_BOUND_FLOPS_PER_BYTE (W4 matmuls at large M): those report FLOPs per second.
MEMORY_BOUND = {"rmsnorm", "paged_attention", "matmul_nbits"}

# Above this many FLOPs per byte moved a row is bound by the tensor cores, not by memory: about
# the ratio of the dense f16 rate to the copy rate on the H100 and H200 (750-790 TFLOP/s over
# 3.1-4.2 TB/s: 185-240).
COMPUTE_BOUND_FLOPS_PER_BYTE = 200


def compute_bound(flops, nbytes):
    return bool(flops) and flops > COMPUTE_BOUND_FLOPS_PER_BYTE * max(nbytes, 1)

# Families whose issue names the baseline of their ratio; elsewhere it is the fastest baseline.
RATIO_BASELINE = {"matmul_nbits": "cuBLAS f16 (criterion)"}


def fmt_rate(rec):
    if rec["flops"] and (rec.get("family") not in MEMORY_BOUND or compute_bound(rec["flops"], rec["bytes"])):
        return f"{rec['flops'] / rec['time_us'] / 1e6:.1f} TFLOP/s"
    return f"{rec['bytes'] / rec['time_us'] / 1e6:.2f} TB/s"


def c_abi_cell(rec):
    """The C ABI column's cell: device time per call from graph replay, then the host time per call
    where the record has it."""
    if not rec:
        return "n/a"
    if rec.get("host_us") is None:
        return f"{rec['time_us']:.2f} us"
    return f"{rec['time_us']:.2f} / {rec['host_us']:.2f} us"


def render_host_cost(results):
    """Host time per call of the launch path (`benches/host_cost.rs`), when the run has it."""
    meta = {m["id"]: m for m in results["meta"]}
    rows = [c for c in results["criterion"] if meta.get(c["id"], {}).get("family") == "host_cost"]
    if not rows:
        return []
    lines = [
        "## Host time per call",
        "",
        "`benches/host_cost.rs`: what one call costs the calling thread (host clock, the stream",
        "synchronized outside the timed calls so that the launch queue never blocks a call).",
        "",
        "| what | host time per call |",
        "| --- | --- |",
    ]
    for c in rows:
        lines.append(f"| {c['id'].removeprefix('host_cost/')} | {c['median_ns'] / 1e3:.2f} us |")
    return lines + [""]


def render_ort_host(records):
    """Host time per ORT node, ORT's own kernels beside dlkern's (`benches/compare_ort.py`,
    records of kind "host")."""
    rows = [r for r in records if r.get("kind") == "host"]
    if not rows:
        return []
    lines = [
        "## Host time per ORT node",
        "",
        "`benches/compare_ort.py` (`host_cost`): sessions of 1 and of N side-by-side decode-sized nodes",
        "of one op on the CUDA EP, run without ORT's end-of-run synchronization, the device synchronized",
        "outside the timing; per node = (time of the N-node run - time of the 1-node run) / (N - 1):",
        "what a node costs the calling thread, ORT's own work for it included.",
        "",
        "| op | case | N | ORT host per node | dlkern host per node | ORT 1-node run | dlkern 1-node run |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "ort_host_us" not in r or "dlkern_host_us" not in r:
            why = r.get("ort_error") or r.get("dlkern_error") or "not measured"
            lines.append(f"| {r['op']} | {r['case']} | {r['nodes']} | {why[:80]} | | | |")
            continue
        lines.append(
            f"| {r['op']} | {r['case']} | {r['nodes']} | {r['ort_host_us']:.2f} us | {r['dlkern_host_us']:.2f} us | "
            f"{r['ort_run_us']:.1f} us | {r['dlkern_run_us']:.1f} us |"
        )
    return lines + [""]


def matmul_nbits_flops(record):
    """2 M N K of a MatMulNBits node from its case ("M 2048, o 4096 x 4096, block 32 sym"), for the
    records of runs before compare_ort.py recorded them; 0 for other ops."""
    found = re.match(r"M (\d+), \S+ (\d+) x (\d+),", record.get("case", ""))
    if record.get("op") != "MatMulNBits" or not found:
        return 0
    m, n, k = map(int, found.groups())
    return 2 * m * n * k


def render_ort(records):
    """The drop-in ops against onnxruntime-gpu's own nodes (`benches/compare_ort.py`); the
    MatMulNBits rows that have their cuBLAS baseline in a table of their own."""
    records = [r for r in records if r.get("kind") != "host"]
    nbits = [r for r in records if "cublas_us" in r]
    records = [r for r in records if "cublas_us" not in r]
    lines = render_ort_nodes(records) if records else []
    return lines + render_ort_matmul_nbits(nbits)


def gpu_times(r):
    """(ORT's GPU time, dlkern's, the mark of summed durations) of an ORT comparison row: the
    busy time where the run recorded it; older runs have the sums alone."""
    busy = "ort_busy_us" in r and "dlkern_busy_us" in r
    if busy:
        return r["ort_busy_us"], r["dlkern_busy_us"], ""
    return r["ort_device_us"], r["dlkern_device_us"], "*"


def comparison_cells(r):
    """The cells every ORT comparison table has, from ORT's per-call time to the GPU speedup, and
    dlkern's GPU time; or (None, None) where a side did not run."""
    if "ort_device_us" not in r or "dlkern_device_us" not in r:
        return None, None
    ort_us, us, mark = gpu_times(r)
    cells = [f"{r['ort_sync_us']:.1f} us", f"{ort_us:.1f} us{mark}", f"{r['dlkern_sync_us']:.1f} us", f"{us:.1f} us{mark}",
             f"{r['ort_sync_us'] / r['dlkern_sync_us']:.2f}", f"{ort_us / us:.2f}"]
    return cells, us


def not_measured(r):
    """Why an ORT comparison row has no times."""
    return (r.get("ort_error") or r.get("dlkern_error") or "not measured")[:80]


def node_rate(r, us):
    """A node's rate at `us`: FLOPs where compute bound, else the bytes it moves."""
    nbytes = r.get("kv_bytes", r.get("bytes", 0))
    flops = r.get("flops") or matmul_nbits_flops(r)
    if compute_bound(flops, nbytes):
        return f"{flops / us / 1e6:.0f} TFLOP/s"
    return f"{nbytes / us / 1e6:.2f} TB/s"


def render_ort_matmul_nbits(records):
    """MatMulNBits as ORT nodes against onnxruntime-gpu's own node and, as kernels, against
    cuBLAS's f16 GEMM on 16-bit weights of the same shape (issue 46's table)."""
    if not records:
        return []
    lines = [
        "## MatMulNBits against onnxruntime-gpu's own node and cuBLAS f16",
        "",
        "`benches/compare_ort.py`, each node dlkern's and onnxruntime-gpu 1.31.1's own on the CUDA EP, on",
        "the same inputs: Llama-3-8B's shapes (N x K), 8 nodes side by side in one session (2 for the LM",
        "head), each with weights of its own, A of a symbolic M bound at each M (one session per shape",
        "and format, as a model that runs prompts and decode steps has it), times per node. Per call: the",
        "median wall time of `run_with_iobinding`; GPU: the busy time of a run (CUPTI: the union of its",
        "kernels' intervals; for dlkern the permutation of A and the kernel). cuBLAS f16: `torch.matmul`",
        "on f16 weights of the same shape, as many matrices side by side, its GPU time measured the same",
        "way: the kernel bar (dlkern / cuBLAS is cuBLAS's time over dlkern's GPU time). Formats: block",
        "size, then zero points: sym (none), zp (packed u8), zp f16 (typed as the scales). Rate: weight",
        "bytes read, or FLOPs where compute bound.",
        "",
        "| case | ORT per call | ORT GPU | dlkern per call | dlkern GPU | speedup (call) | speedup (GPU) | "
        "cuBLAS f16 GPU | dlkern / cuBLAS | dlkern rate (GPU) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in records:
        cells, us = comparison_cells(r)
        if cells is None:
            lines.append(f"| {r['case']} | {not_measured(r)} | | | | | | {r['cublas_us']:.1f} us | | |")
            continue
        cells += [f"{r['cublas_us']:.1f} us", f"{r['cublas_us'] / us:.2f}", node_rate(r, us)]
        lines.append(f"| {r['case']} | " + " | ".join(cells) + " |")
    return lines + [""]


def render_ort_nodes(records):
    """The table of every op's ORT comparison rows."""
    lines = [
        "## ORT drop-ins against onnxruntime-gpu's own nodes",
        "",
        "`benches/compare_ort.py`: each op as one node of an ORT session on the CUDA EP, dlkern's",
        "(domain `dlkern`) and onnxruntime-gpu 1.31.1's own (`com.microsoft`) on the same inputs, caches",
        "bound with IO binding as onnxruntime-genai binds them (present = past). Per call: the median",
        "wall time of `run_with_iobinding` (host + device); GPU: the time of one run during which at",
        "least one kernel runs (CUPTI; the union of the kernels' intervals, since a programmatic",
        "dependent starts under the kernel ahead of it and waits there), or, marked *, the summed",
        "durations of its kernels (runs before 2026-12-07, which counted such overlaps twice).",
        "GroupQueryAttention is the builder's node (packed QKV, rotary),",
        "32 q / 8 kv heads of 128, f16; rates are KV-cache bytes read (decode), FLOPs (prompt) or",
        "bytes moved (norm). Speedup = ORT time / dlkern time. MatMulNBits: Llama-3-8B's shapes (N x K),",
        "8 nodes side by side in one session (2 for the LM head), each with weights of its own so that",
        "none is read from L2, times per node; rate = the node's weight bytes (codes and scales) read, or",
        f"its FLOPs where it does more than {COMPUTE_BOUND_FLOPS_PER_BYTE} per weight byte (compute bound).",
        "",
        "| op | case | ORT per call | ORT GPU | dlkern per call | dlkern GPU | speedup (call) | speedup (GPU) | dlkern rate (GPU) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in records:
        cells, us = comparison_cells(r)
        if cells is None:
            lines.append(f"| {r['op']} | {r['case']} | {not_measured(r)} | | | | | | |")
            continue
        lines.append(f"| {r['op']} | {r['case']} | " + " | ".join(cells + [node_rate(r, us)]) + " |")
    return lines + [""]


def render_e2e(e2e):
    """A Llama-3-8B-shaped int4 model through onnxruntime-genai (`benches/e2e_genai.py`)."""
    rows = e2e.get("rows") if e2e else None
    if not rows:
        return []
    batch = e2e["batch"]
    lines = [
        "## End to end through onnxruntime-genai",
        "",
        f"{e2e.get('date', '')}, {e2e.get('gpu', '')}: `{e2e.get('command', 'benches/e2e_genai.py')}`.",
        f"The {e2e['preset']} shape ({e2e.get('shape', '')}),",
        "int4, random weights from `dlkern.synth` (the model builder's graph), through onnxruntime-genai-cuda",
        "0.18.0 on onnxruntime-gpu 1.31.1: the unmodified model (ORT's own CUDA kernels) and the same folder",
        "after `python -m dlkern.retarget` (every MatMulNBits, GroupQueryAttention and norm on dlkern).",
        f"First token: a {e2e['prompt']}-token prompt at batch 1 (median). Decode: {e2e['steps']} steps after",
        f"{e2e['prompt']}-token prompts. GPU ms/token: CUPTI, the summed durations of every kernel of a",
        "batch-1 step (a programmatic dependent's duration includes its wait for the kernel before it,",
        "so where kernels overlap the sum exceeds the wall time); host us/token: what ORT's profiler",
        "gives the nodes of a batch-1 step (on CUDA the host's share: launches, argument checks).",
        "CUDA graph: ORT's `enable_cuda_graph` provider option.",
        "",
        f"| format | kernels | first token | decode b1 | b1 wall / GPU per token | host per token | decode b{batch} | b1 with CUDA graph |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    by = {(r["format"], r["kernels"], r["cuda_graph"]): r for r in rows}

    def fmt(v, spec, unit):
        return f"{v:{spec}} {unit}" if isinstance(v, (int, float)) else "-"

    for (form, kernels, graph), r in by.items():
        if graph:
            continue
        g = by.get((form, kernels, True), {})
        if "error" in r:
            lines.append(f"| {form} | {kernels} | {r['error'][:100]} | | | | | |")
            continue
        graph_cell = fmt(g.get("decode_b1_tok_s"), ".1f", "tok/s") if "error" not in g else g["error"][:60]
        lines.append(
            f"| {form} | {kernels} | {fmt(r.get('first_token_ms'), '.1f', 'ms')} | "
            f"{fmt(r.get('decode_b1_tok_s'), '.1f', 'tok/s')} | {fmt(r.get('decode_b1_wall_ms'), '.2f', 'ms')} / "
            f"{fmt(r.get('decode_b1_gpu_ms'), '.2f', 'ms')} | {fmt(r.get('decode_b1_host_us'), '.0f', 'us')} | "
            f"{fmt(r.get(f'decode_b{batch}_tok_s'), '.1f', 'tok/s')} | {graph_cell} |")
    speed = []
    for form in dict.fromkeys(f for f, _, _ in by):
        o, d = by.get((form, "ort", False), {}), by.get((form, "dlkern", False), {})
        cells = []
        for key, label, inverse in [("first_token_ms", "first token", True), ("decode_b1_tok_s", "decode b1", False),
                                    (f"decode_b{batch}_tok_s", f"decode b{batch}", False)]:
            if isinstance(o.get(key), (int, float)) and isinstance(d.get(key), (int, float)) and d[key] and o[key]:
                cells.append(f"{label} {o[key] / d[key] if inverse else d[key] / o[key]:.2f}x")
        if cells:
            speed.append(f"- {form}: dlkern against ORT's kernels: " + ", ".join(cells))
    lines += [""] + speed + [""]
    for (form, kernels, graph), r in by.items():
        if graph or not r.get("decode_b1_kernels"):
            continue
        lines += [f"Batch-1 decode, {form}, {kernels}: top kernels, us per token: "
                  + "; ".join(f"`{k[:48]}` {v:.0f}" for k, v in list(r["decode_b1_kernels"].items())[:8]), ""]
        if r.get("first_token_kernels"):
            lines += [f"First token ({e2e['prompt']}-token prompt), {form}, {kernels}: top kernels, us: "
                      + "; ".join(f"`{k[:48]}` {v:.0f}" for k, v in list(r["first_token_kernels"].items())[:6]), ""]
        host = r.get("decode_b1_host_us_by_op") or {}
        if host:
            lines += [f"Host per token by op ({kernels}, {form}): "
                      + ", ".join(f"{k} {v:.0f} us" for k, v in list(host.items())[:8]), ""]
    return lines


def render(results, plots_dir=None, plots_rel=None):
    ceiling = ceiling_tbps(results)
    lines = [
        "# dlkern benchmarks",
        "",
        "Generated by `python/bench_report.py` from the results of one run on the GPU host; do not edit",
        "by hand. Baselines were measured in the same run on the same shapes.",
        "",
        f"- date: {results['date']}",
        f"- GPU: {results['gpu']} (driver {results['driver']}), PyTorch {results['torch']}",
        f"- command: `{results['command']}`",
        f"- memory ceiling: device-to-device copy at {ceiling:.2f} TB/s (bytes read + written)",
    ]
    lines += [f"- later partial run: {s['date']} on {s['gpu']} ({s['note']}), at the end" for s in results.get("supplements", [])]
    lines += [
        "",
        "dlkern times are criterion medians of CUDA-event-timed launch loops (`cargo bench`) and, in the",
        "C ABI column, the registry kernel called through the DLPack C ABI on PyTorch tensors",
        "(`benches/compare_torch.py`, where the PyTorch baselines are timed the same way): the device time",
        "per call from CUDA-graph replays, then the host time per call of the same kernel called as a",
        "Python user calls it: a `dlkern.kernel` handle on torch tensors (torch's DLPack exchange table,",
        "outputs allocated from the kernel's inference, constant weights at the handle's call site on the",
        "packed rows; the median over batches of 20 calls, the device synchronized before each); the",
        "host-cost table (\"Host time per call\") gives the C ABI's own host time per call from Rust. The",
        "column is n/a where the run has no such record, and always on",
        "rows no registry call runs: paged_attention's (`dlkern.paged_attention` is the whole",
        "PagedAttention op, and it reads a status back to the host on every call, which no CUDA graph can",
        "hold) and the kernels a bench forces (attention's mma.sync; W4's mma.sync over packed B, whole",
        "tiles and the large-M kernels the planner did not take). On W4's plain rows at M <= 16 the C ABI",
        "calls, without a call site, do not mark the weights constant as the criterion launches do (on",
        "Hopper the decode kernel then reads them only once the kernel before it has finished); its",
        "(packed B) rows call through a site that does, where the kernel repacks them once. Ratio =",
        "baseline time / dlkern time (the C ABI time where there is one; above 1: dlkern is faster), the",
        "baseline being the fastest one measured, except for matmul_nbits: cuBLAS f16 on the dequantized",
        "weights, its issue's bar (PyTorch's own W4A16 kernel is among the other baselines there). Rates",
        "are bytes moved per second (for attention decode: KV-cache bytes read).",
        "",
    ]
    lines += render_ceilings(results)
    lines += render_host_cost(results)
    lines += render_families(results, ceiling, plots_dir, plots_rel)
    lines += render_ort(results.get("ort_comparison") or [])
    lines += render_ort_host(results.get("ort_comparison") or [])
    lines += render_e2e(results.get("e2e") or {})
    for supplement in results.get("supplements", []):
        lines += render_supplement(supplement)
    if os.path.exists(PRUNED):
        with open(PRUNED) as f:
            lines += [f.read().rstrip("\n"), ""]
    return "\n".join(lines) + "\n"


def render_ceilings(results):
    """The run's measured ceilings (copy, read-only streams, cuBLAS's dense rates), if any."""
    meta = {m["id"]: m for m in results["meta"]}
    rows = []
    for c in results["criterion"]:
        m = meta.get(c["id"])
        if m and m["family"] == "ceilings":
            rec = dict(m, time_us=c["median_ns"] / 1e3)
            rows.append(f"| {m['dtype']} {m['shape']} | {m['implementation']} | {rec['time_us']:.2f} us | {fmt_rate(rec)} |")
    if not rows:
        return []
    return ["## Measured ceilings", "", "| measurement | implementation | time | rate |", "| --- | --- | --- | --- |"] + rows + [""]


def render_families(results, ceiling, plots_dir=None, plots_rel=None):
    """A table per kernel family: dlkern's rows against the same run's baselines (and a plot
    each where `plots_dir` is given)."""
    lines = []
    table = rows_by_family(results)
    families = sorted({k[0] for k in table})
    for family in families:
        lines += [f"## {family}", ""]
        ceiling_of, ceiling_note = family_ceiling(results, family, ceiling)
        if ceiling_note:
            lines += [ceiling_note, ""]
        lines += ["| dtype | shape | dlkern (criterion) | dlkern C ABI (graph / host per call) | baseline | baseline time | ratio | dlkern rate | % of ceiling | extra device memory | other baselines |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        plot_points = collections.defaultdict(list)
        rows = []
        for key in sorted(k for k in table if k[0] == family):
            recs = table[key]
            baselines = {n: r for n, r in recs.items() if not n.startswith("dlkern")}
            # Other dlkern variants of the same call (e.g. "dlkern packed W"): a row each, against
            # the same baselines, with the C ABI record of the same variant where there is one.
            rows.append((key, key[2], recs.get("dlkern (criterion)"), recs.get("dlkern"), baselines))
            variants = (n for n in recs if n.startswith("dlkern ") and n.endswith(" (criterion)"))
            for name in sorted(n for n in variants if n != "dlkern (criterion)"):
                variant = name.removeprefix("dlkern ").removesuffix(" (criterion)")
                rows.append((key, f"{key[2]} ({variant})", recs[name], recs.get(f"dlkern {variant}"), baselines))
        for key, shape, mine, via_abi, baselines in rows:
            base_name = RATIO_BASELINE.get(family)
            if base_name not in baselines:
                base_name = min(baselines, key=lambda n: baselines[n]["time_us"]) if baselines else None
            base = baselines.get(base_name)
            best = min((r for r in (mine, via_abi) if r), key=lambda r: r["time_us"])
            # Like for like where possible: the C ABI run is timed the way the baselines are.
            ratio = f"{base['time_us'] / (via_abi or best)['time_us']:.2f}" if base else "n/a"
            others = ", ".join(f"{n} {r['time_us']:.2f} us" for n, r in sorted(baselines.items()) if n != base_name)
            limit, unit = ceiling_of(key[1], best)
            pct = f"{100 * best[unit] / best['time_us'] / 1e6 / limit:.0f}%" if limit else "n/a"
            def us(rec):
                return f"{rec['time_us']:.2f} us" if rec else "n/a"

            lines.append(
                f"| {key[1]} | {shape} | {us(mine)} | {c_abi_cell(via_abi)} | {base_name or 'none'} | {us(base)} | {ratio} | "
                f"{fmt_rate(best)} | {pct} | {(mine or {}).get('workspace_bytes', 0)} B | {others or '-'} |"
            )
            label = f"{key[1]} {shape}"
            for name, rec in [("dlkern", best)] + sorted(baselines.items()):
                plot_points[name].append((label, rec["bytes"] / rec["time_us"] / 1e6))
        lines.append("")
        if plots_dir:
            png = plot(family, plot_points, ceiling, plots_dir)
            if png:
                lines += [f"![{family}]({os.path.join(plots_rel or plots_dir, os.path.basename(png))})", ""]
    return lines


def render_supplement(run):
    """A later partial run on another GPU than the main one (`merge_results.py --supplement`):
    its own header, then its ceilings, host-cost, family, ORT and end-to-end tables, a heading
    level down (no plots: the main run's stand)."""
    lines = [
        f"## Later partial run: {run['date']}, {run['gpu']}",
        "",
        f"{run['note']}. Its rows stand on their own: every baseline beside them was measured in that run,",
        "on that GPU; the tables above are the main run's.",
        "",
        f"- GPU: {run['gpu']} (driver {run['driver']}), PyTorch {run['torch']}",
        f"- command: `{run['command']}`",
        "",
    ]
    ort = run.get("ort_comparison") or []
    sections = (render_ceilings(run), render_host_cost(run), render_families(run, ceiling_tbps(run)), render_ort(ort),
                render_ort_host(ort), render_e2e(run.get("e2e") or {}))
    for section in sections:
        lines += ["#" + line if line.startswith("## ") else line for line in section]
    return lines


def plot(family, points, ceiling, plots_dir):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    os.makedirs(plots_dir, exist_ok=True)
    labels = []
    for pts in points.values():
        labels += [label for label, _ in pts if label not in labels]
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.9), 4))
    width = 0.8 / max(len(points), 1)
    for i, (name, pts) in enumerate(points.items()):
        ax.bar([labels.index(label) + i * width for label, _ in pts], [v for _, v in pts], width, label=name)
    if ceiling:
        ax.axhline(ceiling, color="k", linestyle="--", linewidth=1, label=f"copy ceiling {ceiling:.2f} TB/s")
    ax.set_xticks([x + width * (len(points) - 1) / 2 for x in range(len(labels))])
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TB/s (bytes moved / time)")
    ax.set_title(f"{family}: dlkern vs baselines")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(plots_dir, f"{family}.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--out", default="BENCHMARKS.md")
    ap.add_argument("--plots", default="benches/plots")
    args = ap.parse_args()
    with open(args.results) as f:
        results = json.load(f)
    rel = os.path.relpath(args.plots, os.path.dirname(os.path.abspath(args.out)))
    text = render(results, args.plots, rel)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
