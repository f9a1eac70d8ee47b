"""Move the nodes of an ONNX model that dlkern can run to domain `dlkern`.

    python -m dlkern.retarget IN OUT [--ep cuda|cpu] [--library libdlkern.so] [--verbose]

IN and OUT are `.onnx` files, or model folders (onnxruntime-genai's: `genai_config.json`
beside the model). dlkern's ops are exact drop-ins for ONNX Runtime 1.31's (`docs/ops.md`), so
a move changes only the node's domain. A node stays where dlkern would compute something
different or not at all (a dtype its kernels do not serve on that execution provider, an
attribute or input it refuses, a head size without a GPU kernel), and the table printed at the
end says why, per op.

A model folder is copied (large files hard-linked when the file system allows) and its
`genai_config.json` names the library in `model.decoder.session_options.custom_ops_library`;
onnxruntime-genai only loads a library that lies inside the model folder (or the working
directory), so the library is copied in. External data stays where the model's references
point: beside the output model (hard-linked or copied when OUT is elsewhere), never loaded
into memory, so models over 2 GB retarget in the time it takes to rewrite the graph.

dlkern's CPU kernels are f64 references: they agree with ORT's but are far slower (the
builder's tiny int4 model: one prompt step 11 ms against 0.23 ms). The tool therefore retargets
for one execution provider (CUDA by default) and says what a CPU session would lose.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto, helper

DOMAIN = "dlkern"
MS = "com.microsoft"

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16

# The element types each typed dlkern op serves per execution provider: the `OrtDecl`s of
# host/ops/*/op.rs, as docs/ops.md prints them (tests/python/test_retarget.py checks the two
# agree).
TYPES = {
    "MatMulNBits": {"cuda": (F16, BF16), "cpu": (F32, F16)},
    "GroupQueryAttention": {"cuda": (F16, BF16), "cpu": (F32, F16)},
    "PagedAttention": {"cuda": (F16, BF16), "cpu": (F32, F16)},
    "RotaryEmbedding": {"cuda": (F32, F16, BF16), "cpu": (F32, F16)},
    "SimplifiedLayerNormalization": {"cuda": (F32, F16, BF16), "cpu": (F32, F16, BF16)},
    "SkipSimplifiedLayerNormalization": {"cuda": (F32, F16, BF16), "cpu": (F32, F16, BF16)},
}
# The domain each op comes from (SimplifiedLayerNormalization is ORT's, in the ONNX domain).
SOURCE_DOMAIN = {op: MS for op in TYPES} | {"SimplifiedLayerNormalization": ""}
# Head sizes with CUDA attention kernels (kernels-gpu/src/{attention,paged_attention}/layout.rs).
CUDA_HEAD_SIZES = (64, 80, 96, 128, 256)

TYPE_NAMES = {F32: "float", F16: "float16", BF16: "bfloat16", TensorProto.DOUBLE: "double"}


def type_name(elem):
    return TYPE_NAMES.get(elem, TensorProto.DataType.Name(elem).lower())


class Graph:
    """What the checks need to know about a graph's tensors without loading external data:
    element types and static shapes of initializers and declared values, and producers."""

    def __init__(self, graph: onnx.GraphProto):
        self.init = {t.name: t for t in graph.initializer}
        self.types: dict[str, tuple[int, list]] = {}
        for v in list(graph.input) + list(graph.output) + list(graph.value_info):
            t = v.type.tensor_type
            if v.type.HasField("tensor_type"):
                dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
                self.types[v.name] = (t.elem_type, dims)
        for t in graph.initializer:
            self.types[t.name] = (t.data_type, list(t.dims))
        for n in graph.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                t = n.attribute[0].t
                self.types[n.output[0]] = (t.data_type, list(t.dims))
        self.producer = {o: n for n in graph.node for o in n.output if o}

    def elem(self, name):
        return self.types.get(name, (None, None))[0]

    def dims(self, name):
        return self.types.get(name, (None, None))[1]

    def last_dim(self, name):
        """The static size of `name`'s last axis: declared, or the width of the MatMulNBits /
        MatMul / bias Add that produced it."""
        dims = self.dims(name)
        if dims and dims[-1]:
            return dims[-1]
        node = self.producer.get(name)
        if node is None:
            return None
        if node.op_type == "MatMulNBits":
            return attr(node, "N")
        if node.op_type == "MatMul" and len(node.input) > 1 and self.dims(node.input[1]):
            return self.dims(node.input[1])[-1]
        if node.op_type == "Add":
            for i in node.input:
                if i in self.init and len(self.init[i].dims) == 1:
                    return self.init[i].dims[0]
            return self.last_dim(node.input[0])
        return None


def attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def given(node, index, outputs=False):
    names = node.output if outputs else node.input
    return index < len(names) and names[index] != ""


def _dtype(g: Graph, node, *candidates):
    """The op's T: the element type of the first of these inputs the graph knows."""
    for i in candidates:
        if given(node, i):
            elem = g.elem(node.input[i])
            if elem is not None:
                return elem
    return None


# Each check returns None (dlkern computes what ORT computes) or why the node stays.
def _check_matmul_nbits(g, node, ep):
    bits, block = attr(node, "bits", 4), attr(node, "block_size")
    if bits != 4:
        return f"bits = {bits} (dlkern: 4)"
    if block is None or block < 16 or block & (block - 1):
        return f"block_size = {block} (dlkern: a power of two >= 16)"
    if given(node, 4):
        return "g_idx given (deprecated upstream; refused)"
    # ORT's CUDA kernel ignores accuracy_level; its CPU kernel at level 4 quantizes the
    # activations to int8 per block, which dlkern's exact reference does not.
    if ep == "cpu" and attr(node, "accuracy_level", 0) == 4:
        return "accuracy_level = 4 on CPU (ORT computes with int8 activations; dlkern does not)"
    return _dtype(g, node, 2, 0)


def _check_gqa(g, node, ep):
    refused_inputs = ["position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
                      "k_norm_weight"]
    for i, what in enumerate(refused_inputs, start=9):
        if given(node, i):
            return f"input {what} given (refused)"
    if given(node, 3, outputs=True) or attr(node, "qk_output", 0):
        return "output_qk asked for (refused)"
    for name, default, what in [("smooth_softmax", 0, "smooth softmax"),
                                ("sliding_window_cache", 0, "a sliding-window cache")]:
        if attr(node, name, default) != default:
            return f"{name} = {attr(node, name)}: {what} (refused)"
    for name in ("k_quant_type", "v_quant_type"):
        v = attr(node, name, b"NONE")
        if (v.decode() if isinstance(v, bytes) else v) != "NONE":
            return f"{name} = {v!r}: quantized caches (refused)"
    if attr(node, "kv_cache_bit_width") is not None:
        return "kv_cache_bit_width set: quantized caches (refused)"
    if len([o for o in node.output if o]) < 3:
        return "no present_key / present_value outputs (dlkern needs them)"
    if ep == "cuda":
        heads, kv_heads = attr(node, "num_heads"), attr(node, "kv_num_heads")
        head = g.last_dim(node.input[3]) if given(node, 3) else None
        if head is None and heads and kv_heads:
            width = g.last_dim(node.input[0])
            if width:
                head = width // (heads + 2 * kv_heads) if not given(node, 1) else width // heads
        if head is None:
            return "head size unknown (no static past_key shape or query width)"
        if head not in CUDA_HEAD_SIZES:
            return f"head size {head} (CUDA kernels: {', '.join(map(str, CUDA_HEAD_SIZES))})"
    return _dtype(g, node, 7, 3, 0)


def _check_paged(g, node, ep):
    refused = {10: "slot_mapping", 11: "head_sink", 12: "q_norm_weight", 13: "k_norm_weight", 14: "k_scale",
               15: "v_scale"}
    for i, what in refused.items():
        if given(node, i):
            return f"input {what} given (refused)"
    if not given(node, 4):
        return "no value_cache (the LATENT layout; refused)"
    for name, want in [("is_causal", 1), ("rotary_offset", 0)]:
        if attr(node, name, want) != want:
            return f"{name} = {attr(node, name)} (dlkern: {want})"
    for name, want in [("kv_cache_layout", "SEPARATE"), ("k_quant_type", "NONE"), ("v_quant_type", "NONE")]:
        v = attr(node, name, want.encode())
        v = v.decode() if isinstance(v, bytes) else v
        if v != want:
            return f"{name} = {v!r} (dlkern: {want!r})"
    if ep == "cuda":
        dims = g.dims(node.input[3])
        if dims and dims[-1] and dims[-1] not in CUDA_HEAD_SIZES:
            return f"head size {dims[-1]} (CUDA kernels: {', '.join(map(str, CUDA_HEAD_SIZES))})"
    return _dtype(g, node, 8, 3, 0)


def _check_rotary(g, node, ep):
    if attr(node, "is_packed_batching", 0):
        return "is_packed_batching = 1 (refused)"
    return _dtype(g, node, 2, 0)


def _check_simplified_ln(g, node, ep):
    if attr(node, "stash_type", 1) != 1:
        return f"stash_type = {attr(node, 'stash_type')} (dlkern: 1, float statistics)"
    x, scale = g.elem(node.input[0]), g.elem(node.input[1])
    if x is not None and scale is not None and x != scale:
        return f"scale is {type_name(scale)} but X is {type_name(x)} (no mixed-type kernel)"
    dims = g.dims(node.input[1])
    if dims and attr(node, "axis", -1) == -1 and len(dims) != 1:
        return f"scale of shape {dims} broadcast over inner axes (refused)"
    return _dtype(g, node, 1, 0)


def _check_skip_sln(g, node, ep):
    return _dtype(g, node, 2, 0, 1)


CHECKS = {
    "MatMulNBits": _check_matmul_nbits,
    "GroupQueryAttention": _check_gqa,
    "PagedAttention": _check_paged,
    "RotaryEmbedding": _check_rotary,
    "SimplifiedLayerNormalization": _check_simplified_ln,
    "SkipSimplifiedLayerNormalization": _check_skip_sln,
}
assert CHECKS.keys() == TYPES.keys()


def verdict(g: Graph, node, ep):
    """None when dlkern runs the node on `ep` as ORT would, else the reason it stays."""
    result = CHECKS[node.op_type](g, node, ep)
    if isinstance(result, str):
        return result
    if result is None:
        return "element type unknown (no typed initializer or declared input)"
    if result not in TYPES[node.op_type][ep]:
        served = ", ".join(type_name(t) for t in TYPES[node.op_type][ep])
        return f"{type_name(result)} on {ep.upper()} (dlkern: {served})"
    return None


@dataclass
class Report:
    ep: str
    moved: collections.Counter = field(default_factory=collections.Counter)
    stayed: collections.Counter = field(default_factory=collections.Counter)  # (op, reason) -> n
    other: collections.Counter = field(default_factory=collections.Counter)  # op types dlkern lacks
    nodes: list = field(default_factory=list)  # (node name, op, "moved" | reason)

    def table(self, verbose=False):
        rows = [("op", "nodes", "moved to dlkern", "stays: why")]
        for op in sorted(set(self.moved) | {op for op, _ in self.stayed}):
            stays = [(r, n) for (o, r), n in sorted(self.stayed.items()) if o == op]
            moved = self.moved.get(op, 0)
            total = moved + sum(n for _, n in stays)
            why = "; ".join(f"{n} x {r}" for r, n in stays) or "-"
            rows.append((op, str(total), str(moved), why))
        if self.other:
            rows.append(("(other ops)", str(sum(self.other.values())), "0",
                         "not dlkern ops: " + ", ".join(f"{op} x{n}" for op, n in sorted(self.other.items()))))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [" | ".join(r[i].ljust(widths[i]) if i < 3 else r[i] for i in range(4)).rstrip() for r in rows]
        lines.insert(1, "-+-".join("-" * w for w in widths) + "-+-" + "-" * 10)
        if verbose:
            lines += ["", "per node:"] + [f"  {name or '(unnamed)'} [{op}]: {what}" for name, op, what in self.nodes]
        return "\n".join(lines)

    def summary(self):
        moved = sum(self.moved.values())
        lines = [f"retargeted for the {self.ep.upper()} execution provider: {moved} node(s) moved to dlkern, "
                 f"{sum(self.stayed.values())} candidate(s) stayed"]
        if moved:
            if self.ep == "cpu":
                lines.append("note: dlkern's CPU kernels are f64 references: they match ORT's CPU kernels but are "
                             "much slower; retarget for the CPU EP to check results, not for speed")
            else:
                lines.append("note: on the CPU EP this model runs dlkern's f64 reference kernels for the moved "
                             "nodes (correct, much slower than ORT's CPU kernels)")
        return "\n".join(lines)


def retarget_model(model: onnx.ModelProto, ep="cuda") -> Report:
    """Moves, in place, every node of `model`'s main graph that dlkern runs on `ep`."""
    if ep not in ("cuda", "cpu"):
        raise ValueError(f"execution provider {ep!r}: expected 'cuda' or 'cpu'")
    g = Graph(model.graph)
    report = Report(ep)
    for node in model.graph.node:
        if node.domain == DOMAIN:
            report.moved[node.op_type] += 1
            report.nodes.append((node.name, node.op_type, "already dlkern"))
            continue
        if node.op_type not in CHECKS or node.domain != SOURCE_DOMAIN[node.op_type]:
            report.other[f"{node.domain}.{node.op_type}" if node.domain else node.op_type] += 1
            continue
        why = verdict(g, node, ep)
        if why is None:
            node.domain = DOMAIN
            report.moved[node.op_type] += 1
            report.nodes.append((node.name, node.op_type, "moved"))
        else:
            report.stayed[(node.op_type, why)] += 1
            report.nodes.append((node.name, node.op_type, why))
    if report.moved and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return report


def _external_files(model: onnx.ModelProto):
    files = set()
    for t in model.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            files.update(e.value for e in t.external_data if e.key == "location")
    return sorted(files)


def _link_or_copy(src: Path, dst: Path):
    if dst.exists() and os.path.samefile(src, dst):
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def retarget_file(src, dst, ep="cuda") -> Report:
    """Retargets the model file `src` into `dst`, keeping its external data reachable."""
    src, dst = Path(src), Path(dst)
    model = onnx.load(str(src), load_external_data=False)
    report = retarget_model(model, ep)
    for location in _external_files(model):
        _link_or_copy(src.parent / location, dst.parent / location)
    dst.parent.mkdir(parents=True, exist_ok=True)
    # The graph alone (its initializers keep their external references), so the protobuf
    # limit of 2 GB applies to the graph, never to the weights.
    onnx.save(model, str(dst))
    return report


def default_library():
    """libdlkern.so from DLKERN_LIB, or the release build of this checkout."""
    env = os.environ.get("DLKERN_LIB")
    if env:
        return Path(env)
    root = Path(__file__).resolve().parents[2]
    for build in ("release", "debug"):
        lib = root / "target" / build / "libdlkern.so"
        if lib.exists():
            return lib
    return None


def retarget_folder(src, dst, ep="cuda", library=None) -> Report:
    """Copies the onnxruntime-genai model folder `src` to `dst` with its decoder retargeted and
    the library copied in and named in genai_config.json."""
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise ValueError("OUT must be another folder than IN")
    config = json.loads((src / "genai_config.json").read_text())
    decoder = config.get("model", {}).get("decoder", {})
    model_name = decoder.get("filename")
    if not model_name:
        raise ValueError(f"{src / 'genai_config.json'}: genai_config.json has no model.decoder.filename")
    library = Path(library) if library else default_library()
    if library is None or not library.exists():
        raise FileNotFoundError("libdlkern.so not found: pass --library or set DLKERN_LIB")
    dst.mkdir(parents=True, exist_ok=True)
    skip = {model_name, "genai_config.json"}
    for path in src.iterdir():
        if path.is_file() and path.name not in skip:
            _link_or_copy(path, dst / path.name)
    report = retarget_file(src / model_name, dst / model_name, ep)
    shutil.copy2(library, dst / "libdlkern.so")
    decoder.setdefault("session_options", {})["custom_ops_library"] = "libdlkern.so"
    (dst / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n")
    return report


def retarget(src, dst, ep="cuda", library=None) -> Report:
    """A model folder (with genai_config.json) or a model file."""
    if Path(src).is_dir():
        return retarget_folder(src, dst, ep, library)
    return retarget_file(src, dst, ep)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m dlkern.retarget", description=__doc__.split("\n\n")[0])
    p.add_argument("input", help="a .onnx file, or an onnxruntime-genai model folder")
    p.add_argument("output", help="the .onnx file or folder to write")
    p.add_argument("--ep", choices=("cuda", "cpu"), default="cuda",
                   help="the execution provider the model will run on (default: cuda)")
    p.add_argument("--library", help="libdlkern.so to copy into a model folder (default: $DLKERN_LIB, "
                   "else this checkout's target/release build)")
    p.add_argument("--verbose", action="store_true", help="also list every candidate node")
    args = p.parse_args(argv)
    try:
        report = retarget(args.input, args.output, args.ep, args.library)
    except (OSError, ValueError, onnx.onnx_cpp2py_export.checker.ValidationError) as e:
        print(f"dlkern.retarget: {e}", file=sys.stderr)
        return 1
    print(report.table(args.verbose))
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
