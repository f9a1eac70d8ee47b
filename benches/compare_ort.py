"""GPU host: dlkern's drop-in ops against onnxruntime-gpu's own com.microsoft kernels, each as one
ORT node on the CUDA EP, same inputs, in the same run (ORT's own node is the baseline an ORT user
has). Caches are bound with IO binding the way onnxruntime-genai binds them (present = past, one
buffer); every input lives on the device except total_sequence_length.

Three times per case, all per run of the one-node session:
- `sync_us`: `run_with_iobinding` with ORT's end-of-run synchronization, the median of many runs:
  what one call costs the caller (host work + launch + device time).
- `device_us`: the summed durations of the kernels one run launches (CUPTI, through
  torch.profiler), i.e. GPU time without the host's share;
- `busy_us`: the time of one run during which at least one kernel runs (the union of their
  intervals): a programmatic dependent starts under the kernel ahead of it and waits, so where
  kernels overlap the sum counts the overlap twice and the union does not.

And, for decode-sized nodes, the host time per node (`host_cost`, see HOST_NODES), ORT's own
kernels beside dlkern's.

    DLKERN_LIB=.gpu/lib/libdlkern.so python3 benches/compare_ort.py out.json
    DLKERN_ORT_OPS=host,MatMulNBits ...   (those rows alone)
    DLKERN_ORT_NBITS_M=2048 ...             (MatMulNBits at those M alone)
    DLKERN_ORT_NBITS_SETS=more ...          (MatMulNBits at the other formats alone)
    DLKERN_ORT_NBITS_SETS=block16 ...       (blocks of 16 at every shape, M <= 16)
    DLKERN_ORT_NBITS_SHAPES=qkv,o ...       (MatMulNBits at those shapes alone)
"""

import json
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlkern_onnx as dx  # noqa: E402
from bench_report import compute_bound  # noqa: E402
from cupti import kernel_profile  # noqa: E402

LIB = os.path.abspath(os.environ["DLKERN_LIB"])
SYNC_RUNS = int(os.environ.get("DLKERN_ORT_RUNS", "50"))


def make_model(nodes, inputs, outputs):
    """A model of one node, or of a list of them."""
    return dx.model(nodes if isinstance(nodes, list) else [nodes], inputs, outputs, opsets=dx.OPSET_WITH_MS)


def session(model):
    return dx.session(LIB, model, "CUDAExecutionProvider")


def timed(sess, bind):
    """(sync_us, device_us, busy_us, kernels) of one run of `sess` with the bindings `bind` makes."""
    io = sess.io_binding()
    bind(io)
    for _ in range(3):
        sess.run_with_iobinding(io)
    times = []
    for _ in range(SYNC_RUNS):
        t0 = time.perf_counter()
        sess.run_with_iobinding(io)
        times.append(time.perf_counter() - t0)
    # Device time: every kernel the runs launched (CUPTI sees ORT's launches too), per run.
    profile = kernel_profile(lambda: sess.run_with_iobinding(io), 10)
    kernels = {k: round(v, 1) for k, v in sorted(profile["kernels"].items())}
    return statistics.median(times) * 1e6, profile["sum_us"], profile["busy_us"], kernels


def bind_tensor(io, name, t):
    elem = {torch.float16: np.float16, torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32}[t.dtype]
    io.bind_input(name, "cuda", 0, elem, list(t.shape), t.data_ptr())


def bind_out(io, name, t):
    elem = {torch.float16: np.float16, torch.float32: np.float32}[t.dtype]
    io.bind_output(name, "cuda", 0, elem, list(t.shape), t.data_ptr())


def gqa_case(batch, seq, context, heads=32, kv_heads=8, head=128):
    """The builder's node: packed QKV, do_rotary, shared past/present caches of `context`
    positions, every sequence at `context` tokens after the step."""
    hidden = (heads + 2 * kv_heads) * head
    e = TensorProto.FLOAT16
    names = ["query", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"]
    ins = [helper.make_tensor_value_info("query", e, ["b", "s", hidden]),
           helper.make_tensor_value_info("past_key", e, ["b", kv_heads, "c", head]),
           helper.make_tensor_value_info("past_value", e, ["b", kv_heads, "c", head]),
           helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
           helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
           helper.make_tensor_value_info("cos_cache", e, ["m", head // 2]),
           helper.make_tensor_value_info("sin_cache", e, ["m", head // 2])]
    outs = [helper.make_tensor_value_info(n, e, None) for n in ("output", "present_key", "present_value")]
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(batch, seq, hidden, device=dev, dtype=torch.float16, generator=g)
    caches = [torch.randn(batch, kv_heads, context, head, device=dev, dtype=torch.float16, generator=g) for _ in range(2)]
    seqlens = torch.full((batch,), context - 1, device=dev, dtype=torch.int32)
    total = np.array(context, np.int32)
    angles = torch.arange(context + 1, device=dev)[:, None] * torch.rand(head // 2, device=dev)[None, :]
    cos, sin = angles.cos().half(), angles.sin().half()
    out = torch.empty(batch, seq, heads * head, device=dev, dtype=torch.float16)

    def bind(io):
        bind_tensor(io, "query", q)
        bind_tensor(io, "past_key", caches[0])
        bind_tensor(io, "past_value", caches[1])
        bind_tensor(io, "seqlens_k", seqlens)
        io.bind_cpu_input("total_sequence_length", total)
        bind_tensor(io, "cos_cache", cos)
        bind_tensor(io, "sin_cache", sin)
        bind_out(io, "output", out)
        bind_out(io, "present_key", caches[0])
        bind_out(io, "present_value", caches[1])

    kv_bytes = 2 * batch * kv_heads * context * head * 2
    # Causal prompt FLOPs (QK^T and PV over the visible half), or decode's.
    flops = 4 * batch * heads * head * (seq * context - seq * (seq - 1) / 2)
    models = {d: make_model(helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                                             domain=d, num_heads=heads, kv_num_heads=kv_heads, do_rotary=1,
                                             local_window_size=-1, softcap=0.0, scale=1.0 / head ** 0.5), ins, outs)
              for d in ("com.microsoft", "dlkern")}
    return models, bind, kv_bytes, flops


GQA_CASES = [
    ("decode B16 ctx4k", 16, 1, 4096),
    ("decode B64 ctx4k", 64, 1, 4096),
    ("decode B1 ctx64k", 1, 1, 65536),
    ("decode B1 ctx8k", 1, 1, 8192),
    ("prompt B1 2048", 1, 2048, 2048),
    ("prompt B4 4096", 4, 4096, 4096),
]


def paged_case(batch, context, block=32, heads=32, kv_heads=8, head=128):
    """PagedAttention decode: one new token per sequence over `context - 1` cached ones, blocks
    scattered through one shared cache, rotary; the cache outputs bound to the input buffers."""
    e = TensorProto.FLOAT16
    names = ["query", "key", "value", "key_cache", "value_cache", "cumulative_sequence_length", "past_seqlens",
             "block_table", "cos_cache", "sin_cache"]
    ints = {"cumulative_sequence_length", "past_seqlens", "block_table"}
    shapes = {"query": ["t", heads * head], "key": ["t", kv_heads * head], "value": ["t", kv_heads * head],
              "key_cache": ["n", block, kv_heads, head], "value_cache": ["n", block, kv_heads, head],
              "cumulative_sequence_length": ["b1"], "past_seqlens": ["b"], "block_table": ["b", "m"],
              "cos_cache": ["p", head // 2], "sin_cache": ["p", head // 2]}
    ins = [helper.make_tensor_value_info(n, TensorProto.INT32 if n in ints else e, shapes[n]) for n in names]
    outs = [helper.make_tensor_value_info(n, e, None) for n in ("output", "key_cache_out", "value_cache_out")]
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(1)
    per_seq = -(-context // block)
    num_blocks = batch * per_seq
    table = torch.randperm(num_blocks, device=dev, generator=g).to(torch.int32).reshape(batch, per_seq)
    t = {
        "query": torch.randn(batch, heads * head, device=dev, dtype=torch.float16, generator=g),
        "key": torch.randn(batch, kv_heads * head, device=dev, dtype=torch.float16, generator=g),
        "value": torch.randn(batch, kv_heads * head, device=dev, dtype=torch.float16, generator=g),
        "key_cache": torch.randn(num_blocks, block, kv_heads, head, device=dev, dtype=torch.float16, generator=g),
        "value_cache": torch.randn(num_blocks, block, kv_heads, head, device=dev, dtype=torch.float16, generator=g),
        "cumulative_sequence_length": torch.arange(batch + 1, device=dev, dtype=torch.int32),
        "past_seqlens": torch.full((batch,), context - 1, device=dev, dtype=torch.int32),
        "block_table": table,
    }
    angles = torch.arange(context + 1, device=dev)[:, None] * torch.rand(head // 2, device=dev)[None, :]
    t["cos_cache"], t["sin_cache"] = angles.cos().half(), angles.sin().half()
    out = torch.empty(batch, heads * head, device=dev, dtype=torch.float16)

    def bind(io):
        for n in names:
            bind_tensor(io, n, t[n])
        bind_out(io, "output", out)
        bind_out(io, "key_cache_out", t["key_cache"])
        bind_out(io, "value_cache_out", t["value_cache"])

    kv_bytes = 2 * batch * kv_heads * context * head * 2
    models = {d: make_model(helper.make_node("PagedAttention", names, ["output", "key_cache_out", "value_cache_out"],
                                             domain=d, num_heads=heads, kv_num_heads=kv_heads, do_rotary=1,
                                             scale=1.0 / head ** 0.5), ins, outs)
              for d in ("com.microsoft", "dlkern")}
    return models, bind, kv_bytes


def skip_norm_case(tokens, hidden=4096):
    """The builder's SkipSimplifiedLayerNormalization: outputs [y, '', '', input_skip_bias_sum]."""
    e = TensorProto.FLOAT16
    ins = [helper.make_tensor_value_info("input", e, [tokens, hidden]),
           helper.make_tensor_value_info("skip", e, [tokens, hidden]),
           helper.make_tensor_value_info("gamma", e, [hidden])]
    outs = [helper.make_tensor_value_info(n, e, [tokens, hidden]) for n in ("output", "input_skip_bias_sum")]
    dev = "cuda"
    t = {n: torch.randn(*shape, device=dev, dtype=torch.float16) for n, shape in
         (("input", (tokens, hidden)), ("skip", (tokens, hidden)), ("gamma", (hidden,)))}
    y, total = (torch.empty(tokens, hidden, device=dev, dtype=torch.float16) for _ in range(2))

    def bind(io):
        for n in ("input", "skip", "gamma"):
            bind_tensor(io, n, t[n])
        bind_out(io, "output", y)
        bind_out(io, "input_skip_bias_sum", total)

    models = {d: make_model(helper.make_node("SkipSimplifiedLayerNormalization", ["input", "skip", "gamma"],
                                             ["output", "", "", "input_skip_bias_sum"], domain=d, epsilon=1e-5),
                            ins, outs)
              for d in ("com.microsoft", "dlkern")}
    return models, bind, 4 * tokens * hidden * 2 + hidden * 2


# Llama-3-8B's MatMulNBits shapes (N, K): fused QKV, attention output, MLP up (gate and up alike),
# MLP down, LM head; the builder's format (block 32, symmetric) and block 128 with zero points.
NBITS_SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("up", 14336, 4096), ("down", 4096, 14336),
                ("lm_head", 128256, 4096)]
NBITS_FORMATS = [(32, None), (128, "u8")]
# The other formats ORT's tools write (blocks 16 to 256; no, u8 or typed zero points), at one
# shape and fewer M.
NBITS_MORE_SHAPES = [("up", 14336, 4096)]
NBITS_MORE_FORMATS = [(16, "u8"), (64, None), (256, "u8"), (128, "typed"), (32, "typed")]
NBITS_MORE_M = (1, 16, 64, 2048)
# Blocks of 16 (no and u8 zero points) at every shape and M <= 16 (`DLKERN_ORT_NBITS_SETS=block16`,
# not in the default sets): the decode path's fine16 records.
NBITS_BLOCK16_FORMATS = [(16, None), (16, "u8")]
NBITS_BLOCK16_M = (1, 4, 16)
# DLKERN_ORT_NBITS_M="256,2048": those M alone (of either set).
NBITS_M_ONLY = os.environ.get("DLKERN_ORT_NBITS_M")
NBITS_M = tuple(int(m) for m in (NBITS_M_ONLY or "1,4,16,64,256,2048").split(","))
# DLKERN_ORT_NBITS_SETS="main" or "more": one of the two sets of formats alone ("block16": the
# set above).
NBITS_SETS = os.environ.get("DLKERN_ORT_NBITS_SETS", "main,more").split(",")
# DLKERN_ORT_NBITS_SHAPES="qkv,o": those shapes alone (e.g. for a profiler).
NBITS_SHAPES_ONLY = os.environ.get("DLKERN_ORT_NBITS_SHAPES")
# Nodes per session: each has weights of its own, so that the next node's are not in L2 (50 MB on
# the H200), up to this many bytes of weights in all (a model over 2 GB cannot be serialized).
NBITS_NODES, NBITS_WEIGHT_BYTES = 8, 600 << 20
ZERO_POINT_LABELS = {None: "sym", "u8": "zp", "typed": "zp f16"}


def matmul_nbits_nodes(n, k, block, zero_points, seed=0, nodes=None):
    """`nodes` MatMulNBits nodes side by side (by default as many as NBITS_NODES and
    NBITS_WEIGHT_BYTES allow), each [M, K] x its own int4 weights [N, K] (random codes, scales
    ~0.01; zero points none, random u8, or typed: f16 in [0, 15]) -> [M, N], all reading one A of
    any M (a symbolic dimension, as in a model that runs both prompts and decode steps): times
    per node are the session's divided by `nodes`. Returns (models, nodes, weight bytes per node,
    bind_for(m))."""
    from onnx import numpy_helper

    e = TensorProto.FLOAT16
    rng = np.random.default_rng(seed)
    k_blocks = -(-k // block)
    weight_bytes = n * k_blocks * block // 2
    nodes = nodes or max(1, min(NBITS_NODES, NBITS_WEIGHT_BYTES // weight_bytes))
    inits, made = [], {"com.microsoft": [], "dlkern": []}
    for i in range(nodes):
        names = [f"B{i}", f"scales{i}"] + ([f"zp{i}"] if zero_points else [])
        inits.append(numpy_helper.from_array(rng.integers(0, 256, (n, k_blocks, block // 2), dtype=np.uint8), names[0]))
        inits.append(numpy_helper.from_array((0.01 + 0.005 * rng.random((n, k_blocks))).astype(np.float16), names[1]))
        if zero_points == "u8":
            inits.append(numpy_helper.from_array(rng.integers(0, 256, (n, -(-k_blocks // 2)), dtype=np.uint8), names[2]))
        elif zero_points == "typed":
            inits.append(numpy_helper.from_array((15 * rng.random((n, k_blocks))).astype(np.float16), names[2]))
        for domain in made:
            made[domain].append(helper.make_node("MatMulNBits", ["A"] + names, [f"Y{i}"], domain=domain,
                                                 K=k, N=n, bits=4, block_size=block))
    ins = [helper.make_tensor_value_info("A", e, ["m", k])]
    outs = [helper.make_tensor_value_info(f"Y{i}", e, ["m", n]) for i in range(nodes)]
    models = {d: dx.model(made[d], ins, outs, inits, opsets=dx.OPSET_WITH_MS) for d in made}

    def bind_for(m):
        a = torch.randn(m, k, device="cuda", dtype=torch.float16) * 0.5
        ys = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(nodes)]

        def bind(io):
            bind_tensor(io, "A", a)
            for i, y in enumerate(ys):
                bind_out(io, f"Y{i}", y)

        return bind

    return models, nodes, weight_bytes + n * k_blocks * 2, bind_for


def matmul_nbits_case(m, n, k, block, zero_points, seed=0, nodes=None):
    """[`matmul_nbits_nodes`] bound for one M: (models, bind, nodes, weight bytes per node)."""
    models, nodes, nbytes, bind_for = matmul_nbits_nodes(n, k, block, zero_points, seed, nodes)
    return models, bind_for(m), nodes, nbytes


def cublas_us(m, n, k, nodes):
    """The kernel baseline of a MatMulNBits row: cuBLAS's f16 GEMM (torch.matmul) on 16-bit
    weights of the same shape, `nodes` weight matrices of their own side by side as the session
    has them, the GPU time per matrix (the union of the kernels' intervals, as the nodes' GPU
    time is measured)."""
    a = torch.randn(m, k, device="cuda", dtype=torch.float16) * 0.5
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.01 for _ in range(nodes)]
    ys = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(nodes)]

    def run():
        for w, y in zip(ws, ys):
            torch.matmul(a, w.t(), out=y)

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    busy = statistics.median(kernel_profile(run, 5)["busy_us"] for _ in range(3)) / nodes
    del ws, ys
    torch.cuda.empty_cache()
    return busy


def matmul_nbits_rows(dest, records):
    """The MatMulNBits rows: every shape at the two main formats, then the other formats at one
    shape; ORT's node, dlkern's and cuBLAS f16 on each M, one pair of sessions per shape and
    format."""
    sets = []
    if "main" in NBITS_SETS:
        sets += [(shape, fmt, NBITS_M) for fmt in NBITS_FORMATS for shape in NBITS_SHAPES]
    if "more" in NBITS_SETS:
        more_m = NBITS_M if NBITS_M_ONLY else NBITS_MORE_M
        sets += [(shape, fmt, more_m) for fmt in NBITS_MORE_FORMATS for shape in NBITS_MORE_SHAPES]
    if "block16" in NBITS_SETS:
        block16_m = NBITS_M if NBITS_M_ONLY else NBITS_BLOCK16_M
        sets += [(shape, fmt, block16_m) for fmt in NBITS_BLOCK16_FORMATS for shape in NBITS_SHAPES]
    if NBITS_SHAPES_ONLY:
        sets = [entry for entry in sets if entry[0][0] in NBITS_SHAPES_ONLY.split(",")]
    # A shape and format in two sets runs once, at the M of both.
    merged = {}
    for shape, fmt, ms in sets:
        merged[(shape, fmt)] = tuple(sorted(set(merged.get((shape, fmt), ())) | set(ms)))
    sets = [(shape, fmt, ms) for (shape, fmt), ms in merged.items()]
    baselines = {}
    for (name, n, k), (block, zero_points), ms in sets:
        models, nodes, nbytes, bind_for = matmul_nbits_nodes(n, k, block, zero_points)
        sessions = {}
        for domain, model in models.items():
            try:
                sessions[domain] = session(model)
            except Exception as err:  # noqa: BLE001 - reported on each row, not fatal
                sessions[domain] = err
        fmt = f"block {block} {ZERO_POINT_LABELS[zero_points]}"
        for m in ms:
            flops = 2 * m * n * k
            rate = ((lambda us, f=flops: f"{f / us / 1e6:.0f} TFLOP/s") if compute_bound(flops, nbytes)
                    else (lambda us, b=nbytes: f"{b / us / 1e6:.2f} TB/s"))
            rec = compare("MatMulNBits", f"M {m}, {name} {n} x {k}, {fmt}", models, bind_for(m), rate, nodes,
                          sessions)
            if (m, n, k, nodes) not in baselines:
                baselines[m, n, k, nodes] = cublas_us(m, n, k, nodes)
            rec["cublas_us"] = baselines[m, n, k, nodes]
            if "dlkern_busy_us" in rec:
                print(f"   cuBLAS f16 {rec['cublas_us']:.1f} us per node: dlkern {rec['cublas_us'] / rec['dlkern_busy_us']:.2f}x",
                      flush=True)
            records.append(rec | {"bytes": nbytes, "nodes": nodes, "flops": flops})
            if dest:  # as it goes: a run cut short keeps what it measured
                open(dest, "w").write(json.dumps(records, indent=1))
        del sessions
        torch.cuda.empty_cache()


# Host time per node: sessions of 1 and of HOST_NODES side-by-side nodes of one op (decode-sized:
# what a batch-1 token launches), each run without ORT's end-of-run synchronization (run option
# disable_synchronize_execution_providers) and the device synchronized outside the timing; per
# node = the difference over HOST_NODES - 1, so a run's fixed costs (ORT's run setup, the IO
# binding) drop out. What remains is the node's share of the calling thread: ORT's own work for
# a node plus the kernel's host code and launches. The launch queue never fills at these counts.
HOST_NODES = 17


def host_us(sess, bind, runs=200):
    """Median host time of one run of `sess` (no synchronization at its end)."""
    io = sess.io_binding()
    bind(io)
    opts = ort.RunOptions()
    opts.add_run_config_entry("disable_synchronize_execution_providers", "1")
    for _ in range(5):
        sess.run_with_iobinding(io, opts)
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        sess.run_with_iobinding(io, opts)
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def host_norm_case(nodes, skip, hidden=4096):
    """`nodes` (Skip)SimplifiedLayerNormalization nodes on one [1, hidden] row, each writing its
    own outputs: the builder's nodes (stash_type 1; outputs [y, '', '', sum] with a skip)."""
    e = TensorProto.FLOAT16
    names = ["input", "skip", "gamma"] if skip else ["input", "gamma"]
    ins = [helper.make_tensor_value_info(n, e, [hidden] if n == "gamma" else [1, hidden]) for n in names]
    outs, made = [], {"com.microsoft": [], "dlkern": []}
    for i in range(nodes):
        results = [f"y{i}", "", "", f"sum{i}"] if skip else [f"y{i}"]
        outs += [helper.make_tensor_value_info(n, e, [1, hidden]) for n in results if n]
        for domain in made:
            attrs = {"epsilon": 1e-5} if skip else {"epsilon": 1e-5, "axis": -1, "stash_type": 1}
            op = "SkipSimplifiedLayerNormalization" if skip else "SimplifiedLayerNormalization"
            # ORT registers SimplifiedLayerNormalization in the ONNX domain, not com.microsoft.
            node_domain = "" if domain == "com.microsoft" and not skip else domain
            made[domain].append(helper.make_node(op, names, results, domain=node_domain, **attrs))
    t = {n: torch.randn(hidden if n == "gamma" else (1, hidden), device="cuda", dtype=torch.float16) for n in names}
    ys = {o.name: torch.empty(1, hidden, device="cuda", dtype=torch.float16) for o in outs}

    def bind(io):
        for n in names:
            bind_tensor(io, n, t[n])
        for n, y in ys.items():
            bind_out(io, n, y)

    return {d: make_model(made[d], ins, outs) for d in made}, bind


def host_gqa_case(nodes, context=4096, heads=32, kv_heads=8, head=128):
    """`nodes` GroupQueryAttention decode nodes (batch 1, the builder's node as in `gqa_case`),
    each over caches of its own, all reading one query."""
    hidden = (heads + 2 * kv_heads) * head
    e = TensorProto.FLOAT16
    shared = ["query", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"]
    ins = [helper.make_tensor_value_info("query", e, [1, 1, hidden]),
           helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
           helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
           helper.make_tensor_value_info("cos_cache", e, ["m", head // 2]),
           helper.make_tensor_value_info("sin_cache", e, ["m", head // 2])]
    outs, made = [], {"com.microsoft": [], "dlkern": []}
    for i in range(nodes):
        ins += [helper.make_tensor_value_info(f"past_{kv}{i}", e, [1, kv_heads, context, head]) for kv in ("key", "value")]
        results = [f"output{i}", f"present_key{i}", f"present_value{i}"]
        outs += [helper.make_tensor_value_info(n, e, None) for n in results]
        names = ["query", "", "", f"past_key{i}", f"past_value{i}"] + shared[1:]
        for domain in made:
            made[domain].append(helper.make_node(
                "GroupQueryAttention", names, results, domain=domain, num_heads=heads, kv_num_heads=kv_heads,
                do_rotary=1, local_window_size=-1, softcap=0.0, scale=1.0 / head ** 0.5))
    q = torch.randn(1, 1, hidden, device="cuda", dtype=torch.float16)
    caches = [[torch.randn(1, kv_heads, context, head, device="cuda", dtype=torch.float16) for _ in range(2)]
              for _ in range(nodes)]
    seqlens = torch.full((1,), context - 1, device="cuda", dtype=torch.int32)
    total = np.array(context, np.int32)
    angles = torch.arange(context + 1, device="cuda")[:, None] * torch.rand(head // 2, device="cuda")[None, :]
    cos, sin = angles.cos().half(), angles.sin().half()
    ys = [torch.empty(1, 1, heads * head, device="cuda", dtype=torch.float16) for _ in range(nodes)]

    def bind(io):
        bind_tensor(io, "query", q)
        bind_tensor(io, "seqlens_k", seqlens)
        io.bind_cpu_input("total_sequence_length", total)
        bind_tensor(io, "cos_cache", cos)
        bind_tensor(io, "sin_cache", sin)
        for i, (k, v) in enumerate(caches):
            bind_tensor(io, f"past_key{i}", k)
            bind_tensor(io, f"past_value{i}", v)
            bind_out(io, f"output{i}", ys[i])
            bind_out(io, f"present_key{i}", k)
            bind_out(io, f"present_value{i}", v)

    return {d: make_model(made[d], ins, outs) for d in made}, bind


HOST_CASES = [
    ("SimplifiedLayerNormalization", "1 x 4096", lambda n: host_norm_case(n, skip=False)),
    ("SkipSimplifiedLayerNormalization", "1 x 4096", lambda n: host_norm_case(n, skip=True)),
    ("MatMulNBits", "M 1, 4096 x 4096, block 32 sym", lambda n: matmul_nbits_case(1, 4096, 4096, 32, None, nodes=n)[:2]),
    ("GroupQueryAttention", "decode B1 ctx4k", host_gqa_case),
]


def host_cost(op, label, make):
    """Host time per node of `op`, ORT's own and dlkern's (see HOST_NODES)."""
    rec = {"op": op, "case": label, "nodes": HOST_NODES}
    one, many = make(1), make(HOST_NODES)
    for domain in ("com.microsoft", "dlkern"):
        key = "ort" if domain == "com.microsoft" else "dlkern"
        try:
            t1, tn = (host_us(session(models[domain]), bind) for models, bind in (one, many))
            rec[f"{key}_run_us"], rec[f"{key}_host_us"] = t1, (tn - t1) / (HOST_NODES - 1)
        except Exception as err:  # noqa: BLE001 - reported, not fatal
            rec[f"{key}_error"] = str(err)[:300]
            print(f"host {op} {label}: {key} failed: {rec[f'{key}_error']}", flush=True)
            return rec
    print(f"host {op} {label}: ORT {rec['ort_host_us']:.2f} us per node (a 1-node run {rec['ort_run_us']:.1f} us), "
          f"dlkern {rec['dlkern_host_us']:.2f} us per node (a 1-node run {rec['dlkern_run_us']:.1f} us)", flush=True)
    return rec


def compare(op, label, models, bind, rate, nodes=1, sessions=None):
    """Both sessions' times; with `nodes` > 1 (side-by-side nodes of one op), per node.
    `sessions`: the models' sessions made already (or the error making one raised), by domain."""
    rec = {"op": op, "case": label}
    for domain, model in models.items():
        key = "ort" if domain == "com.microsoft" else "dlkern"
        try:
            sess = sessions[domain] if sessions else session(model)
            if isinstance(sess, Exception):
                raise sess
            sync_us, device_us, busy_us, kernels = timed(sess, bind)
            rec[f"{key}_sync_us"], rec[f"{key}_device_us"] = sync_us / nodes, device_us / nodes
            rec[f"{key}_busy_us"] = busy_us / nodes
            rec[f"{key}_kernels"] = {name: round(us / nodes, 1) for name, us in kernels.items()}
        except Exception as err:  # noqa: BLE001 - a baseline ORT refuses is reported, not fatal
            rec[f"{key}_error"] = str(err)[:300]
            print(f"{op} {label}: {key} failed: {rec[f'{key}_error']}", flush=True)
            return rec
    print(f"{op} {label}: ORT {rec['ort_sync_us']:.1f} us per call, {rec['ort_device_us']:.1f} us GPU "
          f"({rate(rec['ort_device_us'])}); dlkern {rec['dlkern_sync_us']:.1f} us per call, "
          f"{rec['dlkern_device_us']:.1f} us GPU ({rate(rec['dlkern_device_us'])}); speedup "
          f"{rec['ort_sync_us'] / rec['dlkern_sync_us']:.2f}x per call, "
          f"{rec['ort_device_us'] / rec['dlkern_device_us']:.2f}x GPU; GPU busy ORT {rec['ort_busy_us']:.1f} us, "
          f"dlkern {rec['dlkern_busy_us']:.1f} us", flush=True)
    print("   ORT kernels:", rec["ort_kernels"], "\n   dlkern kernels:", rec["dlkern_kernels"], flush=True)
    return rec


def main():
    dest = sys.argv[1] if len(sys.argv) > 1 else None
    # DLKERN_ORT_OPS="MatMulNBits,...": those ops' rows alone.
    only = os.environ.get("DLKERN_ORT_OPS")
    wanted = (lambda op: op in only.split(",")) if only else (lambda op: True)
    records = []
    # DLKERN_ORT_OPS=host: the host time per node alone.
    for op, label, make in HOST_CASES if (only and "host" in only.split(",")) or not only else ():
        records.append(host_cost(op, label, make) | {"kind": "host"})
    for label, batch, seq, context in GQA_CASES if wanted("GroupQueryAttention") else ():
        models, bind, kv_bytes, flops = gqa_case(batch, seq, context)
        rate = (lambda us, b=kv_bytes: f"{b / us / 1e6:.2f} TB/s") if seq == 1 else \
            (lambda us, f=flops: f"{f / us / 1e6:.0f} TFLOP/s")
        records.append(compare("GroupQueryAttention", label, models, bind, rate) | {"kv_bytes": kv_bytes, "flops": flops})
    for batch in (16, 64) if wanted("PagedAttention") else ():
        models, bind, kv_bytes = paged_case(batch, 4096)
        rec = compare("PagedAttention", f"decode B{batch} ctx4k block32", models, bind,
                      lambda us, b=kv_bytes: f"{b / us / 1e6:.2f} TB/s")
        records.append(rec | {"kv_bytes": kv_bytes})
    for tokens in (1, 16, 2048, 16384) if wanted("SkipSimplifiedLayerNormalization") else ():
        models, bind, nbytes = skip_norm_case(tokens)
        rec = compare("SkipSimplifiedLayerNormalization", f"{tokens} x 4096", models, bind,
                      lambda us, b=nbytes: f"{b / us / 1e6:.2f} TB/s")
        records.append(rec | {"bytes": nbytes})
    if wanted("MatMulNBits"):
        matmul_nbits_rows(dest, records)
    text = json.dumps(records, indent=1)
    if dest:
        open(dest, "w").write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
