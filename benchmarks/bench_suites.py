"""The conformance suites' speed on CUDA: kernel examples per second of wall time, cold and warm compile cache,
one GPU and all of them, and what each check costs per example. Each run's pytest output is kept in its folder
(pytest.log; add --durations=N after -- for per-item times).

    python benchmarks/bench_suites.py                       # default-subset releases: cold, warm (1 GPU), warm (all)
    python benchmarks/bench_suites.py --runs warm:1 -- -x   # one run; pytest options after --
    python benchmarks/bench_suites.py --seeds 1,2,2         # a hypothesis seed per run

A run is one `pytest conformance` process over the releases (replayed), timed from its start to its end. Kernel
examples are result lines of the checks that launch the subject's kernels (bit-identity, determinism, oracle) that
ran them; the checks that launch none (split agreement, malformed caches) are counted apart. `cold` starts from an
empty Triton cache, `warm` reuses the cache the run before it filled. Compiles come from results/run.json (the
warm-up's, and each worker's after it). Prints one line per run and writes them to --out as JSON.

Then, per run, the cost of each check per example in milliseconds, split into phases (harness.device.costs: drawing,
caches, the layer's setting, subject calls, device waits, the check's own work, comparing, result lines) and summed
over its workers, next to the figure docs/measurements.md records under GUARD for that check; and one line per
worker. The guard: the script exits 1 when a check of a warm run costs more than LIMIT times its recorded figure (a
slowdown seen the day it lands; never a conformance verdict). Cold runs are not judged: their warm-up compiles on the
CPUs their examples are drawn on. `--no-guard` prints the figures without judging them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from harness import checks, matrix, results  # noqa: E402
from harness.device import costs

KERNEL_CHECKS = checks.KERNEL_CHECKS
RAN = ("bit-identical", "within-tolerance", "differs")  # kernel examples whose kernels ran
MEASUREMENTS = ROOT / "docs" / "measurements.md"
GUARD = "bench_suites guard"  # the heading in MEASUREMENTS above the table of recorded per-check costs
LIMIT = 1.25


def recorded(text: str) -> dict[str, float]:
    """The recorded ms per example of each check: the first table after the GUARD heading of measurements.md."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("#") and GUARD in line), None)
    if start is None:
        raise ValueError(f"{MEASUREMENTS.name} has no heading naming {GUARD!r}")
    figures: dict[str, float] = {}
    for line in lines[start + 1:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells:
            if figures:
                break
            continue
        if len(cells) >= 2 and cells[0] in checks.BY_NAME:
            try:
                figures[cells[0]] = float(cells[1])
            except ValueError:
                raise ValueError(f"{MEASUREMENTS.name}, {GUARD}: {cells[1]!r} for {cells[0]} is not ms per example")
    if not figures:
        raise ValueError(f"{MEASUREMENTS.name}, {GUARD}: no table of check | ms per example under the heading")
    return figures


def over(measured: dict[str, float], figures: dict[str, float], limit: float = LIMIT) -> list[str]:
    """The checks whose ms per example is above `limit` times the recorded figure, each said in one line."""
    return [f"{check}: {ms:.2f} ms per example, {ms / figures[check]:.2f} x the recorded {figures[check]:.2f} "
            f"(limit {limit:g} x)" for check, ms in sorted(measured.items())
            if check in figures and ms > limit * figures[check]]


def cost_table(report: dict[str, dict[str, float]], figures: dict[str, float]) -> list[str]:
    """Per check: examples, ms per example in total and per phase, and the recorded figure."""
    phases = list(costs.PHASES)
    out = [f"{'check':<18} {'examples':>8} {'ms/ex':>7} {'recorded':>8}  " + " ".join(f"{p:>7}" for p in phases)]
    for check, f in sorted(report.items()):
        ms = costs.per_example(f)
        out.append(f"{check:<18} {int(f.get('examples', 0)):>8} {ms['total']:>7.2f} "
                   f"{figures.get(check, float('nan')):>8.2f}  " + " ".join(f"{ms.get(p, 0):>7.2f}" for p in phases))
    return out


def run(name: str, gpus: str, cpus: int, cache: Path, releases: list[str], out: Path, extra: list[str],
        timeout: float) -> dict:
    """One timed suites process, on the first `cpus` CPUs, ended after `timeout` seconds; its figures."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "CUDA_VISIBLE_DEVICES": gpus, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", "-q", "--hypothesis-profile=kvconform-gpu",
           f"--kvconform-results-dir={out}", *[f"--kvconform-release={r}" for r in releases], *extra]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus]))
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # with its xdist workers and warm-up processes
        stdout, stderr = proc.communicate()
        stdout += f"\ntimed out after {timeout:.0f} s"
    wall = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    (out / "pytest.log").write_text(stdout + "\n--- stderr\n" + stderr)
    done = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    tail = done.stdout.strip().splitlines()[-1:] or [""]
    # A run ended by the timeout never merged its workers' files: count what they hold.
    rows = results.read(out) or results.read(out, files="results.*.jsonl")
    kernel = [r for r in rows if r.check in KERNEL_CHECKS and r.outcome in RAN]
    cheap = [r for r in rows if r.check not in KERNEL_CHECKS and r.case]
    info = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    warm = info.get("warmup") or {}
    processes = info.get("processes", {}).values()
    figures = {
        "run": name, "gpus": gpus, "cpus": cpus, "wall_s": round(wall, 1), "exit": done.returncode, "pytest": tail[0],
        "kernel_examples": len(kernel), "per_s": round(len(kernel) / wall, 1), "cheap_examples": len(cheap),
        "kernel_by_check": dict(Counter(r.check for r in kernel)),
        "kernel_by_device": dict(Counter(r.device for r in kernel)),
        "not_passing": dict(Counter(r.outcome for r in rows if r.outcome not in results.PASSING)),
        "warmup_s": round(warm.get("seconds", 0), 1), "warmup_compiled": warm.get("counts", {}).get("compiled"),
        "warmup_loaded": warm.get("counts", {}).get("loaded"),
        "workers_compiled": sum(p.get("compiled", 0) for p in processes if p),
        "workers_loaded": sum(p.get("loaded", 0) for p in processes if p),
        "costs": costs.merged([p["costs"] for p in processes if p and "costs" in p]),
        "workers": {name: {"results": p.get("results", 0),
                           "busy_s": round(sum(v for c in p.get("costs", {}).values() for k, v in c.items()
                                               if k in costs.PHASES), 1)}
                    for name, p in sorted(info.get("processes", {}).items()) if p},
    }
    if done.returncode not in (0, 1):
        figures["stderr"] = done.stderr[-2000:]
    return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_suites.py")
    parser.add_argument("--releases", default="default", help="'default' (matrix.toml's subset) or a comma list")
    parser.add_argument("--runs", default="cold:0,warm:0,warm:all",
                        help="comma list of cold|warm:GPUS (GPUS: CUDA_VISIBLE_DEVICES, or 'all')")
    parser.add_argument("--cpus-per-gpu", type=int, default=0,
                        help="pin each run to this many CPUs per GPU it uses (a host of that shape); 0: all")
    parser.add_argument("--timeout", default="600",
                        help="seconds a run may take before it is ended: one figure, or a comma list, one per run")
    parser.add_argument("--seeds", default="", help="comma list: the hypothesis seed of each run, in order")
    parser.add_argument("--triton-cache", type=Path, default=None,
                        help="the Triton cache folder (a cold run empties it); default: a new temporary one")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_suites")
    parser.add_argument("--no-guard", action="store_true", help="print the per-check costs without judging them")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_suites needs a CUDA device")
    figures = {} if args.no_guard else recorded(MEASUREMENTS.read_text())
    everything = ",".join(map(str, range(torch.cuda.device_count())))
    releases = ([r.name for r in matrix.default()] if args.releases == "default"
                else args.releases.split(","))
    cache = args.triton_cache or Path(tempfile.mkdtemp(prefix="kvconform-triton-"))
    cache.mkdir(parents=True, exist_ok=True)
    print(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}, {len(os.sched_getaffinity(0))} CPUs; releases "
          f"{', '.join(releases)}; Triton cache {cache}", flush=True)
    seeds = [x for x in args.seeds.split(",") if x]
    timeouts = [float(x) for x in args.timeout.split(",")]
    lines = []
    for i, spec in enumerate(args.runs.split(",")):
        kind, _, gpus = spec.partition(":")
        if kind == "cold":
            shutil.rmtree(cache)
            cache.mkdir(parents=True)
        seed = [f"--hypothesis-seed={seeds[i]}"] if i < len(seeds) else []
        visible = everything if gpus == "all" else gpus
        cpus = args.cpus_per_gpu * len(visible.split(",")) or len(os.sched_getaffinity(0))
        figures = run(spec, visible, cpus, cache, releases, args.out / f"{i}-{kind}", [*extra, *seed],
                      timeouts[min(i, len(timeouts) - 1)])
        figures["seed"] = seeds[i] if i < len(seeds) else None
        lines.append(figures)
        print(json.dumps(figures), flush=True)
        (args.out / "bench.json").write_text(json.dumps(lines, indent=1) + "\n")  # after each run: a cut call keeps it
    print(f"{'run':<10} {'gpus':<5} {'cpus':>4} {'wall s':>7} {'kernel ex':>9} {'per s':>6} {'cheap ex':>8} "
          f"{'warm-up s':>9} {'compiled (warm-up/after)':>24}  by device")
    for f in lines:
        print(f"{f['run']:<10} {f['gpus']:<5} {f['cpus']:>4} {f['wall_s']:>7} {f['kernel_examples']:>9} {f['per_s']:>6} "
              f"{f['cheap_examples']:>8} {f['warmup_s']:>9} {str(f['warmup_compiled']) + ' / ' + str(f['workers_compiled']):>24}"
              f"  {f['kernel_by_device']}")
    slow = []
    for f in lines:
        print(f"\nrun {f['run']}: cost per example (ms), summed over its workers; recorded: {MEASUREMENTS.name}, "
              f"{GUARD}")
        print("\n".join(cost_table(f["costs"], figures)))
        for name, w in f["workers"].items():
            print(f"  worker {name}: {w['results']} results, {w['busy_s']} s in items")
        if not f["run"].startswith("warm"):
            print("  not guarded: a cold run's warm-up compiles on the same CPUs as its examples")
            continue
        measured = {c: costs.per_example(x)["total"] for c, x in f["costs"].items()}
        slow += [f"run {f['run']}: {line}" for line in over(measured, figures)]
    if slow:
        print("\nslower than recorded (a benchmark guard, not a verdict):\n" + "\n".join(slow))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
