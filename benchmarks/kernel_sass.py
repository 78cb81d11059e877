"""The built-in kernel's paging cost read from its machine code, no GPU needed: the attention kernel compiled for
sm_90 (H100/H200) by Triton's own ptxas, and the instructions of its key-tile loop counted, paged and dense, for the
performance lane's workloads over the model dtype's and fp8 e4m3 caches.

    python benchmarks/kernel_sass.py

Why instructions: at prefill the loop issues more instructions than its tensor-core work needs (a 64 x 64 tile's two
dots are about 1,000 cycles of an SM's tensor cores for two resident programs, their loops about 1,300 issue slots on
each of its four schedulers), so paged/dense instructions predict paged/dense time there; decode waits on memory and
hides them. A figure, not a verdict: bench_kernel.py times the kernel on a GPU.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout, not installed
from harness import performance  # noqa: E402
from harness.subjects.builtin import BuiltinSubject, compiled  # noqa: E402


def loop_instructions(sass: str) -> Counter[str]:
    """Opcodes of the longest loop in a kernel's SASS (a label to the furthest branch back to it), counted."""
    lines = sass.splitlines()
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.fullmatch(r"\w+:", line)}
    spans = [(labels[m.group(1)], i) for i, line in enumerate(lines)
             if (m := re.search(r"\bBRA\s+`?\(?(\w+)\)?`?;", line)) and labels.get(m.group(1), i) < i]
    if not spans:
        raise ValueError("no backward branch in this SASS: not a looping kernel, or an unknown listing format")
    start, end = max(spans, key=lambda s: s[1] - s[0])
    ops: Counter[str] = Counter()
    for line in lines[start + 1:end + 1]:
        instruction = re.sub(r"^@!?U?P\w+\s+", "", line.split("\t", 1)[-1].strip())
        if instruction and not instruction.endswith(":"):
            ops[instruction.split()[0].rstrip(";")] += 1
    return ops


def main() -> None:
    subject = BuiltinSubject()
    header = f"{'workload':<26} {'cache':<9} {'tile':<16} {'dense':>6} {'paged':>6} {'paged/dense':>11}"
    print(f"key-tile loop instructions per iteration and warp, sm_90, triton {triton.__version__}")
    print(f"{header}\n{'-' * len(header)}")
    for name, case in performance.WORKLOADS.items():
        tile = subject.tile_config(case)
        for cache, kv in (("model", case.torch_dtype), ("fp8_e4m3", torch.float8_e4m3fn)):
            dense, paged = (sum(loop_instructions(compiled(case, tile, p, kv).asm["sass"]).values())
                            for p in (False, True))
            print(f"{name:<26} {cache:<9} {performance.tile_label(tile):<16} {dense:>6} {paged:>6} "
                  f"{paged / dense:>11.3f}", flush=True)


if __name__ == "__main__":
    main()
