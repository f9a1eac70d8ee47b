"""`pip install dlkern` as a user gets it (issue 40): the wheel built from this tree (setup.py:
cargo builds libdlkern.so into the package) installed into a fresh virtual environment that sees
neither this tree nor DLKERN_LIB, then the README's snippet there: an ORT session through
dlkern.session_options() and dlkern.call on NumPy arrays, the library found inside the package."""

import os
import subprocess
import sys
import venv

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

SNIPPET = """
import numpy as np, onnxruntime as ort, dlkern, dlkern_onnx as dx
from onnx import TensorProto
path = dlkern.get_library_path()
assert "site-packages" in path and path.endswith("dlkern/libdlkern.so"), path
sess = ort.InferenceSession(dx.rmsnorm_model(TensorProto.FLOAT, 16, 1e-6), dlkern.session_options(),
                            providers=["CPUExecutionProvider"])
x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 16)).astype(np.float32)
w = np.linspace(0.5, 1.5, 16, dtype=np.float32)
(y,) = sess.run(None, {"X": x, "scale": w})
ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(dlkern.call("dlkern.rmsnorm", x, w, epsilon=1e-6), y, rtol=1e-6)
print("wheel ok:", path)
"""


def pypi_reachable():
    import socket

    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not pypi_reachable(), reason="needs PyPI (the build backend and the fresh venv's packages)")
def test_the_wheel_installs_and_runs_in_a_fresh_environment(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DLKERN_LIB", "PYTHONPATH")}
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), ROOT],
                   check=True, env=env, timeout=1800)
    (wheel,) = wheels.glob("dlkern-*.whl")
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    constraints = os.path.join(ROOT, "scripts", "constraints.txt")
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", constraints,
                    f"{wheel}[onnx]"], check=True, env=env, timeout=900)
    done = subprocess.run([python, "-c", SNIPPET], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wheel ok:" in done.stdout
