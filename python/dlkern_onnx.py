"""Helpers to build ONNX models that use dlkern's ops and to open ONNX Runtime sessions with
libdlkern.so registered. Used by the demo and the tests; also a worked example for users.

    so = ort.SessionOptions()
    so.register_custom_ops_library("target/release/libdlkern.so")
    sess = ort.InferenceSession(model_bytes, so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
"""

from onnx import TensorProto, helper

DOMAIN = "dlkern"
OPSET = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
# With ONNX Runtime's contrib domain too: a model that holds an op in both its ORT and its dlkern
# version (the drop-in comparisons).
OPSET_WITH_MS = OPSET + [helper.make_opsetid("com.microsoft", 1)]


def value(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def model(nodes, inputs, outputs, initializers=(), opsets=OPSET):
    graph = helper.make_graph(nodes, "dlkern", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(graph, opset_imports=opsets)
    m.ir_version = 9  # readable by onnxruntime >= 1.17
    return m.SerializeToString()


def pack_w8_for_decode(w_q):
    """int8 weights [N, K] in the layout of dlkern.matmul_w8a8's w_layout="decode_packed" (the
    Rust dlkern::ops::matmul_w8a8::pack::pack_for_decode): [ceil(N/16)*16, ceil(K/64)*64] bytes, zero-padded, each
    16 rows x 64 columns tile contiguous in K order. Do it once, when the weights are exported."""
    import numpy as np

    n, k = w_q.shape
    rows, cols = -(-n // 16) * 16, -(-k // 64) * 64
    padded = np.zeros((rows, cols), dtype=np.int8)
    padded[:n, :k] = w_q
    tiles = padded.reshape(rows // 16, 16, cols // 64, 64).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(tiles).reshape(rows, cols)


def w8a8_model(k, w_q, w_scale, out_elem=TensorProto.FLOAT16, w_layout="nk"):
    """y [m, n] = quantize_per_token(x [m, k]) times int8 w_q, both through DLPackKernel;
    x, y of out_elem (f16 or f32). w_q is [n, k] for w_layout="nk", else pack_w8_for_decode's
    (K padded: hence k given)."""
    from onnx import numpy_helper

    out_dtype = {TensorProto.FLOAT16: "f16", TensorProto.FLOAT: "f32"}[out_elem]
    nodes = [
        helper.make_node("DLPackKernel", ["x"], ["x_q", "x_scale"], domain=DOMAIN, name="quant",
                         function_name="dlkern.quantize_per_token"),
        helper.make_node("DLPackKernel", ["x_q", "x_scale", "w_q", "w_scale"], ["y"], domain=DOMAIN, name="mm",
                         function_name="dlkern.matmul_w8a8", out_dtype=out_dtype, w_layout=w_layout,
                         attribute_names="out_dtype,w_layout"),
    ]
    inits = [numpy_helper.from_array(w_q, "w_q"), numpy_helper.from_array(w_scale, "w_scale")]
    return model(nodes, [value("x", out_elem, ["m", k])], [value("y", out_elem, None)], inits)


def rmsnorm_model(elem_type=TensorProto.FLOAT, dim=64, epsilon=1e-5, generic=False):
    """Y = RMSNorm(X [N..., dim], scale [dim]) as the typed op, or through DLPackKernel."""
    if generic:
        node = helper.make_node("DLPackKernel", ["X", "scale"], ["Y"], domain=DOMAIN, name="rms",
                                function_name="dlkern.rmsnorm", epsilon=epsilon, attribute_names="epsilon")
    else:
        node = helper.make_node("RMSNorm", ["X", "scale"], ["Y"], domain=DOMAIN, name="rms", epsilon=epsilon)
    return model([node], [value("X", elem_type, ["batch", "seq", dim]), value("scale", elem_type, [dim])],
                 [value("Y", elem_type, None)])


def attention_model(elem_type, heads, kv_heads, head_dim, packed=False, generic_lse=False, **attrs):
    """dlkern FlashAttention: Q [B, Sq, H, D], K/V [B, Sk, Hkv, D] (or packed [total, H, D] with
    int32 cu_seqlens_q/cu_seqlens_k) -> O. With `generic_lse`, DLPackKernel running
    dlkern.attention_lse instead, which also returns LSE (f32)."""
    if packed:
        inputs = [value("Q", elem_type, ["tq", heads, head_dim]), value("K", elem_type, ["tk", kv_heads, head_dim]),
                  value("V", elem_type, ["tk", kv_heads, head_dim]), value("cu_q", TensorProto.INT32, ["b1"]),
                  value("cu_k", TensorProto.INT32, ["b1"])]
    else:
        inputs = [value("Q", elem_type, ["b", "sq", heads, head_dim]),
                  value("K", elem_type, ["b", "sk", kv_heads, head_dim]),
                  value("V", elem_type, ["b", "sk", kv_heads, head_dim])]
    names = [i.name for i in inputs]
    outputs = [value("O", elem_type, None)]
    if generic_lse:
        listed = {"attribute_names": ",".join(attrs)} if attrs else {}
        node = helper.make_node("DLPackKernel", names, ["O", "LSE"], domain=DOMAIN, name="attn",
                                function_name="dlkern.attention_lse", **listed, **attrs)
        outputs.append(value("LSE", TensorProto.FLOAT, None))
    else:
        node = helper.make_node("FlashAttention", names, ["O"], domain=DOMAIN, name="attn", **attrs)
    return model([node], inputs, outputs)


def session(lib_path, model_bytes, provider="CPUExecutionProvider", profile=False, provider_options=None):
    """A session with libdlkern.so registered on `provider` (the CPU EP after it, for the nodes it
    does not take); `provider_options` go to `provider` (gpu_mem_limit, device_id, ...)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.register_custom_ops_library(str(lib_path))
    so.log_severity_level = 3
    if profile:
        so.enable_profiling = True
    first = (provider, provider_options) if provider_options else provider
    providers = [first] if provider == "CPUExecutionProvider" else [first, "CPUExecutionProvider"]
    return ort.InferenceSession(model_bytes, so, providers=providers)
