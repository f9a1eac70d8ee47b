"""Threads (issue 44): 8 threads over 2 sessions of one model, sharing one loaded libdlkern.so,
each running its own sequence of steps whose shapes change from step to step (so the nodes'
kept output inferences and the per-thread call buffers are exercised from all threads at once),
must give exactly the results of the same steps run one after another on one thread. CPU EP in
CI; on the GPU host (onnxruntime-gpu) the same on the CUDA EP. DLKERN_LIB = path of libdlkern.so."""

import os
import sys
import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern_onnx as dx  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
PROVIDERS = ["CPUExecutionProvider"] + (
    ["CUDAExecutionProvider"] if "CUDAExecutionProvider" in ort.get_available_providers() else [])
HIDDEN, BLOCK = 64, 32
THREADS, SESSIONS, STEPS = 8, 2, 200
SHAPES = [(1, 1), (2, 3), (1, 7), (3, 1)]


def mixed_model():
    """A layer's norms and projection as the model builder chains them, on dlkern's ops:
    SimplifiedLayerNormalization, MatMulNBits (block 32, symmetric), SkipSimplifiedLayerNormalization
    (its sum too), RMSNorm on the sum. f16, batch and sequence symbolic."""
    rng = np.random.default_rng(44)
    e = TensorProto.FLOAT16
    gammas = [numpy_helper.from_array(rng.uniform(0.5, 1.5, HIDDEN).astype(np.float16), f"g{i}") for i in range(3)]
    codes = rng.integers(0, 256, (HIDDEN, HIDDEN // BLOCK, BLOCK // 2), dtype=np.uint8)
    scales = rng.uniform(0.005, 0.02, (HIDDEN, HIDDEN // BLOCK)).astype(np.float16)
    inits = gammas + [numpy_helper.from_array(codes, "B"), numpy_helper.from_array(scales, "scales")]
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "g0"], ["n0"], domain="dlkern", axis=-1,
                         epsilon=1e-5, stash_type=1),
        helper.make_node("MatMulNBits", ["n0", "B", "scales"], ["p"], domain="dlkern", K=HIDDEN, N=HIDDEN, bits=4,
                         block_size=BLOCK),
        helper.make_node("SkipSimplifiedLayerNormalization", ["p", "x", "g1"], ["y", "", "", "sum"], domain="dlkern",
                         epsilon=1e-5),
        helper.make_node("RMSNorm", ["sum", "g2"], ["z"], domain="dlkern", epsilon=1e-6),
    ]
    ins = [helper.make_tensor_value_info("x", e, ["b", "s", HIDDEN])]
    outs = [helper.make_tensor_value_info(n, e, None) for n in ("y", "z")]
    return dx.model(nodes, ins, outs, inits)


def step_input(thread, step):
    b, s = SHAPES[(thread + step) % len(SHAPES)]
    return np.random.default_rng([thread, step]).uniform(-2, 2, (b, s, HIDDEN)).astype(np.float16)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_threads_over_two_sessions_give_the_single_threaded_results(provider):
    model = mixed_model()
    sessions = [dx.session(LIB_PATH, model, provider) for _ in range(SESSIONS)]
    expected = {(t, k): sessions[0].run(None, {"x": step_input(t, k)}) for t in range(THREADS) for k in range(STEPS)}
    got, errors = {}, []
    start = threading.Barrier(THREADS)

    def work(t):
        try:
            start.wait()
            for k in range(STEPS):
                got[(t, k)] = sessions[t % SESSIONS].run(None, {"x": step_input(t, k)})
        except Exception as err:  # noqa: BLE001 - reported below, with the thread
            errors.append((t, err))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert not errors, errors
    for key, want in expected.items():
        for name, w, g in zip(("y", "z"), want, got[key]):
            assert g.shape == w.shape and np.array_equal(g, w, equal_nan=True), f"thread {key[0]} step {key[1]}: {name}"
