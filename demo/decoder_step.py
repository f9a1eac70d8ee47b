"""dlkern's main job: build a small decoder-step ONNX model that uses dlkern's ops, run it through
ONNX Runtime with libdlkern.so registered (CUDA EP when onnxruntime-gpu and a GPU are present,
else the CPU EP), check the result against NumPy, and print per-op timings.

    python demo/decoder_step.py --lib target/release/libdlkern.so

The step: h = RMSNorm(x) (dlkern typed op) -> MLP (ONNX MatMul/Relu/MatMul) -> + x ->
y = DLPackKernel(function_name="dlkern.rmsnorm") (dlkern generic op, any registered kernel).
"""

import argparse
import collections
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import dlkern_onnx as dx  # noqa: E402


def build(dim, hidden, elem, np_dtype, seed=0):
    rng = np.random.default_rng(seed)
    w_norm = rng.uniform(0.5, 1.5, dim).astype(np_dtype)
    w_up = (rng.standard_normal((dim, hidden)) / np.sqrt(dim)).astype(np_dtype)
    w_down = (rng.standard_normal((hidden, dim)) / np.sqrt(hidden)).astype(np_dtype)
    w_final = rng.uniform(0.5, 1.5, dim).astype(np_dtype)
    nodes = [
        helper.make_node("RMSNorm", ["x", "w_norm"], ["h"], domain="dlkern", name="input_rmsnorm", epsilon=1e-5),
        helper.make_node("MatMul", ["h", "w_up"], ["u"], name="mlp_up"),
        helper.make_node("Relu", ["u"], ["a"], name="mlp_act"),
        helper.make_node("MatMul", ["a", "w_down"], ["d"], name="mlp_down"),
        helper.make_node("Add", ["x", "d"], ["r"], name="residual"),
        helper.make_node("DLPackKernel", ["r", "w_final"], ["y"], domain="dlkern", name="final_norm",
                         function_name="dlkern.rmsnorm", epsilon=1e-5, attribute_names="epsilon"),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in
             [(w_norm, "w_norm"), (w_up, "w_up"), (w_down, "w_down"), (w_final, "w_final")]]
    model = dx.model(nodes, [dx.value("x", elem, ["batch", "seq", dim])], [dx.value("y", elem, None)], inits)
    return model, (w_norm, w_up, w_down, w_final)


def reference(x, weights, eps=1e-5):
    w_norm, w_up, w_down, w_final = [w.astype(np.float64) for w in weights]
    x = x.astype(np.float64)

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    r = x + np.maximum(rms(x, w_norm) @ w_up, 0) @ w_down
    return rms(r, w_final)


def node_timings(profile_path):
    with open(profile_path) as f:
        events = json.load(f)
    per_node = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            args = e.get("args", {})
            per_node[(e["name"][: -len("_kernel_time")], args.get("op_name", "?"), args.get("provider", "?"))].append(e["dur"])
    os.remove(profile_path)
    return per_node


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="target/release/libdlkern.so")
    ap.add_argument("--provider", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=2816)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()

    cuda_ok = "CUDAExecutionProvider" in ort.get_available_providers()
    use_cuda = args.provider == "cuda" or (args.provider == "auto" and cuda_ok)
    if use_cuda and not cuda_ok:
        sys.exit("CUDAExecutionProvider is not available in this onnxruntime build")
    provider = "CUDAExecutionProvider" if use_cuda else "CPUExecutionProvider"
    elem, np_dtype = (TensorProto.FLOAT16, np.float16) if use_cuda else (TensorProto.FLOAT, np.float32)
    print(f"onnxruntime {ort.__version__}, provider {provider}, dtype {np.dtype(np_dtype).name}, "
          f"x [{args.batch}, {args.seq}, {args.dim}], MLP hidden {args.hidden}")

    model, weights = build(args.dim, args.hidden, elem, np_dtype)
    sess = dx.session(args.lib, model, provider, profile=True)
    x = np.random.default_rng(1).standard_normal((args.batch, args.seq, args.dim)).astype(np_dtype)
    binding = sess.io_binding()
    if use_cuda:  # inputs and outputs stay in device memory: no host copies inside the run
        binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0))
        binding.bind_output("y", "cuda")
    else:
        binding.bind_cpu_input("x", x)
        binding.bind_output("y")
    sess.run_with_iobinding(binding)  # warm-up: module load, JIT, allocations
    start = time.perf_counter()
    for _ in range(args.runs):
        sess.run_with_iobinding(binding)
    wall_ms = (time.perf_counter() - start) / args.runs * 1e3
    y = binding.copy_outputs_to_cpu()[0]
    timings = node_timings(sess.end_profiling())

    ref = reference(x, weights)
    err = np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max()
    tol = 2e-2 if use_cuda else 1e-4  # fp16 storage of every intermediate vs f64 NumPy
    print(f"\nmax |y - ref| / max |ref| = {err:.2e} (tolerance {tol:.0e})")
    print(f"\n{'node':<16}{'op':<14}{'provider':<24}{'mean us':>10}")
    for (node, op, prov), durs in sorted(timings.items(), key=lambda kv: -np.mean(kv[1][1:] or kv[1])):
        steady = durs[1:] or durs
        print(f"{node:<16}{op:<14}{prov:<24}{np.mean(steady):>10.1f}")
    print(f"\nwhole step: {wall_ms:.3f} ms per run (wall clock, {args.runs} runs)")
    dlkern_nodes = [k for k in timings if k[1] in ("RMSNorm", "DLPackKernel")]
    if len(dlkern_nodes) != 2 or any(k[2] != provider for k in dlkern_nodes):
        sys.exit(f"FAIL: dlkern's nodes did not run on {provider}: {dlkern_nodes}")
    if not np.isfinite(err) or err > tol:
        sys.exit("FAIL: output does not match the NumPy reference")
    print("OK: output matches the NumPy reference")


if __name__ == "__main__":
    main()
