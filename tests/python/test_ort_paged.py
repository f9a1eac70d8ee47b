"""dlkern's PagedAttention (domain dlkern) in ONNX Runtime: on the CPU EP against ORT's own
com.microsoft GroupQueryAttention CPU kernel over the same history gathered from the blocks
(randomized ragged batches, rotary, windows, softcap; the output and both updated caches), and
on the CUDA EP against onnxruntime-gpu's own com.microsoft PagedAttention (skipped without the
CUDA EP). DLKERN_LIB = path of libdlkern.so."""

import os
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern_onnx as dx  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}
PAGED_INPUTS = ["query", "key", "value", "key_cache", "value_cache", "cumulative_sequence_length", "past_seqlens",
                "block_table", "cos_cache", "sin_cache"]


PAGED_SHAPES = {
    "query": ["tokens", "q_hidden"], "key": ["tokens", "kv_hidden"], "value": ["tokens", "kv_hidden"],
    "key_cache": ["blocks", "block_size", "kv_heads", "head"], "value_cache": ["blocks", "block_size", "kv_heads", "head"],
    "cumulative_sequence_length": ["batch_1"], "past_seqlens": ["batch"], "block_table": ["batch", "max_blocks"],
    "cos_cache": ["positions", "half"], "sin_cache": ["positions", "half"],
}


def paged_model(elem, domain, attrs):
    node = helper.make_node("PagedAttention", PAGED_INPUTS, ["output", "key_cache_out", "value_cache_out"],
                            domain=domain, **attrs)
    ints = {"cumulative_sequence_length", "past_seqlens", "block_table"}
    # Ranked shapes (symbolic dims): ORT's own PagedAttention's shape inference needs them.
    inputs = [dx.value(n, TensorProto.INT32 if n in ints else elem, PAGED_SHAPES[n]) for n in PAGED_INPUTS]
    outputs = [dx.value(n, elem, None) for n in ["output", "key_cache_out", "value_cache_out"]]
    return dx.model([node], inputs, outputs, opsets=dx.OPSET_WITH_MS)


def gqa_model(elem, with_past, attrs):
    names = ["query", "key", "value", "past_key" if with_past else "", "past_value" if with_past else "", "seqlens_k",
             "total_sequence_length", "cos_cache", "sin_cache"]
    node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                            domain="com.microsoft", **attrs)
    ints = {"seqlens_k", "total_sequence_length"}
    inputs = [dx.value(n, TensorProto.INT32 if n in ints else elem, None) for n in names if n]
    outputs = [dx.value(n, elem, None) for n in ["output", "present_key", "present_value"]]
    return dx.model([node], inputs, outputs, opsets=dx.OPSET_WITH_MS)


def problem(rng, dtype, seqs, nh, kvh, d, bs, rotary_dim):
    """Random caches, scattered block tables (unused entries far outside the cache) and packed tokens."""
    needed = [-(-(n + p) // bs) for n, p in seqs]
    num_blocks = sum(needed) + 3
    max_blocks = max(needed) + 1
    perm = rng.permutation(num_blocks).astype(np.int32)
    table = np.full((len(seqs), max_blocks), 2**31 - 1, np.int32)
    nxt = 0
    for b, n in enumerate(needed):
        table[b, :n] = perm[nxt:nxt + n]
        nxt += n
    tokens = sum(n for n, _ in seqs)
    cu = np.concatenate([[0], np.cumsum([n for n, _ in seqs])]).astype(np.int32)
    positions = max(n + p for n, p in seqs) + 4
    inv = 1.0 / 10000 ** (np.arange(rotary_dim // 2) / max(rotary_dim // 2, 1))
    angles = np.arange(positions)[:, None] * inv[None, :]
    return dict(
        query=rng.uniform(-1, 1, (tokens, nh * d)).astype(dtype),
        key=rng.uniform(-1, 1, (tokens, kvh * d)).astype(dtype),
        value=rng.uniform(-1, 1, (tokens, kvh * d)).astype(dtype),
        key_cache=rng.uniform(-1, 1, (num_blocks, bs, kvh, d)).astype(dtype),
        value_cache=rng.uniform(-1, 1, (num_blocks, bs, kvh, d)).astype(dtype),
        cumulative_sequence_length=cu,
        past_seqlens=np.array([p for _, p in seqs], np.int32),
        block_table=table,
        cos_cache=np.cos(angles).astype(dtype),
        sin_cache=np.sin(angles).astype(dtype),
    )


def slots(x, b, positions, bs):
    return [int(x["block_table"][b, p // bs]) * bs + p % bs for p in positions]


def gqa_expected(x, seqs, nh, kvh, d, bs, attrs, dtype):
    """ORT's GroupQueryAttention CPU kernel, one sequence at a time, with that sequence's history
    gathered from the blocks as past_key/past_value (BNSH); the expected caches from its present
    keys/values (rotated) scattered back into the slots."""
    out = np.zeros_like(x["query"])
    kc = x["key_cache"].reshape(-1, kvh, d).copy()
    vc = x["value_cache"].reshape(-1, kvh, d).copy()
    sessions = {}
    for b, (n, past) in enumerate(seqs):
        if n == 0:
            continue
        t0 = int(x["cumulative_sequence_length"][b])
        with_past = past > 0
        if with_past not in sessions:
            sessions[with_past] = ort.InferenceSession(gqa_model(ELEM[dtype], with_past, attrs),
                                                       providers=["CPUExecutionProvider"])
        feeds = {
            "query": x["query"][None, t0:t0 + n],
            "key": x["key"][None, t0:t0 + n],
            "value": x["value"][None, t0:t0 + n],
            "seqlens_k": np.array([past + n - 1], np.int32),
            "total_sequence_length": np.array(past + n, np.int32),
            "cos_cache": x["cos_cache"],
            "sin_cache": x["sin_cache"],
        }
        if with_past:
            old = slots(x, b, range(past), bs)
            feeds["past_key"] = np.ascontiguousarray(kc[old].transpose(1, 0, 2)[None])
            feeds["past_value"] = np.ascontiguousarray(vc[old].transpose(1, 0, 2)[None])
        o, pk, pv = sessions[with_past].run(None, feeds)
        out[t0:t0 + n] = o[0]
        new = slots(x, b, range(past, past + n), bs)
        kc[new] = pk[0, :, past:past + n].transpose(1, 0, 2)
        vc[new] = pv[0, :, past:past + n].transpose(1, 0, 2)
    return out, kc.reshape(x["key_cache"].shape), vc.reshape(x["value_cache"].shape)


CASES = [
    # (seqs (new, past), heads, kv heads, head size, block size, attributes)
    ([(1, 40), (7, 0), (5, 33), (0, 3), (1, 0)], 4, 2, 64, 16, {}),
    ([(3, 100), (1, 17), (9, 0)], 8, 2, 64, 32, {"do_rotary": 1}),
    ([(1, 60), (6, 20), (4, 0)], 4, 1, 80, 16, {"do_rotary": 1, "rotary_interleaved": 1}),
    ([(2, 70), (1, 5), (8, 0)], 8, 1, 128, 16, {"do_rotary": 1, "local_window_size": 16}),
    ([(1, 50), (5, 9), (3, 0)], 4, 4, 64, 16, {"softcap": 20.0, "scale": 0.2}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_paged_attention_cpu_ep_matches_ort_group_query_attention(dtype, case):
    seqs, nh, kvh, d, bs, extra = CASES[case]
    rng = np.random.default_rng(100 + case)
    x = problem(rng, dtype, seqs, nh, kvh, d, bs, d)
    attrs = dict(num_heads=nh, kv_num_heads=kvh, **extra)
    want, want_kc, want_vc = gqa_expected(x, seqs, nh, kvh, d, bs, attrs, dtype)
    sess = dx.session(LIB_PATH, paged_model(ELEM[dtype], "dlkern", attrs))
    out, kc, vc = sess.run(None, x)
    tol = dict(rtol=2e-3, atol=2e-3) if dtype == np.float16 else dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out.astype(np.float64), want.astype(np.float64), **tol)
    np.testing.assert_allclose(kc.astype(np.float64), want_kc.astype(np.float64), **tol)
    np.testing.assert_array_equal(vc, want_vc)


def test_paged_attention_cpu_ep_partial_rotary_matches_gqa():
    seqs, nh, kvh, d, bs = [(1, 30), (4, 0), (3, 12)], 4, 2, 64, 16
    rng = np.random.default_rng(7)
    x = problem(rng, np.float32, seqs, nh, kvh, d, bs, 32)  # rotary_dim 32 of 64
    attrs = dict(num_heads=nh, kv_num_heads=kvh, do_rotary=1)
    want, want_kc, _ = gqa_expected(x, seqs, nh, kvh, d, bs, attrs, np.float32)
    out, kc, _ = dx.session(LIB_PATH, paged_model(TensorProto.FLOAT, "dlkern", attrs)).run(None, x)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(kc, want_kc, rtol=1e-5, atol=1e-6)


def test_paged_attention_cpu_ep_refuses_unsupported_and_bad_blocks():
    seqs, nh, kvh, d, bs = [(2, 10)], 4, 2, 64, 16
    x = problem(np.random.default_rng(1), np.float32, seqs, nh, kvh, d, bs, d)
    sess = dx.session(LIB_PATH, paged_model(TensorProto.FLOAT, "dlkern", dict(num_heads=nh, kv_num_heads=kvh,
                                                                              is_causal=0)))
    with pytest.raises(Exception, match="is_causal"):
        sess.run(None, x)
    sess = dx.session(LIB_PATH, paged_model(TensorProto.FLOAT, "dlkern", dict(num_heads=nh, kv_num_heads=kvh)))
    x["block_table"][0, 0] = -1
    with pytest.raises(Exception, match="outside the cache"):
        sess.run(None, x)


CUDA_AVAILABLE = "CUDAExecutionProvider" in ort.get_available_providers()


def run_cuda_in_place(model, x):
    """Runs on the CUDA EP with the caches' outputs bound to the inputs' device buffers (what ORT's
    own PagedAttention requires); returns the output and the caches after the call."""
    sess = dx.session(LIB_PATH, model, provider="CUDAExecutionProvider")
    io = sess.io_binding()
    values = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in x.items()}
    for k, v in values.items():
        io.bind_ortvalue_input(k, v)
    io.bind_output("output", "cuda")
    io.bind_ortvalue_output("key_cache_out", values["key_cache"])
    io.bind_ortvalue_output("value_cache_out", values["value_cache"])
    sess.run_with_iobinding(io)
    return io.copy_outputs_to_cpu()[0], values["key_cache"].numpy(), values["value_cache"].numpy()


@pytest.mark.skipif(not CUDA_AVAILABLE, reason="needs onnxruntime-gpu with the CUDA execution provider")
@pytest.mark.parametrize("case", range(len(CASES)))
def test_paged_attention_cuda_ep_matches_ort_paged_attention(case):
    seqs, nh, kvh, d, bs, extra = CASES[case]
    rng = np.random.default_rng(200 + case)
    x = problem(rng, np.float16, seqs, nh, kvh, d, bs, d)
    attrs = dict(num_heads=nh, kv_num_heads=kvh, **extra)
    want, want_kc, want_vc = run_cuda_in_place(paged_model(TensorProto.FLOAT16, "com.microsoft", attrs),
                                               {k: v.copy() for k, v in x.items()})
    got, kc, vc = run_cuda_in_place(paged_model(TensorProto.FLOAT16, "dlkern", attrs), {k: v.copy() for k, v in x.items()})
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=5e-3, atol=5e-3)
    np.testing.assert_allclose(kc.astype(np.float32), want_kc.astype(np.float32), rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(vc, want_vc)
