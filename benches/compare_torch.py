"""GPU host: dlkern's kernels called on PyTorch tensors through the DLPack C ABI, next to PyTorch's
own implementations on the same shapes in the same run. Inputs rotate through enough copies that each call reads device memory, not L2. Both sides
are captured in CUDA graphs
and timed by graph replay with CUDA events, so Python and ctypes overhead stays out of the GPU
time. Writes JSON records to the path given (default: stdout).

    DLKERN_LIB=.gpu/lib/libdlkern.so python3 benches/compare_torch.py out.json
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import dlkern_ctypes as dk  # noqa: E402

LIB = dk.Library(os.environ["DLKERN_LIB"])
CALLS_PER_GRAPH = 20
REPLAYS = 30


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


def rmsnorm_records():
    out = []
    for dtype in (torch.float16, torch.bfloat16):
        for rows, cols in [(64, 4096), (2048, 4096), (16384, 4096), (4096, 8192), (16384, 8192)]:
            g = torch.Generator(device="cuda").manual_seed(rows * cols)
            w = torch.randn(cols, device="cuda", dtype=dtype, generator=g)
            moved = (2 * rows * cols + cols) * w.element_size()
            sets = rotation(moved)
            xs = [torch.randn(rows, cols, device="cuda", dtype=dtype, generator=g) for _ in range(sets)]
            ys = [torch.empty_like(xs[0]) for _ in range(sets)]
            x, y = xs[0], ys[0]
            turn = [0]

            def dlkern_call():
                k = turn[0] = (turn[0] + 1) % sets
                LIB.call("dlkern.rmsnorm", [xs[k], w], [ys[k]], stream=torch.cuda.current_stream().cuda_stream, epsilon=1e-6)

            def torch_call():
                k = turn[0] = (turn[0] + 1) % sets
                torch.nn.functional.rms_norm(xs[k], (cols,), w, 1e-6)

            ref = torch.nn.functional.rms_norm(x.double(), (cols,), w.double(), 1e-6)
            LIB.call("dlkern.rmsnorm", [x, w], [y], stream=torch.cuda.current_stream().cuda_stream, epsilon=1e-6)
            torch.cuda.synchronize()
            err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
            for impl, fn in (("dlkern", dlkern_call), ("torch.nn.functional.rms_norm", torch_call)):
                out.append({"family": "rmsnorm", "implementation": impl, "shape": f"{rows}x{cols}",
                            "dtype": str(dtype).replace("torch.", "").replace("float16", "f16").replace("bfloat16", "bf16"),
                            "time_us": graph_time_us(fn, max(CALLS_PER_GRAPH, sets)), "bytes": moved, "flops": 4 * rows * cols,
                            "max_rel_err": err if impl == "dlkern" else None})
    return out


def paged_attention_records():
    """PyTorch SDPA on a contiguous cache of the same sizes (the issue's baseline), flash and
    cuDNN backends, on the rows of benches/paged_attention.rs (dlkern's numbers come from that
    criterion bench). One measurement serves both of its block sizes (SDPA's cache is
    contiguous); caches smaller than a few L2s rotate through copies. Several query tokens per
    sequence attend to the whole cache (no mask): the same bytes, a lower bound on a masked call."""
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
            turn = [0]

            def call():
                i = turn[0] = (turn[0] + 1) % sets
                with sdpa_kernel(backend):
                    torch.nn.functional.scaled_dot_product_attention(q, ks[i], vs[i], enable_gqa=hq != hkv)
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
        for b, h, seq, d in [(16, 16, 2048, 128), (4, 16, 8192, 128), (8, 32, 4096, 64), (4, 16, 4096, 256)]:
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
    for m, n, k in [(8192, 8192, 8192), (1, 8192, 8192), (16, 8192, 8192), (128, 8192, 8192), (1024, 8192, 8192),
                    (4096, 8192, 8192), (4096, 28672, 8192)]:
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
        for n, k in ((8192, 8192), (28672, 8192), (8192, 28672)):
            g = torch.Generator(device="cuda").manual_seed(m * n + k)
            w_bytes = n * k // 2 + (k // group) * n * 2 * 2
            sets = rotation(w_bytes)
            try:
                ws = [torch._convert_weight_to_int4pack(
                    torch.randint(0, 256, (n, k // 2), device="cuda", dtype=torch.uint8, generator=g), 8)
                    for _ in range(sets)]
                sz = [torch.rand(k // group, n, 2, device="cuda", generator=g).to(torch.bfloat16) for _ in range(sets)]
                x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
                turn = [0]

                def call():
                    i = turn[0] = (turn[0] + 1) % sets
                    torch._weight_int4pack_mm(x, ws[i], group, sz[i])

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


def main():
    # DLKERN_TORCH_FAMILIES (comma-separated, default all) picks the baselines a partial run needs.
    families = {"rmsnorm": rmsnorm_records, "paged_attention": paged_attention_records, "attention": attention_records,
                "int_mm": int_mm_records, "int4pack_mm": int4pack_mm_records}
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
        print(f"{r['family']:8} {r['dtype']:5} {r['shape']:>11} {r['implementation']:30} {r['time_us']:9.2f} us "
              f"{r['bytes'] / r['time_us'] / 1e6:7.3f} TB/s", file=sys.stderr)


if __name__ == "__main__":
    main()
