"""dlkern's SimplifiedLayerNormalization and SkipSimplifiedLayerNormalization as drop-ins for ONNX
Runtime's own, on the CPU execution provider: the same model built twice, once with the nodes in
ORT's domain ("" and com.microsoft) and once in domain dlkern, fed the same inputs, every output
compared; and the error cases through ORT. DLKERN_LIB = path of libdlkern.so.

The helpers here are shared with test_ort_cuda_norms.py (the same comparison on the CUDA EP)."""

import os
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern_onnx as dx  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("dlkern", 1)]
ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.int32: TensorProto.INT32}
ORT_DOMAIN = {"SimplifiedLayerNormalization": "", "SkipSimplifiedLayerNormalization": "com.microsoft"}
# Output element types other than the inputs' (the statistics are float).
STAT_OUTPUTS = {"inv_std_var", "mean"}


def build(op, domain, feeds, input_names, output_names, np_dtype, symbolic=False, **attrs):
    """One node `op` in `domain` over graph inputs `feeds` (absent optional inputs are '' in
    input_names) with outputs output_names ('' for the omitted ones, as the model builder writes
    them). With `symbolic`, every input dimension but the last is a named symbol."""
    elem = ELEM[np_dtype]
    node = helper.make_node(op, input_names, output_names, domain=domain, name="norm", **attrs)

    def dims(name, a):
        return [f"{name}_{i}" for i in range(a.ndim - 1)] + [a.shape[-1]] if symbolic and a.ndim else list(a.shape)

    inputs = [helper.make_tensor_value_info(n, ELEM[feeds[n].dtype.type], dims(n, feeds[n])) for n in input_names if n]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT if n.split("_")[0] in ("inv", "mean") else elem, None)
               for n in output_names if n]
    graph = helper.make_graph([node], "norms", inputs, outputs)
    m = helper.make_model(graph, opset_imports=OPSETS)
    m.ir_version = 9
    return m.SerializeToString()


def session(model, provider="CPUExecutionProvider"):
    return dx.session(LIB_PATH, model, provider)


def run_pair(op, feeds, input_names, output_names, np_dtype, provider="CPUExecutionProvider", ref_provider=None, **attrs):
    """Outputs of ORT's own op and of dlkern's, by output name."""
    ref_provider = ref_provider or provider
    names = [n for n in output_names if n]
    used = {n: feeds[n] for n in input_names if n}
    theirs = session(build(op, ORT_DOMAIN[op], feeds, input_names, output_names, np_dtype, **attrs), ref_provider)
    ours = session(build(op, "dlkern", feeds, input_names, output_names, np_dtype, **attrs), provider)
    return dict(zip(names, theirs.run(None, used))), dict(zip(names, ours.run(None, used)))


def tolerance(np_dtype, gpu=False):
    if np_dtype == np.float32:
        # ORT accumulates the squares of a row in f32, one after another: for rows of 4096 its
        # own error reaches ~1.5e-6 (dlkern's CPU kernel is f64).
        return 2e-5 if gpu else 1e-5
    # f16: ORT's CPU kernel normalizes the unrounded f32 sum, dlkern the sum rounded to f16 (the
    # tensor the sum output holds): up to about one f16 ulp of difference before the final
    # rounding. The GPU adds f32 accumulation and rsqrt.approx.
    return (6 if gpu else 4) * float(np.finfo(np_dtype).eps)


def compare(theirs, ours, np_dtype, what, gpu=False):
    assert theirs.keys() == ours.keys()
    tol = tolerance(np_dtype, gpu)
    for name in theirs:
        a, b = theirs[name], ours[name]
        assert a.dtype == b.dtype and a.shape == b.shape, (what, name, a.dtype, b.dtype, a.shape, b.shape)
        if name.split("_")[0] in ("inv", "mean"):
            # f16 inputs: the statistics of the rounded sum (dlkern) and of the unrounded one (ORT).
            rtol = tolerance(np.float32, gpu) if np_dtype == np.float32 else 2 * float(np.finfo(np_dtype).eps)
            np.testing.assert_allclose(b, a, rtol=rtol, atol=0, err_msg=f"{what}: {name}")
        else:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            scale = max(1.0, float(np.abs(a64).max(initial=0.0)))
            np.testing.assert_allclose(b64, a64, rtol=tol, atol=tol * scale, err_msg=f"{what}: {name}")


def skip_feeds(rng, x_shape, skip_shape, np_dtype, bias):
    h = x_shape[-1]
    feeds = {
        "input": rng.uniform(-3, 3, x_shape).astype(np_dtype),
        "skip": rng.uniform(-3, 3, skip_shape).astype(np_dtype),
        "gamma": rng.uniform(-1.5, 1.5, h).astype(np_dtype),
    }
    if bias:
        feeds["bias"] = rng.uniform(-1, 1, h).astype(np_dtype)
    return feeds, ["input", "skip", "gamma"] + (["bias"] if bias else [])


def x_shape_for(rows, hidden, rank):
    """A 2-D [rows, H] or 3-D [B, S, H] input of `rows` rows."""
    if rank == 2:
        return (rows, hidden)
    b = next(d for d in (5, 3, 1) if rows % d == 0)
    return (b, rows // b, hidden)


ROWS = [1, 7, 97, 1025]
HIDDEN = [80, 97, 4096]
SHAPES = [(r, h) for r in ROWS for h in HIDDEN]
BUILDER_OUTPUTS = ["y", "", "", "input_skip_bias_sum"]


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows,hidden", SHAPES)
def test_skip_as_the_model_builder_emits_it(rows, hidden, bias, np_dtype):
    rng = np.random.default_rng(rows * 7919 + hidden * 31 + bias)
    x_shape = x_shape_for(rows, hidden, 3 if rows % 2 else 2)
    feeds, names = skip_feeds(rng, x_shape, x_shape, np_dtype, bias)
    theirs, ours = run_pair("SkipSimplifiedLayerNormalization", feeds, names, BUILDER_OUTPUTS, np_dtype, epsilon=1e-6)
    compare(theirs, ours, np_dtype, f"{x_shape} bias={bias}")


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("outputs", [["y"], ["y", "mean", "inv_std_var", "input_skip_bias_sum"], ["y", "", "inv_std_var"],
                                     ["y", "mean"], ["y", "", "", "input_skip_bias_sum"]])
@pytest.mark.parametrize("x_shape", [(1, 7, 80), (7, 97), (5, 205, 4096)])
def test_skip_optional_outputs(x_shape, outputs, np_dtype):
    rng = np.random.default_rng(len(outputs) * 101 + x_shape[-1])
    feeds, names = skip_feeds(rng, x_shape, x_shape, np_dtype, bias=True)
    theirs, ours = run_pair("SkipSimplifiedLayerNormalization", feeds, names, outputs, np_dtype)  # default epsilon
    compare(theirs, ours, np_dtype, f"{x_shape} {outputs}")
    if "mean" in ours:
        assert not ours["mean"].any(), "the simplified norm's mean output is zeros"


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("x_shape,skip_shape", [
    ((5, 205, 80), (205, 80)),        # no batch: one skip for every batch
    ((5, 205, 97), (1, 205, 97)),     # batch of 1
    ((97, 1, 4096), (1, 4096)),
    ((3, 7, 80), (2, 7, 80)),         # another batch: rows index it modulo, as ORT's CPU kernel does
    ((2, 7, 80), (3, 7, 80)),         # a longer one: its first rows
    ((1, 1025, 80), (1025, 80)),
])
def test_skip_broadcast_shapes(x_shape, skip_shape, np_dtype):
    rng = np.random.default_rng(x_shape[0] * 13 + skip_shape[0])
    for bias in (False, True):
        feeds, names = skip_feeds(rng, x_shape, skip_shape, np_dtype, bias)
        theirs, ours = run_pair("SkipSimplifiedLayerNormalization", feeds, names,
                                ["y", "", "inv_std_var", "input_skip_bias_sum"], np_dtype, epsilon=1e-5)
        compare(theirs, ours, np_dtype, f"{x_shape} skip {skip_shape} bias={bias}")


def test_one_session_follows_changing_shapes_run_by_run():
    """One session run with inputs whose shapes change from run to run and back (a prompt,
    then decode steps, then another prompt): each run's outputs have its own shapes and ORT's
    values (dlkern's node keeps its last output inference, keyed by the inputs' shapes)."""
    rng = np.random.default_rng(11)
    first, names = skip_feeds(rng, (1, 7, 64), (1, 7, 64), np.float32, bias=False)
    outputs = ["y", "", "", "input_skip_bias_sum"]
    theirs, ours = (session(build("SkipSimplifiedLayerNormalization", d, first, names, outputs, np.float32,
                                  symbolic=True, epsilon=1e-5)) for d in ("com.microsoft", "dlkern"))
    for shape in [(1, 7, 64), (1, 1, 64), (3, 1, 64), (1, 1, 64), (2, 5, 64)]:
        feeds, _ = skip_feeds(rng, shape, shape, np.float32, bias=False)
        want = dict(zip(["y", "input_skip_bias_sum"], theirs.run(None, feeds)))
        got = dict(zip(["y", "input_skip_bias_sum"], ours.run(None, feeds)))
        assert got["y"].shape == shape
        compare(want, got, np.float32, f"shape {shape}")


def test_skip_keeps_symbolic_dims_and_chains_the_sum():
    """Two layers the way the builder chains them: the second adds the first's sum."""
    rng = np.random.default_rng(5)
    feeds, _ = skip_feeds(rng, (2, 9, 96), (2, 9, 96), np.float16, bias=False)

    def model(domain):
        nodes = [helper.make_node("SkipSimplifiedLayerNormalization", ["input", "skip", "gamma"],
                                  ["y0", "", "", "s0"], domain=domain, epsilon=1e-6),
                 helper.make_node("SkipSimplifiedLayerNormalization", ["y0", "s0", "gamma"],
                                  ["y1", "", "", "s1"], domain=domain, epsilon=1e-6)]
        ins = [helper.make_tensor_value_info("input", TensorProto.FLOAT16, ["b", "s", 96]),
               helper.make_tensor_value_info("skip", TensorProto.FLOAT16, ["b", "s", 96]),
               helper.make_tensor_value_info("gamma", TensorProto.FLOAT16, [96])]
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, None) for n in ("y1", "s1")]
        m = helper.make_model(helper.make_graph(nodes, "chain", ins, outs), opset_imports=OPSETS)
        m.ir_version = 9
        return m.SerializeToString()

    ours = session(model("dlkern"))
    assert ours.get_outputs()[0].shape == ["b", "s", 96]
    theirs = dict(zip(["y1", "s1"], session(model("com.microsoft")).run(None, feeds)))
    compare(theirs, dict(zip(["y1", "s1"], ours.run(None, feeds))), np.float16, "chained")


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("with_inv", [False, True])
@pytest.mark.parametrize("rows,hidden", SHAPES)
def test_simplified_last_axis(rows, hidden, with_inv, np_dtype):
    rng = np.random.default_rng(rows * 3 + hidden)
    x_shape = x_shape_for(rows, hidden, 3 if rows % 2 else 2)
    feeds = {"X": rng.uniform(-3, 3, x_shape).astype(np_dtype), "scale": rng.uniform(-1, 1, hidden).astype(np_dtype)}
    outputs = ["Y", "inv_std_var"] if with_inv else ["Y"]
    theirs, ours = run_pair("SimplifiedLayerNormalization", feeds, ["X", "scale"], outputs, np_dtype, epsilon=1e-6,
                            axis=-1, stash_type=1)
    compare(theirs, ours, np_dtype, f"{x_shape} inv={with_inv}")


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("x_shape,axis,scale_shape", [
    ((2, 3, 80), -1, (80,)),
    ((2, 3, 80), 2, (80,)),
    ((2, 3, 80), 1, (3, 80)),
    ((2, 3, 80), -2, (80,)),          # broadcast over the leading normalized axis
    ((2, 3, 80), -2, (1, 3, 80)),
    ((2, 3, 80), 0, (2, 3, 80)),
    ((7, 4, 97), -3, (97,)),
    ((1025,), 0, (1025,)),
    ((4, 4096), 0, (4096,)),
    ((3, 5, 2, 96), 1, (2, 96)),
])
def test_simplified_axis(x_shape, axis, scale_shape, np_dtype):
    rng = np.random.default_rng(sum(x_shape) + axis)
    feeds = {"X": rng.uniform(-2, 2, x_shape).astype(np_dtype), "scale": rng.uniform(-1, 1, scale_shape).astype(np_dtype)}
    theirs, ours = run_pair("SimplifiedLayerNormalization", feeds, ["X", "scale"], ["Y", "inv_std_var"], np_dtype,
                            axis=axis)  # default epsilon and stash_type
    compare(theirs, ours, np_dtype, f"{x_shape} axis={axis} scale {scale_shape}")


def test_simplified_keeps_symbolic_dims():
    rng = np.random.default_rng(2)
    feeds = {"X": rng.uniform(-2, 2, (3, 5, 64)).astype(np.float32), "scale": rng.uniform(-1, 1, 64).astype(np.float32)}
    model = build("SimplifiedLayerNormalization", "dlkern", feeds, ["X", "scale"], ["Y", "inv_std_var"], np.float32,
                  symbolic=True)
    sess = session(model)
    assert [o.shape for o in sess.get_outputs()] == [["X_0", "X_1", 64], ["X_0", "X_1", 1]]
    y, inv = sess.run(None, feeds)
    x64 = feeds["X"].astype(np.float64)
    expected_inv = 1 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(inv, expected_inv, rtol=1e-6)
    np.testing.assert_allclose(y, x64 * expected_inv * feeds["scale"], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Errors through ORT: clear messages, no crash; and where ORT refuses, dlkern refuses too.

def error_of(fn):
    with pytest.raises(Exception) as info:
        fn()
    return str(info.value)


def both_errors(op, feeds, input_names, output_names, np_dtype, **attrs):
    """(ORT's message, dlkern's message) for a call both must refuse, at session creation or run."""
    used = {n: feeds[n] for n in input_names if n}
    msgs = []
    for domain in (ORT_DOMAIN[op], "dlkern"):
        model = build(op, domain, feeds, input_names, output_names, np_dtype, **attrs)
        msgs.append(error_of(lambda: session(model).run(None, used)))
    return msgs


SKIP_BAD = [
    # (input, skip, gamma, expected dlkern message)
    ((5, 8), (1, 8), 8, "last two dimensions of skip needs to be same as input"),
    ((5, 8), (5, 4), 8, "skip is expected to have same shape as input"),
    ((2, 5, 8), (2, 4, 8), 8, "last two dimensions of skip needs to be same as input"),
    ((2, 5, 8), (2, 1, 5, 8), 8, "skip is expected to have 3 or 2 dimensions, got 4"),
    ((2, 5, 8), (2, 5, 8), 7, "Last dimension of gamma and input does not match"),
    ((1, 2, 5, 8), (1, 2, 5, 8), 8, "input is expected to have 3 or 2 dimensions, got 4"),
    ((8,), (8,), 8, "input is expected to have 3 or 2 dimensions, got 1"),
]


@pytest.mark.parametrize("x_shape,skip_shape,gamma_len,expected", SKIP_BAD)
def test_skip_refuses_what_ort_refuses(x_shape, skip_shape, gamma_len, expected):
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal(x_shape).astype(np.float32),
             "skip": rng.standard_normal(skip_shape).astype(np.float32),
             "gamma": np.ones(gamma_len, np.float32)}
    theirs, ours = both_errors("SkipSimplifiedLayerNormalization", feeds, ["input", "skip", "gamma"], ["y"], np.float32)
    assert "dlkern SkipSimplifiedLayerNormalization node 'norm'" in ours or "dlkern SkipSimplifiedLayerNormalization" in ours, ours
    assert expected in ours, (ours, theirs)


def test_skip_bias_and_gamma_shapes_are_checked():
    rng = np.random.default_rng(1)
    feeds, names = skip_feeds(rng, (2, 3, 8), (2, 3, 8), np.float32, bias=True)
    feeds["bias"] = np.ones(5, np.float32)
    _, ours = both_errors("SkipSimplifiedLayerNormalization", feeds, names, BUILDER_OUTPUTS, np.float32)
    assert "Last dimension of bias and input does not match (5 vs 8)" in ours, ours
    feeds["bias"] = np.ones((1, 8), np.float32)
    _, ours = both_errors("SkipSimplifiedLayerNormalization", feeds, names, BUILDER_OUTPUTS, np.float32)
    assert "bias is expected to have 1 dimension, got 2" in ours, ours


def test_schema_errors_are_refused_by_ort():
    """Missing gamma, wrong element types and mixed types never reach a kernel."""
    rng = np.random.default_rng(3)
    feeds, _ = skip_feeds(rng, (2, 3, 8), (2, 3, 8), np.float32, bias=False)
    model = build("SkipSimplifiedLayerNormalization", "dlkern", feeds, ["input", "skip"], ["y"], np.float32)
    assert error_of(lambda: session(model))
    ints = {k: v.astype(np.int32) for k, v in feeds.items()}
    model = build("SkipSimplifiedLayerNormalization", "dlkern", ints, ["input", "skip", "gamma"], ["y"], np.float32)
    assert error_of(lambda: session(model))
    mixed = dict(feeds, skip=feeds["skip"].astype(np.float16))
    model = build("SkipSimplifiedLayerNormalization", "dlkern", mixed, ["input", "skip", "gamma"], ["y"], np.float32)
    assert error_of(lambda: session(model))


def test_simplified_errors():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    ok = {"X": x, "scale": np.ones(8, np.float32)}
    # A scale of another type than X (ORT's V, which Y takes): ORT computes it; dlkern refuses,
    # ORT's type check at session creation where Y is declared V, dlkern's own message where Y
    # is declared X's type.
    mixed = {"X": x, "scale": np.ones(8, np.float16)}
    (y_v,) = session(build("SimplifiedLayerNormalization", "", mixed, ["X", "scale"], ["Y"], np.float16)).run(None, mixed)
    assert y_v.dtype == np.float16
    model = build("SimplifiedLayerNormalization", "dlkern", mixed, ["X", "scale"], ["Y"], np.float16)
    msg = error_of(lambda: session(model))
    assert "Type (tensor(float16)) of output arg (Y) of node (norm) does not match expected type (tensor(float))" in msg, msg
    model = build("SimplifiedLayerNormalization", "dlkern", mixed, ["X", "scale"], ["Y"], np.float32)
    msg = error_of(lambda: session(model).run(None, mixed))
    assert "scale is f16 but X is f32: dlkern needs them of one type" in msg, msg
    model = build("SimplifiedLayerNormalization", "dlkern", ok, ["X", "scale"], ["Y"], np.float32, stash_type=11)
    msg = error_of(lambda: session(model).run(None, ok))
    assert "stash_type = 11: dlkern computes the statistics in float" in msg, msg
    for axis in (3, -4):
        theirs, ours = both_errors("SimplifiedLayerNormalization", ok, ["X", "scale"], ["Y"], np.float32, axis=axis)
        assert f"axis {axis} is not in valid range [-3, 2]" in ours, ours
    for scale_shape in [(7,), (24,)]:
        bad = {"X": x, "scale": np.ones(scale_shape, np.float32)}
        theirs, ours = both_errors("SimplifiedLayerNormalization", bad, ["X", "scale"], ["Y"], np.float32, axis=1)
        assert "dlkern SimplifiedLayerNormalization node 'norm'" in ours and "is neither X.shape[axis:]" in ours, ours
    # A scale broadcast along an inner normalized axis: ORT computes it, dlkern refuses it by name.
    inner = {"X": x, "scale": np.ones((3, 1), np.float32)}
    model = build("SimplifiedLayerNormalization", "dlkern", inner, ["X", "scale"], ["Y"], np.float32, axis=1)
    msg = error_of(lambda: session(model).run(None, inner))
    assert "shape [3, 1] is neither X.shape[axis:] = [3, 8] nor a suffix of it" in msg, msg
    model = build("SimplifiedLayerNormalization", "dlkern", ok, ["X", "scale"], ["Y"], np.float32, epsilon=-1.0)
    msg = error_of(lambda: session(model))
    assert "attribute 'epsilon' = -1 must be finite and >= 0" in msg, msg
