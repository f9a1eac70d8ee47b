"""GPU host: dlkern's registry kernels called on PyTorch tensors through the DLPack C ABI, on the
rows of dlkern's criterion benches, next to PyTorch's own implementations on the same shapes in the
same run. Inputs rotate through enough copies that each call reads device memory, not L2. Both sides
are captured in CUDA graphs and timed by graph replay with CUDA events, so Python and ctypes overhead
stays out of the GPU time; dlkern's records also carry the host time per call of the same kernel
called as a Python user calls it, through a `dlkern.kernel` handle (`host_us`). Writes JSON records
to the path given (default: stdout).

    DLKERN_LIB=.gpu/lib/libdlkern.so python3 benches/compare_torch.py out.json
"""

import contextlib
import functools
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import dlkern  # noqa: E402
import dlkern_ctypes as dk  # noqa: E402
from python_call_cost import per_call_ns  # noqa: E402  (benches/, this script's folder)

LIB = dk.Library(os.environ["DLKERN_LIB"])
CALLS_PER_GRAPH = 20
REPLAYS = 30
# Calls per timed batch of the host timing: few enough that the launch queue of a row with long
# GPU times never fills, which would block a call and time the GPU instead of the host.
HOST_CALLS_PER_BATCH = 20
DTYPE_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16"}
# The rows of benches/attention.rs: (batch, heads, seqlen, head dim).
ATTENTION_SHAPES = [(16, 16, 2048, 128), (4, 16, 8192, 128), (8, 32, 4096, 64), (4, 16, 4096, 256)]
# The rows of benches/matmul_w8a8.rs: (M, N, K).
W8A8_SHAPES = [(8192, 8192, 8192), (1, 8192, 8192), (16, 8192, 8192), (128, 8192, 8192), (1024, 8192, 8192),
               (4096, 8192, 8192), (4096, 28672, 8192)]
# The rows of benches/matmul_nbits.rs: weights (N, K), rows M, and its format: blocks of 128 without
# zero points (the default, 8).
W4_WEIGHTS = [(8192, 8192), (28672, 8192), (8192, 28672)]
W4_ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 2048]
W4_BLOCK = 128


def graph_time_us(fn, calls=CALLS_PER_GRAPH):
    """Median time of one call of `fn`, from replays of a CUDA graph of `calls` calls, timed
    with events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()  # warm-up: module load, JIT, allocator
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    times.sort()
    return times[len(times) // 2]


def rotation(nbytes):
    """Copies of a working set to cycle through so each call reads device memory, not L2."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(64, -(-4 * l2 // nbytes)))


def host_time_us(fn):
    """Host time per call of `fn`: the median over batches of HOST_CALLS_PER_BATCH calls, the device
    synchronized before each batch so that the launch queue never blocks a call."""
    return per_call_ns(fn, torch.cuda.synchronize, calls=HOST_CALLS_PER_BATCH) / 1e3


def user_call(handle, inputs, attrs):
    """The call a Python user makes, for the host time: `handle` (a `dlkern.kernel`: torch's DLPack
    exchange table, outputs allocated from the kernel's inference; constant weights at the
    handle's own call site) on `inputs`, where the graph-timed calls write preallocated outputs
    through `dlkern_ctypes`, whose `__dlpack__` path costs ~100 us of host time."""
    return lambda: handle(*inputs, **attrs)


def call_dlkern(name, inputs, outputs, site=None, **attrs):
    """One registry call through the C ABI on the current stream (the capturing one inside a graph
    capture)."""
    LIB.call(name, inputs, outputs, stream=torch.cuda.current_stream().cuda_stream, site=site, **attrs)


def rotating(calls):
    """A function that runs the next of `calls` (one per copy of a working set) each time."""
    turn = itertools.cycle(calls)
    return lambda: next(turn)()


def rel_err(got, ref):
    """max |got - ref| / max |ref|, in ref's precision."""
    return ((got.to(ref.dtype) - ref).abs().max() / ref.abs().max()).item()


def dlkern_record(family, dtype, shape, call, host_call, nbytes, flops, max_rel_err, sets=1,
                  graph_calls=CALLS_PER_GRAPH, implementation="dlkern"):
    """The C ABI's record of a criterion row (the same family, dtype, shape, bytes and FLOPs): the
    device time per call of `call` from graph replay, each of its `sets` copies called in a replay,
    and the host time per call of `host_call` (a `user_call` of the same kernel and inputs)."""
    return {"family": family, "implementation": implementation, "shape": shape, "dtype": dtype,
            "time_us": graph_time_us(call, max(graph_calls, sets)), "host_us": host_time_us(host_call), "bytes": nbytes,
            "flops": flops, "max_rel_err": max_rel_err}


def rmsnorm_records():
    out = []
    for dtype, name in DTYPE_NAMES.items():
        for rows, cols in [(64, 4096), (2048, 4096), (16384, 4096), (4096, 8192), (16384, 8192)]:
            g = torch.Generator(device="cuda").manual_seed(rows * cols)
            w = torch.randn(cols, device="cuda", dtype=dtype, generator=g)
            moved = (2 * rows * cols + cols) * w.element_size()
            sets = rotation(moved)
            xs = [torch.randn(rows, cols, device="cuda", dtype=dtype, generator=g) for _ in range(sets)]
            ys = [torch.empty_like(xs[0]) for _ in range(sets)]
            shape, flops = f"{rows}x{cols}", 4 * rows * cols
            try:
                calls = [functools.partial(call_dlkern, "dlkern.rmsnorm", [x, w], [y], epsilon=1e-6)
                         for x, y in zip(xs, ys)]
                calls[0]()
                err = rel_err(ys[0], torch.nn.functional.rms_norm(xs[0].double(), (cols,), w.double(), 1e-6))
                out.append(dlkern_record("rmsnorm", name, shape, rotating(calls),
                                         user_call(dlkern.kernel("dlkern.rmsnorm"), [xs[0], w], dict(epsilon=1e-6)),
                                         moved, flops, err, sets))
            except Exception as e:
                print(f"dlkern.rmsnorm {name} {shape}: {e}", file=sys.stderr)
            torch_call = rotating([functools.partial(torch.nn.functional.rms_norm, x, (cols,), w, 1e-6) for x in xs])
            out.append({"family": "rmsnorm", "implementation": "torch.nn.functional.rms_norm", "shape": shape,
                        "dtype": name, "time_us": graph_time_us(torch_call, max(CALLS_PER_GRAPH, sets)),
                        "bytes": moved, "flops": flops, "max_rel_err": None})
    return out


def dlkern_rmsnorm_skip_records():
    """dlkern.skip_simplified_layer_normalization on the rows of benches/rmsnorm.rs's rmsnorm_skip
    group: f16, the sum written and mean and inv_std_var absent (as the model builder's node has
    them), input, skip, output and sum rotating through copies as the bench's do."""
    out = []
    cols = 4096
    absent = torch.empty(0, device="cuda", dtype=torch.float32)
    for rows in (1, 16, 2048, 16384):
        shape = f"{rows}x{cols}"
        moved = (4 * rows * cols + cols) * 2
        sets = rotation(moved)
        try:
            g = torch.Generator(device="cuda").manual_seed(rows)
            gamma = torch.randn(cols, device="cuda", dtype=torch.float16, generator=g)
            xs, skips = ([torch.randn(rows, cols, device="cuda", dtype=torch.float16, generator=g)
                          for _ in range(sets)] for _ in range(2))
            ys, sums = ([torch.empty(rows, cols, device="cuda", dtype=torch.float16) for _ in range(sets)]
                        for _ in range(2))
            skip_norm = "dlkern.skip_simplified_layer_normalization"
            calls = [functools.partial(call_dlkern, skip_norm, [x, skip, gamma],
                                       [y, absent, absent, total], epsilon=1e-6)
                     for x, skip, y, total in zip(xs, skips, ys, sums)]
            calls[0]()
            # The kernel rounds the sum to f16 before it normalizes it, as this addition does.
            total_ref = (xs[0] + skips[0]).double()
            y_ref = torch.nn.functional.rms_norm(total_ref, (cols,), gamma.double(), 1e-6)
            err = max(rel_err(sums[0], total_ref), rel_err(ys[0], y_ref))
            out.append(dlkern_record("rmsnorm_skip", "f16", shape, rotating(calls),
                                     user_call(dlkern.kernel(skip_norm, num_outputs=4), [xs[0], skips[0], gamma],
                                               dict(epsilon=1e-6)),
                                     moved, 6 * rows * cols, err, sets))
        except Exception as e:
            print(f"dlkern.skip_simplified_layer_normalization {shape}: {e}", file=sys.stderr)
    return out


def paged_attention_records():
    """PyTorch SDPA on a contiguous cache of the same sizes (the issue's baseline), flash and
    cuDNN backends, on the rows of benches/paged_attention.rs (dlkern's numbers come from that
    criterion bench). One measurement serves both of its block sizes (SDPA's cache is
    contiguous); caches smaller than a few L2s rotate through copies. Several query tokens per
    sequence attend to the whole cache (no mask): the same bytes, a lower bound on a masked call.
    No C ABI record: the bench's rows time the decode kernel alone, which no registry kernel is
    (`dlkern.paged_attention` is the whole PagedAttention op, and it reads a status back to the
    host on every call, which no graph can hold)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for batch, hq, hkv, ctx, q_len in [(1, 32, 8, 8192, 1), (1, 32, 8, 32768, 1), (1, 32, 8, 65536, 1),
                                       (1, 32, 8, 131072, 1), (16, 32, 8, 4096, 1), (16, 32, 32, 4096, 1),
                                       (64, 32, 8, 4096, 1), (256, 32, 8, 1024, 1), (64, 32, 8, 4096, 4)]:
        d = 128
        g = torch.Generator(device="cuda").manual_seed(ctx + batch)
        kv_bytes = 2 * batch * ctx * hkv * d * 2
        sets = rotation(kv_bytes)
        q = torch.randn(batch, hq, q_len, d, device="cuda", dtype=torch.float16, generator=g)
        ks = [torch.randn(batch, hkv, ctx, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(sets)]
        vs = [torch.randn(batch, hkv, ctx, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(sets)]
        queries = f" q{q_len}" if q_len > 1 else ""
        for name, backend in (("SDPA flash", SDPBackend.FLASH_ATTENTION), ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION)):
            def sdpa(k, v, backend=backend):
                with sdpa_kernel(backend):
                    torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
            call = rotating([functools.partial(sdpa, k, v) for k, v in zip(ks, vs)])
            try:
                t = graph_time_us(call, max(CALLS_PER_GRAPH, sets))
            except Exception as e:  # a backend that does not take this shape
                print(f"paged_attention baseline {name} B{batch} ctx{ctx}: {e}", file=sys.stderr)
                continue
            for block in (16, 128):
                out.append({"family": "paged_attention", "implementation": name,
                            "shape": f"B{batch} Hq{hq} Hkv{hkv} ctx{ctx} D{d} block{block}{queries}",
                            "dtype": "f16", "time_us": t, "bytes": kv_bytes, "flops": 4 * batch * q_len * hq * ctx * d})
        del q, ks, vs
        torch.cuda.empty_cache()
    return out


def attention_records():
    """PyTorch SDPA (flash and cuDNN backends) on the attention bench's shapes, f16 and bf16,
    causal and not: the issue's baselines. dlkern's numbers come from benches/attention.rs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for dtype, name in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
        for b, h, seq, d in ATTENTION_SHAPES:
            g = torch.Generator(device="cuda").manual_seed(seq + b)
            q, k, v = (torch.randn(b, h, seq, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
            for causal in (False, True):
                flops = 4 * b * h * seq * seq * d // (2 if causal else 1)
                for impl, backend in (("SDPA flash", SDPBackend.FLASH_ATTENTION), ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION)):
                    def call():
                        with sdpa_kernel(backend):
                            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    try:
                        t = graph_time_us(call, calls=4)
                    except Exception as e:  # a backend that does not take this shape
                        print(f"attention baseline {impl} {name} B{b}: {e}", file=sys.stderr)
                        continue
                    out.append({"family": "attention", "implementation": impl,
                                "shape": f"B{b} H{h} S{seq} D{d}{' causal' if causal else ''}", "dtype": name,
                                "time_us": t, "bytes": 4 * b * h * seq * d * 2, "flops": flops})
            del q, k, v
            torch.cuda.empty_cache()
    return out


def int_mm_records():
    """torch._int_mm (int8 x int8 -> int32, cuBLASLt) on the W8A8 bench's shapes: the issue's
    int8 baseline (no scaling epilogue, so a lower bound on a full W8A8 matmul's time)."""
    out = []
    for m, n, k in W8A8_SHAPES:
        # _int_mm needs M > 16 (and multiples of 8): pad small M to 32, as a caller would.
        mp = max(m, 32)
        a = torch.randint(-128, 127, (mp, k), device="cuda", dtype=torch.int8)
        # [N, K] row-major seen as [K, N]: the column-major B that cuBLASLt's int8 kernels take
        # (a row-major [K, N] B falls back to a slow path, ~50x slower here).
        w = torch.randint(-128, 127, (n, k), device="cuda", dtype=torch.int8).t()
        try:
            t = graph_time_us(lambda: torch._int_mm(a, w), calls=4)
        except Exception as e:
            print(f"_int_mm M{m}: {e}", file=sys.stderr)
            continue
        out.append({"family": "matmul_w8a8", "implementation": "torch._int_mm" + (" (M padded to 32)" if mp != m else ""),
                    "shape": f"M{m} N{n} K{k}", "dtype": "int8 -> f16", "time_us": t,
                    "bytes": m * k + n * k + 2 * m * n, "flops": 2 * m * n * k})
        del a, w
        torch.cuda.empty_cache()
    return out


def int4pack_mm_records():
    """torch._weight_int4pack_mm (tinygemm: 4-bit weights in groups of 128, bf16 activations,
    scales and zeros) on the W4 bench's shapes: the W4A16 kernel PyTorch ships, next to the
    issue's cuBLAS f16 baseline. bf16 only (its CUDA kernel takes no f16); the weights and their
    constants rotate through copies, as dlkern's do, so that each call reads device memory."""
    out = []
    group = 128
    for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024):
        for n, k in W4_WEIGHTS:
            g = torch.Generator(device="cuda").manual_seed(m * n + k)
            w_bytes = n * k // 2 + (k // group) * n * 2 * 2
            sets = rotation(w_bytes)
            try:
                ws = [torch._convert_weight_to_int4pack(
                    torch.randint(0, 256, (n, k // 2), device="cuda", dtype=torch.uint8, generator=g), 8)
                    for _ in range(sets)]
                sz = [torch.rand(k // group, n, 2, device="cuda", generator=g).to(torch.bfloat16) for _ in range(sets)]
                x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
                call = rotating([functools.partial(torch._weight_int4pack_mm, x, w, group, s) for w, s in zip(ws, sz)])
                t = graph_time_us(call, max(CALLS_PER_GRAPH, sets))
            except Exception as e:  # a build or GPU without the kernel
                print(f"_weight_int4pack_mm M{m} N{n} K{k}: {e}", file=sys.stderr)
                return out
            out.append({"family": "matmul_nbits", "implementation": "torch._weight_int4pack_mm (bf16)",
                        "shape": f"M{m} N{n} K{k}", "dtype": "f16", "time_us": t,
                        "bytes": w_bytes + 2 * m * k + 2 * m * n, "flops": 2 * m * n * k})
            del ws, sz, x
            torch.cuda.empty_cache()
    return out


def attention_error(q, k, v, out, causal):
    """rel_err of `out` on the first sequence's first head against a float32 reference ([B, S, H, D]
    tensors, scale 1/sqrt(D))."""
    q0, k0, v0 = (t[0, :, 0].float() for t in (q, k, v))
    scores = q0 @ k0.T / q0.shape[-1] ** 0.5
    if causal:
        scores.masked_fill_(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    return rel_err(out[0, :, 0], torch.softmax(scores, dim=-1) @ v0)


def dlkern_attention_records():
    """dlkern.attention on the rows of benches/attention.rs: q, k and v [B, S, H, D] with as many
    KV heads as query heads, scale 1/sqrt(D), causal and not, f16 and bf16; working sets of
    hundreds of MB, not rotated (neither are the bench's nor SDPA's). Its "dlkern mma.sync" rows
    have no record: that kernel is the registry's choice only under DLKERN_ATTENTION_KERNEL=mma_sync,
    read once per process."""
    out = []
    for dtype, name in DTYPE_NAMES.items():
        for b, h, seq, d in ATTENTION_SHAPES:
            try:
                out += attention_shape_records(dtype, name, b, h, seq, d)
            except Exception as e:  # its inputs: each row's own failure is reported inside
                print(f"dlkern.attention {name} B{b} H{h} S{seq} D{d}: {e}", file=sys.stderr)
            torch.cuda.empty_cache()
    return out


def attention_shape_records(dtype, name, b, h, seq, d):
    """dlkern_attention_records' rows of one shape, causal and not."""
    out = []
    g = torch.Generator(device="cuda").manual_seed(seq + b)
    q, k, v = (torch.randn(b, seq, h, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    o = torch.empty_like(q)
    for causal in (False, True):
        shape = f"B{b} H{h} S{seq} D{d}{' causal' if causal else ''}"
        try:
            call = functools.partial(call_dlkern, "dlkern.attention", [q, k, v], [o], causal=int(causal))
            call()
            flops = 4 * b * h * seq * seq * d // (2 if causal else 1)
            out.append(dlkern_record("attention", name, shape, call,
                                     user_call(dlkern.kernel("dlkern.attention"), [q, k, v], dict(causal=int(causal))),
                                     4 * q.numel() * q.element_size(), flops, attention_error(q, k, v, o, causal),
                                     graph_calls=4))
        except Exception as e:
            print(f"dlkern.attention {name} {shape}: {e}", file=sys.stderr)
    return out


def dequantized_w4(b, scales):
    """4-bit codes [N, k_blocks, block / 2] (low nibble first along K, zero point 8) times their
    scales [N, k_blocks]: the weights [N, K] in float32."""
    n, blocks, half = b.shape
    codes = torch.stack((b & 15, b >> 4), dim=-1).reshape(n, blocks, 2 * half)
    return ((codes.float() - 8) * scales.float()[:, :, None]).reshape(n, blocks * 2 * half)


@contextlib.contextmanager
def call_sites(count, constant_inputs):
    """`count` call sites whose inputs at `constant_inputs` are constant, destroyed on leaving once
    the device has run what was queued through them."""
    sites = [LIB.site_create(constant_inputs) for _ in range(count)]
    try:
        yield sites
    finally:
        torch.cuda.synchronize()
        for site in sites:
            LIB.site_destroy(site)


def repacked_bytes(sites, bs, scales, attrs):
    """Primes each of `sites` (B and the scales constant) with a call at M = 1 on its copy of the
    weights, where dlkern.matmul_nbits repacks them for its decode kernels and keeps the copy in
    the site (the repacking waits for the stream, which a graph capture cannot hold). Returns the
    bytes of one repacked copy, or 0 where the device had no memory for one: that site would go
    on reading the MatMulNBits layout."""
    a = torch.zeros(1, attrs["K"], device="cuda", dtype=torch.float16)
    y = torch.empty(1, attrs["N"], device="cuda", dtype=torch.float16)
    held = []
    for b, s, site in zip(bs, scales, sites):
        before = LIB.device_bytes_held()
        call_dlkern("dlkern.matmul_nbits", [a, b, s], [y], site=site, **attrs)
        held.append(LIB.device_bytes_held() - before)
    return held[0] if len(set(held)) == 1 else 0


def dlkern_matmul_nbits_records():
    """dlkern.matmul_nbits on the rows of benches/matmul_nbits.rs: f16, 4-bit weights in blocks of
    128 without zero points, B and the scales rotating through copies as the bench's do. The
    "dlkern" rows are plain calls (for M <= 16 the bench's launches also mark the weights as
    written before the kernel before them, which a call without a site does not); the "dlkern
    packed B" rows (M <= 16) call through a site per copy that marks B and the scales constant, as
    an ONNX node's initializers are: the kernel repacks them once and reads that copy, as
    `Variant::Packed` does. The bench's forced variants (mma.sync over packed B, whole tiles, the
    large-M kernels the planner did not take) have no registry call."""
    out = []
    for n, k in W4_WEIGHTS:
        try:
            out += w4_weight_records(n, k)
        except Exception as e:  # the weights or a row's inputs: each call's failure is reported inside
            print(f"dlkern.matmul_nbits N{n} K{k}: {e}", file=sys.stderr)
        torch.cuda.empty_cache()
    return out


def w4_weight_records(n, k):
    """dlkern_matmul_nbits_records' rows of the weights [N, K], every M."""
    out = []
    blocks = k // W4_BLOCK
    w4_bytes = n * k // 2 + n * blocks * 2
    sets = rotation(w4_bytes)
    g = torch.Generator(device="cuda").manual_seed(n + k)
    bs = [torch.randint(0, 256, (n, blocks, W4_BLOCK // 2), device="cuda", dtype=torch.uint8, generator=g)
          for _ in range(sets)]
    scales = [(0.01 + 0.006 * torch.rand(n, blocks, device="cuda", generator=g)).half() for _ in range(sets)]
    w_ref = dequantized_w4(bs[0], scales[0])
    attrs = dict(K=k, N=n, bits=4, block_size=W4_BLOCK)
    # The host time's handles, one for every M: the constant one repacks bs[0] once, at its first call.
    handles = {"dlkern": dlkern.kernel("dlkern.matmul_nbits"),
               "dlkern packed B": dlkern.kernel("dlkern.matmul_nbits", constant_inputs=(1, 2))}
    with call_sites(sets, constant_inputs=(1, 2)) as sites:
        try:
            packed_bytes = repacked_bytes(sites, bs, scales, attrs)
            if not packed_bytes:
                print(f"dlkern.matmul_nbits N{n} K{k}: no repacked weights (no device memory for them, or "
                      "DLKERN_MATMUL_NBITS_REPACK=0): no packed B rows", file=sys.stderr)
        except Exception as e:
            print(f"dlkern.matmul_nbits N{n} K{k} repacking: {e}", file=sys.stderr)
            packed_bytes = 0
        for m in W4_ROWS:
            shape = f"M{m} N{n} K{k}"
            a = (torch.rand(m, k, device="cuda", generator=g) - 0.5).half()
            y = torch.empty(m, n, device="cuda", dtype=torch.float16)
            ref = a.float() @ w_ref.T
            io = 2 * (m * k + m * n)
            variants = [("dlkern", w4_bytes, [None] * sets)]
            if m <= 16 and packed_bytes:
                variants.append(("dlkern packed B", packed_bytes, sites))
            for implementation, weight_bytes, at in variants:
                try:
                    calls = [functools.partial(call_dlkern, "dlkern.matmul_nbits", [a, b, s], [y], site=site, **attrs)
                             for b, s, site in zip(bs, scales, at)]
                    calls[0]()
                    out.append(dlkern_record("matmul_nbits", "f16", shape, rotating(calls),
                                             user_call(handles[implementation], [a, bs[0], scales[0]], attrs),
                                             weight_bytes + io,
                                             2 * m * n * k, rel_err(y, ref), sets, implementation=implementation))
                except Exception as e:
                    print(f"{implementation} matmul_nbits {shape}: {e}", file=sys.stderr)
    return out


def packed_w8(w):
    """int8 weights [N, K] in dlkern.matmul_w8a8's w_layout "decode_packed" (the layout of
    dlkern_onnx.pack_w8_for_decode, made on the device): zero-padded to [ceil(N/16)*16,
    ceil(K/64)*64], each 16 x 64 tile contiguous."""
    n, k = w.shape
    rows, cols = -(-n // 16) * 16, -(-k // 64) * 64
    padded = torch.zeros(rows, cols, device=w.device, dtype=torch.int8)
    padded[:n, :k] = w
    return padded.reshape(rows // 16, 16, cols // 64, 64).permute(0, 2, 1, 3).contiguous().reshape(rows, cols)


def quantize_record(m, k):
    """dlkern.quantize_per_token on the bench's w8a8_quantize row of M x K f16 activations (a
    rotating working set), against PyTorch's round-half-to-even of x / (max |x| / 127) per row."""
    nbytes = 3 * m * k + 4 * m
    sets = rotation(nbytes)
    g = torch.Generator(device="cuda").manual_seed(m + k)
    xs = [torch.randn(m, k, device="cuda", dtype=torch.float16, generator=g) for _ in range(sets)]
    qs = [torch.empty(m, k, device="cuda", dtype=torch.int8) for _ in range(sets)]
    row_scales = [torch.empty(m, device="cuda", dtype=torch.float32) for _ in range(sets)]
    calls = [functools.partial(call_dlkern, "dlkern.quantize_per_token", [x], [q, s])
             for x, q, s in zip(xs, qs, row_scales)]
    calls[0]()
    x = xs[0].float()
    step = x.abs().amax(dim=-1, keepdim=True) / 127
    err = rel_err(qs[0].float() * row_scales[0][:, None], torch.round(x / step) * step)
    return dlkern_record("w8a8_quantize", "f16 -> int8", f"M{m} K{k}", rotating(calls),
                         user_call(dlkern.kernel("dlkern.quantize_per_token", num_outputs=2), [xs[0]], {}),
                         nbytes, 0, err, sets)


def dlkern_matmul_w8a8_records():
    """dlkern.matmul_w8a8 on the rows of benches/matmul_w8a8.rs: int8 activations with a scale per
    row, int8 weights [N, K] with a scale per column, f16 out, no bias ("dlkern"), and for M <= 16
    the same weights in the decode kernel's packed layout ("dlkern packed W", w_layout
    "decode_packed"), the weights and their scales rotating through copies; and
    dlkern.quantize_per_token once per activation shape (w8a8_quantize)."""
    out = []
    quantized = set()
    for m, n, k in W8A8_SHAPES:
        try:
            out += w8a8_shape_records(m, n, k)
        except Exception as e:  # its inputs: each call's failure is reported inside
            print(f"dlkern.matmul_w8a8 M{m} N{n} K{k}: {e}", file=sys.stderr)
        if (m, k) not in quantized:
            quantized.add((m, k))
            try:
                out.append(quantize_record(m, k))
            except Exception as e:
                print(f"dlkern.quantize_per_token M{m} K{k}: {e}", file=sys.stderr)
        torch.cuda.empty_cache()
    return out


def w8a8_shape_records(m, n, k):
    """dlkern_matmul_w8a8_records' rows of one shape, each weight layout."""
    out = []
    shape = f"M{m} N{n} K{k}"
    sets = rotation(n * k)
    g = torch.Generator(device="cuda").manual_seed(m * n + k)
    a = torch.randint(-127, 127, (m, k), device="cuda", dtype=torch.int8, generator=g)
    a_scale = 0.005 + 0.01 * torch.rand(m, device="cuda", generator=g)
    ws = [torch.randint(-127, 127, (n, k), device="cuda", dtype=torch.int8, generator=g) for _ in range(sets)]
    w_scales = [0.005 + 0.01 * torch.rand(n, device="cuda", generator=g) for _ in range(sets)]
    y = torch.empty(m, n, device="cuda", dtype=torch.float16)
    ref = (a.float() * a_scale[:, None]) @ (ws[0].float() * w_scales[0][:, None]).T
    layouts = [("dlkern", "nk", ws)]
    if m <= 16:
        layouts.append(("dlkern packed W", "decode_packed", [packed_w8(w) for w in ws]))
    for implementation, layout, weights in layouts:
        try:
            calls = [functools.partial(call_dlkern, "dlkern.matmul_w8a8", [a, a_scale, w, s], [y], out_dtype="f16",
                                       w_layout=layout)
                     for w, s in zip(weights, w_scales)]
            calls[0]()
            nbytes = m * k + weights[0].numel() + 2 * m * n
            out.append(dlkern_record("matmul_w8a8", "int8 -> f16", shape, rotating(calls),
                                     user_call(dlkern.kernel("dlkern.matmul_w8a8"),
                                               [a, a_scale, weights[0], w_scales[0]],
                                               dict(out_dtype="f16", w_layout=layout)), nbytes, 2 * m * n * k,
                                     rel_err(y, ref), sets, implementation=implementation))
        except Exception as e:
            print(f"{implementation} matmul_w8a8 {shape}: {e}", file=sys.stderr)
    return out


def main():
    # DLKERN_TORCH_FAMILIES (comma-separated, default all) picks the baselines a partial run needs;
    # the dlkern_* entries (and rmsnorm, with its baseline) time dlkern's registry kernels through
    # the C ABI on the rows of the criterion bench of the family they name.
    families = {"rmsnorm": rmsnorm_records, "paged_attention": paged_attention_records, "attention": attention_records,
                "int_mm": int_mm_records, "int4pack_mm": int4pack_mm_records,
                "dlkern_attention": dlkern_attention_records, "dlkern_matmul_nbits": dlkern_matmul_nbits_records,
                "dlkern_matmul_w8a8": dlkern_matmul_w8a8_records, "dlkern_rmsnorm_skip": dlkern_rmsnorm_skip_records}
    wanted = os.environ.get("DLKERN_TORCH_FAMILIES", ",".join(families)).split(",")
    unknown = [w for w in wanted if w not in families]
    if unknown:
        sys.exit(f"DLKERN_TORCH_FAMILIES: unknown {unknown}; known {list(families)}")
    records = [r for name in wanted for r in families[name]()]
    text = json.dumps(records, indent=1)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)
    else:
        print(text)
    for r in records:
        host = f" host {r['host_us']:7.2f} us" if "host_us" in r else ""
        print(f"{r['family']:8} {r['dtype']:5} {r['shape']:>11} {r['implementation']:30} {r['time_us']:9.2f} us "
              f"{r['bytes'] / r['time_us'] / 1e6:7.3f} TB/s{host}", file=sys.stderr)


if __name__ == "__main__":
    main()
