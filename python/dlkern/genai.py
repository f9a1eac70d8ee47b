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


# --- onnxruntime-genai's Engine (0.18): continuous batching over a paged KV cache -------------
#
# A model the builder made with `--extra_options use_paged_attention=true` takes its tokens
# packed (`input_ids` of rank 1, [num_tokens], with block_table, cumulative_sequence_lengths,
# past_sequence_lengths and attention_metadata beside it) and keeps its KV cache in blocks;
# genai_config.json says so with `state_groups: [{"kind": "paged_kv"}]` and an
# `engine.dynamic_batching` block. `og.Generator` cannot drive it (ORT: "Invalid rank for input:
# input_ids Got: 2 Expected: 1"); `og.Engine` can. The Engine runs the builder's other models
# too, with static batching (get_capabilities().configured_max_batch_size requests at a time,
# no per-turn seed).
#
# The API: engine = og.Engine(model); request = engine.create_request(options=RequestOptions);
# og.TurnOptions(request) holds one turn's search options; request.begin_turn(int32 token ids,
# turn_options) queues it; each engine.run(event_buffer) is one scheduler step (one forward pass
# over every request scheduled in it) and returns its events: flags TOKEN (event.token is one new
# token of event.request), TURN_FINISHED (event.finish_reason, event.usage), FAILED
# (event.error_code), while engine.has_pending_requests(). It gives no logits.


def is_paged(folder):
    """Whether the model in `folder` keeps its KV cache in blocks (a `paged_kv` state group in
    genai_config.json), so that only onnxruntime-genai's Engine can run it (`generate_engine`)."""
    with open(f"{folder}/genai_config.json") as f:
        decoder = json.load(f).get("model", {}).get("decoder", {})
    return any(g.get("kind") == "paged_kv" for g in decoder.get("state_groups") or [])


CPU_ENGINE_SEQUENCES = 8  # full-context sequences load_engine sizes a paged CPU cache for


def load_engine(folder, provider="cpu", overlay=None, provider_options=None, num_blocks=None, random_seed=None):
    """`load` for `generate_engine`. `num_blocks` (per layer) sizes a paged model's KV cache
    (engine.dynamic_batching.num_blocks). Without it onnxruntime-genai sizes the cache from the
    device's free memory (gpu_utilization_factor), which the CPU device does not report: Engine
    creation then fails with std::bad_alloc whatever the factor, so on CPU a paged model gets
    enough blocks for CPU_ENGINE_SEQUENCES sequences of the full context length. `random_seed`
    is the model's search.random_seed, the seed of every request's sampler (the only seed an
    Engine over a non-paged model takes; a paged one also takes generate_engine's per-turn
    random_seed). Any other model loads as `load` would load it."""
    overlay = json.loads(json.dumps(overlay or {}))
    if is_paged(folder):
        with open(f"{folder}/genai_config.json") as f:
            config = json.load(f)
        batching = overlay.setdefault("engine", {}).setdefault("dynamic_batching", {})
        if num_blocks is None and provider == "cpu" and "num_blocks" not in batching:
            block = batching.get("block_size") or config["engine"]["dynamic_batching"]["block_size"]
            per_sequence = -(-int(config["model"]["context_length"]) // int(block))
            num_blocks = CPU_ENGINE_SEQUENCES * per_sequence
        if num_blocks is not None:
            batching["num_blocks"] = int(num_blocks)
    if random_seed is not None:
        overlay.setdefault("search", {})["random_seed"] = int(random_seed)
    return load(folder, provider, overlay=overlay or None, provider_options=provider_options)


SAMPLING_SETTERS = {
    "top_k": "set_top_k",
    "top_p": "set_top_p",
    "temperature": "set_temperature",
    "repetition_penalty": "set_repetition_penalty",
    "no_repeat_ngram_size": "set_no_repeat_ngram_size",
    "random_seed": "set_seed",
}


def generate_engine(model, prompts, new_tokens, sampling=None):
    """`generate` through onnxruntime-genai's Engine, the only way to run a paged model (see
    `is_paged`; load it with `load_engine`); it runs the other models too. Each prompt (a list of
    token ids; lengths may differ) is one request, all begun before the first step so that the
    scheduler batches them; each generates exactly `new_tokens` tokens: end-of-sequence is masked
    until then (TurnOptions.set_min_generated_tokens, as min_length does for the Generator) and
    the turn stops there (set_max_generated_tokens; the request may hold prompt + new_tokens).
    Greedy, or sampled with `sampling` ({top_k, top_p, temperature, repetition_penalty,
    no_repeat_ngram_size, random_seed}: the TurnOptions of each turn). random_seed reseeds each
    request's sampler (TurnOptions.set_seed), which only an Engine over a paged model (dynamic
    batching) allows: for a non-paged one this raises ValueError; load the model with
    `load_engine(..., random_seed=...)` instead, which seeds every request alike (so a request
    samples the same tokens in a batch as alone).

    The Engine gives no logits: `logits` stays empty. Timing: `prompt_s` is the wall time of the
    Engine steps until every request has its first token (the prompt's forward pass and the pick
    of the first token are one step: they cannot be timed apart); `step_s` has a 0.0 for that
    first token, then the wall time of each later step (one decode forward pass over the batch),
    so that `first_token_s` and `tokens_per_s` mean what they mean for `generate`. Raises
    RuntimeError when a request fails or a turn ends early (finish reason, error code)."""
    import onnxruntime_genai as og

    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if new_tokens < 1:
        raise ValueError("new_tokens must be at least 1 (a cap of 0 means no cap to the Engine)")
    sampling = dict(sampling or {})
    unknown = set(sampling) - set(SAMPLING_SETTERS) - {"do_sample"}
    if unknown:
        raise ValueError(f"sampling options the Engine's TurnOptions do not take: {sorted(unknown)}")
    sampling.pop("do_sample", None)
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(4 * len(prompts) + 16)
    requests = []
    for prompt in prompts:
        options = og.RequestOptions()
        options.set_max_session_tokens(len(prompt) + new_tokens)
        request = engine.create_request(options=options)
        turn = og.TurnOptions(request)
        turn.set_max_generated_tokens(new_tokens)
        turn.set_min_generated_tokens(new_tokens)
        turn.set_do_sample(bool(sampling))
        for key, value in sampling.items():
            getattr(turn, SAMPLING_SETTERS[key])(value)
        try:
            request.begin_turn(np.asarray(prompt, dtype=np.int32), turn)
        except RuntimeError as e:
            if "random_seed" in sampling and "seed" in str(e):
                raise ValueError(
                    f"{e} (this model's Engine batches statically: load it with "
                    "load_engine(..., random_seed=...) and leave random_seed out of sampling)"
                ) from e
            raise
        requests.append(request)

    result = Generation(tokens=[[] for _ in prompts])
    finished = [None] * len(prompts)
    flags = og.EngineEventFlags
    started = time.perf_counter()
    try:
        steps = 0
        while engine.has_pending_requests():
            steps += 1
            if steps > 4 * (new_tokens + max(len(p) for p in prompts)) * len(prompts) + 64:
                raise RuntimeError(f"the Engine did not finish in {steps - 1} steps")
            t0 = time.perf_counter()
            events = engine.run(buffer)
            dt = time.perf_counter() - t0
            for event in events:
                i = next(i for i, r in enumerate(requests) if event.request == r)
                if event.flags & flags.FAILED:
                    raise RuntimeError(
                        f"request {i} failed: {event.error_code} (finish reason {event.finish_reason})"
                    )
                if event.flags & flags.TOKEN:
                    result.tokens[i].append(int(event.token))
                if event.flags & flags.TURN_FINISHED:
                    finished[i] = event.finish_reason
            if not result.step_s:
                if all(result.tokens):
                    result.prompt_s = time.perf_counter() - started
                    result.step_s.append(0.0)
            else:
                result.step_s.append(dt)
    finally:
        for request in requests:
            request.close()
    for i, (tokens, reason) in enumerate(zip(result.tokens, finished)):
        if len(tokens) != new_tokens:
            raise RuntimeError(f"request {i} ended after {len(tokens)} of {new_tokens} tokens: {reason}")
    return result
