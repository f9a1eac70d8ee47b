"""GPU host, onnxruntime-genai-cuda over onnxruntime-gpu: serving checks of a dlkern-retargeted
model that the per-fixture comparisons (test_genai.py) do not make. A builder-shaped model
from dlkern.synth (the fixtures' config, with a context long enough for 2000 steps):
- 2000 generated tokens without device memory growing after the first steps;
- two sessions generating in two threads at once give the tokens one session gives alone.
Skipped without CUDA in onnxruntime-genai and onnxruntime. DLKERN_LIB = path of libdlkern.so."""

import dataclasses
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
from dlkern import genai, retarget, synth  # noqa: E402

og = pytest.importorskip("onnxruntime_genai")
ort = pytest.importorskip("onnxruntime")
if not (og.is_cuda_available() and "CUDAExecutionProvider" in ort.get_available_providers()):
    pytest.skip("needs onnxruntime-genai-cuda and onnxruntime-gpu", allow_module_level=True)

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
PROMPT = [5, 17, 42, 101, 7, 250, 33]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    src = tmp_path_factory.mktemp("synth")
    synth.build(src, dataclasses.replace(synth.TINY, context_length=4096), "int4", "cuda")
    out = tmp_path_factory.mktemp("synth-dlkern")
    report = retarget.retarget(src, out, ep="cuda", library=LIB_PATH)
    assert not report.stayed, report.table()
    return src, out


def process_device_mib():
    """This process's device memory (MiB) as the driver accounts it (nvidia-smi)."""
    rows = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, check=True).stdout.splitlines()
    return sum(int(r.split(",")[1]) for r in rows if int(r.split(",")[0]) == os.getpid())


def test_long_generation_holds_device_memory(model_dir):
    _, folder = model_dir
    model = genai.load(folder, "cuda")
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + 2000, min_length=len(PROMPT) + 2000, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens([PROMPT])
    seen = {}
    for step in range(1, 2001):
        gen.generate_next_token()
        if step in (100, 1000, 2000):
            seen[step] = process_device_mib()
    assert gen.is_done()
    # The KV caches are allocated for max_length at the start; dlkern's decode workspace grows
    # with the context within the stream-ordered pool it keeps (2 MiB granules).
    assert seen[2000] - seen[100] <= 4, seen


def test_two_sessions_in_two_threads(model_dir):
    _, folder = model_dir
    models = [genai.load(folder, "cuda") for _ in range(2)]
    prompts = [PROMPT, [9, 8, 7, 6, 5, 4, 3]]
    alone = [genai.generate(models[0], [p], 64, keep_logits=False).tokens for p in prompts]
    results = [None, None]

    def run(i):
        for _ in range(3):
            results[i] = genai.generate(models[i], [prompts[i]], 64, keep_logits=False).tokens

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == alone


def test_cuda_graph_replays_the_same_tokens(model_dir):
    """ORT's CUDA graphs (onnxruntime-genai's enable_cuda_graph) capture dlkern's launches once and
    replay them: the tokens are those of the eager run."""
    _, folder = model_dir
    eager = genai.generate(genai.load(folder, "cuda"), [PROMPT], 64, keep_logits=False)
    graphed = genai.generate(genai.load(folder, "cuda", provider_options={"enable_cuda_graph": 1}), [PROMPT], 64,
                             keep_logits=False)
    assert graphed.tokens == eager.tokens


def test_synth_model_tokens_match_ort(model_dir):
    """The synthesized model on ORT's own CUDA kernels and on dlkern's: the same 64 tokens."""
    src, folder = model_dir
    want = genai.generate(genai.load(src, "cuda"), [PROMPT], 64, keep_logits=False)
    got = genai.generate(genai.load(folder, "cuda"), [PROMPT], 64, keep_logits=False)
    assert got.tokens == want.tokens
