"""Host time per call of `dlkern.call` on PyTorch CUDA tensors (issue 45's Python path), through
torch's DLPack C exchange table and through `__dlpack__`, beside `torch.nn.functional.rms_norm`: what one call costs the calling thread, the device synchronized
outside the timed calls so that the launch queue never blocks one. Writes criterion-shaped rows
(`host_cost/...`, family host_cost) that gpu-bench.sh adds to the host-cost table.

    DLKERN_LIB=.gpu/lib/libdlkern.so python3 benches/python_call_cost.py out.json
"""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def per_call_ns(fn, sync, batches=30, calls=100):
    """Median over batches of the host time per call, each batch synchronized before it starts."""
    for _ in range(calls):
        fn()
    times = []
    for _ in range(batches):
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter_ns() - t0) / calls)
    sync()
    return statistics.median(times)


def main():
    import torch

    import dlkern
    import dlkern_ctypes as dk

    rows, cols = 16, 4096
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
    w = torch.randn(cols, device="cuda", dtype=torch.float16)
    rmsnorm = dlkern.kernel("dlkern.rmsnorm")
    call = lambda: dlkern.call("dlkern.rmsnorm", x, w, epsilon=1e-6)  # noqa: E731
    exchange = dk.exchange_table(torch.Tensor) is not None
    print(f"torch {torch.__version__}: DLPack C exchange table {'published' if exchange else 'absent'}")
    # (name, function, whether dlkern.call may use torch's exchange table)
    cases = [
        (f"dlkern.call (Python, torch, __dlpack__) rmsnorm {rows}x{cols}", call, False),
        (f"torch.nn.functional.rms_norm {rows}x{cols}",
         lambda: torch.nn.functional.rms_norm(x, (cols,), w, 1e-6), True),
    ]
    if exchange:
        cases[1:1] = [(f"dlkern.call (Python, torch, exchange table) rmsnorm {rows}x{cols}", call, True),
                      (f"dlkern.kernel handle (Python, torch, exchange table) rmsnorm {rows}x{cols}",
                       lambda: rmsnorm(x, w, epsilon=1e-6), True)]
    ref = torch.nn.functional.rms_norm(x.float(), (cols,), w.float(), 1e-6)
    # The W4 decode GEMV (builder's format: block 32, symmetric) through dlkern.call, and through
    # a handle whose weights are constant, which calls at a site where the kernel keeps them
    # repacked; cuBLAS's f16 GEMV through torch beside them.
    n = k = 4096
    a = torch.randn(1, k, device="cuda", dtype=torch.float16) * 0.1
    b = torch.randint(0, 256, (n, k // 32, 16), device="cuda", dtype=torch.uint8)
    scales = torch.rand(n, k // 32, device="cuda", dtype=torch.float16) * 0.02
    w4 = dict(K=k, N=n, bits=4, block_size=32)
    w4_handle = dlkern.kernel("dlkern.matmul_nbits", constant_inputs=(1, 2))
    w_dense = torch.randn(k, n, device="cuda", dtype=torch.float16)
    w4_ref = dlkern.call("dlkern.matmul_nbits", a, b, scales, **w4).float()
    w4_cases = [
        (f"dlkern.call (Python, torch, exchange table) matmul_nbits M1 {n}x{k} b32",
         lambda: dlkern.call("dlkern.matmul_nbits", a, b, scales, **w4), True),
        (f"dlkern.kernel handle, constant weights (Python, torch, exchange table) matmul_nbits M1 {n}x{k} b32",
         lambda: w4_handle(a, b, scales, **w4), True),
    ] if exchange else []
    rows_out = []
    for name, fn, use_table in cases + w4_cases:
        dlkern.kernels.USE_EXCHANGE_TABLES = use_table
        want = w4_ref if "matmul_nbits" in name else ref
        got = fn().float()
        assert (got - want).abs().max().item() <= 5e-2 * max(1.0, want.abs().max().item()), f"{name} gave a wrong result"
        rows_out.append({"id": f"host_cost/{name}", "median_ns": per_call_ns(fn, torch.cuda.synchronize)})
    rows_out.append({"id": f"host_cost/torch.matmul f16 M1 {n}x{k}",
                     "median_ns": per_call_ns(lambda: torch.matmul(a, w_dense), torch.cuda.synchronize)})
    dlkern.kernels.USE_EXCHANGE_TABLES = True
    for r in rows_out:
        print(f"{r['id']}: {r['median_ns'] / 1e3:.2f} us")
    with open(sys.argv[1], "w") as f:
        json.dump({"criterion": rows_out, "meta": [{"id": r["id"], "family": "host_cost"} for r in rows_out]}, f)


if __name__ == "__main__":
    main()
