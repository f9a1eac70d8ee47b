"""dlkern's GroupQueryAttention and RotaryEmbedding against ONNX Runtime's own com.microsoft
kernels: the same node in both domains, the same inputs, every output compared (attention output
rows of the new tokens, present caches up to each sequence's length). CPU EP in CI (onnxruntime
1.31.1 from PyPI); the CUDA EP where onnxruntime has it (the GPU host's onnxruntime-gpu 1.31.1).
DLKERN_LIB = path of libdlkern.so."""

import os
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern_onnx as dx  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
PROVIDERS = ["CPUExecutionProvider"] + (["CUDAExecutionProvider"] if HAS_CUDA else [])
ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def make_model(nodes, inputs, outputs):
    return dx.model(nodes, inputs, outputs, opsets=dx.OPSET_WITH_MS)


def session(model, provider):
    return dx.session(LIB_PATH, model, provider)


def dtypes_for(provider):
    return [np.float32, np.float16] if provider == "CPUExecutionProvider" else [np.float16]


def rotary_caches(rng, positions, rotary_dim, dtype):
    inv = 1.0 / (10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim))
    angles = np.arange(positions)[:, None] * inv[None, :] + rng.uniform(0, 0.1, (positions, rotary_dim // 2))
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def gqa_model(domain, dtype, heads, kv_heads, head, packed, past, rotary, **attrs):
    e = ELEM[dtype]
    ins = [helper.make_tensor_value_info("query", e, ["b", "s", "hidden"])]
    names = ["query"]
    if packed:
        names += ["", ""]
    else:
        ins += [helper.make_tensor_value_info(n, e, ["b", "s", "kv_hidden"]) for n in ("key", "value")]
        names += ["key", "value"]
    if past:
        ins += [helper.make_tensor_value_info(n, e, ["b", "kv_heads", "p", "head"]) for n in ("past_key", "past_value")]
        names += ["past_key", "past_value"]
    else:
        names += ["", ""]
    ins += [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    names += ["seqlens_k", "total_sequence_length"]
    if rotary:
        ins += [helper.make_tensor_value_info(n, e, ["m", "r"]) for n in ("cos_cache", "sin_cache")]
        names += ["cos_cache", "sin_cache"]
    node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"], domain=domain,
                            num_heads=heads, kv_num_heads=kv_heads, do_rotary=int(bool(rotary)), **attrs)
    outs = [helper.make_tensor_value_info("output", e, None),
            helper.make_tensor_value_info("present_key", e, None),
            helper.make_tensor_value_info("present_value", e, None)]
    return make_model([node], ins, outs)


def gqa_inputs(rng, dtype, batch, seq, heads, kv_heads, head, packed, past_len, lengths, rotary_dim, total=None):
    """Random inputs; `lengths[b]` = tokens after the step (T). Past rows beyond P are noise."""
    hidden = (heads + 2 * kv_heads) * head if packed else heads * head
    feeds = {"query": rng.uniform(-1, 1, (batch, seq, hidden)).astype(dtype)}
    if not packed:
        feeds["key"] = rng.uniform(-1, 1, (batch, seq, kv_heads * head)).astype(dtype)
        feeds["value"] = rng.uniform(-1, 1, (batch, seq, kv_heads * head)).astype(dtype)
    if past_len is not None:
        for n in ("past_key", "past_value"):
            feeds[n] = rng.uniform(-1, 1, (batch, kv_heads, past_len, head)).astype(dtype)
    total = max(lengths) if total is None else total
    feeds["seqlens_k"] = np.array([t - 1 for t in lengths], np.int32)
    feeds["total_sequence_length"] = np.array(total, np.int32)
    if rotary_dim:
        feeds["cos_cache"], feeds["sin_cache"] = rotary_caches(rng, max(total, past_len or 0) + 3, rotary_dim, dtype)
    return feeds


def tolerance(dtype):
    return dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else dict(rtol=2e-3, atol=3e-3)


def compare_gqa(provider, dtype, batch, seq, heads, kv_heads, head, lengths, past_len=None, packed=False,
                rotary_dim=0, total=None, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    feeds = gqa_inputs(rng, dtype, batch, seq, heads, kv_heads, head, packed, past_len, lengths, rotary_dim, total)
    if rotary_dim:
        attrs.setdefault("rotary_interleaved", 0)
    got = {}
    for domain in ("com.microsoft", "dlkern"):
        model = gqa_model(domain, dtype, heads, kv_heads, head, packed, past_len is not None, rotary_dim, **attrs)
        got[domain] = session(model, provider).run(None, feeds)
    ref, ours = got["com.microsoft"], got["dlkern"]
    for r, o in zip(ref, ours):
        assert r.shape == o.shape and r.dtype == o.dtype
    tol = tolerance(dtype)
    for b, t in enumerate(lengths):
        new = min(seq, t)
        np.testing.assert_allclose(ours[0][b, :new].astype(np.float64), ref[0][b, :new].astype(np.float64), **tol,
                                   err_msg=f"output of sequence {b}")
        for i, what in ((1, "present_key"), (2, "present_value")):
            np.testing.assert_allclose(ours[i][b, :, :t].astype(np.float64), ref[i][b, :, :t].astype(np.float64),
                                       **tol, err_msg=f"{what} of sequence {b}")
    return ours


# (batch, seq, heads, kv_heads, head, lengths, past_len): prompts (right-padded batches, with an
# empty past or none), decode steps over ragged pasts, a continued prompt (chunked prefill).
SHAPES = [
    (1, 1, 2, 2, 64, [1], None),
    (1, 7, 8, 2, 64, [7], None),
    (3, 7, 8, 1, 80, [7, 3, 1], 0),
    (2, 97, 16, 2, 128, [97, 50], None),
    (1, 1025, 2, 1, 64, [1025], None),
    (4, 1, 8, 8, 64, [1, 9, 33, 97], 96),
    (3, 1, 16, 2, 128, [5, 1025, 300], 1030),
    (2, 1, 4, 1, 80, [2, 70], 69),
    (1, 7, 8, 2, 128, [27], 20),
    (1, 97, 4, 2, 64, [150], 53),
]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:5])) + f"_past{s[6]}")
def test_gqa_matches_ort(provider, shape):
    batch, seq, heads, kv_heads, head, lengths, past_len = shape
    for dtype in dtypes_for(provider):
        compare_gqa(provider, dtype, batch, seq, heads, kv_heads, head, lengths, past_len)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("variant", [
    dict(packed=True),
    dict(rotary_dim=64),
    dict(rotary_dim=64, rotary_interleaved=1),
    dict(rotary_dim=32, packed=True),
    dict(rotary_dim=16, rotary_interleaved=1, packed=True),
    dict(local_window_size=16),
    dict(softcap=5.0),
    dict(scale=0.3),
    dict(local_window_size=8, softcap=2.0, rotary_dim=64, packed=True),
], ids=lambda v: "_".join(f"{k}{v[k]}" for k in v))
def test_gqa_options_match_ort(provider, variant):
    for dtype in dtypes_for(provider):
        # A prompt with right padding, then a decode step and a continued prompt over a past.
        compare_gqa(provider, dtype, 2, 37, 8, 2, 64, [37, 20], None, **variant)
        compare_gqa(provider, dtype, 3, 1, 8, 2, 64, [40, 7, 64], 64, seed=1, **variant)
        compare_gqa(provider, dtype, 1, 9, 8, 2, 64, [50], 41, seed=2, **variant)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_gqa_shared_past_present_buffer(provider):
    """onnxruntime-genai binds present_key to past_key's buffer: decode steps in place."""
    dtype = dtypes_for(provider)[-1]
    rng = np.random.default_rng(5)
    batch, heads, kv_heads, head, cap = 2, 8, 2, 64, 48
    device = "cpu" if provider == "CPUExecutionProvider" else "cuda"
    results = {}
    for domain in ("com.microsoft", "dlkern"):
        rng = np.random.default_rng(5)
        sess = session(gqa_model(domain, dtype, heads, kv_heads, head, False, True, 64), provider)
        # The arrays stay referenced: a CPU OrtValue borrows their memory.
        buffers = [np.zeros((batch, kv_heads, cap, head), dtype) for _ in range(2)]
        caches = [ort.OrtValue.ortvalue_from_numpy(b, device) for b in buffers]
        cos, sin = rotary_caches(np.random.default_rng(9), cap, 64, dtype)
        lengths = [5, 3]
        outs = []
        for step in range(4):
            seq = 5 if step == 0 else 1
            if step > 0:
                lengths = [t + 1 for t in lengths]
            feeds = gqa_inputs(rng, dtype, batch, seq, heads, kv_heads, head, False, cap, lengths, 0)
            io = sess.io_binding()
            for n in ("query", "key", "value", "seqlens_k", "total_sequence_length"):
                io.bind_cpu_input(n, feeds[n])
            io.bind_cpu_input("cos_cache", cos)
            io.bind_cpu_input("sin_cache", sin)
            io.bind_ortvalue_input("past_key", caches[0])
            io.bind_ortvalue_input("past_value", caches[1])
            io.bind_output("output", device)
            io.bind_ortvalue_output("present_key", caches[0])
            io.bind_ortvalue_output("present_value", caches[1])
            sess.run_with_iobinding(io)
            out = io.copy_outputs_to_cpu()[0]
            outs.append([out[b, :min(seq, t)] for b, t in enumerate(lengths)])
        results[domain] = (outs, [np.array(c.numpy(), copy=True) for c in caches], lengths)
    (ref_outs, ref_caches, lengths), (our_outs, our_caches, _) = results["com.microsoft"], results["dlkern"]
    tol = tolerance(dtype)
    for r_step, o_step in zip(ref_outs, our_outs):
        for r, o in zip(r_step, o_step):
            np.testing.assert_allclose(o.astype(np.float64), r.astype(np.float64), **tol)
    for r, o in zip(ref_caches, our_caches):
        for b, t in enumerate(lengths):
            np.testing.assert_allclose(o[b, :, :t].astype(np.float64), r[b, :, :t].astype(np.float64), **tol)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_gqa_outputs_follow_total_sequence_length_run_by_run(provider):
    """The same node run again with inputs of the same shapes: only the host input
    total_sequence_length moves present's length (max(past, total)), and each run must have
    ORT's shapes and values (dlkern's node keeps its last output inference per input key)."""
    dtype = dtypes_for(provider)[-1]
    heads, kv_heads, head, past_len = 4, 2, 64, 8
    sessions = {d: session(gqa_model(d, dtype, heads, kv_heads, head, False, True, 0), provider)
                for d in ("com.microsoft", "dlkern")}
    for step, length in enumerate([5, 9, 5, 9]):
        feeds = gqa_inputs(np.random.default_rng(step), dtype, 1, 1, heads, kv_heads, head, False, past_len, [length], 0)
        ref, ours = (sessions[d].run(None, feeds) for d in ("com.microsoft", "dlkern"))
        assert ours[1].shape == ref[1].shape == (1, kv_heads, max(past_len, length), head), (step, ours[1].shape)
        tol = tolerance(dtype)
        np.testing.assert_allclose(ours[0].astype(np.float64), ref[0].astype(np.float64), **tol)
        for i in (1, 2):
            np.testing.assert_allclose(ours[i][:, :, :length].astype(np.float64),
                                       ref[i][:, :, :length].astype(np.float64), **tol)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("case,message", [
    (dict(lengths=[60], past_len=32, total=40), "seqlens_k"),
    (dict(lengths=[0], past_len=8, total=1), "seqlens_k"),
    (dict(lengths=[5], past_len=8, rotary_dim=64, drop="cos_cache"), "cos_cache"),
    (dict(lengths=[5], past_len=8, attrs=dict(num_heads=6)), "num_heads"),
    (dict(lengths=[5], past_len=8, attrs=dict(num_heads=7)), "num_heads"),
    (dict(lengths=[5], past_len=8, attrs=dict(smooth_softmax=1)), "smooth_softmax"),
    (dict(lengths=[5], past_len=8, attrs=dict(kv_cache_bit_width=8)), "kv_cache_bit_width"),
])
def test_gqa_bad_input_is_an_error(provider, case, message):
    if message == "seqlens_k" and provider != "CPUExecutionProvider":
        pytest.skip("on CUDA seqlens_k stays on the device, where the kernels clamp it to the cache (as ORT's do)")
    dtype = dtypes_for(provider)[-1]
    rng = np.random.default_rng(3)
    attrs = dict(num_heads=8)
    attrs.update(case.get("attrs", {}))
    rotary_dim = case.get("rotary_dim", 0)
    feeds = gqa_inputs(rng, dtype, 1, 1, 8, 2, 64, False, case["past_len"], case["lengths"], rotary_dim,
                       case.get("total"))
    if case.get("drop"):
        feeds.pop("cos_cache")
        feeds.pop("sin_cache")
        rotary_dim_in_model = 0
    else:
        rotary_dim_in_model = rotary_dim
    heads = attrs.pop("num_heads")
    model = gqa_model("dlkern", dtype, heads, 2, 64, False, True, rotary_dim_in_model, **attrs)
    if case.get("drop"):
        # do_rotary = 1 without the caches.
        import onnx
        m = onnx.load_from_string(model)
        for a in m.graph.node[0].attribute:
            if a.name == "do_rotary":
                a.i = 1
        model = m.SerializeToString()
    with pytest.raises(Exception, match=message):
        session(model, provider).run(None, feeds)


def rotary_model(domain, dtype, shape, pos_shape, cache_shape, **attrs):
    e = ELEM[dtype]
    ins = [helper.make_tensor_value_info("input", e, list(shape)),
           helper.make_tensor_value_info("position_ids", TensorProto.INT64, list(pos_shape)),
           helper.make_tensor_value_info("cos_cache", e, list(cache_shape)),
           helper.make_tensor_value_info("sin_cache", e, list(cache_shape))]
    node = helper.make_node("RotaryEmbedding", ["input", "position_ids", "cos_cache", "sin_cache"], ["output"],
                            domain=domain, **attrs)
    return make_model([node], ins, [helper.make_tensor_value_info("output", e, None)])


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("case", [
    dict(shape=(2, 7, 4 * 64), rotary_dim=0, heads=4, head=64),
    dict(shape=(1, 97, 2 * 80), rotary_dim=0, heads=2, head=80),
    dict(shape=(3, 1, 8 * 128), rotary_dim=64, heads=8, head=128, interleaved=1),
    dict(shape=(2, 4, 7, 64), rotary_dim=0, heads=4, head=64, interleaved=1),
    dict(shape=(1, 1025, 2 * 64), rotary_dim=32, heads=2, head=64),
    dict(shape=(2, 5, 3 * 64), rotary_dim=0, heads=3, head=64, first=True),
], ids=lambda c: "x".join(map(str, c["shape"])) + f"_r{c['rotary_dim']}_i{c.get('interleaved', 0)}")
def test_rotary_embedding_matches_ort(provider, case):
    shape = case["shape"]
    transposed = len(shape) == 4
    batch, seq = shape[0], shape[2] if transposed else shape[1]
    rd = case["rotary_dim"] or case["head"]
    attrs = dict(interleaved=case.get("interleaved", 0))
    if case["rotary_dim"]:
        attrs.update(num_heads=case["heads"], rotary_embedding_dim=case["rotary_dim"])
    dtypes = dtypes_for(provider)
    for dtype in dtypes:
        rng = np.random.default_rng(11)
        x = rng.uniform(-2, 2, shape).astype(dtype)
        cos, sin = rotary_caches(rng, seq + 40, rd, dtype)
        pos = np.array([7], np.int64) if case.get("first") else rng.integers(0, seq + 40, (batch, seq)).astype(np.int64)
        feeds = {"input": x, "position_ids": pos, "cos_cache": cos, "sin_cache": sin}
        got = {d: session(rotary_model(d, dtype, shape, pos.shape, cos.shape, **attrs), provider).run(None, feeds)[0]
               for d in ("com.microsoft", "dlkern")}
        np.testing.assert_allclose(got["dlkern"].astype(np.float64), got["com.microsoft"].astype(np.float64),
                                   **tolerance(dtype))


def test_rotary_embedding_position_out_of_range_is_an_error():
    dtype = np.float32
    x = np.ones((1, 2, 64), dtype)
    cos, sin = rotary_caches(np.random.default_rng(0), 4, 64, dtype)
    pos = np.array([[1, 9]], np.int64)
    sess = session(rotary_model("dlkern", dtype, x.shape, pos.shape, cos.shape), "CPUExecutionProvider")
    with pytest.raises(Exception, match="position 9"):
        sess.run(None, {"input": x, "position_ids": pos, "cos_cache": cos, "sin_cache": sin})


def test_rotary_embedding_huge_num_heads_is_an_error():
    """Found by the fuzz campaign (seed 11, case 4734): num_heads = 2^62 overflowed the check
    that the heads split the hidden size (a panic in a debug build, a wrapped product in a
    release build). Head counts are now bounded before any size is computed from them."""
    dtype = np.float32
    x = np.ones((1, 7, 320), dtype)
    cos, sin = rotary_caches(np.random.default_rng(0), 8, 80, dtype)
    pos = np.array([[1, 6, 2, 0, 3, 4, 5]], np.int64)
    model = rotary_model("dlkern", dtype, x.shape, pos.shape, cos.shape, num_heads=1 << 62, interleaved=1)
    sess = session(model, "CPUExecutionProvider")
    with pytest.raises(Exception, match=r"'num_heads' = 4611686018427387904 must be in 1\.\.=65535") as err:
        sess.run(None, {"input": x, "position_ids": pos, "cos_cache": cos, "sin_cache": sin})
    assert "panic" not in str(err.value)
