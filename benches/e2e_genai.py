"""GPU host: a Llama-3-8B-shaped int4 model end to end through onnxruntime-genai, on
onnxruntime-gpu's own CUDA kernels and retargeted to dlkern's, in the same run.

The model comes from dlkern.synth (the builder's graph with random weights; the GPU host has no
torch checkpoint or network), in the builder's default int4 format (block 32, symmetric) and
with block 128 and zero points. Per variant:
- time to first token of a 2048-token prompt (batch 1: the prompt's forward pass plus picking
  the token), the median of a few;
- decode tokens/s at batch 1 and 16, each sequence 2048 tokens into its context (the median
  step);
- for batch-1 decode: GPU time per token (CUPTI: every kernel the step launches), its split by
  kernel, and the host time per token that ORT's profiler gives the nodes, per op type;
- batch-1 decode with ORT's CUDA graphs (provider option enable_cuda_graph), or why not.

    DLKERN_LIB=.gpu/lib/libdlkern.so python3 benches/e2e_genai.py out.json [--work /tmp/e2e]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
from dlkern import genai, retarget, synth  # noqa: E402

FORMATS = {"b32-sym": dict(block_size=32, zero_points=False), "b128-zp": dict(block_size=128, zero_points=True)}


def prompt(batch, length, vocab, seed=0):
    return np.random.default_rng(seed).integers(1, vocab, (batch, length)).tolist()


def first_token_ms(model, ids, repeats):
    times = [genai.generate(model, ids, 1, keep_logits=False).first_token_s for _ in range(repeats)]
    return statistics.median(times) * 1e3


def decode(model, ids, steps):
    """tokens/s over `steps` decode steps after the prompt."""
    return genai.generate(model, ids, steps + 1, keep_logits=False).tokens_per_s(len(ids))


def decode_profile(model, ids, steps):
    """Batch-1 decode: (wall ms per token, GPU ms per token, top kernels {name: us per token})."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids[0]) + 2 * steps + 4, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray(ids, dtype=np.int32))
    for _ in range(steps // 2 + 2):
        gen.generate_next_token()
    t0 = time.perf_counter()
    for _ in range(steps // 2):
        gen.generate_next_token()
    wall_ms = (time.perf_counter() - t0) / (steps // 2) * 1e3
    from cupti import kernel_times  # torch, on the GPU host

    device_us, kernels = kernel_times(gen.generate_next_token, steps // 2)
    top = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:12])
    return wall_ms, device_us / 1e3, {k: round(v, 1) for k, v in top.items()}


def variant(folder, cfg, args, graphs=False):
    model = genai.load(folder, args.provider, provider_options={"enable_cuda_graph": 1} if graphs else None)
    one = prompt(1, args.prompt, cfg.vocab_size)
    genai.generate(model, one, 4, keep_logits=False)  # warm-up: allocations, repacking, autotuning
    row = {}
    if not graphs:
        row["first_token_ms"] = first_token_ms(model, one, args.repeats)
        if args.provider == "cuda":
            from cupti import kernel_times

            _, kernels = kernel_times(lambda: genai.generate(model, one, 1, keep_logits=False), 1)
            top = sorted(kernels.items(), key=lambda kv: -kv[1])[:10]
            row["first_token_kernels"] = {k: round(v, 1) for k, v in top}
    row["decode_b1_tok_s"] = decode(model, one, args.steps)
    if args.provider == "cuda":
        wall, gpu, top = decode_profile(model, one, args.steps)
        row.update(decode_b1_wall_ms=wall, decode_b1_gpu_ms=gpu, decode_b1_kernels=top)
    if not graphs:
        with tempfile.TemporaryDirectory() as d:
            host = genai.profile_ops(model, one[0], 8, d)
        row["decode_b1_host_us_by_op"] = {k: round(v, 1) for k, v in sorted(host.items(), key=lambda kv: -kv[1])}
        row["decode_b1_host_us"] = round(sum(host.values()), 1)
        row[f"decode_b{args.batch}_tok_s"] = decode(model, prompt(args.batch, args.prompt, cfg.vocab_size, 1),
                                                    args.steps)
    del model
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--work", default="/tmp/dlkern-e2e")
    ap.add_argument("--preset", default="llama3-8b", choices=sorted(synth.PRESETS))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the generated models")
    ap.add_argument("--provider", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke test of this script (tiny preset), no GPU timings")
    args = ap.parse_args()
    cfg = synth.PRESETS[args.preset]
    lib = os.environ["DLKERN_LIB"]
    import datetime
    import subprocess

    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip() if shutil.which("nvidia-smi") else "no GPU"
    shape = (f"{cfg.num_layers} layers, {cfg.num_heads} q / {cfg.num_kv_heads} kv heads of {cfg.head_size}, "
             f"hidden {cfg.hidden_size}, MLP {cfg.intermediate_size}, vocab {cfg.vocab_size}")
    results = {"date": datetime.date.today().isoformat(), "gpu": gpu, "shape": shape,
               "command": "python3 benches/e2e_genai.py " + " ".join(sys.argv[2:]) + " (DLKERN_BENCHES=e2e bash "
               ".gpu/gpu-bench.sh)", "preset": args.preset, "prompt": args.prompt, "steps": args.steps,
               "batch": args.batch, "rows": []}
    for fmt in args.formats.split(","):
        src = Path(args.work) / f"{args.preset}-int4-{fmt}"
        made = synth.build(src, cfg, "int4", "cuda", **FORMATS[fmt])  # the CUDA model; the CPU EP runs it too
        print(f"{src.name}: {made['bytes'] / 2**30:.2f} GiB in {made['seconds']:.0f} s", flush=True)
        dst = Path(str(src) + "-dlkern")
        report = retarget.retarget(src, dst, ep=args.provider, library=lib)
        print(report.table(), flush=True)
        graph_runs = [("ort", src, True), ("dlkern", dst, True)] if args.provider == "cuda" else []
        for name, folder, graphs in [("ort", src, False), ("dlkern", dst, False)] + graph_runs:
            label = f"{fmt} {name}{' cuda-graph' if graphs else ''}"
            try:
                row = variant(folder, cfg, args, graphs)
            except Exception as e:  # noqa: BLE001 (a variant that cannot run is reported, not fatal)
                row = {"error": str(e)[:400]}
            row.update(format=fmt, kernels=name, cuda_graph=graphs)
            results["rows"].append(row)
            print(label, json.dumps({k: v for k, v in row.items() if not k.endswith(("kernels", "_by_op"))}),
                  flush=True)
        if not args.keep:
            shutil.rmtree(src)
            shutil.rmtree(dst)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
