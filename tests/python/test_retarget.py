"""dlkern.retarget on graphs made here: which nodes move for which execution provider and why
the others stay, its element-type table against docs/ops.md (generated from the Rust op
declarations), external data kept reachable, and a model folder made ready for
onnxruntime-genai. The builder-made fixtures are retargeted in test_genai.py.
DLKERN_LIB = path of libdlkern.so."""

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
import dlkern_onnx as dx  # noqa: E402
from dlkern import retarget as rt  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
F16, F32 = TensorProto.FLOAT16, TensorProto.FLOAT
# What ORT's tools write: no dlkern domain yet.
ORT_OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def gqa_model(elem=F16, head=64, heads=4, kv_heads=2, extra_inputs=(), **attrs):
    """A builder-shaped GroupQueryAttention node: packed QKV, past caches as graph inputs with a
    static head size, fp cos/sin initializers."""
    width = (heads + 2 * kv_heads) * head
    half = head // 2
    cos = numpy_helper.from_array(np.ones((16, half), dx_np(elem)), "cos_cache")
    sin = numpy_helper.from_array(np.zeros((16, half), dx_np(elem)), "sin_cache")
    inputs = ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_seq", "cos_cache", "sin_cache",
              *extra_inputs]
    node = helper.make_node("GroupQueryAttention", inputs, ["out", "present_key", "present_value"],
                            domain="com.microsoft", name="attn", num_heads=heads, kv_num_heads=kv_heads,
                            do_rotary=1, **attrs)
    cache = ["batch", kv_heads, "past", head]
    graph_inputs = [dx.value("qkv", elem, ["batch", "seq", width]), dx.value("past_key", elem, cache),
                    dx.value("past_value", elem, cache), dx.value("seqlens_k", TensorProto.INT32, ["batch"]),
                    dx.value("total_seq", TensorProto.INT32, [])]
    graph_inputs += [dx.value(n, TensorProto.INT64, ["batch", "seq"]) for n in extra_inputs if n]
    outputs = [dx.value(n, elem, None) for n in ("out", "present_key", "present_value")]
    return onnx.load_from_string(dx.model([node], graph_inputs, outputs, [cos, sin], opsets=ORT_OPSETS))


def dx_np(elem):
    return {F16: np.float16, F32: np.float32, TensorProto.BFLOAT16: np.float32}[elem]


def nbits_node(bits=4, block=32, g_idx=False, name="mm"):
    inputs = ["x", f"{name}.B", f"{name}.scales", "", "g_idx" if g_idx else ""]
    return helper.make_node("MatMulNBits", inputs, [f"{name}.y"], domain="com.microsoft", name=name, K=64, N=32,
                            bits=bits, block_size=block)


def nbits_model(elem=F32, nodes=None, external=None, rng=np.random.default_rng(0)):
    """x [1, 64] through MatMulNBits nodes (all reading x) summed; weights as initializers."""
    nodes = nodes or [nbits_node()]
    inits, outputs = [], []
    for n in nodes:
        block = rt.attr(n, "block_size")
        blocks = 64 // block
        inits.append(numpy_helper.from_array(rng.integers(0, 256, (32, blocks, block // 2), dtype=np.uint8),
                                             n.input[1]))
        inits.append(numpy_helper.from_array((rng.random((32, blocks)) * 0.1).astype(dx_np(elem)), n.input[2]))
        outputs.append(dx.value(n.output[0], elem, None))
    return onnx.load_from_string(dx.model(nodes, [dx.value("x", elem, [1, 64])], outputs, inits, opsets=ORT_OPSETS))


def moved(model, ep):
    report = rt.retarget_model(model, ep)
    return report, {n.name: n.domain for n in model.graph.node}


@pytest.mark.parametrize("ep", ["cuda", "cpu"])
def test_builder_shaped_attention_moves(ep):
    report, domains = moved(gqa_model(), ep)
    assert domains == {"attn": "dlkern"}
    assert report.moved == {"GroupQueryAttention": 1} and not report.stayed
    model = gqa_model()
    assert not [o for o in model.opset_import if o.domain == "dlkern"]
    rt.retarget_model(model, ep)
    rt.retarget_model(model, ep)
    assert [o.version for o in model.opset_import if o.domain == "dlkern"] == [1]


@pytest.mark.parametrize(
    "kwargs, ep, reason",
    [
        (dict(head=32), "cuda", "head size 32"),
        (dict(elem=F32), "cuda", "float on CUDA"),
        (dict(smooth_softmax=1), "cpu", "smooth_softmax = 1"),
        (dict(extra_inputs=("position_ids",)), "cpu", "input position_ids given"),
        (dict(extra_inputs=("", "", "head_sink")), "cuda", "input head_sink given"),
        (dict(k_quant_type="PER_TENSOR"), "cuda", "k_quant_type"),
    ],
)
def test_attention_stays_where_dlkern_differs(kwargs, ep, reason):
    report, domains = moved(gqa_model(**kwargs), ep)
    assert domains == {"attn": "com.microsoft"}
    ((op, why),) = report.stayed
    assert op == "GroupQueryAttention" and reason in why, why
    assert reason in report.table()


def test_head_size_only_limits_cuda():
    _, domains = moved(gqa_model(head=32), "cpu")
    assert domains == {"attn": "dlkern"}


def test_matmul_nbits_formats():
    nodes = [nbits_node(name="a"), nbits_node(block=16, name="b"), nbits_node(bits=8, name="c"),
             nbits_node(block=64, g_idx=True, name="d")]
    model = nbits_model(F32, nodes)
    report, domains = moved(model, "cpu")
    assert domains == {"a": "dlkern", "b": "dlkern", "c": "com.microsoft", "d": "com.microsoft"}
    reasons = {why for _, why in report.stayed}
    assert reasons == {"bits = 8 (dlkern: 4)", "g_idx given (deprecated upstream; refused)"}
    # f32 has no CUDA kernel: the table says so per op.
    report, domains = moved(nbits_model(F32, [nbits_node(name="a")]), "cuda")
    assert domains == {"a": "com.microsoft"}
    assert "float on CUDA (dlkern: float16, bfloat16)" in report.table()


def test_norms():
    x = dx.value("x", F16, ["b", "s", 8])
    gamma = numpy_helper.from_array(np.ones(8, np.float16), "gamma")
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y0"], name="ln", epsilon=1e-6,
                         stash_type=1, axis=-1),
        helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y1"], name="ln_double", stash_type=0),
        helper.make_node("SkipSimplifiedLayerNormalization", ["x", "y0", "gamma"], ["y2", "", "", "sum"],
                         domain="com.microsoft", name="skip"),
        helper.make_node("Relu", ["y2"], ["y3"], name="relu"),
    ]
    outputs = [dx.value(n, F16, None) for n in ("y1", "y3", "sum")]
    model = onnx.load_from_string(dx.model(nodes, [x], outputs, [gamma], opsets=ORT_OPSETS))
    report, domains = moved(model, "cuda")
    assert domains == {"ln": "dlkern", "ln_double": "", "skip": "dlkern", "relu": ""}
    assert report.other == {"Relu": 1}
    assert "stash_type = 0" in report.table()


def test_types_agree_with_the_op_declarations():
    """docs/ops.md prints each typed op's element types from its Rust declaration (tests/ops_doc.rs
    keeps it exact); the retarget table must say the same."""
    names = {v: k for k, v in rt.TYPE_NAMES.items()}
    docs = (ROOT / "docs" / "ops.md").read_text()
    for op, per_ep in rt.TYPES.items():
        m = re.search(rf"ORT op `{op}` \(domain `dlkern`\)\. T: (.*)\.\n", docs)
        assert m, f"{op} has no typed ORT op in docs/ops.md"
        found = {}
        for part in m.group(1).split("; "):
            ep, types = re.match(r"(CUDA|CPU) execution provider (.*)", part).groups()
            found[ep.lower()] = tuple(names[t.strip("`")] for t in types.split(", "))
        assert found == per_ep, op


def run(path, feeds, domain_lib=True):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if domain_lib:
        so.register_custom_ops_library(LIB_PATH)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_external_data_stays_reachable(tmp_path):
    """A model whose weights live in an external file, retargeted into another folder: the graph is
    rewritten without loading the weights, the data file follows it, and the result computes what
    ORT's own kernels compute."""
    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    model = nbits_model(F32, [nbits_node(name="a"), nbits_node(block=16, name="b")])
    onnx.save(model, str(src), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    dst = tmp_path / "out" / "model.onnx"
    report = rt.retarget(src, dst, ep="cpu")
    assert report.moved == {"MatMulNBits": 2}
    assert (dst.parent / "model.onnx.data").exists()
    assert os.path.getsize(dst) < 2048, "the weights were inlined into the graph"
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    want = run(src, {"x": x}, domain_lib=False)
    got = run(dst, {"x": x})
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_model_folder_for_genai(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    onnx.save(gqa_model(), str(src / "decoder.onnx"))
    (src / "tokenizer.json").write_text("{}")
    config = {"model": {"decoder": {"filename": "decoder.onnx", "session_options": {"log_id": "x"}}}}
    (src / "genai_config.json").write_text(json.dumps(config))
    rt.main([str(src), str(dst), "--library", LIB_PATH])
    written = json.loads((dst / "genai_config.json").read_text())
    assert written["model"]["decoder"]["session_options"] == {"log_id": "x", "custom_ops_library": "libdlkern.so"}
    assert (dst / "libdlkern.so").stat().st_size == os.path.getsize(LIB_PATH)
    assert (dst / "tokenizer.json").read_text() == "{}"
    assert onnx.load(str(dst / "decoder.onnx")).graph.node[0].domain == "dlkern"
    assert onnx.load(str(src / "decoder.onnx")).graph.node[0].domain == "com.microsoft", "IN was modified"


def test_errors_are_messages(tmp_path, capsys):
    assert rt.main([str(tmp_path / "missing.onnx"), str(tmp_path / "out.onnx")]) == 1
    assert "dlkern.retarget:" in capsys.readouterr().err
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "genai_config.json").write_text("{}")
    assert rt.main([str(tmp_path / "folder"), str(tmp_path / "folder2")]) == 1
    assert "genai_config.json has no model.decoder.filename" in capsys.readouterr().err
