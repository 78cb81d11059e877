"""Built-in kernel speed on CUDA: paged vs dense per physical order, decode and prefill, against the copy rate: the
kernel author's view of the built-in (the six orders, its tile sweep); the performance lane (`nox -s bench`,
harness.performance) times any subject over every geometry of the releases.

    python benchmarks/bench_kernel.py            # the pinned tile configs, every physical order
    python benchmarks/bench_kernel.py --sweep    # candidate tile configs and split targets (to choose the pins)

Times the kernel launch alone (inputs validated beforehand) with triton.testing.do_bench, median, at several
placements of each tensor (see `placed`), and reports the median over placements. KV bandwidth
counts the bytes of K and V read once over the time; the ceiling is a device-to-device copy measured here (bytes
read + written over its time). Each paged output is checked bit-identical to dense before it is timed.
Targets: decode at >= 90% of the copy rate, paged within 5% of dense on every order.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout, not installed
from harness import performance  # noqa: E402
from harness.compare import assert_bit_identical  # noqa: E402
from harness.contract import Contract, Dims, families, views  # noqa: E402
from harness.draws.cases import Case  # noqa: E402
from harness.handed.cache import paging, write  # noqa: E402
from harness.subjects import TileConfig, builtin  # noqa: E402
from harness.subjects.builtin import BuiltinSubject, batch_tensors, launch, num_splits  # noqa: E402

WORKLOADS = {"decode 64x4k": performance.WORKLOADS["decode 64x4k fp16"],
             "prefill 8x2k": performance.WORKLOADS["prefill 8x2k fp16"]}  # the performance lane's


def bench(fn, rep: int = 300) -> float:
    return triton.testing.do_bench(fn, warmup=50, rep=rep, return_mode="median")


def copy_rate() -> float:
    """Bytes read + written per second by a 4 GiB device-to-device copy."""
    src = torch.empty(2**31, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def causal_flops(case: Case) -> float:
    pairs = sum(kv * q - q * (q - 1) / 2 for q, kv in zip(case.q_lens, case.kv_lens))
    return 4 * case.head_dim * case.num_heads * pairs


PLACEMENTS = 5  # addresses each tensor is timed at (dense K/V, every layout's cache), all alive at once
SPACER = 37 << 20  # bytes allocated between placements, so that each lands elsewhere relative to 2 MiB pages


def placed(make: Callable[[], tuple], timed: Callable[..., float]) -> list[float]:
    """`timed(*make())` at PLACEMENTS addresses: where a tensor lands moves a kernel's time by several percent
    (the same dense K/V rows: 0.875-0.948 ms at prefill on an H200), so one placement cannot tell two kernels apart."""
    alive, times = [], []
    for _ in range(PLACEMENTS):
        tensors = make()
        alive += [*tensors, torch.empty(SPACER, dtype=torch.uint8, device="cuda")]
        times.append(timed(*tensors))
    return times


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("bench_kernel needs a CUDA device")
    subject = BuiltinSubject()
    copy = copy_rate()
    print(f"device {torch.cuda.get_device_name()}, triton {triton.__version__}, torch {torch.__version__}")
    print(f"device-to-device copy: {copy / 1e12:.2f} TB/s (read + written)")
    print(f"ms: median over {PLACEMENTS} placements (min-max); paged/dense: median over median")
    header = (f"{'workload':<14} {'layout':<30} {'ms':>8} {'min-max':>13} {'KV TB/s':>8} {'of copy':>8} "
              f"{'TFLOP/s':>8} {'paged/dense':>11}")
    print(header)
    print("-" * len(header))
    for name, case in WORKLOADS.items():
        q, k, v = case.inputs("cuda")
        tile = subject.tile_config(case)
        batch = batch_tensors(case, q.device)
        kv_bytes = 2 * k.numel() * k.element_size()
        dense_out = subject.dense_forward(case, q, k, v, tile)
        rows = [("dense", placed(lambda: (k.clone(), v.clone()),
                                 lambda kd, vd: bench(lambda: launch(case, q, kd, vd, None, tile, batch))))]
        dims = Dims(case.blocks_needed() + 64, case.block_size, case.kv_heads, case.head_dim)
        pages = paging(case.kv_lens, case.block_size, dims.num_blocks, "shuffled").to("cuda")

        def cache(contract: Contract) -> tuple[torch.Tensor, torch.Tensor]:
            k_cache, v_cache = views.split(contract, views.allocate(contract, dims, case.torch_dtype, "cuda"))
            write(k_cache, v_cache, pages, k, v)
            return k_cache, v_cache

        def paged(contract: Contract, k_cache: torch.Tensor, v_cache: torch.Tensor) -> float:
            out = subject.paged_forward(case, q, k_cache, v_cache, pages, tile)
            assert_bit_identical(out, dense_out, f"{name} {contract.name}")
            return bench(lambda: launch(case, q, k_cache, v_cache, pages.block_table, tile, batch))

        for contract in families():
            rows.append((f"paged {contract.name}", placed(lambda: cache(contract), partial(paged, contract))))
        dense_ms = statistics.median(rows[0][1])
        for layout, times in rows:
            ms = statistics.median(times)
            bw = kv_bytes / (ms * 1e-3)
            print(f"{name:<14} {layout:<30} {ms:8.3f} {min(times):6.3f}-{max(times):6.3f} {bw / 1e12:8.2f} "
                  f"{bw / copy:8.1%} {causal_flops(case) / (ms * 1e-3) / 1e12:8.1f} {ms / dense_ms:11.3f}")
        print(f"{'':<14} tile {tile}, splits {num_splits(case, tile)}, KV {kv_bytes / 1e9:.2f} GB")


def sweep() -> None:
    """Time candidate tiles (and split targets for decode), dense and two paged orders, to pick the pinned set."""
    candidates = {
        "decode 64x4k": [TileConfig(16, n, 4, s) for n, s in ((32, 4), (64, 2), (64, 3), (128, 3))],
        "prefill 8x2k": [TileConfig(m, n, w, s) for m, n, w, s in (
            (64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 4, 2), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2))],
    }
    contracts = [families()[0], families()[1]]
    for name, case in WORKLOADS.items():
        q, k, v = case.inputs("cuda")
        batch = batch_tensors(case, q.device)
        kv_bytes = 2 * k.numel() * k.element_size()
        caches = []
        for contract in contracts:
            dims = Dims(case.blocks_needed() + 64, case.block_size, case.kv_heads, case.head_dim)
            k_cache, v_cache = views.split(contract, views.allocate(contract, dims, case.torch_dtype, "cuda"))
            pages = paging(case.kv_lens, case.block_size, dims.num_blocks, "shuffled").to("cuda")
            write(k_cache, v_cache, pages, k, v)
            caches.append((contract.name, k_cache, v_cache, pages.block_table))
        targets = (512, 1024, 2048) if name.startswith("decode") else (1024,)
        for tile in candidates[name]:
            for target in targets:
                builtin.TILES = (*builtin.TILES, tile)
                builtin.TARGET_PROGRAMS = target
                try:
                    ms = [bench(lambda: launch(case, q, k, v, None, tile, batch), rep=100)]
                    ms += [bench(lambda: launch(case, q, kc, vc, t, tile, batch), rep=100) for _, kc, vc, t in caches]
                except Exception as e:  # a candidate may not fit the chip (shared memory, registers)
                    print(f"{name} {tile}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    break
                print(f"{name} {tile} splits {num_splits(case, tile)}: dense {ms[0]:.3f} ms "
                      f"({kv_bytes / ms[0] / 1e9:.2f} TB/s), "
                      + ", ".join(f"{c[0]} {m:.3f}" for c, m in zip(caches, ms[1:])), flush=True)


if __name__ == "__main__":
    sweep() if "--sweep" in sys.argv else main()
