"""dlkern FlashAttention through ONNX Runtime (CPU EP, runs in CI) against an independent NumPy
implementation: padded and packed batches, GQA, causal with more keys than queries (bottom-right
aligned), window, soft cap, explicit scale, f32 and f16; the log-sum-exp through DLPackKernel;
and the errors a user sees. DLKERN_LIB = path of libdlkern.so."""

import os
import sys

import numpy as np
import pytest
from onnx import TensorProto

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern_onnx as dx  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])


def attention_np(q, k, v, causal=False, scale=None, softcap=0.0, window_left=-1):
    """q [Sq, H, D], k/v [Sk, Hkv, D] for one sequence, in f64: (out [Sq, H, D], lse [H, Sq])."""
    sq, h, d = q.shape
    sk, hkv, _ = k.shape
    scale = 1 / np.sqrt(d) if not scale else scale
    rep = h // hkv
    k = np.repeat(k.astype(np.float64), rep, axis=1)
    v = np.repeat(v.astype(np.float64), rep, axis=1)
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), k) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    diag = np.arange(sq)[:, None] + sk - sq
    j = np.arange(sk)[None, :]
    mask = np.ones((sq, sk), bool)
    if causal:
        mask &= j <= diag
    if window_left >= 0:
        mask &= j >= diag - window_left
    s = np.where(mask[None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m)
    total = p.sum(-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", p / np.where(total > 0, total, 1), v)
    lse = np.where(total[..., 0] > 0, np.log(total[..., 0]) + m[..., 0], -np.inf)
    return out, lse


def run(model, feeds):
    sess = dx.session(LIB_PATH, model)
    return sess.run(None, feeds)


CASES = [
    dict(),
    dict(causal=1),
    dict(causal=1, window_left=3),
    dict(softcap=2.0, scale=0.3),
]


@pytest.mark.parametrize("attrs", CASES)
@pytest.mark.parametrize("np_dtype,elem", [(np.float32, TensorProto.FLOAT), (np.float16, TensorProto.FLOAT16)])
@pytest.mark.parametrize("heads,kv_heads,d", [(4, 4, 16), (8, 2, 80)])
def test_padded_batch_matches_numpy(attrs, np_dtype, elem, heads, kv_heads, d):
    rng = np.random.default_rng(5)
    b, sq, sk = 2, 7, 11  # more keys than queries: chunked prefill
    q = rng.uniform(-1, 1, (b, sq, heads, d)).astype(np_dtype)
    k = rng.uniform(-1, 1, (b, sk, kv_heads, d)).astype(np_dtype)
    v = rng.uniform(-1, 1, (b, sk, kv_heads, d)).astype(np_dtype)
    (o,) = run(dx.attention_model(elem, heads, kv_heads, d, **attrs), {"Q": q, "K": k, "V": v})
    assert o.dtype == np_dtype and o.shape == q.shape
    tol = 2e-3 if np_dtype == np.float16 else 1e-5
    for i in range(b):
        want, _ = attention_np(q[i], k[i], v[i], **attrs)
        np.testing.assert_allclose(o[i].astype(np.float64), want, rtol=tol, atol=tol)


def test_packed_batch_and_lse_through_the_generic_op():
    rng = np.random.default_rng(9)
    heads, kv_heads, d = 4, 1, 32  # MQA
    lens_q, lens_k = [3, 1, 6], [5, 1, 9]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], heads, d)).astype(np.float32)
    k = rng.standard_normal((cu_k[-1], kv_heads, d)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], kv_heads, d)).astype(np.float32)
    feeds = {"Q": q, "K": k, "V": v, "cu_q": cu_q, "cu_k": cu_k}
    model = dx.attention_model(TensorProto.FLOAT, heads, kv_heads, d, packed=True, generic_lse=True, causal=1)
    o, lse = run(model, feeds)
    assert lse.dtype == np.float32 and lse.shape == (heads, cu_q[-1])
    (o_typed,) = run(dx.attention_model(TensorProto.FLOAT, heads, kv_heads, d, packed=True, causal=1), feeds)
    np.testing.assert_array_equal(o, o_typed)
    for i in range(3):
        rows = slice(cu_q[i], cu_q[i + 1])
        want, want_lse = attention_np(q[rows], k[cu_k[i]:cu_k[i + 1]], v[cu_k[i]:cu_k[i + 1]], causal=1)
        np.testing.assert_allclose(o[rows], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(lse[:, rows], want_lse, rtol=1e-5, atol=1e-5)


def test_errors_name_the_problem():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)  # 3 query heads over 2 KV heads
    k = rng.standard_normal((1, 2, 2, 8)).astype(np.float32)
    with pytest.raises(Exception, match="multiple of KV heads"):
        run(dx.attention_model(TensorProto.FLOAT, 3, 2, 8), {"Q": q, "K": k, "V": k})
    q = rng.standard_normal((4, 2, 8)).astype(np.float32)
    k = rng.standard_normal((4, 2, 8)).astype(np.float32)
    bad = {"Q": q, "K": k, "V": k, "cu_q": np.array([0, 3], np.int32), "cu_k": np.array([0, 4], np.int32)}
    with pytest.raises(Exception, match="end at 4"):
        run(dx.attention_model(TensorProto.FLOAT, 2, 2, 8, packed=True), bad)
    q4 = rng.standard_normal((1, 2, 2, 8)).astype(np.float32)
    with pytest.raises(Exception, match="causal = 3"):
        run(dx.attention_model(TensorProto.FLOAT, 2, 2, 8, causal=3), {"Q": q4, "K": q4, "V": q4})
