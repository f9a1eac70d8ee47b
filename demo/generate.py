"""dlkern's main job: an LLM that ONNX Runtime's own model builder made, moved onto dlkern's ops by
`dlkern.retarget` and generating through onnxruntime-genai, against the same model on ORT's own
kernels.

    python demo/generate.py --lib target/release/libdlkern.so [--model FOLDER] [--provider auto]

Steps: retarget the model folder for the provider (the table says which nodes moved and why
the others stayed), generate greedily from the same prompt with both folders, print the tokens
(and text, through the model's tokenizer), tokens per second, whether the two agree, and per
op type the time ORT's profiler gives each node per decode step. The default model is the
builder's tiny random-weight Llama (tests/fixtures/llm): its text is noise, its tokens are the
check. Without a usable GPU it runs on the CPU EP and says that the GPU kernels did not run.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
from dlkern import genai, retarget  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "llm"


def cuda_usable():
    """(usable, why not): onnxruntime-genai's CUDA build, onnxruntime-gpu and a device."""
    import onnxruntime as ort
    import onnxruntime_genai as og

    if not og.is_cuda_available():
        return False, "this onnxruntime-genai is its CPU build (no onnxruntime-genai-cuda)"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False, "this onnxruntime has no CUDAExecutionProvider (no onnxruntime-gpu)"
    try:
        import ctypes

        cuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
            return False, "the CUDA driver sees no device"
    except OSError:
        return False, "no CUDA driver (libcuda.so.1)"
    return True, ""


def prompt_ids(folder, text, model):
    """The prompt through the model's tokenizer, or fixed ids when it has none that works."""
    import onnxruntime_genai as og

    try:
        tok = og.Tokenizer(model)
        ids = [int(i) for i in tok.encode(text)]
        if ids:
            return ids, tok
    except Exception as e:  # noqa: BLE001 (any tokenizer failure falls back to ids)
        print(f"(tokenizer unavailable: {e}; using fixed token ids)")
    return [1, 17, 203, 5, 99, 311, 42], None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default=str(ROOT / "target" / "release" / "libdlkern.so"))
    ap.add_argument("--model", help="an onnxruntime-genai model folder (default: the builder's tiny int4 "
                    "Llama for CUDA, tests/fixtures/llm/llama-int4-cuda, which the CPU EP runs too)")
    ap.add_argument("--provider", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--prompt", default="The quick brown fox jumps over the lazy dog")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--work", help="where the retargeted folder goes (default: a temporary folder)")
    args = ap.parse_args()

    usable, why = cuda_usable()
    provider = args.provider if args.provider != "auto" else ("cuda" if usable else "cpu")
    if provider == "cuda" and not usable:
        sys.exit(f"--provider cuda: {why}")
    source = Path(args.model) if args.model else FIXTURES / "llama-int4-cuda"
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="dlkern-demo-"))
    target = work / f"{source.name}-dlkern"

    import onnxruntime as ort
    import onnxruntime_genai as og

    print(f"onnxruntime {ort.__version__}, onnxruntime-genai {og.__version__}, provider {provider}")
    print(f"model: {source}\n\n== dlkern.retarget {source.name} -> {target}")
    report = retarget.retarget(source, target, ep=provider, library=args.lib)
    print(report.table())
    print(report.summary())

    models = {"ORT's kernels": genai.load(source, provider), "dlkern": genai.load(target, provider)}
    ids, tok = prompt_ids(source, args.prompt, models["ORT's kernels"])
    print(f"\n== generate {args.tokens} tokens, greedy, prompt of {len(ids)} tokens: {ids}")
    runs = {}
    for label, model in models.items():
        genai.generate(model, [ids], 4, keep_logits=False)  # warm-up: loading, first allocations
        runs[label] = genai.generate(model, [ids], args.tokens, keep_logits=False)
        r = runs[label]
        print(f"{label:>14}: {r.tokens[0]}")
        if tok is not None:
            print(f"{'':>14}  text: {tok.decode(np.asarray(r.tokens[0], dtype=np.int32))!r}")
        print(f"{'':>14}  first token {r.first_token_s * 1e3:.2f} ms, decode {r.tokens_per_s(1):.1f} tokens/s")
    same = runs["dlkern"].tokens == runs["ORT's kernels"].tokens

    steps = args.profile_steps
    print(f"\n== per op type, us per decode step (ORT's profiler, {steps} steps; on CUDA the host's share)")
    with tempfile.TemporaryDirectory() as d:
        times = {label: genai.profile_ops(model, ids, steps, d) for label, model in models.items()}
    ops = sorted(set().union(*times.values()), key=lambda op: -max(t.get(op, 0.0) for t in times.values()))
    print(f"{'op':<34}{'ORT kernels':>12}{'dlkern':>12}")
    for op in ops:
        print(f"{op:<34}" + "".join(f"{times[label].get(op, 0.0):>12.1f}" for label in models))

    print()
    if provider == "cpu":
        print("NOTE: the GPU kernels were not exercised: " + (why or "--provider cpu was asked for")
              + "; this run used dlkern's CPU reference kernels. On a GPU host: "
              "bash scripts/gpu-bundle.sh, then bash .gpu/gpu-check.sh there (README, 'GPU host').")
    if not same:
        sys.exit("FAIL: dlkern's tokens differ from ORT's")
    print(f"OK: dlkern generated the same {args.tokens} tokens as ORT's own kernels on {provider}")


if __name__ == "__main__":
    main()
