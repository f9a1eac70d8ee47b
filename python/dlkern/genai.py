"""Generation through onnxruntime-genai, the client an ORT LLM user runs: a model folder (as its
model builder writes it, or as `dlkern.retarget` rewrote it) loaded on one execution provider,
token ids in, token ids and logits out. Shared by the end-to-end tests, the demo and the
end-to-end benchmark so that all three drive the model the same way."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np

PROVIDERS = ("cpu", "cuda")


def load(folder, provider="cpu", overlay=None, provider_options=None):
    """An `onnxruntime_genai.Model` of `folder` on `provider` ('cpu' or 'cuda'), whatever
    provider its genai_config.json names, with `provider_options` ({key: value}) for it;
    `overlay` is merged into the config (a dict)."""
    import onnxruntime_genai as og

    if provider not in PROVIDERS:
        raise ValueError(f"provider {provider!r}: expected one of {PROVIDERS}")
    config = og.Config(str(folder))
    config.clear_providers()
    if provider != "cpu":
        config.append_provider(provider)
        for key, value in (provider_options or {}).items():
            config.set_provider_option(provider, key, str(value))
    if overlay:
        config.overlay(json.dumps(overlay))
    return og.Model(config)


@dataclass
class Generation:
    tokens: list  # per sequence: the new token ids
    logits: list = field(default_factory=list)  # per step: float32 [batch, vocab] of the last position
    prompt_s: float = 0.0  # wall time of the prompt's forward pass (append_tokens)
    step_s: list = field(default_factory=list)  # per token: wall time of generate_next_token

    @property
    def first_token_s(self):
        """Time to the first token: the prompt's forward pass and picking from its logits."""
        return self.prompt_s + (self.step_s[0] if self.step_s else 0.0)

    def tokens_per_s(self, batch):
        """Decode throughput at the median step (the steps after the first token, each one forward
        pass; the median leaves out one-off costs such as a CUDA graph's capture)."""
        steps = sorted(self.step_s[1:] or self.step_s)
        return batch / steps[len(steps) // 2] if steps else 0.0


def generate(model, prompts, new_tokens, sampling=None, keep_logits=True, max_length=None):
    """Runs `prompts` (equal-length lists of token ids, one per sequence) for `new_tokens` steps:
    greedy, or sampled with `sampling` (search options such as top_k, temperature,
    random_seed). Every step is timed; the logits of each step are kept if asked (they are
    copied to the host)."""
    import onnxruntime_genai as og

    batch, prompt_len = len(prompts), len(prompts[0])
    if any(len(p) != prompt_len for p in prompts):
        raise ValueError("prompts must have equal lengths (onnxruntime-genai pads otherwise)")
    params = og.GeneratorParams(model)
    options = dict(max_length=max_length or prompt_len + new_tokens, batch_size=batch)
    options.update(sampling or {"do_sample": False})
    if sampling:
        options["do_sample"] = True
    params.set_search_options(**options)
    gen = og.Generator(model, params)
    result = Generation(tokens=[[] for _ in range(batch)])

    # append_tokens runs the prompt's forward pass; each generate_next_token picks a token from
    # the last logits, after running the forward pass of the token before it (not on the first
    # call, whose logits the prompt step made).
    t0 = time.perf_counter()
    gen.append_tokens(np.asarray(prompts, dtype=np.int32))
    result.prompt_s = time.perf_counter() - t0
    while len(result.tokens[0]) < new_tokens and not gen.is_done():
        t0 = time.perf_counter()
        gen.generate_next_token()
        result.step_s.append(time.perf_counter() - t0)
        for b, t in enumerate(gen.get_next_tokens()):
            result.tokens[b].append(int(t))
        if keep_logits:
            result.logits.append(np.asarray(gen.get_output("logits"), dtype=np.float32)[:, -1, :].copy())
    return result


def profile_ops(model, prompt, steps, directory):
    """Per op type, the mean time per decode step that ORT's profiler gives its nodes (for the
    CUDA EP the host's share, launches included; for the CPU EP the compute), over `steps`
    decode steps after the first token: {(op_type, domain-or-provider): us per step}."""
    import glob
    import os

    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + steps + 2, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([prompt], dtype=np.int32))
    gen.generate_next_token()
    prefix = os.path.join(str(directory), "ort_profile")
    gen.set_runtime_option("enable_profiling", prefix)
    for _ in range(steps):
        gen.generate_next_token()
    gen.set_runtime_option("enable_profiling", "0")
    totals, files = {}, sorted(glob.glob(prefix + "*.json"))
    for path in files:
        with open(path) as f:
            for e in json.load(f):
                if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
                    key = e.get("args", {}).get("op_name", "?")
                    totals[key] = totals.get(key, 0.0) + e["dur"]
        os.remove(path)
    if not files:
        raise RuntimeError("onnxruntime-genai wrote no profile (runtime option enable_profiling)")
    return {op: us / steps for op, us in totals.items()}
