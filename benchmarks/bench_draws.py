"""What drawing one example costs, per check's strategy and device's sizes: hypothesis choices per example and
milliseconds per example, measured through a @given test whose body does nothing (the engine's own work: choices,
spans, its tree of what was tried), over one recorded geometry of each kind.

    python benchmarks/bench_draws.py                   # 0.33.0's first per-layer and shared geometries, 400 examples
    python benchmarks/bench_draws.py --release 0.22.1 --examples 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from harness import checks  # noqa: E402
from harness.draws import strategies
from harness.recordings import store
from harness.run import implementation  # noqa: E402
from harness.run.releases import load_release  # noqa: E402
from harness.run.targets import Target  # noqa: E402


def strategy_of(check: checks.Check, target: Target, sizes) -> st.SearchStrategy:
    it = implementation.of(check)
    return st.tuples(it.examples(target, sizes), it.extra())


def measure(strategy: st.SearchStrategy, count: int) -> tuple[float, float]:
    """(choices per example, ms per example) over `count` examples."""
    choices: list[int] = []

    @seed(0)
    @settings(max_examples=count, database=None, deadline=None, derandomize=True, phases=("generate",),
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def body(data) -> None:
        data.draw(strategy)
        choices.append(len(data.conjecture_data.choices))

    start = time.perf_counter()
    with strategies.alike():
        body()
    return statistics.mean(choices), 1000 * (time.perf_counter() - start) / max(len(choices), 1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_draws.py")
    parser.add_argument("--release", default="0.33.0")
    parser.add_argument("--examples", type=int, default=400)
    args = parser.parse_args(argv)
    release = load_release(args.release, store.ROOT)
    contracts = release.contracts
    kinds = {"per-layer": next(c for c in contracts if not c.layout.shared and not c.layout.latent),
             "shared": next((c for c in contracts if c.layout.shared), None)}
    print(f"{'check':<18} {'sizes':<5} {'geometry':<10} {'choices/ex':>10} {'ms/ex':>7}")
    for check in (checks.SPLIT_AGREES, checks.REJECTS_MALFORMED, checks.BIT_IDENTITY):
        for name, sizes in (("cpu", strategies.CPU), ("gpu", strategies.GPU)):
            for kind, contract in kinds.items():
                if contract is None:
                    continue
                n, ms = measure(strategy_of(check, Target(release, contract), sizes), args.examples)
                print(f"{check.name:<18} {name:<5} {kind:<10} {n:>10.1f} {ms:>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
