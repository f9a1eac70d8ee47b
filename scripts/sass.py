#!/usr/bin/env python3
"""What ptxas makes of a kernel: registers, local memory and the SASS instruction mix, per entry
and per loop step, without a GPU.

Usage: scripts/sass.py [--ptx FILE] [--arch sm_90a] [--split REGEX] ENTRY_REGEX [...]
  e.g. scripts/sass.py --split 'DEPBAR.LE SB0' 'matmul_nbits_decode(8|16)_packed_f16$'

It assembles the newest PTX of the last release build (target/release/build/dlkern-*/out, or
--ptx) with ptxas (DLKERN_PTXAS, from scripts/env.sh), disassembles the cubin with nvdisasm
(installed into .venv from PyPI's nvidia-cuda-nvdisasm on first use) and prints, for every
entry whose name matches: registers, stack and spill bytes, the instruction count and its most
common opcodes; with --split, the same per segment between instructions that match the regex
(the `cp.async` wait of a ring, say, marks each step of a software-pipelined loop). Static
counts: a segment with a branch counts both sides.
"""
import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def newest_ptx(arch):
    found = glob.glob(os.path.join(ROOT, "target/release/build/dlkern-*/out", f"dlkern_kernels_gpu.{arch}.ptx"))
    if not found:
        sys.exit(f"sass.py: no {arch} PTX under target/release/build: run `cargo build --release` first")
    return max(found, key=os.path.getmtime)


def tool(name, env_var=None):
    if env_var and os.environ.get(env_var):
        return os.environ[env_var]
    hits = glob.glob(os.path.join(ROOT, ".venv/lib/python3*/site-packages/nvidia/cu*/bin", name))
    if hits:
        return hits[0]
    if name == "nvdisasm":
        pip = os.path.join(ROOT, ".venv/bin/pip")
        if not os.path.exists(pip):
            sys.exit("sass.py: no .venv: run scripts/setup.sh first")
        subprocess.run([pip, "install", "-q", "nvidia-cuda-nvdisasm"], check=True)
        return tool(name)
    sys.exit(f"sass.py: {name} not found: run scripts/setup.sh (and `. scripts/env.sh`)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("entries", nargs="+", help="regexes matched against entry names")
    ap.add_argument("--ptx", help="PTX file (default: the newest release build's)")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--split", help="regex of the instruction that starts each segment")
    ap.add_argument("--top", type=int, default=14, help="opcodes to list per entry or segment")
    args = ap.parse_args()
    ptx = args.ptx or newest_ptx(args.arch)
    ptxas, nvdisasm = tool("ptxas", "DLKERN_PTXAS"), tool("nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        info = subprocess.run(
            [ptxas, f"-arch={args.arch}", "-v", ptx, "-o", cubin], check=True, capture_output=True, text=True
        ).stderr
        sass = subprocess.run([nvdisasm, "-c", cubin], check=True, capture_output=True, text=True).stdout

    resources = {}
    for block in info.split("Compiling entry function")[1:]:
        name = re.search(r"'(\w+)'", block).group(1)
        regs = re.search(r"Used (\d+) registers", block)
        local = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", block)
        resources[name] = (regs.group(1) if regs else "?", local.groups() if local else ("?", "?", "?"))

    code = collections.defaultdict(list)
    current = None
    for line in sass.splitlines():
        section = re.match(r"\s*\.section\s+\.text\.(\w+)", line)
        if section:
            current = section.group(1)
            continue
        insn = re.match(r"\s+/\*[0-9a-f]{4,6}\*/\s+((?:@!?U?P\w+\s+)?[A-Z][A-Z0-9_.]*.*?);", line)
        if insn and current:
            code[current].append(insn.group(1))

    patterns = [re.compile(p) for p in args.entries]
    split = re.compile(args.split) if args.split else None
    names = sorted(n for n in code if any(p.search(n) for p in patterns))
    if not names:
        sys.exit(f"sass.py: no entry of {ptx} matches {args.entries}")

    def mix(insns):
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0] for i in insns)
        return f"{len(insns)}: " + " ".join(f"{op} {n}" for op, n in ops.most_common(args.top))

    for name in names:
        regs, (stack, stores, loads) = resources.get(name, ("?", ("?", "?", "?")))
        print(f"{name}: {regs} registers, stack {stack} B, spills {stores}/{loads} B")
        print(f"  all {mix(code[name])}")
        if split:
            segments, seg = [], []
            for insn in code[name]:
                if split.search(insn) and seg:
                    segments.append(seg)
                    seg = []
                seg.append(insn)
            segments.append(seg)
            for i, seg in enumerate(segments):
                print(f"  segment {i} {mix(seg)}")


if __name__ == "__main__":
    main()
