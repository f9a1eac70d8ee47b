#!/usr/bin/env python3
"""Builder-made LLM test fixtures: tiny random-weight Llama / Qwen2 / Phi checkpoints turned into
ONNX by onnxruntime-genai's model builder, written to tests/fixtures/llm/<name>/.

Run it through scripts/make-llm-fixtures.sh (which makes .venv-builder/ with torch, transformers,
onnxruntime 1.31.1 and onnxruntime-genai 0.18.0). Everything is seeded: a rerun rewrites the same
folders with the same weights. Each fixture is then checked on CPU (onnxruntime.InferenceSession
and an onnxruntime-genai greedy run of 32 tokens) and its graph facts (op counts, attributes of
the attention / MatMulNBits / norm nodes, graph I/O) are written to tests/fixtures/llm/README.md
and tests/fixtures/llm/manifest.json.

  python python/make_llm_fixtures.py                 # build all, verify, write README + manifest
  python python/make_llm_fixtures.py --only llama-int4-cuda qwen-fp32-cpu
  python python/make_llm_fixtures.py --verify-only   # skip the builds
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "llm"
WORK = ROOT / "target" / "llm-fixtures"  # HF checkpoints and the builder's cache (ignored by git)

SEED = 20240601
VOCAB = 320  # 256 byte-level symbols + <|endoftext|> + 63 merges
PROMPT_IDS = [5, 17, 42, 101, 7, 250, 33, 64, 199, 12]  # fixed prompt (token ids) for the checks
NEW_TOKENS = 32

# Shared shape: head_dim 64 (dlkern's attention takes 64/80/96/128/256), 4 query heads over 2 KV
# heads (GQA group 2). hidden_size is 128, not heads * head_dim = 256: head_dim is given
# explicitly (as Qwen3 / Gemma do) so that q_proj is 128 -> 256 and o_proj 256 -> 128; with a
# 256-wide hidden state the nine fixtures would come to ~11 MB instead of ~5.
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=64,  # != vocab_size (the builder misreads a model where they are equal)
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=256,  # cos/sin caches of 256 rows
    tie_word_embeddings=False,  # tied would turn the embedding into GatherBlockQuantized for int4
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)

ARCHS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(rms_norm_eps=1e-5, rope_theta=10000.0)),
    "qwen": (
        "Qwen2ForCausalLM",
        "Qwen2Config",
        dict(rms_norm_eps=1e-6, rope_theta=10000.0, use_sliding_window=False),
    ),
    # Phi-2 style: LayerNorm (with bias), parallel attention + MLP, fc1/fc2 with gelu_new,
    # q/k/v/dense with bias, rotary over the first half of each head (partial_rotary_factor 0.5
    # -> rotary_embedding_dim 32 of head 64).
    "phi": (
        "PhiForCausalLM",
        "PhiConfig",
        dict(
            layer_norm_eps=1e-5,
            rope_theta=10000.0,
            partial_rotary_factor=0.5,
            hidden_act="gelu_new",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attention_dropout=0.0,
            qk_layernorm=False,
        ),
    ),
}

# name -> (arch, precision, ep, extra_options)
FIXTURE_SPECS = {
    "llama-int4-cuda": ("llama", "int4", "cuda", []),
    "llama-int4-cpu": ("llama", "int4", "cpu", []),
    "llama-fp16-cuda": ("llama", "fp16", "cuda", []),
    "llama-fp32-cpu": ("llama", "fp32", "cpu", []),
    "llama-int4-cuda-paged": ("llama", "int4", "cuda", ["use_paged_attention=true"]),
    "llama-fp16-cuda-paged": ("llama", "fp16", "cuda", ["use_paged_attention=true"]),
    "qwen-int4-cuda": ("qwen", "int4", "cuda", []),
    "qwen-fp32-cpu": ("qwen", "fp32", "cpu", []),
    "phi-int4-cuda": ("phi", "int4", "cuda", []),
    "phi-fp32-cpu": ("phi", "fp32", "cpu", []),
}

TOKENIZER_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, this is a tiny tokenizer for the dlkern test fixtures.",
    "Attention heads read keys and values from the cache; the rotary embedding turns queries.",
    "Small models with random weights still generate tokens one at a time, greedily.",
    "0123456789 + - * / = ( ) [ ] { } < > : ; , . ! ? ' \"",
] * 8


# ----------------------------------------------------------------------------------------------
# checkpoints


def make_tokenizer(out_dir: Path):
    """A byte-level BPE of VOCAB entries trained on a fixed text (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TOKENIZER_TEXT, trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.model_max_length = COMMON["max_position_embeddings"]
    fast.save_pretrained(out_dir)
    fix_tokenizer_config(out_dir)


def fix_tokenizer_config(folder: Path):
    """transformers 5 writes tokenizer_class "TokenizersBackend", which onnxruntime-genai's
    tokenizer (onnxruntime-extensions) does not know; name the GPT-2 byte-level BPE class."""
    p = folder / "tokenizer_config.json"
    if not p.exists():
        return
    cfg = json.loads(p.read_text())
    cfg["tokenizer_class"] = "GPT2Tokenizer"
    cfg.pop("backend", None)
    cfg["model_max_length"] = COMMON["max_position_embeddings"]
    cfg["add_bos_token"] = False
    cfg["add_prefix_space"] = False
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def reinit_(model, seed: int):
    """Deterministic weights that make every parameter visible in the output: matrices N(0, 0.08)
    (attention scores of std ~0.8), embeddings N(0, 0.5), norm scales 1 + N(0, 0.1), biases
    N(0, 0.1) (HF initialises norm scales to 1 and biases to 0, which would hide them)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            shape = p.shape
            if "norm" in name and name.endswith("weight"):
                v = 1.0 + 0.1 * torch.randn(shape, generator=g)
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(shape, generator=g)
            elif "embed_tokens" in name:
                v = 0.5 * torch.randn(shape, generator=g)
            else:
                v = 0.08 * torch.randn(shape, generator=g)
            p.copy_(v.to(p.dtype))


def make_checkpoint(arch: str, out_dir: Path):
    import torch
    import transformers

    cls_name, cfg_name, extra = ARCHS[arch]
    cfg = getattr(transformers, cfg_name)(**COMMON, **extra)
    cfg.architectures = [cls_name]
    torch.manual_seed(SEED)
    model = getattr(transformers, cls_name)(cfg).to(torch.float32).eval()
    reinit_(model, SEED + sum(map(ord, arch)))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    make_tokenizer(out_dir)
    return model


def build(name: str):
    arch, precision, ep, extra = FIXTURE_SPECS[name]
    hf = WORK / "hf" / arch
    out = FIXTURES / name
    cache = WORK / "cache" / name
    for d in (out, cache):
        if d.exists():
            shutil.rmtree(d)
    cmd = [
        sys.executable, "-m", "onnxruntime_genai.models.builder",
        "-i", str(hf), "-o", str(out), "-p", precision, "-e", ep, "-c", str(cache),
        "--extra_options", "hf_token=false", *extra,
    ]
    print("+", " ".join(os.path.relpath(c, ROOT) if c.startswith(str(ROOT)) else c for c in cmd), flush=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    log = r.stdout + r.stderr
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    (WORK / "logs" / f"{name}.log").write_text(log)
    if r.returncode != 0:
        if out.exists():
            shutil.rmtree(out)
        tail = "\n".join(log.strip().splitlines()[-6:])
        print(f"  builder failed ({r.returncode}):\n{tail}", flush=True)
        return {"built": False, "builder_error": last_error_line(log)}
    fix_tokenizer_config(out)
    return {"built": True}


def last_error_line(log: str) -> str:
    lines = [l for l in log.strip().splitlines() if l.strip()]
    for l in reversed(lines):
        if "Error" in l or "error" in l or "Exception" in l:
            return l.strip()
    return lines[-1].strip() if lines else ""


# ----------------------------------------------------------------------------------------------
# graph facts


def dtype_name(elem_type: int) -> str:
    import onnx

    return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name if elem_type not in (
        onnx.TensorProto.BFLOAT16,
    ) else "bfloat16"


def value_info_str(vi) -> dict:
    t = vi.type.tensor_type
    dims = [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else "?")
            for d in t.shape.dim]
    return {"name": vi.name, "dtype": dtype_name(t.elem_type), "shape": dims}


def attr_dict(node) -> dict:
    import onnx

    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        if isinstance(v, float):
            v = float(f"{v:.9g}")
        out[a.name] = v
    return out


def graph_facts(folder: Path) -> dict:
    import onnx

    m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    ops = collections.Counter(n.op_type for n in g.node)
    op_domains = {}
    for n in g.node:
        op_domains.setdefault(n.op_type, set()).add(n.domain or "ai.onnx")
    facts = {
        "opsets": {o.domain or "ai.onnx": o.version for o in m.opset_import},
        "ops": dict(sorted(ops.items())),
        "op_domains": {k: "/".join(sorted(v)) for k, v in sorted(op_domains.items())},
        "inputs": [value_info_str(v) for v in g.input],
        "outputs": [value_info_str(v) for v in g.output],
        "nodes": {},
    }

    def init_shape(name):
        return list(inits[name].dims) if name in inits else None

    schemas = op_input_names()

    wanted = ("GroupQueryAttention", "PagedAttention", "MatMulNBits", "SkipSimplifiedLayerNormalization",
              "SimplifiedLayerNormalization", "SkipLayerNormalization", "LayerNormalization",
              "RotaryEmbedding", "MultiHeadAttention", "Attention", "GatherBlockQuantized", "Gelu", "FastGelu")
    for n in g.node:
        if n.op_type not in wanted:
            continue
        entry = {"name": n.name, "domain": n.domain or "ai.onnx", "attrs": attr_dict(n),
                 "inputs": list(n.input), "outputs": list(n.output)}
        if n.op_type == "MatMulNBits":
            b = n.input[1]
            entry["B_shape"] = init_shape(b)
            entry["B_dtype"] = dtype_name(inits[b].data_type) if b in inits else None
            entry["scales_shape"] = init_shape(n.input[2])
            entry["scales_dtype"] = dtype_name(inits[n.input[2]].data_type) if n.input[2] in inits else None
            entry["zero_points"] = len(n.input) > 3 and n.input[3] != ""
            entry["g_idx"] = len(n.input) > 4 and n.input[4] != ""
            entry["bias"] = len(n.input) > 5 and n.input[5] != ""
        if n.op_type in ("GroupQueryAttention", "PagedAttention"):
            entry["input_shapes"] = {i: [dtype_name(inits[i].data_type), init_shape(i)] for i in n.input if i in inits}
            names = schemas.get((n.domain or "ai.onnx", n.op_type), [])
            entry["input_slots"] = [[names[k] if k < len(names) else f"#{k}", v] for k, v in enumerate(n.input)]
        facts["nodes"].setdefault(n.op_type, []).append(entry)
    return facts


def op_input_names() -> dict:
    """(domain, op) -> input names, from the op schemas onnxruntime registers."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as C

        return {(sc.domain or "ai.onnx", sc.name): [i.name for i in sc.inputs] for sc in C.get_all_operator_schema()}
    except Exception:  # noqa: BLE001
        return {}


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------------------------
# runs on CPU


def short_err(e: BaseException) -> str:
    s = str(e).strip().replace("\n", " ")
    return f"{type(e).__name__}: {s[:600]}"


def check_ort(folder: Path) -> dict:
    import numpy as np
    import onnxruntime as ort

    res = {}
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
        res["ort_cpu_session"] = "ok"
    except Exception as e:  # noqa: BLE001
        res["ort_cpu_session"] = short_err(e)
        return res
    # One prompt forward through ORT directly (only for the non-paged graphs).
    names = {i.name: i for i in sess.get_inputs()}
    if "block_table" in names:
        return res
    try:
        np_dt = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
        feeds = {}
        s = len(PROMPT_IDS)
        for n, i in names.items():
            if n == "input_ids":
                feeds[n] = np.array([PROMPT_IDS], dtype=np.int64)
            elif n == "attention_mask":
                feeds[n] = np.ones((1, s), dtype=np.int64)
            elif n == "position_ids":
                feeds[n] = np.arange(s, dtype=np.int64)[None]
            elif n.startswith("past_key_values"):
                # [batch, kv_heads, past_len, head_size]; the builder names the last dim "kv_cache_dim"
                shape = [1, COMMON["num_key_value_heads"], 0, COMMON["head_dim"]]
                shape = [d if isinstance(d, int) else shape[k] for k, d in enumerate(i.shape)]
                feeds[n] = np.zeros(shape, dtype=np_dt[i.type])
            else:
                raise RuntimeError(f"unknown input {n}")
        outs = sess.run(["logits"], feeds)
        logits = outs[0].astype(np.float32)
        res["ort_cpu_prompt_argmax"] = logits[0].argmax(-1).tolist()
    except Exception as e:  # noqa: BLE001
        res["ort_cpu_prompt_run"] = short_err(e)
    return res


def check_genai(folder: Path, ep: str) -> dict:
    import onnxruntime_genai as og

    res = {}
    try:
        cfg = og.Config(str(folder))
        if ep != "cpu":
            cfg.clear_providers()
        model = og.Model(cfg)
        res["genai_model"] = "ok"
    except Exception as e:  # noqa: BLE001
        res["genai_model"] = short_err(e)
        return res
    try:
        params = og.GeneratorParams(model)
        # min_length = max_length: eos (id 0) is masked, so every fixture gives exactly 32 tokens
        # (without it qwen-int4-cuda emits eos after 11).
        n = len(PROMPT_IDS) + NEW_TOKENS
        params.set_search_options(max_length=n, min_length=n, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(PROMPT_IDS)
        while not gen.is_done():
            gen.generate_next_token()
        seq = [int(t) for t in gen.get_sequence(0)]
        res["genai_greedy"] = "ok"
        res["genai_new_tokens"] = seq[len(PROMPT_IDS):]
    except Exception as e:  # noqa: BLE001
        res["genai_greedy"] = short_err(e)
    try:
        tok = og.Tokenizer(model)
        text = "Hello world, the quick brown fox."
        ids = [int(t) for t in tok.encode(text)]
        back = tok.decode(ids)
        res["genai_tokenizer"] = {"text": text, "ids": ids, "decoded": back, "roundtrip": back == text}
    except Exception as e:  # noqa: BLE001
        res["genai_tokenizer"] = short_err(e)
    return res


def check_genai_subprocess(folder: Path, ep: str) -> dict:
    """check_genai in a child process, so that a native crash is recorded instead of ending us."""
    r = subprocess.run([sys.executable, __file__, "--genai-check", str(folder), ep],
                       capture_output=True, text=True, timeout=600)
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("GENAI_CHECK "):
            return json.loads(line[len("GENAI_CHECK "):])
    err = (r.stderr.strip().splitlines() or [""])[-1]
    return {"genai_model": f"child process died (rc {r.returncode}): {err}"}


def check_hf(arch: str) -> list[int]:
    """Greedy tokens of the fp32 HF model (transformers), the reference for the fp32 fixtures."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(WORK / "hf" / arch, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT_IDS]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, eos_token_id=0, pad_token_id=0)
    return out[0, len(PROMPT_IDS):].tolist()


# ----------------------------------------------------------------------------------------------
# README


def fmt_shape(s):
    return "[" + ", ".join(str(d) for d in s) + "]"


def md_io(ios):
    return "<br>".join(f"`{v['name']}` {v['dtype']} {fmt_shape(v['shape'])}" for v in ios)


def compress_io(ios):
    """past_key_values.0.key .. past_key_values.N.value -> one line with N."""
    out, seen = [], set()
    for v in ios:
        name = v["name"]
        parts = name.split(".")
        if len(parts) == 3 and parts[1].isdigit():
            key = (parts[0], parts[2], v["dtype"], tuple(v["shape"]))
            if key in seen:
                continue
            seen.add(key)
            n = sum(1 for w in ios if w["name"].split(".")[0] == parts[0] and w["name"].endswith("." + parts[2]))
            out.append(dict(v, name=f"{parts[0]}.{{0..{n - 1}}}.{parts[2]}"))
        else:
            out.append(v)
    return out


def summarize_nodes(entries, keys=None):
    """Group nodes of one op type by their attribute set."""
    groups = collections.OrderedDict()
    for e in entries:
        a = dict(e["attrs"])
        if keys:
            a = {k: a[k] for k in keys if k in a}
        k = json.dumps(a, sort_keys=True)
        groups.setdefault(k, []).append(e)
    return groups


def write_readme(manifest: dict):
    lines = []
    v = manifest["versions"]
    lines += [
        "# Builder-made LLM fixtures",
        "",
        "Tiny random-weight decoder LLMs exported to ONNX by onnxruntime-genai's model builder, for the",
        "end-to-end tests: the graphs have exactly the node shapes (GroupQueryAttention, PagedAttention,",
        "MatMulNBits, (Skip)SimplifiedLayerNormalization, ...) that real builder-made models have, at a",
        "few hundred kB each. **Generated; do not edit by hand** (this README and `manifest.json` too).",
        "",
        "## How they were made",
        "",
        "```sh",
        "scripts/make-llm-fixtures.sh            # makes .venv-builder/ once, then builds + verifies all",
        "scripts/make-llm-fixtures.sh --only llama-int4-cuda   # one fixture (README/manifest keep the rest)",
        "scripts/make-llm-fixtures.sh --verify-only           # re-check and rewrite README/manifest",
        "```",
        "",
        f"Versions: torch {v['torch']}, transformers {v['transformers']}, onnxruntime-genai {v['onnxruntime-genai']}"
        f" (its model builder; CPU package), onnxruntime {v['onnxruntime']}, onnx {v['onnx']}, onnx-ir {v['onnx-ir']},"
        f" tokenizers {v['tokenizers']}.",
        "",
        "`python/make_llm_fixtures.py` makes a seeded HF checkpoint per architecture under",
        "`target/llm-fixtures/hf/<arch>/` (weights re-drawn from fixed generators: matrices N(0, 0.08),",
        "embeddings N(0, 0.5), norm scales 1 + N(0, 0.1), every bias N(0, 0.1), so that no scale or bias is",
        "a no-op) and runs, per fixture:",
        "",
        "```sh",
        "python -m onnxruntime_genai.models.builder -i target/llm-fixtures/hf/<arch> -o tests/fixtures/llm/<name> \\",
        "    -p <precision> -e <ep> -c target/llm-fixtures/cache/<name> --extra_options hf_token=false [use_paged_attention=true]",
        "```",
        "",
        "then rewrites `tokenizer_config.json`'s `tokenizer_class` from transformers 5's `TokenizersBackend`",
        "to `GPT2Tokenizer` (see Tokenizer below). Builder logs: `target/llm-fixtures/logs/<name>.log`.",
        "",
        "## Checkpoints",
        "",
        "Common: vocab " + str(COMMON["vocab_size"]) + ", hidden_size " + str(COMMON["hidden_size"])
        + ", intermediate_size " + str(COMMON["intermediate_size"]) + ", " + str(COMMON["num_hidden_layers"])
        + " layers, " + str(COMMON["num_attention_heads"]) + " query heads / " + str(COMMON["num_key_value_heads"])
        + " KV heads (GQA group 2), head_dim " + str(COMMON["head_dim"]) + " (explicit: hidden_size is not heads x"
        " head_dim, q_proj is 128 -> 256 and o_proj 256 -> 128), max_position_embeddings "
        + str(COMMON["max_position_embeddings"]) + ", rope_theta 10000, untied embeddings, bos = eos = pad = 0.",
        "",
        "| arch | HF class | differences |",
        "| --- | --- | --- |",
        "| llama | LlamaForCausalLM | RMSNorm eps 1e-5, SiLU gated MLP, no biases |",
        "| qwen | Qwen2ForCausalLM | RMSNorm eps 1e-6, q/k/v biases, no sliding window |",
        "| phi | PhiForCausalLM | LayerNorm (with bias) eps 1e-5, parallel attention + MLP (fc1/fc2, gelu_new),"
        " biases on q/k/v/dense/fc1/fc2/lm_head, partial_rotary_factor 0.5 (rotary over 32 of the 64 head dims: GQA gets"
        " cos/sin caches of 16 columns, no rotary_embedding_dim attribute). The builder writes LayerNorm epsilon 1e-6, not"
        " the checkpoint's 1e-5 (it reads `rms_norm_eps` only); greedy tokens still equal HF's |",
        "",
        "Size: with hidden_size = 4 x 64 = 256 the set would be ~11 MB (three fp32 models of ~2.9 MB); hidden 128 gives"
        " ~7 MB and keeps hidden (128), head_dim (64) and the q width (256) apart, so that a kernel mixing them up"
        " fails (intermediate_size is 64, equal to head_dim).",
        "",
        "## Fixtures",
        "",
        "| name | arch | precision / EP | size | ORT CPU session | genai on CPU (greedy 32) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    total = 0
    for name, f in manifest["fixtures"].items():
        if not f.get("built"):
            lines.append(f"| {name} | {f['arch']} | {f['precision']} / {f['ep']} {' '.join(f['extra_options'])} |"
                         f" not built | - | builder: `{f.get('builder_error', '')}` |")
            continue
        total += f["size_bytes"]
        g = f["checks"].get("genai_greedy", f["checks"].get("genai_model"))
        g = "yes" if g == "ok" else f"no: `{g}`"
        s = f["checks"].get("ort_cpu_session")
        s = "yes" if s == "ok" else f"no: `{s}`"
        extra = " " + " ".join(f["extra_options"]) if f["extra_options"] else ""
        lines.append(f"| `{name}` | {f['arch']} | {f['precision']} / {f['ep']}{extra} | {f['size_bytes'] / 1024:.0f} kB"
                     f" | {s} | {g} |")
    lines += ["", f"Total {total / 1024 / 1024:.2f} MiB. Files per folder: " +
              "`model.onnx` (+ `model.onnx.data` when the builder writes external data), `genai_config.json`,"
              " `tokenizer.json`, `tokenizer_config.json`"
              + (", `chat_template.jinja`" if any((FIXTURES / n / "chat_template.jinja").exists() for n in manifest["fixtures"]) else "")
              + ".", ""]
    lines += ["Greedy tokens (prompt ids " + json.dumps(PROMPT_IDS) + ", 32 new tokens, onnxruntime-genai on CPU with"
              " `max_length = min_length = 10 + 32` so that eos is masked; also in `manifest.json`; the fp32 HF model's own"
              " greedy tokens (transformers `generate`, `min_new_tokens=32`) are the reference):", ""]
    for arch, toks in manifest.get("hf_greedy", {}).items():
        lines.append(f"- HF fp32 `{arch}`: `{toks}`")
    for name, f in manifest["fixtures"].items():
        t = f.get("checks", {}).get("genai_new_tokens")
        if t is not None:
            ref = manifest.get("hf_greedy", {}).get(f["arch"])
            same = "" if ref is None else (" (= HF)" if t == ref else
                                           f" (first {next((i for i, (a, b) in enumerate(zip(t, ref)) if a != b), len(t))} equal to HF)")
            lines.append(f"- `{name}`: `{t}`{same}")
    lines.append("")

    for name, f in manifest["fixtures"].items():
        if not f.get("built"):
            continue
        gf = f["graph"]
        lines += [f"## `{name}`", ""]
        lines += [f"Size {f['size_bytes']} bytes ({', '.join(f'{k} {s}' for k, s in f['files'].items())}). "
                  f"Opsets: {', '.join(f'{k} {x}' for k, x in gf['opsets'].items())}.", ""]
        lines += ["Ops (all nodes, count; `ms` = com.microsoft): " + ", ".join(
            f"{k}{' (ms)' if gf['op_domains'][k] == 'com.microsoft' else ''} x{c}" for k, c in gf["ops"].items()) + ".", ""]
        lines += ["| graph inputs | graph outputs |", "| --- | --- |",
                  f"| {md_io(compress_io(gf['inputs']))} | {md_io(compress_io(gf['outputs']))} |", ""]
        nodes = gf["nodes"]
        for op in ("GroupQueryAttention", "PagedAttention"):
            for e in nodes.get(op, [])[:1]:
                lines += [f"{op} (x{len(nodes[op])}, com.microsoft; first one `{e['name']}`):", "",
                          f"- attributes: `{json.dumps(e['attrs'], sort_keys=True)}`",
                          f"- inputs ({len(e['inputs'])} slots, name from ORT {manifest['versions']['onnxruntime']}'s schema = value): "
                          + ", ".join(f"{k} = `{i}`" if i else f"{k} = (empty)" for k, i in e["input_slots"]),
                          "- outputs: " + ", ".join(f"`{o}`" for o in e["outputs"]), ""]
                if e.get("input_shapes"):
                    lines += ["- initializer inputs: " + ", ".join(f"`{k}` {v[0]} {v[1]}" for k, v in e["input_shapes"].items()), ""]
        if "MatMulNBits" in nodes:
            lines += ["MatMulNBits (com.microsoft):", "",
                      "| node | K | N | bits | block_size | accuracy_level | B | scales | zero_points | bias | other attrs |",
                      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
            for e in nodes["MatMulNBits"]:
                a = e["attrs"]
                other = {k: x for k, x in a.items() if k not in ("K", "N", "bits", "block_size", "accuracy_level")}
                lines.append(f"| `{e['name']}` | {a.get('K')} | {a.get('N')} | {a.get('bits')} | {a.get('block_size')}"
                             f" | {a.get('accuracy_level', '(absent)')} | {e['B_dtype']} {e['B_shape']} | {e['scales_dtype']}"
                             f" {e['scales_shape']} | {'yes' if e['zero_points'] else 'no'} | {'yes' if e['bias'] else 'no'}"
                             f" | {json.dumps(other) if other else ''} |")
            lines.append("")
        for op in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "LayerNormalization",
                   "SkipLayerNormalization", "Gelu", "FastGelu", "RotaryEmbedding", "GatherBlockQuantized",
                   "MultiHeadAttention", "Attention"):
            if op not in nodes:
                continue
            dom = gf["op_domains"][op]
            lines += [f"{op} (x{len(nodes[op])}, {dom}):", ""]
            for k, es in summarize_nodes(nodes[op]).items():
                e = es[0]
                lines.append(f"- attrs `{k}` on {len(es)} node(s), e.g. `{e['name']}`: inputs "
                             + ", ".join(f"`{i}`" if i else '`""`' for i in e["inputs"])
                             + "; outputs " + ", ".join(f"`{o}`" if o else '`""`' for o in e["outputs"]))
            lines.append("")
        c = f["checks"]
        lines += ["CPU checks:", ""]
        lines.append(f"- `onnxruntime.InferenceSession(model.onnx, CPU)`: {c.get('ort_cpu_session')}"
                     + (f"; prompt argmax {c['ort_cpu_prompt_argmax']}" if "ort_cpu_prompt_argmax" in c else "")
                     + (f"; prompt run: {c['ort_cpu_prompt_run']}" if "ort_cpu_prompt_run" in c else ""))
        lines.append(f"- `og.Model` ({'providers cleared' if f['ep'] != 'cpu' else 'as built'}): {c.get('genai_model')}")
        if "genai_greedy" in c:
            lines.append(f"- greedy 32 tokens: {c['genai_greedy']}")
        if isinstance(c.get("genai_tokenizer"), dict):
            t = c["genai_tokenizer"]
            lines.append(f"- `og.Tokenizer`: encode({t['text']!r}) = {t['ids']}; decode round trip: {t['roundtrip']}")
        elif "genai_tokenizer" in c:
            lines.append(f"- `og.Tokenizer`: {c['genai_tokenizer']}")
        lines.append("")
    lines += [
        "## Tokenizer",
        "",
        "A byte-level BPE (`tokenizers`), trained on a fixed short text to exactly "
        f"{VOCAB} entries: id 0 `<|endoftext|>` (bos = eos = pad = unk), ids 1-256 the byte alphabet, then merges.",
        "transformers 5 saves it with `tokenizer_class: TokenizersBackend`; onnxruntime-genai 0.18.0 reads that",
        "too, but the script names `GPT2Tokenizer` (the byte-level BPE class every reader knows) in the checkpoint",
        "and in each fixture folder. The builder re-saves the tokenizer through `AutoTokenizer`, so what lands in",
        "a fixture is transformers' rendering of it: for `qwen-*` (model_type qwen2) `tokenizer.json` gets Qwen2's",
        "NFC normalizer and regex Split pre-tokenizer in front of ByteLevel; the ids of the text above are the same.",
        "`og.Tokenizer(model)` encodes and decodes it (round trip checked for every fixture that loads on CPU).",
        "Decoding the random models' greedy output gives bytes that are mostly not valid UTF-8; use the ids.",
        "",
    ]
    (FIXTURES / "README.md").write_text("\n".join(lines))


# ----------------------------------------------------------------------------------------------


def versions():
    return {k: md.version(k) for k in ("torch", "transformers", "onnxruntime-genai", "onnxruntime", "onnx", "onnx-ir", "tokenizers", "numpy")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="+", choices=sorted(FIXTURE_SPECS), help="build only these fixtures")
    ap.add_argument("--verify-only", action="store_true", help="skip the builds; re-check and rewrite README/manifest")
    ap.add_argument("--genai-check", nargs=2, metavar=("FOLDER", "EP"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.genai_check:
        print("GENAI_CHECK " + json.dumps(check_genai(Path(args.genai_check[0]), args.genai_check[1])), flush=True)
        return

    FIXTURES.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    manifest_path = FIXTURES / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"fixtures": {}}

    names = args.only or list(FIXTURE_SPECS)
    build_info = {}
    if not args.verify_only:
        for arch in sorted({FIXTURE_SPECS[n][0] for n in names}):
            make_checkpoint(arch, WORK / "hf" / arch)
        for n in names:
            build_info[n] = build(n)

    hf_greedy = dict(old.get("hf_greedy", {}))
    for arch in sorted({FIXTURE_SPECS[n][0] for n in FIXTURE_SPECS}):
        if (WORK / "hf" / arch).exists():
            hf_greedy[arch] = check_hf(arch)

    manifest = {
        "generator": "python/make_llm_fixtures.py",
        "versions": versions(),
        "seed": SEED,
        "prompt_ids": PROMPT_IDS,
        "new_tokens": NEW_TOKENS,
        "common_config": COMMON,
        "arch_config": {a: {"class": c, **x} for a, (c, _, x) in ARCHS.items()},
        "hf_greedy": hf_greedy,
        "fixtures": {},
    }
    for name, (arch, precision, ep, extra) in FIXTURE_SPECS.items():
        folder = FIXTURES / name
        entry = {"arch": arch, "precision": precision, "ep": ep, "extra_options": extra}
        if name in build_info:
            entry.update(build_info[name])
        elif name in old.get("fixtures", {}) and not old["fixtures"][name].get("built", True):
            entry.update({k: old["fixtures"][name][k] for k in ("built", "builder_error") if k in old["fixtures"][name]})
        else:
            entry["built"] = (folder / "model.onnx").exists()
        if entry["built"]:
            print(f"== check {name}", flush=True)
            entry["files"] = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
            entry["size_bytes"] = folder_size(folder)
            entry["sha256_model_onnx"] = hashlib.sha256((folder / "model.onnx").read_bytes()).hexdigest()
            entry["graph"] = graph_facts(folder)
            checks = {}
            checks.update(check_ort(folder))
            checks.update(check_genai_subprocess(folder, ep))
            entry["checks"] = checks
            print("  ", {k: v for k, v in checks.items() if k not in ("genai_tokenizer",)}, flush=True)
        manifest["fixtures"][name] = entry
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    write_readme(manifest)
    print(f"wrote {os.path.relpath(manifest_path, ROOT)} and README.md;"
          f" total {sum(f.get('size_bytes', 0) for f in manifest['fixtures'].values()) / 1024:.0f} kB")


if __name__ == "__main__":
    main()
