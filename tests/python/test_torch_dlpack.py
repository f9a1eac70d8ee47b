"""GPU host: PyTorch as DLPack producer and consumer through the C ABI (ctypes only), and a CUDA C
plug-in built with nvcc. Usage: DLKERN_LIB=.gpu/lib/libdlkern.so python3 -m pytest tests/python/test_torch_dlpack.py"""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
import dlkern_ctypes as dk  # noqa: E402

LIB = dk.Library(os.environ["DLKERN_LIB"])
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def rmsnorm_ref(x, w, eps):
    return torch.nn.functional.rms_norm(x.double(), (x.shape[-1],), w.double(), eps)


def check(y, ref, dtype):
    # One rounding to the storage type plus f32 accumulation: 2 units of roundoff.
    rtol = 2 * torch.finfo(dtype).eps
    err = ((y.double() - ref).abs() / (ref.abs() * rtol + 1e-6)).max().item()
    assert torch.isfinite(y).all(), "unwritten or non-finite output"
    assert err <= 1.0, f"error {err:.2f}x the bound"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 97), (5, 1025), (7, 80), (64, 4096), (2, 3, 128)])
@pytest.mark.parametrize("versioned", [False, True])
def test_rmsnorm_on_torch_tensors(dtype, shape, versioned):
    g = torch.Generator(device="cuda").manual_seed(hash((shape, str(dtype))) % 2**31)
    x = (torch.rand(shape, device="cuda", generator=g) * 6 - 3).to(dtype)
    w = (torch.rand(shape[-1], device="cuda", generator=g) * 2 - 1).to(dtype)
    y = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    stream = torch.cuda.current_stream().cuda_stream
    LIB.call("dlkern.rmsnorm", [x, w], [y], stream=stream, versioned=versioned, epsilon=1e-6)
    check(y, rmsnorm_ref(x, w, 1e-6), dtype)


def test_side_stream_strided_and_misaligned_inputs():
    side = torch.cuda.Stream()
    wide = torch.randn(33, 4096 + 64, device="cuda", dtype=torch.float16)
    x = wide[:, :4096]  # row stride 4160: strided rows
    w = torch.randn(4096, device="cuda", dtype=torch.float16)
    y = torch.empty(33, 4096, device="cuda", dtype=torch.float16)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        LIB.call("dlkern.rmsnorm", [x, w], [y], stream=side.cuda_stream, epsilon=1e-5)
    side.synchronize()
    check(y, rmsnorm_ref(x, w, 1e-5), torch.float16)
    # A view one element into its storage: 2-byte but not 16-byte aligned (scalar path).
    flat = torch.randn(1 + 8 * 1000, device="cuda", dtype=torch.bfloat16)
    x2 = flat[1:].view(8, 1000)
    w2 = torch.randn(1000, device="cuda", dtype=torch.bfloat16)
    y2 = torch.empty(8, 1000, device="cuda", dtype=torch.bfloat16)
    LIB.call("dlkern.rmsnorm", [x2, w2], [y2], stream=torch.cuda.current_stream().cuda_stream)
    check(y2, rmsnorm_ref(x2, w2, 1e-5), torch.bfloat16)
    # dlkern wrote y2; PyTorch consumes it as an ordinary tensor.
    assert torch.allclose((y2.float() * 2).sum(), 2 * y2.float().sum())


def test_errors_from_torch_inputs():
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises(dk.DLKernError, match=r"tensor 'weight': is on Cpu, expected Cuda\(0\)"):
        LIB.call("dlkern.rmsnorm", [x, torch.ones(8)], [torch.empty_like(x)])
    with pytest.raises(dk.DLKernError, match="tensor 'weight': dtype f16 differs from x's f32"):
        LIB.call("dlkern.rmsnorm", [x, torch.ones(8, device="cuda", dtype=torch.float16)], [torch.empty_like(x)])
    with pytest.raises(dk.DLKernError, match=r"tensor 'y': shape \[8, 4\] \(expected \[4, 8\]\)"):
        LIB.call("dlkern.rmsnorm", [x, torch.ones(8, device="cuda")], [torch.empty(8, 4, device="cuda")])


@pytest.fixture(scope="module")
def cuda_plugin():
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    out = os.path.join(tempfile.mkdtemp(), "libdlkern_cuda_plugin.so")
    subprocess.run(
        [nvcc, "-shared", "-Xcompiler", "-fPIC", "-I", os.path.join(ROOT, "include"),
         os.path.join(ROOT, "tests", "plugin", "cuda_plugin.cu"), "-o", out],
        check=True,
    )
    if "plugin.saxpy" not in LIB.kernels():  # another test module may have loaded it already
        LIB.load_plugin(out)
    return out


def test_nvcc_plugin_kernel_runs_on_torch_tensors(cuda_plugin):
    assert "plugin.saxpy" in LIB.kernels()
    x = torch.randn(3, 1001, device="cuda")
    y = torch.full_like(x, float("nan"))
    LIB.call("plugin.saxpy", [x], [y], stream=torch.cuda.current_stream().cuda_stream, a=2.5, b=-1.0)
    torch.testing.assert_close(y, 2.5 * x - 1.0)
    with pytest.raises(dk.DLKernError, match="plugin.saxpy: tensor 0 must be a contiguous f32 CUDA tensor"):
        LIB.call("plugin.saxpy", [x.half()], [y])
    with pytest.raises(dk.DLKernError, match="input 0 is on Cpu, which this kernel does not accept"):
        LIB.call("plugin.saxpy", [x.cpu()], [y.cpu()])
    # Loading it twice registers the same name again: refused with the registry's message.
    with pytest.raises(dk.DLKernError, match="already registered"):
        LIB.load_plugin(cuda_plugin)
