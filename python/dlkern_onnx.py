"""Helpers to build ONNX models that use dlkern's ops and to open ONNX Runtime sessions with
libdlkern.so registered. Used by the demo and the tests; also a worked example for users.

    so = ort.SessionOptions()
    so.register_custom_ops_library("target/release/libdlkern.so")
    sess = ort.InferenceSession(model_bytes, so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
"""

from onnx import TensorProto, helper

DOMAIN = "dlkern"
OPSET = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]


def value(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "dlkern", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(graph, opset_imports=OPSET)
    m.ir_version = 9  # readable by onnxruntime >= 1.17
    return m.SerializeToString()


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


def session(lib_path, model_bytes, provider="CPUExecutionProvider", profile=False):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.register_custom_ops_library(str(lib_path))
    so.log_severity_level = 3
    if profile:
        so.enable_profiling = True
    providers = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
    return ort.InferenceSession(model_bytes, so, providers=providers)
