"""Llama-shaped ONNX models with random weights, in the exact form onnxruntime-genai 0.18.0's model
builder (`python -m onnxruntime_genai.models.builder -p int4 -e cuda ...`) emits, built with onnx
and numpy only.

Why: end-to-end benchmarks need a Llama-3-8B-sized int4 model on hosts with no torch, no
transformers and no network. Everything the runtime sees is the builder's: node names, op
types, attributes and input slots, graph inputs/outputs (names, dtypes, symbolic dims), the
KV-cache layout, initializer names and formats, one external data file `model.onnx.data`, and
the `genai_config.json` beside it. Only the weight values are random.

What the builder does for Llama (builders/base.py, 0.18.0), reproduced here:
  * precision/EP -> I/O dtype: int4+cuda and fp16+cuda run in fp16, int4+cpu and fp32+cpu in
    fp32 (`default_io_dtype`). GroupQueryAttention is used for (cpu, fp32) and (cuda, fp16)
    only (`is_gqa_supported`); other pairs get MultiHeadAttention/Attention graphs, not built here.
  * int4: the builder emits float MatMuls and lets ORT's MatMulNBitsQuantizer (DEFAULT algo)
    rewrite them, so node `<matmul>_Q4` gets `<weight>_Q4` (uint8 [N, k_blocks, block/2], low
    nibble first), `<weight>_scales` (io dtype [N, k_blocks]) and, when asymmetric,
    `<weight>_zero_points` (uint8 [N, ceil(k_blocks/2)]). Defaults: block 32, symmetric,
    accuracy_level 0 on cuda (attribute omitted) and 4 on cpu; lm_head quantized, the
    embedding Gather not (op_types_to_quantize = MatMul).
  * weights are written directly as random codes + scales (quantizing an fp matrix at 8B
    scale would take far too long) and streamed to `model.onnx.data` one tensor at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

# Builder constants (builders/base.py): graph name, opsets, IR version, producer.
OPSETS = {"": 22, "com.microsoft": 1}
IR_VERSION = 10
PRODUCER = ("onnxruntime-genai", "0.18.0+a5f5c27")  # the 0.18.0 wheel stamps its commit too
DATA_FILE = "model.onnx.data"
QUANT_SUFFIXES = ("_Q4", "_scales", "_zero_points")  # names of the quantizer's initializers
CHUNK_BYTES = 64 << 20  # random data is made and written in pieces of about this size


@dataclass(frozen=True)
class Config:
    """The Hugging Face config fields the builder reads for a Llama model."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    vocab_size: int
    context_length: int  # max_position_embeddings: rotary cache rows, search.max_length
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    bos_token_id: int = 128000
    eos_token_id: int | tuple = 128001
    pad_token_id: int | None = None  # None: the builder's fallback, the first eos id


LLAMA3_8B = Config(hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                   head_size=128, vocab_size=128256, context_length=8192)
# The config of the builder-made fixtures in tests/fixtures/llm/ (see its README), so the
# structural test can compare node for node.
TINY = Config(hidden_size=128, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_size=64,
              vocab_size=320, context_length=256, rope_theta=10000.0, bos_token_id=0, eos_token_id=0)
PRESETS = {"llama3-8b": LLAMA3_8B, "tiny": TINY}

# (precision, ep) -> I/O dtype, as the builder's default_io_dtype picks it; only the pairs
# whose attention is GroupQueryAttention.
IO_DTYPES = {("int4", "cuda"): TensorProto.FLOAT16, ("fp16", "cuda"): TensorProto.FLOAT16,
             ("int4", "cpu"): TensorProto.FLOAT, ("fp32", "cpu"): TensorProto.FLOAT}
NP_DTYPES = {TensorProto.FLOAT16: np.float16, TensorProto.FLOAT: np.float32}


class _Writer:
    """Collects nodes and initializers; initializer bytes go straight to the data file, so peak
    memory is one chunk, not the model (the builder also puts every initializer, however small,
    in the one file: ir.save(..., size_threshold_bytes=0))."""

    def __init__(self, out_dir, rng, float_bytes=0):
        self.rng = rng
        self.nodes, self.inits, self.value_info = [], [], []
        self.data = open(os.path.join(out_dir, DATA_FILE), "wb")
        # The builder's file holds the float initializers first, then the quantizer's; two
        # cursors put each tensor where the builder would although they are made interleaved.
        self.float_bytes = float_bytes
        self.cursor = {False: 0, True: float_bytes}

    def node(self, op, inputs, outputs, name, domain="", types=(), **attrs):
        """Append a node; `types` are (dtype, shape) for its non-empty outputs, in order, recorded as
        value_info like the builder's (graph outputs get none: zip stops short)."""
        # Attributes in the order given (make_node would sort them), domain None left unset (not
        # ""): the builder's protos byte for byte.
        node = helper.make_node(op, inputs, outputs, name=name, domain=domain or None)
        node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
        self.nodes.append(node)
        for out, (dtype, shape) in zip([o for o in outputs if o], types):
            self.value_info.append(helper.make_tensor_value_info(out, dtype, shape))
        return outputs[0]

    def constant(self, name, value):
        # The builder's "/model/constants/INT64/<v>" values come from Constant nodes named
        # "/model/constant_nodes/INT64/<v>", made just before their first consumer.
        arr = np.array(value, dtype=np.int64)
        self.node("Constant", [], [name], name.replace("constants", "constant_nodes"),
                  types=[(TensorProto.INT64, [])],  # a scalar even for [1]: the builder's annotation
                  value=onnx.numpy_helper.from_array(arr, name))
        return name

    def init(self, name, dtype, shape, chunks):
        """External initializer whose bytes are the concatenation of `chunks` (numpy arrays)."""
        late = name.endswith(QUANT_SUFFIXES)
        start = self.cursor[late]
        self.data.seek(start)
        for c in chunks:
            c = np.ascontiguousarray(c)
            self.data.write(c.data)
            self.cursor[late] += c.nbytes
        t = TensorProto(name=name, data_type=dtype, dims=shape)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", DATA_FILE), ("offset", str(start)), ("length", str(self.cursor[late] - start))):
            t.external_data.add(key=k, value=v)
        self.inits.append(t)
        return name

    def finish(self):
        """(initializers, value_info) in the builder's order: its int4 weights come from the
        quantizer pass, which appends them after the float initializers; the builder's
        value_info lists every initializer, then the node outputs."""
        assert self.cursor[False] == self.float_bytes or not self.float_bytes, "float_bytes miscounted"
        inits = sorted(self.inits, key=lambda t: t.name.endswith(QUANT_SUFFIXES))
        return inits, [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in inits] + self.value_info

    def random(self, name, dtype, shape, make):
        """Initializer of `shape` filled row block by row block: make(rows, row_shape, rng)."""
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(dtype).itemsize
        step = max(1, CHUNK_BYTES // max(row_bytes, 1))
        chunks = (make(min(step, shape[0] - r), tuple(shape[1:]), self.rng) for r in range(0, shape[0], step))
        return self.init(name, dtype, shape, chunks)

    def close(self):
        self.data.close()


def _codes(rows, row_shape, rng):
    # Uniform nibbles: bytes are two 4-bit codes each, any byte value is valid.
    return np.frombuffer(rng.bytes(rows * int(np.prod(row_shape))), np.uint8).reshape((rows, *row_shape))


def _signed_codes(rows, row_shape, rng):
    """Symmetric int4 codes for rows of B, meaning c - 8. Uniform codes would have mean -0.5, a
    common part of every weight column that, through the layers, swamps the input-dependent part
    (every position then predicts one token). Code 0 (-8) is turned into 8 (0), giving -7..7 with
    mean 0."""
    c = _codes(rows, row_shape, rng)
    return c | ((c & 0x0F) == 0).view(np.uint8) << 3 | ((c & 0xF0) == 0).view(np.uint8) << 7


def _uniform(scale, np_dtype):
    """Float weights (code - 7.5) * scale, code uniform in 0..15: the spread of the int4 weights
    (so every precision keeps the same activation sizes) with zero mean."""
    def make(rows, row_shape, rng):
        c = _codes(rows, row_shape, rng) & np.uint8(15)
        return ((c.astype(np.float32) - 7.5) * scale).astype(np_dtype)
    return make


class _Model:
    def __init__(self, w, cfg, precision, ep, block_size, zero_points):
        self.w, self.cfg, self.ep = w, cfg, ep
        self.quantized = precision == "int4"
        self.io = IO_DTYPES[(precision, ep)]
        self.np_io = NP_DTYPES[self.io]
        self.block, self.zero_points = block_size, zero_points
        self.accuracy_level = 4 if ep == "cpu" else 0  # builder default; 0 is left out of the node

    def hidden(self, last):
        """(io dtype, [batch_size, sequence_length, last]): the builder's hidden-state value_info."""
        return self.io, ["batch_size", "sequence_length", last]

    def linear(self, basename, x, k, n, output=None):
        """One projection, `basename` being the builder's ".../MatMul" node name: MatMulNBits plus
        its B/scales(/zero_points) initializers in int4, MatMul plus a [K, N] weight otherwise.

        Weight scale 1/(8 sqrt(K)) keeps each projection's output rms at about half its input's
        (the codes' values have rms ~4.2), so the residual stream stays O(1) through 32 layers in
        fp16 and the logits are finite and input-dependent (Llama-3-8B int4: logits std ~0.55,
        |present| <= 2, a different argmax per position)."""
        scale = 1.0 / (8.0 * np.sqrt(k))
        weight = basename[1:].replace("/", ".") + ".weight"
        output = output or f"{basename}/output_0"
        types = [] if output == "logits" else [self.hidden(n)]
        if not self.quantized:
            self.w.random(weight, self.io, [k, n], _uniform(scale, self.np_io))
            return self.w.node("MatMul", [x, weight], [output], basename, types=types)
        k_blocks = -(-k // self.block)
        codes = _codes if self.zero_points else _signed_codes  # random zero points spread the means anyway
        inputs = [x, self.w.random(weight + "_Q4", TensorProto.UINT8, [n, k_blocks, self.block // 2], codes)]

        def scales(rows, row_shape, rng):  # per-block scales in [0.5, 1.5) x scale
            u = _codes(rows, row_shape, rng).astype(np.float32)
            return (scale * (0.5 + u / 256.0)).astype(self.np_io)
        inputs.append(self.w.random(weight + "_scales", self.io, [n, k_blocks], scales))
        if self.zero_points:
            # Random zero points over the full 0..15 range, two per byte (low nibble = even block).
            zp_shape = [n, (k_blocks + 1) // 2]
            inputs.append(self.w.random(weight + "_zero_points", TensorProto.UINT8, zp_shape, _codes))
        # Sorted, as the quantizer's make_node writes them; accuracy_level only when nonzero.
        attrs = {"K": k, "N": n, **({"accuracy_level": self.accuracy_level} if self.accuracy_level else {}),
                 "bits": 4, "block_size": self.block}
        return self.w.node("MatMulNBits", inputs, [output], basename + "_Q4", "com.microsoft", types, **attrs)

    def norm(self, layer, location, root, skip=None, last=False):
        """SimplifiedLayerNormalization for the first norm, SkipSimplifiedLayerNormalization (outputs
        [y, '', '', residual sum]; only y for the final norm) for every later one."""
        cfg, prefix = self.cfg, f"/model/layers.{layer}/{location}_layernorm"
        weight = self.w.init(f"model.layers.{layer}.{location}_layernorm.weight", self.io, [cfg.hidden_size],
                             [np.ones(cfg.hidden_size, self.np_io)])
        y = f"{prefix}/output_0"
        if skip is None:
            self.w.node("SimplifiedLayerNormalization", [root, weight], [y], f"{prefix}/LayerNorm",
                        types=[self.hidden(cfg.hidden_size)], epsilon=cfg.rms_norm_eps, axis=-1, stash_type=1)
            return y, root
        outputs = [y] if last else [y, "", "", f"{prefix}/output_3"]
        self.w.node("SkipSimplifiedLayerNormalization", [root, skip, weight], outputs, f"{prefix}/SkipLayerNorm",
                    "com.microsoft", [self.hidden(cfg.hidden_size)] * 2, epsilon=cfg.rms_norm_eps)
        return y, outputs[-1]

    def rotary_caches(self):
        # make_rotary_embedding_caches_from_scratch: [context_length, head_size/2] in the io dtype,
        # from torch's float32 math. Rounding theta**x from float64 and cos/sin from float64
        # reproduces torch's values to 1 ulp (plain float32 numpy is off by up to 2^-17).
        cfg = self.cfg
        exponent = (np.arange(0, cfg.head_size, 2, dtype=np.float32) / np.float32(cfg.head_size)).astype(np.float64)
        inv_freq = np.float32(1) / (cfg.rope_theta ** exponent).astype(np.float32)
        freqs = np.outer(np.arange(cfg.context_length, dtype=np.float32), inv_freq).astype(np.float64)
        for name, fn in (("cos_cache", np.cos), ("sin_cache", np.sin)):
            self.w.init(name, self.io, list(freqs.shape), [fn(freqs).astype(np.float32).astype(self.np_io)])
        return "cos_cache", "sin_cache"

    def build(self):
        cfg, w = self.cfg, self.w
        # attention_mask -> seqlens_k (row sums - 1, int32) and total_sequence_length (int32 scalar),
        # make_attention_mask_reformatting_for_gqa.
        base = "/model/attn_mask_reformat/attn_mask_subgraph"
        one = w.constant("/model/constants/INT64/[1]", [1])
        batch = ["batch_size"]
        s = w.node("ReduceSum", ["attention_mask", one], [f"{base}/ReduceSum/output_0"], f"{base}/ReduceSum",
                   types=[(TensorProto.INT64, batch)], keepdims=0)
        s = w.node("Sub", [s, one], [f"{base}/Sub/output_0"], f"{base}/Sub", types=[(TensorProto.INT64, batch)])
        seqlens_k = w.node("Cast", [s], [f"{base}/Sub/Cast/output_0"], f"{base}/Sub/Cast",
                           types=[(TensorProto.INT32, batch)], to=TensorProto.INT32)
        shape = w.node("Shape", ["attention_mask"], [f"{base}/Shape/output_0"], f"{base}/Shape",
                       types=[(TensorProto.INT64, [2])])
        g = w.node("Gather", [shape, w.constant("/model/constants/INT64/1", 1)], [f"{base}/Gather/output_0"],
                   f"{base}/Gather", types=[(TensorProto.INT64, [])], axis=0)
        total_len = w.node("Cast", [g], [f"{base}/Gather/Cast/output_0"], f"{base}/Gather/Cast",
                           types=[(TensorProto.INT32, None)], to=TensorProto.INT32)  # no shape, as the builder

        emb_weight = w.random("model.embed_tokens.weight", self.io, [cfg.vocab_size, cfg.hidden_size],
                              _uniform(1.0 / 8.0, self.np_io))
        h, inter = cfg.hidden_size, cfg.intermediate_size
        q, kv = cfg.num_heads * cfg.head_size, cfg.num_kv_heads * cfg.head_size
        x = w.node("Gather", [emb_weight, "input_ids"], ["/model/embed_tokens/Gather/output_0"],
                   "/model/embed_tokens/Gather", types=[self.hidden(h)])

        residual, skip, caches = x, None, None
        for i in range(cfg.num_layers):
            p = f"/model/layers.{i}"
            y, residual = self.norm(i, "input", residual, skip)
            qkv = self.linear(f"{p}/attn/qkv_proj/MatMul", y, h, q + 2 * kv)
            caches = caches or self.rotary_caches()  # made where the first attention needs them
            attn = w.node("GroupQueryAttention",
                          [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens_k, total_len,
                           *caches, "", "", ""],  # position_ids, attention_bias, sinks: left empty
                          [f"{p}/attn/GroupQueryAttention/output_0", f"present.{i}.key", f"present.{i}.value"],
                          f"{p}/attn/GroupQueryAttention", "com.microsoft", [self.hidden(q)],
                          num_heads=cfg.num_heads, kv_num_heads=cfg.num_kv_heads,
                          scale=float(1 / np.sqrt(cfg.head_size)), local_window_size=-1, softcap=0.0,
                          do_rotary=1, rotary_interleaved=0)
            o = self.linear(f"{p}/attn/o_proj/MatMul", attn, q, h)
            y, residual = self.norm(i, "post_attention", residual, o)
            gate = self.linear(f"{p}/mlp/gate_proj/MatMul", y, h, inter)
            up = self.linear(f"{p}/mlp/up_proj/MatMul", y, h, inter)
            # SiLU as the builder writes it: gate * Sigmoid(gate), then * up.
            t = [self.hidden(inter)]
            sig = w.node("Sigmoid", [gate], [f"{p}/mlp/act_fn/Sigmoid/output_0"], f"{p}/mlp/act_fn/Sigmoid", types=t)
            act = w.node("Mul", [gate, sig], [f"{p}/mlp/act_fn/Mul/output_0"], f"{p}/mlp/act_fn/Mul", types=t)
            m = w.node("Mul", [act, up], [f"{p}/mlp/Mul/output_0"], f"{p}/mlp/Mul", types=t)
            skip = self.linear(f"{p}/mlp/down_proj/MatMul", m, inter, h)
        y, _ = self.norm(cfg.num_layers, "final_norm", residual, skip, last=True)
        self.linear("/lm_head/MatMul", y, h, cfg.vocab_size, output="logits")

    def io_values(self):
        """Graph inputs/outputs in the builder's order: all keys, then all values."""
        cfg, io, n = self.cfg, self.io, range(self.cfg.num_layers)
        def vi(name, dtype, shape):
            return helper.make_tensor_value_info(name, dtype, shape)
        def cache(name, seq):
            return vi(name, io, ["batch_size", cfg.num_kv_heads, seq, "kv_cache_dim"])
        inputs = [vi("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
                  vi("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])]
        inputs += [cache(f"past_key_values.{i}.{kv}", "past_sequence_length") for kv in ("key", "value") for i in n]
        outputs = [vi("logits", io, ["batch_size", "sequence_length", cfg.vocab_size])]
        outputs += [cache(f"present.{i}.{kv}", "total_sequence_length") for kv in ("key", "value") for i in n]
        return inputs, outputs


def genai_config(cfg, ep):
    """genai_config.json as the builder's make_genai_config writes it for a Llama model."""
    eos = list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, (list, tuple)) else cfg.eos_token_id
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    provider_options = [] if ep == "cpu" else [{ep: {"enable_cuda_graph": "0"}}]
    return {
        "model": {
            "bos_token_id": cfg.bos_token_id,
            "context_length": cfg.context_length,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": provider_options},
                "filename": "model.onnx",
                "head_size": cfg.head_size,
                "hidden_size": cfg.hidden_size,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "num_attention_heads": cfg.num_heads,
                "num_hidden_layers": cfg.num_layers,
                "num_key_value_heads": cfg.num_kv_heads,
            },
            "eos_token_id": eos,
            "pad_token_id": pad,
            "type": "llama",
            "vocab_size": cfg.vocab_size,
        },
        "search": {
            "diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
            "max_length": cfg.context_length, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
            "num_return_sequences": 1, "past_present_share_buffer": True, "repetition_penalty": 1.0,
            "temperature": 1.0, "top_k": 50, "top_p": 1.0,
        },
    }


def build(out_dir, config=TINY, precision="int4", ep="cuda", block_size=32, zero_points=False, seed=0):
    """Write model.onnx, model.onnx.data and genai_config.json to out_dir. zero_points=True is the
    builder's is_symmetric=false (uint8 zero points). Returns {"seconds", "bytes"}."""
    if (precision, ep) not in IO_DTYPES:
        raise ValueError(f"{precision}/{ep}: the builder uses GroupQueryAttention only for {sorted(IO_DTYPES)}")
    if precision != "int4" and zero_points:
        raise ValueError("zero_points applies to int4 only")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError("MatMulNBits block_size must be a power of two >= 16")
    start = time.time()
    os.makedirs(out_dir, exist_ok=True)
    # In int4 the embedding, the 2L+1 norm weights and the cos/sin caches precede the quantized weights.
    c, itemsize = config, np.dtype(NP_DTYPES[IO_DTYPES[(precision, ep)]]).itemsize
    float_elems = c.vocab_size * c.hidden_size + (2 * c.num_layers + 1) * c.hidden_size + c.context_length * c.head_size
    float_bytes = float_elems * itemsize if precision == "int4" else 0
    writer = _Writer(out_dir, np.random.default_rng(seed), float_bytes)
    model = _Model(writer, config, precision, ep, block_size, zero_points)
    try:
        model.build()
    finally:
        writer.close()
    inputs, outputs = model.io_values()
    inits, value_info = writer.finish()
    graph = helper.make_graph(writer.nodes, "main_graph", inputs, outputs, inits, value_info=value_info)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSETS.items()],
                              ir_version=IR_VERSION, producer_name=PRODUCER[0], producer_version=PRODUCER[1])
    onnx.save(proto, os.path.join(out_dir, "model.onnx"))
    with open(os.path.join(out_dir, "genai_config.json"), "w") as f:
        json.dump(genai_config(config, ep), f, indent=4)
    size = sum(os.path.getsize(os.path.join(out_dir, n)) for n in ("model.onnx", DATA_FILE, "genai_config.json"))
    return {"seconds": time.time() - start, "bytes": size}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dlkern.synth", description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama3-8b")
    ap.add_argument("--precision", choices=["int4", "fp16", "fp32"], default="int4")
    ap.add_argument("--ep", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--zero-points", action="store_true", help="asymmetric int4 (uint8 zero points)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    info = build(a.out_dir, PRESETS[a.preset], a.precision, a.ep, a.block_size, a.zero_points, a.seed)
    print(f"{a.out_dir}: {a.preset} {a.precision}/{a.ep} block {a.block_size}"
          f"{' zero points' if a.zero_points else ''}: {info['bytes'] / 2**30:.2f} GiB in {info['seconds']:.1f} s")


if __name__ == "__main__":
    main()
