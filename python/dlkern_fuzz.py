"""A fuzz campaign over libdlkern.so's ONNX Runtime surface (CPU execution provider): models of
one random dlkern node each (every ORT op `docs/ops.md` declares, and `DLPackKernel`), with
random attributes of random types, missing and extra inputs and outputs, random dtypes, ranks
and shapes (0, 1, odd sizes, huge dimensions of empty tensors, symbolic dimensions), and random
values (host inputs such as `total_sequence_length` included). Each model must either run or
fail with an ONNX Runtime error; a crash or a hang is a failure, which the caller sees as this
process dying or outliving its time.

    python python/dlkern_fuzz.py LIB --seed 1 --cases 2000 [--progress FILE] [--case K]

Before each case its number goes to FILE (flushed), so a crash names the case to replay with
`--case K`. The last line is the campaign's counts. The op declarations come from docs/ops.md
(the tables generated from each op's one declaration), so a new op is fuzzed without a change
here.
"""

import argparse
import os
import re
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, ValueInfoProto, helper

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OPS_MD = os.path.join(ROOT, "docs", "ops.md")

ELEM = {
    "float": (TensorProto.FLOAT, np.float32),
    "float16": (TensorProto.FLOAT16, np.float16),
    "bfloat16": (TensorProto.BFLOAT16, None),
    "int8": (TensorProto.INT8, np.int8),
    "uint8": (TensorProto.UINT8, np.uint8),
    "int32": (TensorProto.INT32, np.int32),
    "int64": (TensorProto.INT64, np.int64),
    "bool": (TensorProto.BOOL, np.bool_),
    "double": (TensorProto.DOUBLE, np.float64),
}
# numpy cannot make bfloat16 arrays: such inputs are fed as float16 bit patterns through a Cast.


class OpSpec:
    """An ORT op as docs/ops.md declares it."""

    def __init__(self, name, inputs, outputs, attrs, cpu_types):
        self.name, self.inputs, self.outputs, self.attrs, self.cpu_types = name, inputs, outputs, attrs, cpu_types

    def __repr__(self):
        return f"OpSpec({self.name}, {len(self.inputs)} in, {len(self.outputs)} out, {len(self.attrs)} attrs)"


def _tensor_type(text):
    """'T', 'T (...)' or 'uint8 or T' -> 'T'; 'int32 (host memory)' -> 'int32'."""
    text = text.strip()
    if text.startswith("T") or " or T" in text:
        return "T"
    return text.split()[0]


def _rank(shape):
    """The rank of the first `[...]` of a shape cell ('`[B, S, H * D]`': 3); None where it has
    '...' or none."""
    m = re.search(r"\[([^\]]*)\]", shape)
    if not m or "..." in m.group(1):
        return None
    return len([d for d in m.group(1).split(",") if d.strip()])


def parse_ops(path=OPS_MD):
    """Every ORT op of the schema tables in `path`, with its CPU EP types."""
    text = open(path).read()
    ops = []
    for block in re.findall(r"<!-- dlkern-schema [^>]*-->(.*?)<!-- /dlkern-schema -->", text, re.S):
        m = re.search(r"ORT op `(\w+)` \(domain `dlkern`\)\. T: (.*)", block)
        if not m:
            continue  # a registry kernel without an ORT op
        cpu = re.search(r"CPU execution provider ([^;\n]*)", m.group(2))
        if not cpu:
            continue
        cpu_types = [t for t in re.findall(r"`(\w+)`", cpu.group(1)) if t in ELEM]
        inputs, outputs, attrs = [], [], []
        for row in block.splitlines():
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            if len(cells) < 3 or not cells[1].startswith("`"):
                continue
            kind, name, ty = cells[0], cells[1].strip("`"), cells[2]
            if kind.startswith("input"):
                inputs.append((name, _tensor_type(ty), "optional" in kind, _rank(cells[3] if len(cells) > 3 else "")))
            elif kind.startswith("output"):
                outputs.append((name, "optional" in kind))
            elif kind == "attribute":
                attrs.append((name, ty.split()[0]))
        ops.append(OpSpec(m.group(1), inputs, outputs, attrs, cpu_types))
    return ops


# Sizes a case draws its dimensions and integer attributes from: a few per case, so that shapes
# and attributes agree often enough to reach the kernels, not only their checks.
SIZES = [0, 1, 2, 3, 4, 7, 8, 16, 32, 64, 97, 128]
# Elements a fed tensor may have at most (memory stays small); empty tensors may have huge dims.
MAX_ELEMENTS = 1 << 16
HUGE = [1 << 31, (1 << 40) + 1]  # (numpy refuses shapes whose nonzero dims pass 2^63 bytes)


def _templates(rng, t):
    """A valid node per op, as {op: (inputs by declared name as (dtype, shape, values or None for
    random), attributes[, how many outputs: all declared ones by default])}: the start of the
    mutated cases. Sizes are random and small; values that must agree with shapes (lengths,
    positions) are given."""
    pick = lambda *v: int(rng.choice(v))  # noqa: E731
    b, s, d, h, hkv = pick(1, 2, 3), pick(1, 2, 7), pick(16, 32, 64, 80), pick(2, 4), pick(1, 2)
    if h % hkv:
        hkv = 1
    rows, hidden = pick(1, 3, 7), pick(8, 64, 97)
    out = {
        "RMSNorm": ({"X": (t, [rows, hidden], None), "scale": (t, [hidden], None)}, {"epsilon": 1e-5}),
        "SimplifiedLayerNormalization": ({"X": (t, [b, s, hidden], None), "scale": (t, [hidden], None)},
                                         {"axis": -1, "epsilon": 1e-5, "stash_type": 1}),
        "SkipSimplifiedLayerNormalization": ({"input": (t, [b, s, hidden], None), "skip": (t, [b, s, hidden], None),
                                              "gamma": (t, [hidden], None), "bias": (t, [hidden], None)},
                                             {"epsilon": 1e-5}),
    }
    block, blocks, n, m = pick(16, 32, 64, 128), pick(1, 2, 3), pick(1, 8, 33), pick(1, 4, 17)
    k = block * blocks
    out["MatMulNBits"] = ({"A": (t, [m, k], None), "B": ("uint8", [n, blocks, block // 2], None),
                           "scales": (t, [n, blocks], None), "zero_points": ("uint8", [n, (blocks + 1) // 2], None),
                           "bias": (t, [n], None)},
                          {"K": k, "N": n, "bits": 4, "block_size": block})
    out["MatMulIntegerToFloat"] = ({"A": ("int8", [m, k], None), "B": ("int8", [k, n], None),
                                    "a_scale": (t, [1], None), "b_scale": (t, [n], None),
                                    "a_zero_point": ("int8", [1], None), "b_zero_point": ("int8", [n], None),
                                    "bias": (t, [n], None)}, {})
    sk = pick(1, 5, 9)
    out["FlashAttention"] = ({"q": (t, [b, s, h, d], None), "k": (t, [b, sk, hkv, d], None),
                              "v": (t, [b, sk, hkv, d], None)}, {"causal": pick(0, 1), "window_left": pick(-1, 2)})
    past = pick(0, 4, 16)
    lengths = rng.integers(1, past + 1, b) + s - 1 if past else np.full(b, s)
    total = int(lengths.max())
    cache = (t, [max(total, past) + 2, d // 2], None)
    out["GroupQueryAttention"] = ({"query": (t, [b, s, (h + 2 * hkv) * d], None),
                                   "past_key": (t, [b, hkv, past, d], None), "past_value": (t, [b, hkv, past, d], None),
                                   "seqlens_k": ("int32", [b], (lengths - 1).astype(np.int32)),
                                   "total_sequence_length": ("int32", [], np.array(total, np.int32)),
                                   "cos_cache": cache, "sin_cache": cache},
                                  {"num_heads": h, "kv_num_heads": hkv, "do_rotary": 1, "local_window_size": pick(-1, 3)},
                                  3)  # (output_qk is refused)
    positions = rng.integers(0, 8, (b, s)).astype(np.int64)
    out["RotaryEmbedding"] = ({"input": (t, [b, s, h * d], None), "position_ids": ("int64", [b, s], positions),
                               "cos_cache": (t, [8, d // 2], None), "sin_cache": (t, [8, d // 2], None)},
                              {"num_heads": h, "interleaved": pick(0, 1)})
    return out


class Case:
    """One random model and its feeds, made from `rng`."""

    def __init__(self, rng, ops):
        self.rng = rng
        generic = rng.random() < 0.1
        self.op = None if generic else ops[rng.integers(len(ops))]
        self.t = "float" if generic else str(rng.choice(self.op.cpu_types))
        # Half the cases keep to the declaration (types, attributes, input and output counts)
        # and draw their dims from two sizes: they reach the kernels, not only the checks.
        self.tidy = rng.random() < 0.5
        self.pool = [int(v) for v in rng.choice(SIZES[1:], size=2 if self.tidy else 4)] + ([] if self.tidy else [0])
        # A third of the cases start from a valid node of the op and bend one or two things.
        template = None if generic else _templates(rng, self.t).get(self.op.name)
        if template is not None and rng.random() < 0.35:
            self.model, self.feeds = self._mutated(*template)
        else:
            self.model, self.feeds = self._build(generic)

    def _dim(self):
        r = self.rng.random()
        if r < 0.85 or (self.tidy and r < 0.97):
            return int(self.rng.choice(self.pool))
        if r < 0.95:
            return int(self.rng.choice(SIZES))
        return int(self.rng.choice(HUGE))

    def _shape(self, declared_rank=None):
        rank = declared_rank if declared_rank is not None and self.rng.random() < 0.7 else int(self.rng.integers(0, 5))
        return self._bounded([self._dim() for _ in range(rank)])

    def _bounded(self, shape):
        """`shape` with one huge dim at most, only on an empty tensor, and at most
        [`MAX_ELEMENTS`] elements."""
        rank = len(shape)
        huge = [a for a, d in enumerate(shape) if d >= HUGE[0]]
        for a in huge[1:]:
            shape[a] = 1  # one huge dim at most
        if huge and 0 not in shape:
            shape[(huge[0] + 1) % rank if rank > 1 else 0] = 0  # and only on an empty tensor
        while int(np.prod(shape, dtype=object)) > MAX_ELEMENTS:
            shape[int(np.argmax(shape))] //= 2
        return shape

    def _dtype(self, declared):
        if self.tidy or self.rng.random() < 0.85:
            return self.t if declared == "T" else declared
        return str(self.rng.choice(list(ELEM)))

    def _values(self, dtype, shape):
        np_type = ELEM[dtype][1] or np.float16
        n = int(np.prod(shape, dtype=object))
        rng = self.rng
        if np_type in (np.float32, np.float16, np.float64):
            special = rng.random() < 0.1
            v = rng.choice([0.0, np.inf, -np.inf, np.nan, 1e30, -1e-30], n) if special else rng.uniform(-3, 3, n)
            with np.errstate(over="ignore"):  # 1e30 becomes inf in float16, as meant
                return np.asarray(v, dtype=np_type).reshape(shape)
        if np_type is np.bool_:
            return (rng.random(n) < 0.5).reshape(shape)
        info = np.iinfo(np_type)
        r = rng.random()
        if r < 0.6:  # lengths, ids, sizes: small values, around the pool
            v = rng.integers(-2, max(self.pool) + 3, n)
        elif r < 0.9:
            v = rng.integers(max(info.min, -1000), min(info.max, 5000), n)
        else:
            v = rng.choice([info.min, info.max, -1, 0], n)
        return np.asarray(v).astype(np_type).reshape(shape)

    def _attr(self, name, kind):
        rng = self.rng
        r = 1.0 if self.tidy else rng.random()
        if r < 0.15:
            return None  # absent
        if r < 0.25:  # another type than declared
            kind = str(rng.choice(["int", "float", "string", "ints", "floats"]))
        if kind == "int":
            s = rng.random()
            if s < 0.6:
                return int(rng.choice(self.pool + [16, 32, 64, 128]))
            if s < 0.8 or self.tidy:
                return int(rng.choice([-1, 0, 1, 2, 4]))
            return int(rng.choice([-(1 << 62), (1 << 31), (1 << 62), -7]))
        if kind == "float":
            sane = [0.0, 1e-6, 0.125, 1.0, 50.0]
            return float(rng.choice(sane if self.tidy else sane + [-1.0, np.inf, np.nan, 1e38]))
        if kind == "string":
            return str(rng.choice(["", "NONE", "nk", "decode_packed", "f16", "bf16", "f32", "x" * 300, "\u00e9"]))
        # (onnx's helper cannot type an empty list: lists have 1 to 3 values.)
        if kind == "ints":
            return [int(v) for v in rng.choice([-1, 0, 1, 8, 1 << 40], int(rng.integers(1, 4)))]
        return [float(v) for v in rng.choice([0.0, 1.0, -2.5], int(rng.integers(1, 4)))]

    def _mutated(self, inputs, attrs, outputs=None):
        """The op's template with 0 to 2 of: a dim changed, an attribute changed, an optional
        input dropped, a dtype changed, a given value changed."""
        rng = self.rng
        inputs = {name: [dtype, list(shape), values] for name, (dtype, shape, values) in inputs.items()}
        attrs = dict(attrs)
        for _ in range(int(rng.integers(0, 3))):
            what = rng.integers(5)
            name = str(rng.choice(list(inputs)))
            if what == 0 and inputs[name][1]:
                shape = inputs[name][1]
                shape[int(rng.integers(len(shape)))] = self._dim()
                inputs[name][1] = self._bounded(shape)
                inputs[name][2] = None
            elif what == 1 and attrs:
                key = str(rng.choice(list(attrs)))
                value = attrs[key]
                kind = {int: "int", float: "float", str: "string"}.get(type(value)) or (
                    "ints" if all(isinstance(v, int) for v in value) else "floats")
                attrs[key] = self._attr(key, kind) if rng.random() < 0.8 else None
                if attrs[key] is None:
                    del attrs[key]
            elif what == 2:
                optional = [n for n, _, opt, _ in self.op.inputs if opt and n in inputs]
                if optional:
                    del inputs[str(rng.choice(optional))]
            elif what == 3:
                inputs[name][0] = str(rng.choice(list(ELEM)))
                inputs[name][2] = None
            elif inputs[name][2] is not None:
                v = inputs[name][2].copy()
                flat = v.reshape(-1)
                if flat.size:
                    flat[int(rng.integers(flat.size))] = int(rng.choice([-1, 0, 1 << 20, -(1 << 30), 3]))
                inputs[name][2] = v
        names, graph_inputs = [], []
        for i, (declared, *_rest) in enumerate(self.op.inputs):
            if declared not in inputs:
                names.append("")
                continue
            dtype, shape, values = inputs[declared]
            input_name = f"in{i}"
            names.append(input_name)
            graph_inputs.append((input_name, dtype, shape, values, shape))
        while names and names[-1] == "":
            names.pop()
        outputs = [f"out{i}" for i in range(outputs or len(self.op.outputs))]
        return self._model(self.op.name, names, outputs, attrs, graph_inputs)

    def _model(self, op_name, names, outputs, attrs, graph_inputs):
        """The serialized model of one node and its feeds; `graph_inputs` as (name, dtype,
        shape, values or None for random ones, the dims the graph declares). bfloat16 inputs are
        fed as float16 and cast inside the model (numpy has no bfloat16)."""
        node = helper.make_node(op_name, names, outputs, domain="dlkern", name="fuzzed", **attrs)
        # Outputs without a declared type: ORT takes the op's (its inference).
        graph_outputs = [ValueInfoProto(name=o) for o in outputs if o]
        nodes, infos, fed = [], [], {}
        for name, dtype, shape, values, dims in graph_inputs:
            if dtype == "bfloat16":
                nodes.append(helper.make_node("Cast", [name + "_f16"], [name], to=TensorProto.BFLOAT16))
                name, dtype = name + "_f16", "float16"
            fed[name] = self._values(dtype, shape) if values is None else values.astype(ELEM[dtype][1])
            infos.append(helper.make_tensor_value_info(name, ELEM[dtype][0], dims))
        graph = helper.make_graph(nodes + [node], "fuzz", infos, graph_outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dlkern", 1)])
        model.ir_version = 9
        return model.SerializeToString(), fed

    def _count(self, declared, extra):
        """How many inputs or outputs an untidy case passes: rarely `extra()` more than
        declared, or fewer (0 to all); a tidy case passes the declared count."""
        rng = self.rng
        if not self.tidy and rng.random() < 0.05:
            return declared + extra()
        if not self.tidy and rng.random() < 0.1:
            return int(rng.integers(0, declared + 1))
        return declared

    def _build(self, generic):
        rng = self.rng
        if generic:
            declared_in = [(f"x{i}", "float", False, None) for i in range(int(rng.integers(1, 4)))]
            declared_out = [(f"y{i}", False) for i in range(int(rng.integers(1, 3)))]
            attrs = {"function_name": str(rng.choice(["dlkern.rmsnorm", "dlkern.matmul_nbits", "dlkern.attention",
                                                       "no.such.kernel", "dlkern.group_query_attention"]))}
            if rng.random() < 0.5:
                attrs["epsilon"] = 1e-5
                attrs["attribute_names"] = str(rng.choice(["epsilon", "epsilon,missing", ""]))
            op_name = "DLPackKernel"
        else:
            declared_in, declared_out = self.op.inputs, self.op.outputs
            attrs = {}
            for name, kind in self.op.attrs:
                value = self._attr(name, kind)
                if value is not None:
                    attrs[name] = value
            if not self.tidy and rng.random() < 0.1:
                attrs["not_an_attribute"] = 1
            op_name = self.op.name
        # Inputs: each declared one present, absent ('' / left off at the end) or, rarely, an
        # extra one past the declared count.
        names, graph_inputs = [], []
        for i in range(self._count(len(declared_in), extra=lambda: int(rng.integers(1, 3)))):
            name, ty, optional, rank = declared_in[i] if i < len(declared_in) else (f"extra{i}", "T", True, None)
            if (optional and rng.random() < 0.5) or (not self.tidy and rng.random() < 0.03):
                names.append("")
                continue
            dtype = self._dtype(ty)
            shape = self._shape(rank)
            input_name = f"in{i}"
            names.append(input_name)
            dims = [f"s{i}_{a}" if rng.random() < 0.1 else d for a, d in enumerate(shape)]
            graph_inputs.append((input_name, dtype, shape, None, dims))
        while names and names[-1] == "":
            names.pop()
        outputs = []
        for i in range(self._count(len(declared_out), extra=lambda: 1)):
            optional = declared_out[i][1] if i < len(declared_out) else True
            outputs.append("" if optional and rng.random() < 0.4 else f"out{i}")
        while outputs and outputs[-1] == "":
            outputs.pop()
        return self._model(op_name, names, outputs, attrs, graph_inputs)


class Finding(Exception):
    """A case that failed the way no input may make dlkern fail (a contained panic)."""


def _ort_error(e):
    """Whether `e` is an error ONNX Runtime raised (anything else is the harness's own). A panic
    that dlkern contained is an error value too, but one that a bad input must never cause."""
    if "panic" in str(e):
        raise Finding(str(e)[:2000]) from e
    # (run_with_iobinding raises a plain RuntimeError that carries ORT's status.)
    return "onnxruntime" in type(e).__module__ or (type(e) is RuntimeError and str(e).startswith("Error in execution"))


def run_case(lib, ops, seed, k):
    """(outcome, op name) of case `k`: 'ran', 'load' (ORT refused the model or the session) or
    'run' (the run failed with an ORT error). Anything else escapes: a crash kills the process."""
    case = Case(np.random.default_rng([seed, k]), ops)
    name = case.op.name if case.op else "DLPackKernel"
    so = ort.SessionOptions()
    so.register_custom_ops_library(lib)
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    try:
        sess = ort.InferenceSession(case.model, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        if not _ort_error(e):
            raise
        return "load", name
    try:
        # Outputs stay OrtValues (numpy has no bfloat16).
        io = sess.io_binding()
        for name_in, value in case.feeds.items():
            io.bind_cpu_input(name_in, value)
        for out in sess.get_outputs():
            io.bind_output(out.name, "cpu")
        sess.run_with_iobinding(io)
    except Exception as e:
        if not _ort_error(e):
            raise
        return "run", name
    return "ran", name


def limit_address_space():
    """Caps this process's address space (DLKERN_FUZZ_AS_GIB, default 64 GiB), so that an absurd
    output (a shape of 2^40 rows) fails to allocate as it does where the kernel does not
    overcommit memory. Where it does, the allocation succeeds and ONNX Runtime's CPU arena fills
    a handle table of 8 bytes per 256 bytes of the region (128 GiB for a 4 TiB output): the
    process is killed for memory in ORT's own code, which is no finding about dlkern."""
    try:
        import resource
    except ImportError:
        return
    gib = int(os.environ.get("DLKERN_FUZZ_AS_GIB", "64"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = gib << 30
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if soft == resource.RLIM_INFINITY or soft > want:
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lib")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--first", type=int, default=0, help="the first case's number")
    ap.add_argument("--case", type=int, help="replay this one case")
    ap.add_argument("--seconds", type=float, default=0, help="stop starting cases after this long (0: no limit)")
    ap.add_argument("--progress", help="file that holds the number of the case being run")
    args = ap.parse_args()
    limit_address_space()
    ops = parse_ops()
    if not ops:
        sys.exit("no ORT op found in docs/ops.md")
    counts = {"ran": 0, "load": 0, "run": 0}
    by_op = {}
    numbers = [args.case] if args.case is not None else range(args.first, args.first + args.cases)
    start = time.monotonic()
    for k in numbers:
        if args.seconds and time.monotonic() - start > args.seconds:
            break
        if args.progress:
            with open(args.progress, "w") as f:
                f.write(f"{args.seed} {k}\n")
        outcome, name = run_case(os.path.abspath(args.lib), ops, args.seed, k)
        counts[outcome] += 1
        by_op.setdefault(name, {"ran": 0, "load": 0, "run": 0})[outcome] += 1
    total = sum(counts.values())
    for op, c in sorted(by_op.items()):
        print(f"  {op}: {sum(c.values())} cases, {c['ran']} ran, {c['run']} failed at run, {c['load']} refused at load")
    print(f"fuzz: {total} cases (seed {args.seed}), {counts['ran']} ran, {counts['run']} failed at run with an ORT "
          f"error, {counts['load']} refused at load, {time.monotonic() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
