"""What the onnxruntime-genai tests (test_genai.py, test_genai_engine.py) share: the builder's
fixtures, the execution providers to run them on, and one retargeted copy per (fixture, provider)."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
from dlkern import retarget  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
FIXTURES = ROOT / "tests" / "fixtures" / "llm"


def fixture_names():
    return sorted(p.name for p in FIXTURES.iterdir() if (p / "genai_config.json").exists()) if FIXTURES.exists() else []


def providers():
    """DLKERN_GENAI_PROVIDERS (comma-separated), else the CPU EP and, where onnxruntime-genai and
    onnxruntime both have it, the CUDA EP."""
    wanted = os.environ.get("DLKERN_GENAI_PROVIDERS")
    if wanted:
        return wanted.split(",")
    import onnxruntime as ort
    import onnxruntime_genai as og

    cuda = og.is_cuda_available() and "CUDAExecutionProvider" in ort.get_available_providers()
    return ["cpu", "cuda"] if cuda else ["cpu"]


def retargeted_copies(tmp_path_factory):
    """get(name, provider) -> (folder, retarget report): the fixture retargeted for that provider
    once, then the same copy for every later call (the body of a module-scoped fixture)."""
    made = {}

    def get(name, provider):
        if (name, provider) not in made:
            out = tmp_path_factory.mktemp(f"{name}-{provider}")
            made[(name, provider)] = (out, retarget.retarget(FIXTURES / name, out, ep=provider, library=LIB_PATH))
        return made[(name, provider)]

    return get
