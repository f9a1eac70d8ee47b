"""GPU host, with onnxruntime-gpu: dlkern's SimplifiedLayerNormalization and
SkipSimplifiedLayerNormalization on the CUDA execution provider against ORT's own ops, the same
model with only the node's domain changed (test_ort_norms.py does it on the CPU EP). The
reference for every output is ORT's own op on the CPU EP (ORT's CUDA SkipSimplifiedLayerNorm
leaves mean and inv_std_var unwritten); y and the sum are also compared with ORT's own op on the
CUDA EP. Skipped where the CUDA EP is unavailable. DLKERN_LIB = path of libdlkern.so."""

import collections
import json
import os
import sys

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
if "CUDAExecutionProvider" not in ort.get_available_providers():
    pytest.skip("needs onnxruntime-gpu with the CUDA execution provider", allow_module_level=True)

sys.path.insert(0, os.path.dirname(__file__))
import test_ort_norms as base  # noqa: E402  (helpers only: pytest collects no tests through a module)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def providers_of(model, feeds, names):
    """Runs `model` on the CUDA EP with profiling: its outputs, and which provider ran each op."""
    so = ort.SessionOptions()
    so.register_custom_ops_library(base.LIB_PATH)
    so.log_severity_level = 3
    so.enable_profiling = True
    sess = ort.InferenceSession(model, so, providers=[CUDA, CPU])
    out = dict(zip(names, sess.run(None, feeds)))
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    used = collections.defaultdict(set)
    for e in events:
        if e.get("cat") == "Node":
            used[e["args"].get("op_name")].add(e["args"].get("provider"))
    return out, used


def check(op, feeds, input_names, output_names, np_dtype, what, cuda_cross_check=True, **attrs):
    names = [n for n in output_names if n]
    used_feeds = {n: feeds[n] for n in input_names if n}
    ours_model = base.build(op, "dlkern", feeds, input_names, output_names, np_dtype, **attrs)
    ours, used = providers_of(ours_model, used_feeds, names)
    assert used[op] == {CUDA}, (what, dict(used))
    theirs_model = base.build(op, base.ORT_DOMAIN[op], feeds, input_names, output_names, np_dtype, **attrs)
    reference = dict(zip(names, base.session(theirs_model, CPU).run(None, used_feeds)))
    base.compare(reference, ours, np_dtype, f"{what} vs ORT CPU", gpu=True)
    if not cuda_cross_check:
        return
    try:
        ort_cuda = dict(zip(names, base.session(theirs_model, CUDA).run(None, used_feeds)))
    except Exception as e:  # ORT's CUDA kernels take fewer scale shapes than its CPU one
        print(f"{what}: ORT's own op refuses on the CUDA EP ({str(e)[:200]}); compared with its CPU EP only")
        return
    rows = {n: ort_cuda[n] for n in names if n.split("_")[0] not in ("inv", "mean")}
    base.compare(rows, {n: ours[n] for n in rows}, np_dtype, f"{what} vs ORT CUDA", gpu=True)


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows,hidden", base.SHAPES)
def test_cuda_skip_as_the_model_builder_emits_it(rows, hidden, bias, np_dtype):
    rng = np.random.default_rng(rows * 7919 + hidden * 31 + bias)
    x_shape = base.x_shape_for(rows, hidden, 3 if rows % 2 else 2)
    feeds, names = base.skip_feeds(rng, x_shape, x_shape, np_dtype, bias)
    check("SkipSimplifiedLayerNormalization", feeds, names, base.BUILDER_OUTPUTS, np_dtype, f"{x_shape} bias={bias}",
          epsilon=1e-6)


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("outputs", [["y"], ["y", "mean", "inv_std_var", "input_skip_bias_sum"], ["y", "", "inv_std_var"]])
@pytest.mark.parametrize("x_shape,skip_shape", [((1, 7, 80), (1, 7, 80)), ((7, 97), (7, 97)), ((5, 205, 4096), (205, 4096)),
                                                ((5, 205, 97), (1, 205, 97)), ((97, 1, 4096), (1, 4096))])
def test_cuda_skip_outputs_and_broadcast(x_shape, skip_shape, outputs, np_dtype):
    rng = np.random.default_rng(len(outputs) * 101 + x_shape[-1])
    feeds, names = base.skip_feeds(rng, x_shape, skip_shape, np_dtype, bias=True)
    check("SkipSimplifiedLayerNormalization", feeds, names, outputs, np_dtype, f"{x_shape} skip {skip_shape} {outputs}")


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("with_inv", [False, True])
@pytest.mark.parametrize("rows,hidden", base.SHAPES)
def test_cuda_simplified_last_axis(rows, hidden, with_inv, np_dtype):
    rng = np.random.default_rng(rows * 3 + hidden)
    x_shape = base.x_shape_for(rows, hidden, 3 if rows % 2 else 2)
    feeds = {"X": rng.uniform(-3, 3, x_shape).astype(np_dtype), "scale": rng.uniform(-1, 1, hidden).astype(np_dtype)}
    outputs = ["Y", "inv_std_var"] if with_inv else ["Y"]
    check("SimplifiedLayerNormalization", feeds, ["X", "scale"], outputs, np_dtype, f"{x_shape} inv={with_inv}",
          epsilon=1e-6, axis=-1, stash_type=1)


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("x_shape,axis,scale_shape", [((2, 3, 80), 1, (3, 80)), ((2, 3, 80), -2, (80,)),
                                                      ((4, 4096), 0, (4096,)), ((3, 5, 2, 96), 1, (2, 96))])
def test_cuda_simplified_axis(x_shape, axis, scale_shape, np_dtype):
    rng = np.random.default_rng(sum(x_shape) + axis)
    feeds = {"X": rng.uniform(-2, 2, x_shape).astype(np_dtype), "scale": rng.uniform(-1, 1, scale_shape).astype(np_dtype)}
    # ORT's CUDA kernel reads `scale` as if it had the whole normalized shape (seen on
    # onnxruntime-gpu 1.31.1: it disagrees with ORT's CPU kernel exactly where the scale
    # broadcasts), so a broadcast scale is compared with ORT's CPU EP only.
    normalized = x_shape[axis % len(x_shape):]
    check("SimplifiedLayerNormalization", feeds, ["X", "scale"], ["Y", "inv_std_var"], np_dtype,
          f"{x_shape} axis={axis} scale {scale_shape}", cuda_cross_check=tuple(scale_shape) == tuple(normalized),
          axis=axis)


def test_cuda_errors_are_errors():
    x = np.ones((2, 5, 8), np.float32)
    feeds = {"input": x, "skip": np.ones((2, 4, 8), np.float32), "gamma": np.ones(8, np.float32)}
    model = base.build("SkipSimplifiedLayerNormalization", "dlkern", feeds, ["input", "skip", "gamma"], ["y"], np.float32)
    sess = base.session(model, CUDA)
    msg = base.error_of(lambda: sess.run(None, feeds))
    assert "last two dimensions of skip needs to be same as input" in msg, msg
