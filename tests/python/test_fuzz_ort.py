"""The fuzz campaign over the ORT surface (python/dlkern_fuzz.py) with a fixed seed and budget:
random dlkern nodes on the CPU execution provider must each run or fail with an ORT error. The
campaign runs in a child process, so a crash or a hang fails this test and names the case to
replay (`python python/dlkern_fuzz.py LIB --seed S --case K`). DLKERN_FUZZ_CASES and
DLKERN_FUZZ_SEED make a longer or another campaign. DLKERN_LIB = path of libdlkern.so."""

import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
CASES = int(os.environ.get("DLKERN_FUZZ_CASES", "6000"))
SEED = int(os.environ.get("DLKERN_FUZZ_SEED", "1"))


def test_random_nodes_run_or_fail_with_an_ort_error(tmp_path):
    progress = tmp_path / "progress"
    cmd = [sys.executable, os.path.join(ROOT, "python", "dlkern_fuzz.py"), LIB_PATH, "--seed", str(SEED),
           "--cases", str(CASES), "--progress", str(progress)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60 + CASES // 20)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the campaign hung at case {progress.read_text().strip()} (seed, case)") from None
    last = progress.read_text().strip() if progress.exists() else "none"
    assert done.returncode == 0, (
        f"the campaign died (exit {done.returncode}) at case {last} (seed, case):\n{done.stderr[-3000:]}")
    summary = done.stdout.strip().splitlines()[-1]
    print(done.stdout)
    assert summary.startswith(f"fuzz: {CASES} cases"), summary
