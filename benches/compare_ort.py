"""GPU host: dlkern's drop-in ops against onnxruntime-gpu's own com.microsoft kernels, each as one
ORT node on the CUDA EP, same inputs, in the same run (ORT's own node is the baseline an ORT user
has). Caches are bound with IO binding the way onnxruntime-genai binds them (present = past, one
buffer); every input lives on the device except total_sequence_length.

Two times per case, both per run of the one-node session:
- `sync_us`: `run_with_iobinding` with ORT's end-of-run synchronization, the median of many runs:
  what one call costs the caller (host work + launch + device time).
- `device_us`: the summed durations of the kernels one run launches (CUPTI, through
  torch.profiler), i.e. GPU time without the host's share.

    DLKERN_LIB=.gpu/lib/libdlkern.so python3 benches/compare_ort.py out.json
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

LIB = os.path.abspath(os.environ["DLKERN_LIB"])
SYNC_RUNS = int(os.environ.get("DLKERN_ORT_RUNS", "50"))


def make_model(node, inputs, outputs):
    graph = helper.make_graph([node], "g", inputs, outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("dlkern", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def session(model):
    so = ort.SessionOptions()
    so.register_custom_ops_library(LIB)
    so.log_severity_level = 3
    return ort.InferenceSession(model, so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])


def timed(sess, bind):
    """(sync_us, device_us) of one run of `sess` with the bindings `bind` makes."""
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
    runs = 10
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            sess.run_with_iobinding(io)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    device_us = sum(e.device_time for e in kernels) / runs
    return statistics.median(times) * 1e6, device_us, sorted({e.name[:60] for e in kernels})


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


def main():
    dest = sys.argv[1] if len(sys.argv) > 1 else None
    records = []
    for label, batch, seq, context in GQA_CASES:
        models, bind, kv_bytes, flops = gqa_case(batch, seq, context)
        rec = {"op": "GroupQueryAttention", "case": label, "kv_bytes": kv_bytes, "flops": flops}
        for domain, model in models.items():
            key = "ort" if domain == "com.microsoft" else "dlkern"
            rec[f"{key}_sync_us"], rec[f"{key}_device_us"], rec[f"{key}_kernels"] = timed(session(model), bind)
        records.append(rec)
        rate = lambda us: (f"{kv_bytes / us / 1e6:.2f} TB/s" if seq == 1 else f"{flops / us / 1e6:.0f} TFLOP/s")
        print(f"{label}: ORT {rec['ort_sync_us']:.1f} us per call, {rec['ort_device_us']:.1f} us GPU ({rate(rec['ort_device_us'])}); "
              f"dlkern {rec['dlkern_sync_us']:.1f} us per call, {rec['dlkern_device_us']:.1f} us GPU "
              f"({rate(rec['dlkern_device_us'])}); speedup {rec['ort_sync_us'] / rec['dlkern_sync_us']:.2f}x per call, "
              f"{rec['ort_device_us'] / rec['dlkern_device_us']:.2f}x GPU", flush=True)
        print("   ORT kernels:", rec["ort_kernels"], "\n   dlkern kernels:", rec["dlkern_kernels"], flush=True)
    text = json.dumps(records, indent=1)
    if dest:
        open(dest, "w").write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
