"""onnxruntime-genai's Engine (0.18; continuous batching) through dlkern.genai.generate_engine, the
only way to run the builder's paged models (use_paged_attention=true: packed rank-1 input_ids, a
blocked KV cache; og.Generator refuses them):
- on the builder's other models the Engine generates the Generator's tokens (greedy, with eos
  masked the same way, and sampled from the same seed);
- a batch of requests, of uneven prompt lengths, generates what each request generates alone;
- the paged fixtures retargeted to dlkern generate the tokens of their non-paged twins (the same
  checkpoint and weights, llama-*-cuda) through the Generator. ORT has no CPU PagedAttention, so on
  the CPU EP only the retargeted model runs (dlkern's CPU PagedAttention); on the CUDA EP the
  original (ORT's CUDA PagedAttention) runs too and both must agree.

CPU EP in CI; the CUDA EP too on a GPU host with onnxruntime-genai-cuda and onnxruntime-gpu
(DLKERN_GENAI_PROVIDERS=cuda selects it alone). DLKERN_LIB = path of libdlkern.so."""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
from dlkern import genai  # noqa: E402

og = pytest.importorskip("onnxruntime_genai")
if not hasattr(og, "Engine"):
    pytest.skip("onnxruntime-genai without the Engine API (0.18+)", allow_module_level=True)
from genai_cases import FIXTURES, fixture_names, providers, retargeted_copies  # noqa: E402

STEPS = 32
# Uneven lengths; the third one's greedy first token is eos (0) on llama-int4-cuda, so that the
# masking of eos is exercised; the last is one token long.
PROMPTS = [
    [1, 17, 203, 5, 99, 311, 42],
    [3, 8, 250, 77, 2, 61, 9],
    [130, 159, 135, 169, 74, 251],
    [5, 17, 42, 101, 7, 250, 33, 64, 199, 12],
    [7],
]
SAMPLING = {"top_k": 8, "temperature": 0.9}
SEEDS = (1, 2, 3)
# The paged fixtures and their non-paged twins: made by the builder from the same checkpoint.
PAGED = {"llama-fp16-cuda-paged": "llama-fp16-cuda", "llama-int4-cuda-paged": "llama-int4-cuda"}
BLOCKS = 16  # KV cache blocks per layer for the paged models (block_size 256 = their whole context)


PLAIN = [(n, p) for p in providers() for n in fixture_names() if not genai.is_paged(FIXTURES / n)]
PAGED_CASES = [(n, p) for p in providers() for n in sorted(PAGED) if (FIXTURES / n).exists()]


@pytest.fixture(scope="module")
def retargeted(tmp_path_factory):
    """One dlkern-retargeted copy per (fixture, provider), shared by the tests of this module."""
    copies = retargeted_copies(tmp_path_factory)

    def get(name, provider):
        out, report = copies(name, provider)
        assert report.moved.get("PagedAttention", 0) == ("paged" in name) * 2, report.table()
        return out

    return get


def generator_tokens(model, prompt, new_tokens):
    """og.Generator's greedy tokens with eos masked (min_length = max_length), one sequence."""
    params = og.GeneratorParams(model)
    length = len(prompt) + new_tokens
    params.set_search_options(max_length=length, min_length=length, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([prompt], dtype=np.int32))
    tokens = []
    while not gen.is_done():
        gen.generate_next_token()
        tokens.append(int(gen.get_next_tokens()[0]))
    return tokens


def test_is_paged():
    names = fixture_names()
    assert set(PAGED) <= set(names), f"fixtures missing under {FIXTURES}: run scripts/make-llm-fixtures.sh"
    assert [n for n in names if genai.is_paged(FIXTURES / n)] == sorted(PAGED)


@pytest.mark.parametrize("name, provider", PLAIN)
def test_engine_generates_generator_tokens(name, provider):
    """All prompts in one batch, 32 greedy tokens each: the Generator's, one prompt at a time."""
    model = genai.load_engine(FIXTURES / name, provider)
    got = genai.generate_engine(model, PROMPTS, STEPS)
    assert got.tokens == [generator_tokens(model, p, STEPS) for p in PROMPTS]
    assert got.logits == [] and len(got.step_s) == STEPS and got.step_s[0] == 0.0 and got.prompt_s > 0


def test_eos_is_masked():
    """The prompt whose greedy first token is eos: the Generator without min_length stops there;
    generate_engine goes on for all its tokens, as the Generator with min_length does."""
    model = genai.load_engine(FIXTURES / "llama-int4-cuda", "cpu")
    assert genai.generate(model, [PROMPTS[2]], 8, keep_logits=False).tokens == [[0]]
    got = genai.generate_engine(model, [PROMPTS[2]], 8).tokens[0]
    assert len(got) == 8 and 0 not in got and got == generator_tokens(model, PROMPTS[2], 8)


# On CPU only: on the CUDA EP the Generator samples on the device and the Engine does not draw the
# same (seen on an H200: other tokens from the first step on, for every seed tried).
@pytest.mark.parametrize("name", [n for n, p in PLAIN if p == "cpu"])
def test_engine_samples_as_generator(name):
    """A non-paged model's Engine seeds every request's sampler from search.random_seed (it takes
    no per-turn seed): one request samples the Generator's tokens for the same seed, eos masked
    in both (min_length). Without min_length the Generator may sample eos where the Engine
    samples another token from the same draw, and even where eos is not among the top k the two
    can part: the builder's tiny models give top-k tokens equal logits, and masking eos changes
    the order in which the (unstable) partial sort leaves the tied ones (llama-int4-cuda, seeds 1
    and 4, first step: 234 and 131)."""
    sequences = set()
    for seed in SEEDS:
        model = genai.load_engine(FIXTURES / name, "cpu", random_seed=seed)
        masked = dict(SAMPLING, random_seed=seed, min_length=len(PROMPTS[0]) + 16)
        want = genai.generate(model, [PROMPTS[0]], 16, masked, keep_logits=False)
        got = genai.generate_engine(model, [PROMPTS[0]], 16, SAMPLING)
        assert got.tokens == want.tokens, seed
        sequences.add(str(got.tokens))
    assert len(sequences) > 1, "the seeds all sampled the same tokens"


def test_static_engine_takes_no_turn_seed():
    model = genai.load_engine(FIXTURES / "llama-int4-cuda", "cpu")
    with pytest.raises(ValueError, match="load_engine"):
        genai.generate_engine(model, [PROMPTS[0]], 4, dict(SAMPLING, random_seed=1))


def batch_cases():
    cases = [c for c in PLAIN if c[0] == "llama-int4-cuda"]
    return cases + [c for c in PAGED_CASES if c[0] == "llama-fp16-cuda-paged"]


@pytest.mark.parametrize("name, provider", batch_cases())
def test_batch_equals_alone(name, provider, retargeted):
    """Three requests of uneven lengths at once, greedy and sampled: each as it generates alone."""
    paged = genai.is_paged(FIXTURES / name)
    folder = retargeted(name, provider) if paged else FIXTURES / name
    prompts = PROMPTS[1:4]
    model = genai.load_engine(folder, provider, num_blocks=BLOCKS, random_seed=None if paged else 5)
    for sampling in (None, dict(SAMPLING, random_seed=5) if paged else SAMPLING):
        both = genai.generate_engine(model, prompts, 8, sampling)
        alone = [genai.generate_engine(model, [p], 8, sampling).tokens[0] for p in prompts]
        assert both.tokens == alone, sampling


@pytest.mark.parametrize("name, provider", PAGED_CASES)
def test_generator_refuses_paged(name, provider, retargeted):
    """Why the Engine: a paged model's input_ids is [num_tokens], the Generator feeds [batch, length]."""
    model = genai.load_engine(retargeted(name, provider), provider, num_blocks=BLOCKS)
    with pytest.raises(RuntimeError, match="input_ids"):
        genai.generate(model, [PROMPTS[0]], 2)


@pytest.mark.parametrize("name, provider", PAGED_CASES)
def test_paged_on_dlkern(name, provider, retargeted):
    """The retargeted paged model, all prompts batched, 32 greedy tokens each: on CPU the tokens the
    non-paged twin generates through the Generator; on CUDA the original paged model's (ORT's
    PagedAttention) through the Engine."""
    model = genai.load_engine(retargeted(name, provider), provider, num_blocks=BLOCKS)
    got = genai.generate_engine(model, PROMPTS, STEPS)
    if provider == "cpu":
        twin = genai.load(FIXTURES / PAGED[name], provider)
        want = [generator_tokens(twin, p, STEPS) for p in PROMPTS]
    else:
        want = genai.generate_engine(genai.load_engine(FIXTURES / name, provider, num_blocks=BLOCKS), PROMPTS, STEPS).tokens
    assert got.tokens == want


@pytest.mark.parametrize("name, provider", PAGED_CASES[:1] + [c for c in PAGED_CASES if c[1] == "cuda"][:1])
def test_paged_turn_seed(name, provider, retargeted):
    """A paged model's Engine (dynamic batching) takes a per-turn seed: it samples what the model's
    search.random_seed samples, the same on every run, and other seeds sample other tokens."""
    folder = retargeted(name, provider)
    sequences = set()
    for seed in SEEDS:
        per_turn = genai.load_engine(folder, provider, num_blocks=BLOCKS)
        configured = genai.load_engine(folder, provider, num_blocks=BLOCKS, random_seed=seed)
        got = genai.generate_engine(per_turn, [PROMPTS[0]], 8, dict(SAMPLING, random_seed=seed)).tokens
        assert genai.generate_engine(per_turn, [PROMPTS[0]], 8, dict(SAMPLING, random_seed=seed)).tokens == got
        assert genai.generate_engine(configured, [PROMPTS[0]], 8, SAMPLING).tokens == got, seed
        sequences.add(str(got))
    assert len(sequences) > 1, "the seeds all sampled the same tokens"
